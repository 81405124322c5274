"""After Redis lost every key (FLUSHALL, or a restart without persistence) each node
writes again the state of the sessions it serves: their claims, subscriptions and
descriptions, and an away session's queue (issue 14: "republishes its routes and its
sessions' state from what it holds"). On a throwaway standalone Redis and cluster."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import router
from router.errors import RouteWriteError
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import take
from tests.support.servers import RedisClusterServers, RedisServer

Flush = Callable[[], Awaitable[None]]


def throwaway(
    kind: str,
    redis_server_factory: Callable[..., RedisServer],
    redis_cluster_factory: Callable[..., RedisClusterServers],
) -> tuple[str, Flush]:
    """The URL of a Redis of ``kind`` for this test alone, and how to flush all of it."""
    if kind == "standalone":
        server = redis_server_factory()
        urls, url = [server.url], server.url
    else:
        cluster = redis_cluster_factory()
        urls, url = [node.node_url for node in cluster.nodes], cluster.url

    async def flush() -> None:
        for each in urls:
            admin = Redis.from_url(each)
            try:
                await admin.flushall()
            finally:
                await admin.aclose()

    return url, flush


async def writes_routes(node: router.RouterNode) -> bool:
    """Whether a route change of ``node`` lands in Redis now (a node that rejoins after a
    FLUSHALL refuses them until it claimed its route set again, as a new incarnation)."""
    try:
        await node.subscribe("probe", "probe")
    except RouteWriteError:
        return False
    return node.stats()["route_changes_unwritten"] == 0


@pytest.mark.parametrize("kind", ["standalone", "cluster"])
async def test_after_a_flushall_each_node_writes_its_sessions_state_again(
    kind: str,
    redis_server_factory: Callable[..., RedisServer],
    redis_cluster_factory: Callable[..., RedisClusterServers],
    keys: Keys,
) -> None:
    url, flush = throwaway(kind, redis_server_factory, redis_cluster_factory)
    options: dict[str, Any] = {"prefix": keys.prefix, "heartbeat_interval": 0.2}
    async with (
        router.connect(url, node_id="a", **options) as a,
        router.connect(url, node_id="b", handoff_timeout=2.0, **options) as b,
    ):
        await a.connect("phone", clean_start=False, expiry=600)
        await a.subscribe("phone", "news", qos=1)
        await a.subscribe("tablet", "alerts")  # a clean session, connected
        await a.connect("laptop", clean_start=False, expiry=600)
        await a.subscribe("laptop", "news", qos=1)
        await a.put_away("laptop")
        clients = ["phone", "tablet", "laptop"]
        stored = [await a.subscriptions.subscriptions(c) for c in clients]
        owners = await a.subscriptions.owners(clients)
        incarnation_b = b.incarnation

        await flush()

        await waiting.eventually(
            lambda: a.stats()["sessions_restored"] == 3, 10, "a wrote its sessions again"
        )
        assert [await a.subscriptions.subscriptions(c) for c in clients] == stored
        assert await a.subscriptions.owners(clients) == owners
        phone, laptop = await a.session_store.describe_many(["phone", "laptop"])
        assert phone is not None and phone.connected and phone.expiry == 600
        assert laptop is not None and not laptop.connected
        await a.subscribe("tablet", "more")  # its claim fences the write again
        await waiting.eventually(lambda: "a" in b.mirror.match("news").nodes, 10, "b routes")
        await waiting.eventually(lambda: b.incarnation != incarnation_b, 10, "b rejoined")
        await waiting.eventually(lambda: writes_routes(b), 10, "b writes routes again")
        await b.publish("news", b"while the laptop is away", qos=1)
        assert await b.connect("laptop", clean_start=False, expiry=600)  # session present
        [delivery] = await take(b, "laptop", 1)
        assert delivery.payload == b"while the laptop is away"
