"""``router bench hostile --json`` on a tiny size: its shape, the probes' answers on both
brokers, and floods that reached them (a router node, then mosquitto, one second a phase),
the control phase whose floods go to a mosquitto beside them, the router node's
heartbeats watched in each phase (:mod:`router.bench.heartbeat_watch`), and 40 slow
lorises against a node whose bounds on unfinished packets are small (1 MiB, 1 s): it
ends every one of them (0x97 past the bytes, 0x8D past the time), mosquitto none.
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
LORIS_FIELDS = {
    *("lorises", "loris_bytes", "announced_bytes", "hold_s", "accepted", "refused"),
    *("ended_while_sending", "open_at_end", "ended", "ended_after_s", "probes"),
    *("rss_mib_before", "rss_mib_during", "rss_mib_peak", "rss_mib_held", "rss_mib_after"),
}
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
    lorises = ["--lorises", "40", "--loris-hold", "3", "--node-packet-timeout", "1"]
    lorises += ["--node-max-unfinished-bytes", str(1 << 20), "--loris-waves", "2"]
    result = CliRunner().invoke(app, [*args, *lorises, "--seconds", "1", "--json"])
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
        loris = figures["lorises"]
        assert set(loris) == LORIS_FIELDS
        assert loris["accepted"] == 40 and loris["refused"] == 0
        assert loris["probes"]["round_trips"] > 0 and loris["probes"]["wrong"] == 0
        assert loris["rss_mib_before"] > 0 and loris["rss_mib_peak"] >= loris["rss_mib_during"]
        [again] = figures["loris_waves"]  # (a second wave once the first ended)
        assert set(again) == LORIS_FIELDS and again["accepted"] == 40
    router, mosquitto = report["router"]["lorises"], report["mosquitto"]["lorises"]
    assert router["open_at_end"] == 0 and sum(router["ended"].values()) == 40
    assert report["router"]["loris_waves"][0]["open_at_end"] == 0
    # (16 x 64 KiB fill the 1 MiB; on a busy machine the first ones may time out, 0x8D,
    # before the last ones connect, and free their bytes for them)
    assert router["ended"]["disconnect 0x97"] >= 1 and router["ended"]["disconnect 0x8d"] >= 1
    assert mosquitto["open_at_end"] == 40 and mosquitto["ended"] == {}


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
