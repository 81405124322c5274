"""The command line, through click's CliRunner."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from router.cli import app


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "bench" in result.output
    assert "demo" in result.output


def test_bench_match_json_shape_and_agreement() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "match",
            "--subscriptions",
            "3000",
            "--topics",
            "500",
            "--rounds",
            "1",
            "--hot-publishes",
            "12000",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for name in ("devices", "dashboards"):
        workload = report["workloads"][name]
        for field in (
            "router_matches_per_s",
            "paho_matches_per_s",
            "match_ratio",
            "router_bytes_per_sub",
            "paho_bytes_per_sub",
        ):
            assert workload[field] > 0, (name, field)
    assert (
        report["workloads"]["dashboards"]["average_fanout"]
        > (report["workloads"]["devices"]["average_fanout"])
    )
    hot = report["workloads"]["hot"]
    assert hot["wrong_answers"] == 0
    assert hot["publishes"] == 12000
    for field in ("cached_matches_per_s", "uncached_matches_per_s", "cache_speedup"):
        assert hot[field] > 0, field


def test_bench_match_table() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "match",
            "--subscriptions",
            "2000",
            "--topics",
            "200",
            "--rounds",
            "1",
            "--hot-publishes",
            "12000",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "match_ratio" in result.output
    assert "cache_speedup" in result.output


def test_unknown_command_fails_cleanly() -> None:
    result = CliRunner().invoke(app, ["no-such-command"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output


def test_node_run_help_names_the_environment_variable_of_every_option() -> None:
    """docs/operations.md says ``router node run --help`` lists the ``ROUTER_*`` variables."""
    result = CliRunner().invoke(app, ["node", "run", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # (as wrapped, in words)
    run = app.commands["node"].commands["run"]  # type: ignore[attr-defined]
    options = [p for p in run.params if p.name != "help" and p.opts[0].startswith("--")]
    assert options and all(isinstance(p.envvar, str) for p in options)
    missing = [p.envvar for p in options if not re.search(rf"\b{p.envvar}\b", text)]
    assert missing == []
