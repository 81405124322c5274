"""``router bench backends --json`` on a tiny size: the shape, every delivery accounted
for, and who processed what (behaviour, never speed). Then the workload's plan, checked
against a brute-force count."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from router.bench import backends
from router.bench.backend_plan import BACKENDS, BackendsConfig
from router.cli import app

FIELDS = (
    "msgs_per_s",
    "deliveries_per_s",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "elapsed_s",
    "send_s",
    "senders_cpu_us_per_msg",
    "workers_cpu_us_per_msg",
    "redis_cpu_us_per_msg",
    "delivered",
    "expected",
    "lost",
    "duplicates",
    "misdelivered",
    "probe_rounds",
    "fenced",
    "processed_per_worker",
    "needed_per_worker",
    "processed_over_needed",
)
TINY = {
    "--workers": "3",
    "--senders": "2",
    "--groups": "6",
    "--members-per-group": "1",
    "--messages": "300",
    "--payload-bytes": "32",
    "--rate": "240",
    "--seconds": "0.5",
}


def test_every_backend_delivers_exactly_the_plan(redis_standalone_url: str) -> None:
    options = [part for pair in TINY.items() for part in pair]
    result = CliRunner().invoke(
        app, ["bench", "backends", "--redis", redis_standalone_url, *options, "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["backends"]) == set(BACKENDS)
    assert report["answers_agree"] is True
    assert report["vs_channels_redis"] > 0 and report["vs_socketio_redis"] > 0
    # 6 groups, a member each on one of 3 workers: each worker holds 2 groups, a third of
    # every message; a probe round is one probe from each of the 2 senders to each group,
    # and each sender ends with a fence to each group.
    messages = 300 + 120  # throughput phase + latency phase (240/s for 0.5 s): 70 a group
    for name, figures in report["backends"].items():
        assert set(FIELDS) <= set(figures), name
        assert figures["expected"] == figures["delivered"] == messages, name
        assert (figures["lost"], figures["duplicates"], figures["misdelivered"]) == (0, 0, 0)
        assert figures["msgs_per_s"] > 0, name
        for part in ("senders", "workers", "redis"):  # (/proc and Redis's INFO both answer)
            assert figures[f"{part}_cpu_us_per_msg"] is not None, name
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"], name
        assert figures["fenced"] is True, name
        everything = messages + (figures["probe_rounds"] + 1) * 2 * 6
        assert figures["needed_per_worker"] == [everything // 3] * 3, name
        processed = figures["processed_per_worker"]
        if name == "socketio_redis":  # one Redis channel: every worker reads every message
            # (the other workers' last fences, after the worker's own, may be on their way)
            fences = 2 * 6
            assert all(everything - fences <= count <= everything for count in processed)
        else:  # the router's backends route by interest; channels_redis's pub/sub layer
            # subscribes one Redis channel per group: each worker took in only its own
            assert processed == figures["needed_per_worker"], name


def test_the_table_shows_every_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = dict.fromkeys(FIELDS, 0)
    canned: dict[str, Any] = {
        "backends": dict.fromkeys(BACKENDS, figures),
        "vs_channels_redis": 1.0,
        "vs_socketio_redis": 1.0,
        "answers_agree": True,
    }
    monkeypatch.setattr(backends, "run", lambda url, config: dict(canned))
    result = CliRunner().invoke(app, ["bench", "backends"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in (*BACKENDS, "processed_per_worker", "vs_socketio_redis", "answers_agree"):
        assert name in result.output


@pytest.mark.parametrize(
    ("workers", "groups", "members"), [(1, 1, 1), (4, 100, 2), (3, 7, 3), (5, 3, 2), (4, 10, 1)]
)
def test_the_plan_places_every_member_once(workers: int, groups: int, members: int) -> None:
    config = BackendsConfig(workers=workers, groups=groups, members_per_group=members)
    held = {w: config.groups_of(w) for w in range(workers)}
    for group in range(groups):
        holders = {w for w in range(workers) if group in held[w]}
        assert holders == set(config.workers_of(group))
        assert len(holders) == members
    # sends_to counts the messages of a group as a loop over them would.
    for first, count in ((0, 1), (0, 250), (17, 33), (1_000, 999)):
        by_group = [0] * groups
        for seq in range(first, first + count):
            by_group[config.group_of(seq)] += 1
        assert [config.sends_to(g, first, count) for g in range(groups)] == by_group
        for worker in range(workers):
            assert config.expected(worker, first, count) == sum(by_group[g] for g in held[worker])
