"""``router bench soak``: a short soak with every kind of fault loses no acknowledged
QoS 1 message and reports every figure; bad options are one ``Error:`` line.

The short run (21 s of load, a fault every 5 s from the start: kill -9 of node 2 and its
restart, 2.7 s on a quiet machine and 7.9 s in one CI run, a Redis restart, kill -9 of
node 3 due at 15 s unless the first two took longer, and a fourth at 20 s when the
machine is quick) is the bench's own
proof; its long form is `router bench soak` with
its defaults, whose figures are in docs/reliability.md.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from router.bench.soak_clients import QosOnePublisher
from router.cli import app
from tests.support.waiting import wait_until

FIELDS = (
    "lost",
    "lost_where",
    "duplicates",
    "qos1",
    "qos0",
    "churn",
    "reconnects",
    "faults",
    "rss_growth_mib_per_min",
    "target_rss_growth_mib_per_min",
    "series",
    "drain_s",
)
SAMPLE_FIELDS = ("t_s", "deliveries_per_s", "qos1_p99_ms", "qos0_p99_ms", "rss_mib", "acked")


@pytest.mark.fault
def test_a_short_soak_with_every_fault_loses_nothing_and_reports_every_figure() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "soak",
            "--minutes",
            "0.35",
            "--fault-every",
            "5",
            "--subscriptions",
            "600",
            "--qos1-rate",
            "90",
            "--qos0-rate",
            "90",
            "--churn",
            "30",
            "--sample-seconds",
            "1.5",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    print(f"\nsoak: { {k: v for k, v in report.items() if k != 'series'} }")
    for field in FIELDS:
        assert field in report, field
    kinds = [(fault["kind"], fault["target"].rsplit("-", 1)[-1]) for fault in report["faults"]]
    cycle = [("kill -9 node", "2"), ("restart redis", "redis"), ("kill -9 node", "3")]
    assert len(kinds) >= len(cycle), kinds
    assert kinds == [cycle[turn % len(cycle)] for turn in range(len(kinds))]
    assert report["qos1"]["acked"] > 0
    assert report["lost"] == 0, report["lost_where"]
    assert report["qos1"]["delivered"] == report["qos1"]["expected_deliveries"]
    assert report["churn"]["subscribes"] > 0
    assert report["qos0"]["delivered"] > 0
    assert len(report["series"]) >= 10
    for sample in report["series"]:
        assert set(SAMPLE_FIELDS) <= set(sample)
        assert len(sample["rss_mib"]) == 3


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--minutes", "0"),
        ("--fault-every", "-1"),
        ("--subscriptions", "5"),
        ("--qos1-rate", "0"),
        ("--qos0-rate", "nan"),
        ("--churn", "-3"),
        ("--sample-seconds", "0"),
        ("--redis", "nowhere://x"),
    ],
)
def test_a_bad_soak_option_is_one_error_line(option: str, value: str) -> None:
    result = CliRunner().invoke(app, ["bench", "soak", option, value, "--json"])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.output


class _Refused:
    """paho's MQTTMessageInfo of a publish that could not go out (not connected)."""

    def wait_for_publish(self, timeout: float) -> None:
        raise RuntimeError("Message publish failed: The client is not currently connected.")

    def is_published(self) -> bool:
        raise RuntimeError("Message publish failed: The client is not currently connected.")


class _Acked:
    def wait_for_publish(self, timeout: float) -> None:
        return None

    def is_published(self) -> bool:
        return True


class _FlakyClient:
    """Refuses every other publish, as a paho client whose connection just dropped."""

    def __init__(self) -> None:
        self.calls = 0

    def publish(self, topic: str, payload: bytes, qos: int) -> Any:
        self.calls += 1
        return _Refused() if self.calls % 2 else _Acked()


def test_a_qos_1_publisher_sends_again_what_its_dropped_connection_refused() -> None:
    # paho raises from is_published() for a publish made while disconnected; that killed
    # the publisher's thread in a 10-minute soak (it stopped publishing for good).
    client = _FlakyClient()
    link = SimpleNamespace(client=client, connected=threading.Event(), resets=0)
    link.connected.set()
    link.reset = lambda: setattr(link, "resets", link.resets + 1)
    stop = threading.Event()
    publisher = QosOnePublisher(1, link, rate=1000.0, stop=stop)  # type: ignore[arg-type]
    publisher.thread.start()
    try:
        wait_until(lambda: len(publisher.acked) >= 3, 10, "three acknowledged publishes")
    finally:
        stop.set()
        publisher.thread.join(5)
    assert publisher.acked[:3] == [0, 1, 2]  # each sent again until acknowledged
    assert publisher.resends >= 3
    assert link.resets >= 3
