"""The cluster's events (router.state.event_log, router.cluster.events, .alarms) on a real
Redis, standalone and Cluster: a node's start and stop, a peer's death told once however
many nodes see it, and the alarms a node raises from its own figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from router.cluster.alarms import STORM, Alarms
from router.cluster.events import EventReporter
from router.errors import InvalidSettingError, StateUnavailableError
from router.state.event_log import Event, EventLog
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import StartNode, die

BOTH = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


@BOTH
async def test_a_dead_node_is_told_once_and_its_peers_starts_and_stops_each_once(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    ttl = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    a = await start_node("a", **ttl)
    await a.connect("kept", clean_start=False, expiry=600)
    b = await start_node("b", **ttl)
    c = await start_node("c", **ttl)
    await die(a)
    events = EventLog(await redis_connect(), keys)

    async def kinds() -> list[tuple[str, str]]:
        return [(e.kind, e.subject) for e in reversed(await events.recent())]

    await waiting.eventually(lambda: _has(kinds, ("node_purged", "a")), 15.0, "a purged and told")
    await c.stop()
    await waiting.eventually(lambda: _has(kinds, ("node_stopped", "c")), 5.0, "c stopped")
    told = await kinds()
    assert told.count(("node_down", "a")) == 1  # (b and c both saw it)
    assert [k for k in told if k[0] == "node_up"] == [("node_up", n) for n in "abc"]
    [down] = await events.recent(kinds=["node_down"])
    assert down.severity == "critical" and "heartbeat expired" in down.text
    assert down.node in ("b", "c") and down.at_ms > 0
    assert b.stats()["events_unwritten"] == 0


async def _has(kinds: Callable[[], Any], wanted: tuple[str, str]) -> bool:
    return wanted in await kinds()


@BOTH
async def test_an_event_told_once_is_kept_once_and_recent_filters(
    redis_connect: Callable[..., Any], keys: Keys
) -> None:
    events = EventLog(await redis_connect(), keys)
    event = Event("ban_added", "info", "cli", "client:x", "client x banned")
    assert await events.add(event, once="ban:x") is True
    assert await events.add(event, once="ban:x") is False
    await events.add_many([Event("node_up", "info", n, n, f"node {n} started") for n in "pq"])
    assert [e.subject for e in await events.recent()] == ["q", "p", "client:x"]
    assert [e.subject for e in await events.recent(1)] == ["q"]
    assert [e.kind for e in await events.recent(kinds=["ban_added"])] == ["ban_added"]
    assert [e.subject for e in await events.recent(subject="p")] == ["p"]
    newest = (await events.recent(1))[0]
    assert await events.recent(since_ms=newest.at_ms) == []
    with pytest.raises(InvalidSettingError):
        Event("made_up", "info", "n", "s", "t")


class Figures:
    def __init__(self) -> None:
        self.now: dict[str, int] = {"queue_drops": 0, "sessions_taken_over": 0}
        self.up = True

    async def ping(self) -> None:
        if not self.up:
            raise StateUnavailableError("Redis is down (the test says)")


async def test_alarms_tell_an_outage_once_it_ended_and_overflows_and_storms_once_a_minute(
    redis_connect: Callable[..., Any], keys: Keys
) -> None:
    events = EventLog(await redis_connect(), keys)
    reporter = EventReporter(events, "n1")
    figures = Figures()
    alarms = Alarms(
        reporter, "n1", lambda: figures.now, figures.ping, lambda n: [("slowpoke", 40)][:n]
    )
    await alarms.look()
    figures.up = False
    await alarms.look()
    await alarms.look()
    figures.up = True
    figures.now = {"queue_drops": 40, "sessions_taken_over": STORM + 1}
    await alarms.look()
    figures.now = {"queue_drops": 90, "sessions_taken_over": 3 * STORM}
    await alarms.look()  # (both again within a minute: not told twice)
    await reporter.flush()
    told = {e.kind: e for e in await events.recent()}
    assert set(told) == {"redis_unreachable", "queue_overflow", "takeover_storm"}
    assert len(await events.recent()) == 3
    assert "could not reach Redis" in told["redis_unreachable"].text
    assert "40 messages dropped" in told["queue_overflow"].text
    assert "slowpoke 40" in told["queue_overflow"].text
    assert told["takeover_storm"].severity == "warning"
    assert reporter.stats() == {"events_told": 3, "events_unwritten": 0, "events_suppressed": 2}
