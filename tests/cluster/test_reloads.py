"""A node's record of its reloads (:mod:`router.cluster.reloads`): what each outcome
counts, tells and keeps as what the node runs with."""

from __future__ import annotations

from typing import Any

from router.cluster.events import EventReporter
from router.cluster.reloads import Reloads
from router.errors import AclRuleError
from router.state.event_log import EventLog
from router.state.keys import Keys


def reporter() -> EventReporter:
    redis: Any = None  # (told events only queue: nothing is written in these tests)
    return EventReporter(EventLog(redis, Keys("t")), "n1")


def test_without_a_reloader_a_reload_fails_and_says_why() -> None:
    events = reporter()
    reloads = Reloads(events, "n1")
    assert reloads.reload("SIGHUP") is False
    assert reloads.stats()["reload_failures"] == 1 and reloads.stats()["reloads"] == 0
    assert not reloads.last.ok and "not run by router node run" in reloads.last.text
    assert events.told == 1


def test_a_failed_reload_keeps_what_the_node_runs_with() -> None:
    outcomes: list[Any] = ["ACL a.conf (2 rules)", AclRuleError("a.conf:3: bad"), "ACL a.conf"]

    def reloader() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return str(outcome)

    reloads = Reloads(reporter(), "n1")
    reloads.install(reloader, "ACL a.conf (1 rules)")
    assert (reloads.last.loaded, reloads.last.at_ms) == ("ACL a.conf (1 rules)", 0)
    assert reloads.reload("SIGHUP") is True
    assert reloads.last.ok and reloads.last.loaded == "ACL a.conf (2 rules)"
    assert reloads.reload("asked by router node reload") is False
    assert (reloads.last.ok, reloads.last.text) == (False, "a.conf:3: bad")
    assert reloads.last.loaded == "ACL a.conf (2 rules)"
    assert reloads.last.at_ms > 0
    assert reloads.reload("SIGHUP") is True
    stats = reloads.stats()
    assert (stats["reloads"], stats["reload_failures"]) == (2, 1)
    assert stats["reload_last_ms"] == reloads.last.at_ms
