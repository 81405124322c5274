"""``router demo`` on the embedded Redis: a real redis-server, and the fakeredis fallback."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from router.cli import app
from router.ops.demo import DemoReport, run_demo_on
from router.ops.embedded_redis import embedded_redis


def check(report: DemoReport) -> None:
    assert report.copies["sensors"]["node-3"] == 0  # no sensor subscriber on node-3
    assert report.copies["jobs"]["node-1"] == 0  # no worker on node-1
    assert report.deliveries["node-1"]["dashboard"] == 3
    assert report.deliveries["node-2"]["archiver"] == 6
    workers = report.deliveries["node-2"]["worker-a"] + report.deliveries["node-3"]["worker-b"]
    assert workers == 6  # each job to exactly one member of the group
    assert report.routes["sensors/#"] == {"node-2": 1}
    assert report.routes["$share/workers/jobs/#"] == {"node-2": 1, "node-3": 1}


@pytest.mark.parametrize(
    "prefer_real",
    [
        pytest.param(True, marks=pytest.mark.redis, id="redis-server"),
        pytest.param(False, id="fakeredis"),
    ],
)
def test_demo_on_the_embedded_server(prefer_real: bool) -> None:
    with embedded_redis(prefer_real=prefer_real) as url:
        report = asyncio.run(run_demo_on(url))
    check(report)
    assert report.server.startswith("Redis") == prefer_real


def test_demo_command_prints_the_report(redis_standalone_url: str) -> None:
    result = CliRunner().invoke(app, ["demo", "--redis", redis_standalone_url])
    assert result.exit_code == 0, result.output
    assert "Cluster route table" in result.output
    assert "sensors/...    node-1=3, node-2=6, node-3=0   (no copy to: node-3)" in result.output


def test_demo_with_unreachable_redis_fails_cleanly() -> None:
    result = CliRunner().invoke(app, ["demo", "--redis", "redis://127.0.0.1:1/0"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "cannot reach Redis" in result.output
