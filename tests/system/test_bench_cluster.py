"""``router bench cluster --json`` on a tiny size: the shape, the routing invariants, and
that what it reports counts every message sent."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from router.bench import cluster
from router.bench.broker_runs import cut
from router.cli import app
from router.cluster.node import RouterNode
from router.core.messages import Outgoing, PublishResult

FIELDS = (
    "cross_node_msgs_per_s",
    "raw_publish_per_s",
    "throughput_ratio",
    "delivered",
    "lost",
    "duplicates",
    "latency_messages",
    "latency_lost",
    "p50_latency_ms",
    "p99_latency_ms",
    "raw_latency_messages",
    "raw_latency_lost",
    "raw_latency_duplicates",
    "raw_p50_latency_ms",
    "raw_p99_latency_ms",
    "p99_vs_raw",
    "p99_vs_raw_target_met",
    "convergence_p50_ms",
    "convergence_p99_ms",
    "subscribe_p50_ms",
    "subscribe_p99_ms",
    "forwards_per_publish",
    "uninterested_forwards",
)


def run_cluster(url: str) -> Result:
    return CliRunner().invoke(
        app,
        [
            "bench",
            "cluster",
            "--redis",
            url,
            "--messages",
            "600",
            "--rate",
            "500",
            "--seconds",
            "0.5",
            "--convergence-rounds",
            "5",
            "--json",
        ],
    )


def test_bench_cluster_reports_every_field(redis_standalone_url: str) -> None:
    result = run_cluster(redis_standalone_url)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for field in FIELDS:
        assert field in report, field
    assert report["delivered"] == 600  # every message crossed, none twice
    assert report["lost"] == 0 and report["duplicates"] == 0
    assert report["latency_messages"] == 250 and report["latency_lost"] == 0
    assert report["forwards_per_publish"] == 1.0  # one copy per interested node
    assert report["uninterested_forwards"] == 0
    assert report["cross_node_msgs_per_s"] > 0 and report["raw_publish_per_s"] > 0
    assert 0 < report["p50_latency_ms"] <= report["p99_latency_ms"]
    # The raw hop, at the same rate: every message it sent arrived once.
    assert report["raw_latency_messages"] == 250
    assert report["raw_latency_lost"] == 0 and report["raw_latency_duplicates"] == 0
    assert 0 < report["raw_p50_latency_ms"] <= report["raw_p99_latency_ms"]
    ratio = report["p99_latency_ms"] / report["raw_p99_latency_ms"]
    assert report["p99_vs_raw"] == cut(ratio)
    assert report["p99_vs_raw_target"] == 3.0
    assert report["p99_vs_raw_target_met"] is (ratio <= 3.0)


def test_a_message_never_delivered_is_lost_and_counts(
    redis_standalone_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node A (in this process) drops every 10th message it is given, and so does the raw
    hop's publisher: the report must say so, and the latency percentiles count the missing
    ones as never arriving."""
    publish_many = RouterNode.publish_many
    seen = {"tp": 0, "lat": 0}
    dropped = {"tp": 0, "lat": 0}

    def keep(item: Outgoing) -> bool:
        phase = item.topic.split("/", 1)[0]
        seen[phase] += 1
        if seen[phase] % 10:
            return True
        dropped[phase] += 1
        return False

    async def lossy(self: RouterNode, items: Iterable[Outgoing]) -> list[PublishResult]:
        return await publish_many(self, [item for item in items if keep(item)])

    monkeypatch.setattr(RouterNode, "publish_many", lossy)
    raw_publish = cluster.raw_publish

    def lossy_raw(*args: Any) -> cluster.Publish:
        publish = raw_publish(*args)
        return lambda seqs, start: publish([seq for seq in seqs if seq % 10], start)

    monkeypatch.setattr(cluster, "raw_publish", lossy_raw)
    monkeypatch.setattr("router.bench.cluster.DRAIN_QUIET", 1.0)
    result = run_cluster(redis_standalone_url)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    assert dropped == {"tp": 60, "lat": 25}
    assert report["delivered"] == 540
    assert report["latency_messages"] == 225
    assert report["latency_lost"] == 25
    assert report["lost"] == 85
    # 10% never arrived: the 99th percentile of what was sent is one of them.
    assert report["p99_latency_ms"] is None and report["max_latency_ms"] is None
    assert report["p50_latency_ms"] > 0
    assert report["raw_latency_messages"] == 225 and report["raw_latency_lost"] == 25
    assert report["raw_p99_latency_ms"] is None and report["raw_p50_latency_ms"] > 0
    assert report["p99_vs_raw"] is None and report["p99_vs_raw_target_met"] is False


def test_convergence_is_measured_across_processes(
    redis_standalone_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench process only watches its route mirror: every subscribe happens in a node
    of another process."""

    async def refuse(self: RouterNode, *args: object, **kwargs: object) -> bool:
        raise AssertionError("a subscribe in the measuring process")

    monkeypatch.setattr(RouterNode, "subscribe", refuse)
    result = run_cluster(redis_standalone_url)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["convergence_rounds"] == 5
    assert 0 <= report["convergence_p50_ms"] <= report["convergence_p99_ms"]
    assert 0 < report["subscribe_p50_ms"] <= report["subscribe_p99_ms"]
