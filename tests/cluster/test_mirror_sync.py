"""A node's route mirror: it keeps a peer whose heartbeat expired until that node may
judge it dead, and it hears route hints again after a failover.

Found by the Redis Cluster fault scenarios (``tests/system/test_cluster_faults.py``, a
``kill -9`` of the master that holds the registry): no heartbeat lands during the
failover, so afterwards every node looks expired to the first node whose beat lands
again. That node dropped the others' routes at its next refresh, and what it published
until their next beat was acknowledged to its publishers with no route at all: lost,
though their subscribers were connected all along. Purging already waits until a node
is steady (its own beats land again for a TTL); dropping from the mirror waits too.
"""

from __future__ import annotations

import asyncio

import fakeredis
import pytest
from redis.asyncio.cluster import RedisCluster

from router.cluster.mirror_sync import MirrorSync
from router.cluster.supervisor import Supervisor
from router.core.route_mirror import RouteMirror
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.routes import RouteStore
from tests.support.servers import RedisClusterServers
from tests.support.topology import agreed_owner, first_slot, replica_of
from tests.support.waiting import eventually, wait_until


def no_bug(where: str, error: BaseException) -> None:
    raise AssertionError(f"a bug in {where}: {error!r}")


SHORT_TTL = 0.05


@pytest.mark.parametrize("steady", [False, True])
async def test_a_peer_stays_routed_until_it_is_purged_and_is_dropped_only_by_a_steady_node(
    keys: Keys, steady: bool
) -> None:
    """A peer whose heartbeat expired keeps its routes until it is purged: its sessions
    have no other route until the purging node adopts them, so copies go to its inbox
    (a joining node loads it too). Once purged, a steady node drops it; one that is not
    steady keeps it (after a Redis outage it must not judge from a registry it cannot
    read yet)."""
    redis = fakeredis.FakeAsyncRedis()
    routes = RouteStore(redis, keys)
    registry = NodeRegistry(redis, keys, ttl=SHORT_TTL, routes=routes)
    await registry.register("a", "ia")
    await routes.claim("a", "ia", {"news": 1})
    mirror = RouteMirror()
    sync = MirrorSync(
        redis, keys, routes, registry, mirror, "b", 1.0, no_bug, may_purge=lambda: steady
    )
    joining = RouteMirror()
    late = MirrorSync(
        redis, keys, routes, registry, joining, "c", 1.0, no_bug, may_purge=lambda: True
    )
    try:
        await sync.reload("a")
        assert set(mirror.match("news").nodes) == {"a"}

        async def expired() -> bool:
            return not await registry.live_nodes()

        await eventually(expired, 5.0, "a's heartbeat expired")
        await sync.refresh()
        assert set(mirror.match("news").nodes) == {"a"}
        await late.refresh()
        await eventually(lambda: "a" in joining.nodes(), 5.0, "a joining node loaded a")

        await registry.purge("a", "ia")
        await sync.refresh()
        assert set(mirror.match("news").nodes) == (set() if steady else {"a"})
    finally:
        await sync.stop()
        await late.stop()
        await redis.aclose()


async def test_route_hints_are_heard_again_after_their_node_failed_over(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys
) -> None:
    """The hint listener is a plain connection to one node (the client's default one);
    when a cluster fails that node over it must subscribe again elsewhere, not try the
    dead node forever (found by the Redis Cluster fault scenarios)."""
    cluster = redis_cluster_with_replicas
    client = await open_redis(cluster.url, socket_timeout=1, socket_connect_timeout=1)
    assert isinstance(client, RedisCluster)
    default = client.get_default_node()
    assert default is not None
    victim = next(server for server in cluster.nodes if server.port == default.port)
    slot = first_slot(victim)
    heir = replica_of(cluster, victim)
    routes = RouteStore(client, keys)
    mirror = RouteMirror()
    registry = NodeRegistry(client, keys, routes=routes)
    # (never steady: c, never registered, stays once a hint loaded it)
    sync = MirrorSync(
        client, keys, routes, registry, mirror, "b", 0.1, no_bug, may_purge=lambda: False
    )
    supervisor = Supervisor("b")
    await sync.start(supervisor)
    publisher = None
    try:
        assert victim.process is not None
        victim.process.kill()
        victim.process.wait()
        await asyncio.to_thread(
            wait_until, lambda: agreed_owner(cluster, slot) is heir, 30.0, "the promotion"
        )
        survivor = next(server for server in cluster.running() if server is not heir)
        publisher = await open_redis(survivor.node_url, socket_timeout=1)
        await RouteStore(publisher, keys).claim("c", "ic", {"news": 1})  # c is not registered

        async def heard() -> bool:
            await publisher.publish(keys.route_hints(), "c")  # only a hint loads c
            return set(mirror.match("news").nodes) == {"c"}

        await eventually(heard, 15.0, "a hint heard after the failover", poll=0.2)
    finally:
        await supervisor.stop()
        await sync.stop()
        await client.aclose()
        if publisher is not None:
            await publisher.aclose()
