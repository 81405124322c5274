"""``router bench mqtt --json`` on a tiny size: the shape, and every broker's answers agree;
the load's plan (which subscriber gets which publisher's messages).

It starts two router nodes, then one, then mosquitto and amqtt (amqtt from the bench's own
virtualenv under ~/.cache/router/, created by pip on first use).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from router.bench.broker_runs import MqttBenchConfig, cut, report
from router.bench.mqtt_load import LoadPlan, LoadResult
from router.cli import app

BROKERS = ("router_two_nodes", "router_one_node", "mosquitto", "amqtt")
QOS_FIELDS = (
    *(f"{broker}_msgs_per_s" for broker in BROKERS),
    "vs_mosquitto",
    "vs_amqtt",
    "lost",
    "duplicates",
    "lost_by_broker",
    "duplicates_by_broker",
    "answers_agree",
)
TOP_FIELDS = (
    "qos0",
    "qos1",
    "p50_latency_ms",
    "p99_latency_ms",
    "latency_messages",
    "mosquitto_p50_latency_ms",
    "mosquitto_p99_latency_ms",
    "mosquitto_latency_messages",
    "mosquitto_latency_lost",
    "p99_vs_mosquitto",
    "messages",
    "publishers",
    "subscribers",
    "rate",
    "seconds",
    "targets_met",
)


def test_bench_mqtt_reports_every_field(redis_standalone_url: str) -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "mqtt",
            "--redis",
            redis_standalone_url,
            "--messages",
            "300",
            "--publishers",
            "3",
            "--subscribers",
            "2",
            "--fanout",
            "2",
            "--rate",
            "400",
            "--seconds",
            "0.5",
            "--drain-seconds",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for field in TOP_FIELDS:
        assert field in report, field
    for qos in ("qos0", "qos1"):
        row = report[qos]
        for field in QOS_FIELDS:
            assert field in row, (qos, field)
        for broker in BROKERS:
            assert row[f"{broker}_msgs_per_s"] > 0, (qos, broker)
        assert set(row["lost_by_broker"]) == set(BROKERS)
        assert row["vs_mosquitto"] > 0 and row["vs_amqtt"] > 0
    assert report["qos1"]["lost_by_broker"] == dict.fromkeys(BROKERS, 0)
    assert report["qos1"]["duplicates_by_broker"] == dict.fromkeys(BROKERS, 0)
    assert report["qos1"]["answers_agree"] is True
    assert report["qos0"]["lost_by_broker"]["router_two_nodes"] == 0
    assert report["fan_out"] == 2  # lost 0: each of the 300 messages reached both
    assert report["latency_messages"] == 200  # 400 msg/s for 0.5 s, every one through
    assert 0 < report["p50_latency_ms"] <= report["p99_latency_ms"]
    # mosquitto's latency run, the same one: every message through, once.
    assert report["mosquitto_latency_messages"] == 200
    assert report["mosquitto_latency_lost"] == 0 and report["mosquitto_latency_duplicates"] == 0
    assert 0 < report["mosquitto_p50_latency_ms"] <= report["mosquitto_p99_latency_ms"]
    ratio = report["p99_latency_ms"] / report["mosquitto_p99_latency_ms"]
    assert report["p99_vs_mosquitto"] == cut(ratio)


def test_mosquittos_latency_beside_ours_and_none_when_left_out() -> None:
    config = MqttBenchConfig(messages=4, publishers=1, subscribers=1, rate=4.0, seconds=1.0)
    plan = config.latency_plan("latency")

    def run(latencies_ms: list[float]) -> LoadResult:
        nanoseconds = [int(ms * 1e6) for ms in latencies_ms]
        return LoadResult(plan, 0, 10**9, 4, 0, [b"\x01" * 4], 0, 0.0, nanoseconds, nanoseconds)

    results = {
        name: {qos: run([1.0] * 4) for qos in (0, 1)}
        for name in ("router_two_nodes", "router_one_node")
    }
    cpu = {name: {0: [None], 1: [None]} for name in results}
    ours = run([1.0, 2.0, 3.0, 4.0])
    config = replace(config, skip_mosquitto=True, skip_amqtt=True)  # (no version asked)
    alone = report(config, results, ours, cpu)
    assert alone["p99_latency_ms"] == 4.0 and alone["latency_messages"] == 4
    assert alone["mosquitto_p99_latency_ms"] is None
    assert alone["mosquitto_latency_messages"] is None
    assert alone["p99_vs_mosquitto"] is None
    beside = report(config, results, ours, cpu, run([0.5, 0.5, 0.5, 1.5]))
    assert beside["mosquitto_p50_latency_ms"] == 0.5 and beside["mosquitto_p99_latency_ms"] == 1.5
    assert beside["mosquitto_latency_messages"] == 4 and beside["mosquitto_latency_lost"] == 0
    assert beside["p99_vs_mosquitto"] == 2.66  # 4 / 1.5, truncated


@pytest.mark.parametrize(("publishers", "subscribers", "fanout"), [(4, 4, 1), (5, 3, 1), (7, 4, 3)])
def test_each_message_has_fanout_subscribers(
    publishers: int, subscribers: int, fanout: int
) -> None:
    plan = LoadPlan(100, publishers, subscribers, 0, fanout=fanout)
    receivers = {p: [s for s in range(subscribers) if p in plan.publishers_of(s)] for p in range(7)}
    assert all(len(receivers[p]) == fanout for p in range(publishers))
    assert all(not receivers[p] for p in range(publishers, 7))
    if fanout == 1:  # the bench's first plan: p % S == s
        assert all(receivers[p] == [p % subscribers] for p in range(publishers))


def test_bench_mqtt_runs_the_nodes_with_an_acl(redis_standalone_url: str, tmp_path: Path) -> None:
    """With ``--acl`` the nodes judge every delivery: a topic the file denies receiving
    goes to nobody (counted lost, as the bench must), the rest arrives once."""
    acl = tmp_path / "acl.conf"
    acl.write_text("deny all subscribe bench/p000/t000\nallow all all bench/#\n")
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "mqtt",
            "--redis",
            redis_standalone_url,
            "--messages",
            "200",
            "--publishers",
            "2",
            "--subscribers",
            "2",
            "--rate",
            "200",
            "--seconds",
            "0.5",
            "--drain-seconds",
            "0.5",
            "--skip-mosquitto",
            "--skip-amqtt",
            "--acl",
            str(acl),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["router_options"].endswith(f"--acl {acl}")
    for broker in ("router_two_nodes", "router_one_node"):
        # 100 messages of publisher 0, seq % 100 == 0 on bench/p000/t000: one each run
        assert report["qos1"]["lost_by_broker"][broker] == 1
        assert report["qos1"]["duplicates_by_broker"][broker] == 0
