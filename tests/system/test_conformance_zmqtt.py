"""zMQTT's broker suite (tests/conformance/zmqtt) against ``router node run --mqtt`` processes.

An independent MQTT client's own end-to-end tests of a broker (MQTT 3.1.1 and 5.0) run in a
pytest of their own, in a child process with the suite's options, against one node on
standalone Redis, two nodes on standalone Redis and two nodes on the 3-master Redis Cluster.
With two nodes every client the suite makes connects to the next node, so the nodes must
behave as one broker. The test reads the suite's own summary line: no failure, no error, and
at least :data:`EXPECTED_PASSED` passed; on failure the message holds the suite's output.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from router.state.keys import Keys
from tests.support.cli import delete_namespace
from tests.support.mqtt import mqtt_node

SUITE = Path(__file__).resolve().parents[1] / "conformance" / "zmqtt"
SUITE_TESTS = "tests/test_brokers/test_router.py"
#: Of the suite's 76 tests, 2 are skipped on MQTT 3.1.1 (retain handling is MQTT 5.0's).
EXPECTED_PASSED = 74
#: The whole suite runs in about 12 s; past this it is stopped and the test fails.
SUITE_TIMEOUT = 300.0
SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in [\d.]+s")


def suite_summary(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``"1 failed, 73 passed, 2 skipped in
    12.1s"``) by outcome, plural forms made singular (``errors`` counts as ``error``).

    Raises AssertionError with the output when it has no summary line (the run broke)."""
    for line in reversed(output.splitlines()):
        match = SUMMARY.match(line.strip())
        if match is not None:
            counts = {}
            for count in match.group("counts").split(", "):
                number, outcome = count.split(" ")
                counts[outcome.removesuffix("s")] = int(number)
            return counts
    raise AssertionError(f"no pytest summary in the suite's output:\n{output}")


def run_suite(ports: list[int]) -> subprocess.CompletedProcess[str]:
    """Run the suite against the nodes listening on ``ports`` (on 127.0.0.1)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env["ROUTER_NODES"] = ",".join(f"127.0.0.1:{port}" for port in ports)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the vendored tree as it is
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", SUITE_TESTS],
        cwd=SUITE,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        ("74 passed, 2 skipped in 7.25s", {"passed": 74, "skipped": 2}),
        ("1 failed, 73 passed, 2 skipped in 12.10s", {"failed": 1, "passed": 73, "skipped": 2}),
        (
            "73 passed, 1 xfailed, 2 errors in 61.02s (0:01:01)",
            {"passed": 73, "xfailed": 1, "error": 2},
        ),
        ("======= 1 error in 0.31s =======", {"error": 1}),
    ],
)
def test_the_summary_line_is_read_by_outcome(line: str, counts: dict[str, int]) -> None:
    assert (
        suite_summary(f"....F...\n[100%]\nFAILED tests/x.py::test_y - 2 passed\n{line}\n") == counts
    )


def test_an_output_without_summary_fails_with_that_output() -> None:
    with pytest.raises(AssertionError, match="ImportError: no zmqtt"):
        suite_summary("ImportError: no zmqtt\n")


@pytest.mark.redis
@pytest.mark.parametrize(
    ("redis", "node_count"),
    [("redis_standalone_url", 1), ("redis_standalone_url", 2), ("redis_cluster_url", 2)],
    ids=["one-node", "two-nodes", "two-nodes-redis-cluster"],
)
def test_the_zmqtt_broker_suite_passes(
    request: pytest.FixtureRequest, keys: Keys, redis: str, node_count: int
) -> None:
    url: str = request.getfixturevalue(redis)
    env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
    try:
        with contextlib.ExitStack() as nodes:
            ports = [
                nodes.enter_context(mqtt_node(f"zmqtt-{index}", env))[1]
                for index in range(node_count)
            ]
            run = run_suite(ports)
    finally:
        delete_namespace(url, keys)
    output = run.stdout + run.stderr
    counts = suite_summary(output)
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, output
    assert counts.get("passed", 0) >= EXPECTED_PASSED, output
    assert run.returncode == 0, output
