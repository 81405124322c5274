"""``router bench cluster --json`` on a tiny size: the shape and the routing invariants."""

from __future__ import annotations

import json

from click.testing import CliRunner

from router.cli import app

FIELDS = (
    "cross_node_msgs_per_s",
    "raw_publish_per_s",
    "throughput_ratio",
    "p50_latency_ms",
    "p99_latency_ms",
    "convergence_p50_ms",
    "convergence_p99_ms",
    "forwards_per_publish",
    "uninterested_forwards",
)


def test_bench_cluster_reports_every_field(redis_standalone_url: str) -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "cluster",
            "--redis",
            redis_standalone_url,
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
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for field in FIELDS:
        assert field in report, field
    assert report["delivered"] == 600  # every message crossed, none twice
    assert report["latency_messages"] == 250
    assert report["forwards_per_publish"] == 1.0  # one copy per interested node
    assert report["uninterested_forwards"] == 0
    assert report["cross_node_msgs_per_s"] > 0 and report["raw_publish_per_s"] > 0
