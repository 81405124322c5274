"""The heartbeat of a node lands every interval whatever else the node waits for.

Found by the Redis Cluster fault scenarios (``tests/system/test_cluster_faults.py``): the
audit of session claims, run after each heartbeat, read the claim of a client whose keys
were on a master that had just been killed; it waited out the failover, the heartbeat
waited for it, and the others purged a node that was alive and well.
"""

from __future__ import annotations

import asyncio

import fakeredis

from router.cluster.liveness import Liveness
from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
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
    """A registry whose heartbeats fail while ``down`` (Redis restarting); counts the
    heartbeats that landed."""

    def __init__(self) -> None:
        self.down = False
        self.landed = 0

    async def heartbeat(self, node_id: str, incarnation: str) -> None:
        if self.down:
            raise ConnectionError("Redis is restarting")
        self.landed += 1


async def test_a_node_whose_heartbeats_missed_a_beat_does_not_judge_others_at_once() -> None:
    """Found by `router bench soak`: Redis was down for 1.85 s, less than the TTL (3 s).
    The publishing node's heartbeat landed first after it and, its own gap being under
    the TTL, it judged the others' expired heartbeats at once: it dropped their routes
    and 55 acknowledged QoS 1 messages went to no node. Their heartbeats were missed for
    the same outage: after a missed beat a node waits a TTL and an interval again."""
    registry = FlakyRegistry()

    async def nothing() -> None:
        return None

    liveness = Liveness(
        "n1",
        registry,
        Supervisor("n1"),
        INTERVAL,
        TTL,
        incarnation=lambda: "i1",  # type: ignore[arg-type]
        rejoin=nothing,
        audit=nothing,
        taken_over=asyncio.Event(),
    )
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
