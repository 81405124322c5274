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
        "n1", registry, Supervisor("n1"), INTERVAL, TTL, incarnation=lambda: "i1",
        rejoin=rejoin, audit=audit, taken_over=asyncio.Event(),
    )  # fmt: skip
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
