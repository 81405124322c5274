"""The node registry: incarnations, heartbeats on Redis server time, dead nodes, purges."""

from __future__ import annotations

import pytest

from router.errors import (
    InvalidIdError,
    NodeNotRegisteredError,
    ScriptError,
    StaleIncarnationError,
)
from router.state.keys import Keys
from router.state.node_registry import NodeInfo, NodeRegistry
from router.state.routes import RouteStore
from router.state.scripts import RedisClient, Scripts
from tests.support.waiting import eventually

DEADLINE = 5.0


@pytest.fixture
def registry(redis_client: RedisClient, keys: Keys) -> NodeRegistry:
    return NodeRegistry(redis_client, keys, ttl=30.0)


async def server_ms(redis: RedisClient) -> int:
    seconds, micros = await redis.time()
    return seconds * 1000 + micros // 1000


async def wait_dead(registry: NodeRegistry, node_id: str) -> NodeInfo:
    """Poll the registry until ``node_id`` is dead, within a deadline."""
    found: list[NodeInfo] = []

    async def dead() -> bool:
        found[:] = [n for n in await registry.dead_nodes() if n.node_id == node_id]
        return bool(found)

    await eventually(dead, DEADLINE, f"{node_id} to expire", poll=0.005)
    return found[0]


async def test_register_lists_a_live_node_with_server_time(
    registry: NodeRegistry, redis_client: RedisClient
) -> None:
    before = await server_ms(redis_client)
    registration = await registry.register("n1", "inc-1")
    after = await server_ms(redis_client)
    assert registration.previous_incarnation is None
    assert before + 30_000 <= registration.expires_ms <= after + 30_000
    (node,) = await registry.nodes()
    assert (node.node_id, node.incarnation, node.expires_ms) == (
        "n1",
        "inc-1",
        registration.expires_ms,
    )
    assert node.alive
    assert before <= node.now_ms <= await server_ms(redis_client)
    assert [n.node_id for n in await registry.live_nodes()] == ["n1"]
    assert await registry.dead_nodes() == []


async def test_a_new_incarnation_replaces_the_old_one(registry: NodeRegistry) -> None:
    await registry.register("n1", "inc-1")
    again = await registry.register("n1", "inc-2")
    assert again.previous_incarnation == "inc-1"
    with pytest.raises(StaleIncarnationError):
        await registry.heartbeat("n1", "inc-1")
    assert [n.incarnation for n in await registry.nodes()] == ["inc-2"]


async def test_heartbeats_extend_the_expiry(registry: NodeRegistry) -> None:
    first = await registry.register("n1", "inc-1")
    second = await registry.heartbeat("n1", "inc-1")
    assert second >= first.expires_ms
    with pytest.raises(NodeNotRegisteredError):
        await registry.heartbeat("ghost", "inc-1")
    assert [n.node_id for n in await registry.nodes()] == ["n1"]


async def test_a_node_without_heartbeats_dies_and_is_purged(
    redis_client: RedisClient, keys: Keys
) -> None:
    routes = RouteStore(redis_client, keys)
    short = NodeRegistry(redis_client, keys, ttl=0.05, routes=routes)
    long = NodeRegistry(redis_client, keys, ttl=30.0, routes=routes)
    await long.register("alive", "inc-a")
    await short.register("dying", "inc-d")
    await routes.claim("alive", "inc-a", {"a": 1})
    await routes.claim("dying", "inc-d", {"d/#": 1, "$share/g/x": 2})
    dead = await wait_dead(short, "dying")
    assert dead.expires_ms <= dead.now_ms
    assert [n.node_id for n in await long.live_nodes()] == ["alive"]
    results = await long.purge_dead()
    assert [tuple(r) for r in results] == [("dying", "purged", 2)]
    assert [n.node_id for n in await long.nodes()] == ["alive"]
    assert (await routes.snapshot("dying")).generation is None
    assert (await routes.snapshot("alive")).routes == {"a": 1}
    for key in routes.node_keys("dying"):
        assert await redis_client.exists(key) == 0
    assert await long.purge_dead() == []
    assert tuple(await long.purge("dying", "inc-d")) == ("dying", "absent", 0)
    with pytest.raises(NodeNotRegisteredError):
        await short.heartbeat("dying", "inc-d")


async def test_a_heartbeat_revives_a_node_that_was_not_purged_yet(
    redis_client: RedisClient, keys: Keys
) -> None:
    registry = NodeRegistry(redis_client, keys, ttl=0.05)
    await registry.register("n1", "inc-1")
    await wait_dead(registry, "n1")
    registry.ttl = 30.0
    await registry.heartbeat("n1", "inc-1")
    assert [n.node_id for n in await registry.live_nodes()] == ["n1"]


async def test_a_purge_never_touches_a_newer_incarnation(
    registry: NodeRegistry, redis_client: RedisClient, keys: Keys
) -> None:
    routes = registry.routes
    await registry.register("n1", "inc-2")
    await routes.claim("n1", "inc-2", {"fresh": 1})
    result = await registry.purge("n1", "inc-1")
    assert result.status == "skipped"
    assert [n.incarnation for n in await registry.nodes()] == ["inc-2"]
    assert (await routes.snapshot("n1")).routes == {"fresh": 1}
    assert await registry.unregister("n1", "inc-1") is False
    assert await registry.unregister("n1") is True
    assert await registry.unregister("n1") is False
    assert await registry.nodes() == []


