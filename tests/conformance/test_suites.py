"""How ``make conformance`` reads and judges the suites of others
(:mod:`tests.conformance.suites`): table-driven, without running a suite."""

from __future__ import annotations

import pytest

from tests.conformance.suites import (
    LAYOUTS,
    READERS,
    Outcome,
    Run,
    judge,
    pytest_counts,
    read_gmqtt,
    read_pytest,
    suites,
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
def test_pytest_s_summary_line_is_read_by_outcome(line: str, counts: dict[str, int]) -> None:
    assert pytest_counts(f"....F...\n[100%]\nFAILED tests/x.py::test_y - 2 passed\n{line}\n") == (
        counts
    )


def test_a_pytest_output_without_summary_is_no_result() -> None:
    assert pytest_counts("ImportError: no zmqtt\n") is None
    assert read_pytest("ImportError: no zmqtt\n").found is False


def test_failed_and_errored_tests_are_named() -> None:
    output = (
        "FAILED tests/test_brokers/test_router.py::TestRouter::test_will[5.0] - assert 1\n"
        "ERROR tests/test_brokers/test_router.py::TestRouter::test_retain - Timeout\n"
        "2 failed, 1 error, 71 passed, 2 skipped in 30.00s\n"
    )
    outcome = read_pytest(output)
    assert outcome.passed == 71
    assert outcome.failed == ("test_will[5.0]", "test_retain", "(unnamed failures)")


def test_gmqtt_s_result_line_is_read() -> None:
    output = "...\ngmqtt: 14/16 passed; failed: test_assigned_clientid, test_basic_ssl\n"
    assert read_gmqtt(output) == Outcome(14, ("test_assigned_clientid", "test_basic_ssl"))
    assert read_gmqtt("gmqtt: 16/16 passed; failed: none\n") == Outcome(16, ())
    assert read_gmqtt("gmqtt: install failed\n").found is False


def judged(suite: str, outcome: Outcome, logs: list[str] | None = None) -> list[str]:
    run = Run(suite, LAYOUTS[0], outcome, node_logs=logs or [])
    judge(run, READERS[suite])
    return run.problems


def test_only_what_upstream_says_cannot_pass_here_may_fail() -> None:
    known = ("test_assigned_clientid", "test_basic_ssl")
    assert judged("gmqtt", Outcome(14, known)) == []
    assert judged("gmqtt", Outcome(13, (*known, "test_shared_subscriptions"))) == [
        "failed: test_shared_subscriptions",
        "only 13 passed (at least 14)",
    ]
    assert judged("zmqtt", Outcome(73, ("test_will",))) == [
        "failed: test_will",
        "only 73 passed (at least 74)",
    ]
    assert judged("zmqtt", Outcome(0, (), found=False)) == ["no result in the suite's output"]


def test_a_traceback_or_error_in_a_node_s_log_fails_a_passing_run() -> None:
    logs = [
        "2026-12-02 10:00:00,000 INFO router.ops.node_process: node a ready",
        "2026-12-02 10:00:01,000 ERROR router.mqtt.protocol: MQTT client c failed",
        "Traceback (most recent call last):",
    ]
    assert judged("zmqtt", Outcome(74, ()), logs) == [
        "2 traceback or ERROR lines in the nodes' logs"
    ]


def test_every_suite_beside_the_repository_has_a_reader() -> None:
    """A suite added to shared/conformance is judged by a reader here, or the run fails."""
    assert {suite.name for suite in suites()} <= set(READERS)
