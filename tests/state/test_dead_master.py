"""A master of a Redis Cluster dies and nobody has taken over yet: what the router does
fails for the keys that lived there, and only for those; the other masters' slots stay
usable, by the same call and by every other caller of the same client. Reads of many
entities at once (session owners, session descriptions, node figures), and scripts used
for the first time (or again after NOSCRIPT).

Each test starts a cluster of its own (3 masters, no replica) with a node timeout far
longer than the test, so the dead master stays in the slot map throughout: the state
that lasts a whole ``cluster-node-timeout`` (15 s by default) in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from router.errors import StateUnavailableError
from router.state.channels import Channel
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.node_figures import NodeFigures, NodeFigureStore
from router.state.session_store import SessionStore
from router.state.subscriptions import SubscriptionStore
from tests.support.servers import RedisClusterServers, RedisServer
from tests.support.topology import admin, owner, slot_of

NEVER_SUSPECTED_MS = 120_000  # cluster-node-timeout: nothing fails over during a test


@pytest.fixture
async def redis(
    redis_cluster_factory: Callable[..., RedisClusterServers],
) -> AsyncIterator[tuple[RedisCluster, RedisClusterServers]]:
    """A client as a node opens it (1 s timeouts) on a cluster of the test's own."""
    cluster = redis_cluster_factory(node_timeout_ms=NEVER_SUSPECTED_MS)
    client = await open_redis(cluster.url, socket_timeout=1, socket_connect_timeout=1)
    assert isinstance(client, RedisCluster)
    try:
        yield client, cluster
    finally:
        await client.aclose()


def first_server(client: RedisCluster, cluster: RedisClusterServers) -> RedisServer:
    """The master redis-py met first: its default node, the one it asks for the command
    table when it reads the slot map again."""
    default = client.get_default_node()
    assert default is not None
    return next(server for server in cluster.nodes if server.port == default.port)


def ids_on(cluster: RedisClusterServers, server: RedisServer, key: Callable[[str], str]) -> str:
    """An id whose key (``key(id)``) lives on ``server``."""
    return next(f"id{n}" for n in range(10_000) if owner(cluster, slot_of(key(f"id{n}"))) is server)


def ids_off(cluster: RedisClusterServers, server: RedisServer, key: Callable[[str], str]) -> str:
    """An id whose key lives on another master than ``server``."""
    return next(
        f"id{n}" for n in range(10_000) if owner(cluster, slot_of(key(f"id{n}"))) is not server
    )


async def kill(server: RedisServer) -> None:
    assert server.process is not None
    server.process.kill()
    server.process.wait()


Read = Callable[[RedisCluster, Keys, list[str]], Awaitable[list[Any]]]


async def read_owners(client: RedisCluster, keys: Keys, ids: list[str]) -> list[Any]:
    return await SubscriptionStore(client, keys).owners(ids)


async def read_sessions(client: RedisCluster, keys: Keys, ids: list[str]) -> list[Any]:
    store = SessionStore(client, keys, SubscriptionStore(client, keys))
    return await store.describe_many(ids)


async def read_figures(client: RedisCluster, keys: Keys, ids: list[str]) -> list[Any]:
    found = await NodeFigureStore(client, keys).read(ids)
    return [found.get(node_id) for node_id in ids]


@pytest.mark.parametrize(
    ("read", "key_of"),
    [
        (read_owners, Keys.client_owner),
        (read_sessions, Keys.client_session),
        (read_figures, Keys.node_figures),
    ],
    ids=["session owners", "session descriptions", "node figures"],
)
async def test_a_read_that_reaches_a_dead_master_leaves_the_other_masters_usable(
    redis: tuple[RedisCluster, RedisClusterServers],
    keys: Keys,
    read: Read,
    key_of: Callable[[Keys, str], str],
) -> None:
    client, cluster = redis
    victim = first_server(client, cluster)
    stranded = ids_on(cluster, victim, lambda i: key_of(keys, i))
    reachable = ids_off(cluster, victim, lambda i: key_of(keys, i))
    await SubscriptionStore(client, keys).claim(reachable, "n1")
    await NodeFigureStore(client, keys).write(reachable, NodeFigures(clients=3), ttl=60)
    before = await read(client, keys, [reachable])
    exists = await client.exists(key_of(keys, reachable))
    await kill(victim)

    with pytest.raises(StateUnavailableError):
        await read(client, keys, [stranded, reachable])
    # The same read without the dead master's key, and any other call, still work.
    assert await read(client, keys, [reachable]) == before
    assert await client.exists(key_of(keys, reachable)) == exists


async def test_a_script_first_used_while_a_master_is_dead_runs_on_the_others(
    redis: tuple[RedisCluster, RedisClusterServers], keys: Keys
) -> None:
    """Scripts are loaded when first used (and again after NOSCRIPT): on every master
    that answers, not on all or none."""
    client, cluster = redis
    victim = first_server(client, cluster)
    name = ids_off(cluster, victim, keys.channel_clock)
    await kill(victim)

    channel = Channel(client, name, 60.0, keys)  # its own scripts, not loaded yet
    try:
        assert await channel.add_subscriber("reader") is True
        survivor = owner(cluster, slot_of(keys.channel_clock(name)))
        with admin(survivor) as direct:
            direct.script_flush()  # as after a restart, or on a replica just promoted
        [published] = await channel.publish([("m1", b"after the flush")])
        assert published.clock == 1
    finally:
        await channel.aclose()