async def test_bad_input(registry: NodeRegistry, redis_client: RedisClient) -> None:
    await registry.register("n1", "inc-1")
    for call in (
        registry.register("", "inc"),
        registry.register("n2", ""),
        registry.heartbeat("", "inc"),
        registry.retire("", "inc"),
        registry.retire("n1", ""),
        registry.unregister(""),
        registry.purge(""),
    ):
        with pytest.raises(InvalidIdError):
            await call
    for ttl in (0, -1.0, "10"):
        with pytest.raises(ValueError, match="ttl"):
            NodeRegistry(redis_client, registry.keys, ttl=ttl)  # type: ignore[arg-type]
    scripts = Scripts(redis_client)
    keys = [registry.keys.registry(), registry.keys.registry_heartbeats()]
    keys.append(registry.keys.registry_retired())
    for name, args in (
        ("node_register", []),
        ("node_register", ["n2", "inc", "0"]),
        ("node_register", ["n2", "inc", "soon"]),
        ("node_register", ["", "inc", "10"]),
        ("node_heartbeat", ["n1", "inc-1"]),
        ("node_heartbeat", ["n1", "inc-1", "-5"]),
        ("node_list", ["x"]),
        ("node_unregister", ["n1"]),
        ("node_unregister", ["", ""]),
        ("node_retire", ["n1"]),
        ("node_retire", ["n1", ""]),
        ("node_retire", ["n1", "inc-1", "x"]),
    ):
        with pytest.raises(ScriptError):
            await scripts.run(name, keys[:2] if name == "node_heartbeat" else keys, args)
    with pytest.raises(ScriptError):  # (without the retired hash)
        await scripts.run("node_retire", keys[:2], ["n1", "inc-1"])
    (node,) = await registry.nodes()
    assert (node.node_id, node.incarnation, node.alive, node.retired) == (
        "n1",
        "inc-1",
        True,
        False,
    )


async def test_a_retired_node_is_not_alive_at_once_and_keeps_its_routes(
    registry: NodeRegistry, redis_client: RedisClient
) -> None:
    """A node that leaves gracefully with persistent sessions retires: every node sees it
    not alive at once (its TTL here is 30 s), retired rather than dead, its route set
    still there for the live node that adopts its sessions and then purges it."""
    routes = registry.routes
    await registry.register("n1", "inc-1")
    await registry.register("n2", "inc-2")
    await routes.claim("n1", "inc-1", {"a/#": 1})
    before = await server_ms(redis_client)
    retired_at = await registry.retire("n1", "inc-1")
    assert before <= retired_at <= await server_ms(redis_client)
    n1, n2 = await registry.nodes()
    assert (n1.node_id, n1.retired, n1.alive, n1.expires_ms) == ("n1", True, False, retired_at)
    assert (n2.node_id, n2.retired, n2.alive) == ("n2", False, True)
    assert [n.node_id for n in await registry.dead_nodes()] == ["n1"]
    assert (await routes.snapshot("n1")).routes == {"a/#": 1}
    assert [tuple(r) for r in await registry.purge_dead()] == [("n1", "purged", 1)]
    assert [n.node_id for n in await registry.nodes()] == ["n2"]
    assert await redis_client.exists(registry.keys.registry_retired()) == 0


async def test_only_the_current_incarnation_retires_and_a_new_one_is_not_retired(
    registry: NodeRegistry,
) -> None:
    await registry.register("n1", "inc-1")
    await registry.register("n1", "inc-2")
    with pytest.raises(StaleIncarnationError):
        await registry.retire("n1", "inc-1")
    with pytest.raises(NodeNotRegisteredError):
        await registry.retire("ghost", "inc-1")
    (node,) = await registry.nodes()
    assert (node.incarnation, node.retired, node.alive) == ("inc-2", False, True)
    await registry.retire("n1", "inc-2")
    assert (await registry.register("n1", "inc-3")).previous_incarnation == "inc-2"
    (node,) = await registry.nodes()
    assert (node.incarnation, node.retired, node.alive) == ("inc-3", False, True)


async def test_a_mark_left_by_an_earlier_incarnation_does_not_retire_a_newer_one(
    registry: NodeRegistry, redis_client: RedisClient
) -> None:
    """The mark names the incarnation that retired: should it outlive that incarnation
    (a node_register of an older version that does not clear it), the newer one is not
    taken for retired. Unregistering removes the mark."""
    await registry.register("n1", "inc-1")
    await registry.retire("n1", "inc-1")
    await redis_client.hset(registry.keys.registry(), "n1", "inc-2")
    await registry.heartbeat("n1", "inc-2")
    (node,) = await registry.nodes()
    assert (node.incarnation, node.retired, node.alive) == ("inc-2", False, True)
    assert await registry.unregister("n1") is True
    assert await redis_client.exists(registry.keys.registry_retired()) == 0
