"""Nodes keep their promises when Redis misbehaves: nothing a node accepted is dropped
without a retry or a count (issue 14's silent-loss paths), on real Redis and a cluster.

Faults are real Redis errors provoked through Redis itself (a key of the wrong type
makes the node's own Lua script fail with WRONGTYPE), not mocks of the client.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from router.errors import RouteWriteError
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support import waiting
from tests.support.nodes import StartNode

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def eventually(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    await waiting.eventually(check, timeout, what)


async def test_a_route_write_that_redis_refuses_is_kept_and_written_later(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    a = await start_node("a")
    routes = keys.node_routes("a")
    await redis_client.set(routes, b"not a hash")  # route_apply.lua now fails: WRONGTYPE
    with pytest.raises(RouteWriteError):
        await a.subscribe("phone", "alerts/#")
    assert a.stats()["route_batches_failed"] >= 1
    assert a.stats()["route_changes_unwritten"] == 1

    await redis_client.delete(routes)  # Redis takes the write again; nobody subscribes again

    async def stored() -> bool:
        return await redis_client.hget(routes, "alerts/#") == b"1"

    await eventually(stored, "the kept route change in a's route set")
    b = await start_node("b")
    await eventually(lambda: "a" in b.mirror.match("alerts/x").nodes, "b routes alerts/x to a")
    assert a.stats()["route_changes_unwritten"] == 0
