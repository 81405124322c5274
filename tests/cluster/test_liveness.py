"""The heartbeat of a node lands every interval whatever else the node waits for.

Found by the Redis Cluster fault scenarios (``tests/system/test_cluster_faults.py``): the
audit of session claims, run after each heartbeat, read the claim of a client whose keys
were on a master that had just been killed; it waited out the failover, the heartbeat
waited for it, and the others purged a node that was alive and well.
"""

from __future__ import annotations

import asyncio
import logging

import fakeredis
import pytest

from router.cluster.liveness import Liveness
from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
from router.errors import StateUnavailableError
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from tests.support.waiting import eventually

INTERVAL = 0.05
TTL = 1.0


async def test_a_heartbeat_does_not_wait_for_an_audit_that_hangs(keys: Keys) -> None:
    redis = fakeredis.FakeAsyncRedis()
    registry = NodeRegistry(redis, keys, ttl=TTL)
    await registry.register("n1", "i1")
    audits = 0
    stuck = asyncio.Event()  # never set: an audit waiting on a dead master

    async def audit() -> None:
        nonlocal audits
        audits += 1
        await stuck.wait()

    async def rejoin() -> None:
        raise AssertionError("the node was never purged")

    liveness = Liveness(
        "n1",
        registry,
        Supervisor("n1"),
        INTERVAL,
        TTL,
        incarnation=lambda: "i1",
        rejoin=rejoin,
        audit=audit,
        taken_over=asyncio.Event(),
    )
    beating = asyncio.create_task(liveness.run())
    try:
        await eventually(lambda: audits == 1, 5.0, "the first audit")
        (first,) = await registry.nodes()

        async def renewed() -> bool:
            (now,) = await registry.nodes()
            return now.expires_ms >= first.expires_ms + 10 * INTERVAL * 1000

        await eventually(renewed, 5.0, "ten more heartbeats while the audit hangs")
        assert audits == 1  # one audit at a time: the stuck one is not piled upon
    finally:
        await stop_task(beating)
        await redis.aclose()


class FlakyRegistry:
    """A registry whose heartbeats fail while ``down`` (Redis restarting, told as the
    state layer tells it) or raise ``bug`` (a programming error); counts the heartbeats
    that landed."""

    def __init__(self) -> None:
        self.down = False
        self.bug: Exception | None = None
        self.landed = 0

    async def heartbeat(self, node_id: str, incarnation: str) -> None:
        if self.bug is not None:
            raise self.bug
        if self.down:
            raise StateUnavailableError("Redis is restarting")
        self.landed += 1


def _liveness(registry: FlakyRegistry, supervisor: Supervisor) -> Liveness:
    async def nothing() -> None:
        return None

    return Liveness(
        "n1",
        registry,  # type: ignore[arg-type]
        supervisor,
        INTERVAL,
        TTL,
        incarnation=lambda: "i1",
        rejoin=nothing,
        audit=nothing,
        taken_over=asyncio.Event(),
    )


async def test_a_node_whose_heartbeats_missed_a_beat_does_not_judge_others_at_once() -> None:
    """Found by `router bench soak`: Redis was down for 1.85 s, less than the TTL (3 s).
    The publishing node's heartbeat landed first after it and, its own gap being under
    the TTL, it judged the others' expired heartbeats at once: it dropped their routes
    and 55 acknowledged QoS 1 messages went to no node. Their heartbeats were missed for
    the same outage: after a missed beat a node waits a TTL and an interval again."""
    registry = FlakyRegistry()
    liveness = _liveness(registry, Supervisor("n1"))
    beating = asyncio.create_task(liveness.run())
    try:
        await eventually(liveness.steady, 5.0, "steady after a TTL and an interval")
        registry.down = True
        failed = liveness.beats_failed
        await eventually(lambda: liveness.beats_failed > failed, 5.0, "a missed beat")
        assert not liveness.steady()  # (at once: the others' beats are failing too)
        await eventually(lambda: liveness.beats_failed >= failed + 3, 5.0, "missed beats")
        landed = registry.landed
        registry.down = False  # back well within the TTL
        await eventually(lambda: registry.landed > landed, 5.0, "a beat landed again")
        assert not liveness.steady()
        await eventually(liveness.steady, 5.0, "steady again a TTL and an interval later")
    finally:
        await stop_task(beating)


async def test_a_bug_in_a_heartbeat_is_told_as_a_bug_not_as_redis_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A heartbeat that fails for a programming error is counted ``internal_errors`` and
    logged at ERROR with its type; one that fails because Redis is away is a missed beat
    only. Both leave the beat missed (it did not land), and the heartbeat goes on."""
    registry = FlakyRegistry()
    supervisor = Supervisor("n1")
    liveness = _liveness(registry, supervisor)
    beating = asyncio.create_task(liveness.run())
    try:
        await eventually(lambda: registry.landed >= 1, 5.0, "a first beat")
        registry.down = True
        failed = liveness.beats_failed
        await eventually(lambda: liveness.beats_failed > failed, 5.0, "a beat missed")
        assert supervisor.internal_errors == 0
        registry.down = False
        with caplog.at_level(logging.ERROR, logger="router.cluster.supervisor"):
            registry.bug = KeyError("a field the code forgot")
            failed = liveness.beats_failed
            await eventually(lambda: supervisor.internal_errors >= 2, 5.0, "bugs counted")
            assert liveness.beats_failed > failed
            registry.bug = None
        told = [r for r in caplog.records if r.name == "router.cluster.supervisor"]
        assert told and all(r.levelno == logging.ERROR for r in told)
        assert "KeyError" in told[0].getMessage() and "heartbeat" in told[0].getMessage()
        assert supervisor.stats()["internal_errors"] == supervisor.internal_errors
        landed = registry.landed
        await eventually(lambda: registry.landed > landed, 5.0, "the beats go on")
        assert not beating.done()
    finally:
        await stop_task(beating)
