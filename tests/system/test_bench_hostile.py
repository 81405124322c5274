"""``router bench hostile --json`` on a tiny size: its shape, the probes' answers on both
brokers, and floods that reached them (a router node, then mosquitto, one second a phase),
the control phase whose floods go to a mosquitto beside them, and the router node's
heartbeats watched in each phase (:mod:`router.bench.heartbeat_watch`).
"""

from __future__ import annotations

import json
from uuid import uuid4

import redis
from click.testing import CliRunner

from router.bench.heartbeat_watch import HeartbeatWatch
from router.bench.hostile_floods import FLOODS
from router.cli import app
from router.state.keys import Keys
from tests.support.waiting import wait_until

PHASE_FIELDS = {"round_trips", "p50_ms", "p99_ms", "missed", "wrong", "probe_failures"}
HEARTBEAT_FIELDS = {
    "heartbeats",
    "max_gap_ms",
    "interval_ms",
    "expired",
    "unanswered_reads",
    "on_time",
}


def test_bench_hostile_reports_both_brokers_quiet_and_flooded(redis_standalone_url: str) -> None:
    args = ["bench", "hostile", "--redis", redis_standalone_url, "--probes", "3"]
    result = CliRunner().invoke(app, [*args, "--seconds", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["mode"] == "hostile" and report["floods"] == list(FLOODS)
    for broker in ("router", "mosquitto"):
        figures = report[broker]
        for phase in ("quiet", "flooded", "floods_elsewhere"):
            heartbeat = figures[phase].pop("heartbeat", None)
            assert set(figures[phase]) == PHASE_FIELDS
            assert figures[phase]["round_trips"] > 0 and figures[phase]["wrong"] == 0
            if broker == "mosquitto":
                assert heartbeat is None
            else:  # (the node's renewals seen while the phase ran)
                assert heartbeat is not None and set(heartbeat) == HEARTBEAT_FIELDS
                assert heartbeat["heartbeats"] >= 1 and heartbeat["interval_ms"] == 1000
        quiet = figures["quiet"]
        assert quiet["missed"] == 0 and quiet["probe_failures"] == []
        assert 0 < quiet["p50_ms"] <= quiet["p99_ms"]
        assert set(figures["floods_sent"]) == set(FLOODS)
        assert all(sent["packets"] > 0 for sent in figures["floods_sent"].values())
        assert figures["p99_flooded_over_quiet"] > 0
        assert figures["p99_floods_elsewhere_over_quiet"] > 0
        assert figures["p99_flooded_over_floods_elsewhere"] > 0


def test_the_heartbeat_watch_measures_gaps_on_redis_time_and_sees_an_expiry(
    redis_standalone_url: str,
) -> None:
    """A node's renewals written by hand: the gaps are the differences of the stored
    expiries (not of when the watch read them), one over two intervals is not on time,
    and an expiry below Redis's time is seen."""
    keys = Keys(f"t{uuid4().hex[:12]}")
    client = redis.Redis.from_url(redis_standalone_url)
    seconds, _ = client.time()
    base = (seconds + 60) * 1000
    node = "watched-1"

    def renew(score: int, seen: int) -> None:
        client.zadd(keys.registry_heartbeats(), {node: score})
        wait_until(lambda: watch.figures()["heartbeats"] == seen, 10, f"renewal {seen} seen")

    try:
        with HeartbeatWatch(redis_standalone_url, keys.prefix, node, interval=1.0) as watch:
            renew(base, 1)
            renew(base + 700, 2)
            renew(base + 1_400, 3)
            on_time = watch.figures()
            renew(base + 3_500, 4)
            late = watch.figures()
            client.zadd(keys.registry_heartbeats(), {node: 1_000})
            wait_until(lambda: watch.figures()["expired"], 10, "the expiry seen")
    finally:
        client.delete(keys.registry_heartbeats())
        client.close()
    assert on_time["max_gap_ms"] == 700 and on_time["on_time"] and not on_time["expired"]
    assert late["max_gap_ms"] == 2_100 and not late["on_time"]
    assert not watch.figures()["on_time"]
