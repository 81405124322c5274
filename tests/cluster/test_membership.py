"""Node death, the driver (router.cluster.membership) on a real Redis: the rounds act on
the verdicts (router.core.peer_verdicts, tested alone in tests/core/test_peer_verdicts.py)."""

from __future__ import annotations

from router.cluster.membership import Membership
from router.cluster.mirror_sync import MirrorSync
from router.cluster.supervisor import Supervisor
from router.core.route_mirror import RouteMirror
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.routes import RouteStore
from router.state.scripts import RedisClient
from tests.support.waiting import eventually


def no_bug(where: str, error: BaseException) -> None:
    raise AssertionError(f"a bug in {where}: {error!r}")


SHORT_TTL = 0.2
LONG = 30.0  # (seconds: an interval no test waits for)


def parts(redis: RedisClient, keys: Keys, ttl: float) -> tuple[RouteStore, NodeRegistry]:
    routes = RouteStore(redis, keys)
    return routes, NodeRegistry(redis, keys, ttl=ttl, routes=routes)


async def test_a_node_that_adopts_no_sessions_purges_a_dead_peer_at_its_round(
    redis_client: RedisClient, keys: Keys
) -> None:
    routes, registry = parts(redis_client, keys, SHORT_TTL)
    await registry.register("a", "ia")
    await routes.claim("a", "ia", {"news": 1})
    await registry.register("b", "ib")
    mirror = RouteMirror()
    sync = MirrorSync(redis_client, keys, routes, registry, mirror, "b", LONG, no_bug)
    membership = Membership(registry, sync, "b", LONG)  # (no adopt_sessions)
    try:
        await sync.reload("a")
        assert set(mirror.match("news").nodes) == {"a"}

        async def a_expired() -> bool:
            await registry.heartbeat("b", "ib")
            return {n.node_id for n in await registry.dead_nodes()} == {"a"}

        await eventually(a_expired, 5.0, "a's heartbeat expired, b's renewed")
        await membership.purge_dead()
        assert membership.dead == {"a"} and membership.purged == 1
        assert [node.node_id for node in await registry.nodes()] == ["b"]
        assert set(mirror.match("news").nodes) == set()
    finally:
        await sync.stop()


async def test_a_peer_that_retired_is_adopted_at_once_and_one_leased_elsewhere_is_not(
    redis_client: RedisClient, keys: Keys
) -> None:
    """A retirement told on the departures channel starts a round at once (the interval
    is far longer than the wait); a dead peer whose adoption lease another node holds is
    left to that node."""
    routes, registry = parts(redis_client, keys, LONG)
    for node_id in ("a", "b", "c"):
        await registry.register(node_id, f"i{node_id}")
    await routes.claim("a", "ia", {"news": 1})
    await registry.retire("c", "ic")
    assert await registry.lease_adoption("c", "d", LONG)  # (d adopts c's sessions)
    adopted: list[str] = []

    async def adopt(dead: str) -> None:
        adopted.append(dead)

    sync = MirrorSync(redis_client, keys, routes, registry, RouteMirror(), "b", LONG, no_bug)
    membership = Membership(registry, sync, "b", LONG, adopt_sessions=adopt)
    supervisor = Supervisor("b")
    try:
        await sync.start(supervisor)
        membership.start(supervisor)
        await registry.retire("a", "ia")
        await sync.depart()  # (a's departure: any node's PUBLISH is heard alike)

        async def a_purged() -> bool:
            return "a" not in {node.node_id for node in await registry.nodes()}

        await eventually(a_purged, 10.0, "b adopted a's sessions and purged it")
        assert adopted == ["a"] and membership.purged == 1
        assert membership.dead == {"a", "c"}
        assert "c" in {node.node_id for node in await registry.nodes()}  # (d's to purge)
    finally:
        await supervisor.stop()
        await membership.stop_adopting()
        await sync.stop()
