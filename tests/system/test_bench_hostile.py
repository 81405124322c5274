"""``router bench hostile --json`` on a tiny size: its shape, the probes' answers on both
brokers, and floods that reached them (a router node, then mosquitto, one second a phase),
and the control phase whose floods go to a mosquitto beside them.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from router.bench.hostile_floods import FLOODS
from router.cli import app

PHASE_FIELDS = {"round_trips", "p50_ms", "p99_ms", "missed", "wrong", "probe_failures"}


def test_bench_hostile_reports_both_brokers_quiet_and_flooded(redis_standalone_url: str) -> None:
    args = ["bench", "hostile", "--redis", redis_standalone_url, "--probes", "3"]
    result = CliRunner().invoke(app, [*args, "--seconds", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["mode"] == "hostile" and report["floods"] == list(FLOODS)
    for broker in ("router", "mosquitto"):
        figures = report[broker]
        for phase in ("quiet", "flooded", "floods_elsewhere"):
            assert set(figures[phase]) == PHASE_FIELDS
            assert figures[phase]["round_trips"] > 0 and figures[phase]["wrong"] == 0
        quiet = figures["quiet"]
        assert quiet["missed"] == 0 and quiet["probe_failures"] == []
        assert 0 < quiet["p50_ms"] <= quiet["p99_ms"]
        assert set(figures["floods_sent"]) == set(FLOODS)
        assert all(sent["packets"] > 0 for sent in figures["floods_sent"].values())
        assert figures["p99_flooded_over_quiet"] > 0
        assert figures["p99_floods_elsewhere_over_quiet"] > 0
        assert figures["p99_flooded_over_floods_elsewhere"] > 0
