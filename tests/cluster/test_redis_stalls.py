"""A Redis that stops answering (its process stopped with SIGSTOP): calls fail within
their deadlines instead of blocking (issue 14, silent loss 6), on a throwaway server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import router
from router.errors import PublishTimeoutError, UnsafeRedisError
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import take
from tests.support.servers import RedisClusterServers, RedisServer, stopped


async def test_a_publish_fails_within_its_deadline_when_redis_stops_answering(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    server = redis_server_factory()
    options = {"prefix": keys.prefix, "heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    bounds = {"redis_timeout": 0.5, "publish_timeout": 1.0}
    async with (
        router.connect(server.url, node_id="a", **bounds, **options) as a,
        router.connect(server.url, node_id="b", **options) as b,
    ):
        await b.subscribe("phone", "news")
        await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5.0, "a routes")
        assert a.stats()["redis_errors"] == 0
        with stopped(server):
            async with asyncio.timeout(5.0):  # (the bound of the test, not of the node)
                with pytest.raises(PublishTimeoutError):
                    await a.publish("news", b"unanswered")
            # (its heartbeats time out meanwhile: counted, and scraped as a metric)
            await waiting.eventually(lambda: a.stats()["redis_errors"] > 0, 5.0, "counted")


async def test_a_redis_stall_longer_than_the_ttl_purges_nobody(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    """Silent loss 7: when Redis answers again after a stall, every heartbeat looks
    expired on its clock; the nodes wait for each other instead of purging each other."""
    server = redis_server_factory()
    options = {"prefix": keys.prefix, "heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    async with (
        router.connect(server.url, node_id="a", **options) as a,
        router.connect(server.url, node_id="b", **options) as b,
    ):
        await b.subscribe("phone", "news")
        await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5.0, "a routes")
        await waiting.eventually(a.liveness.steady, 5.0, "a beats steadily")
        with stopped(server):
            await asyncio.sleep(2.5)  # the stall itself: longer than the TTL
        await waiting.eventually(
            lambda: a.liveness.steady() and b.liveness.steady(), 10.0, "steady again"
        )
        assert a.stats()["nodes_purged"] == 0 and b.stats()["nodes_purged"] == 0
        await a.publish("news", b"after the stall")
        [delivery] = await take(b, "phone", 1)
        assert delivery.payload == b"after the stall"


async def test_copies_stored_after_a_flushall_reach_the_node_that_reads_them(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    """Silent loss 4: after FLUSHALL a peer's copies make the inbox anew from clock 1;
    the reader takes that for a new channel (a new epoch), not for copies it read."""
    server = redis_server_factory()
    options = {"prefix": keys.prefix, "heartbeat_ttl": 30.0}
    async with (
        router.connect(server.url, node_id="a", heartbeat_interval=10.0, **options) as a,
        router.connect(
            server.url, node_id="b", heartbeat_interval=0.2, inbox_poll=0.2, **options
        ) as b,
    ):
        await b.subscribe("phone", "news")
        await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5.0, "a routes")
        for number in range(3):  # b's inbox clock moves on
            await a.publish("news", b"before %d" % number)
        assert len(await take(b, "phone", 3)) == 3
        redis = Redis.from_url(server.url)
        try:
            await redis.flushall()
        finally:
            await redis.aclose()
        await a.publish("news", b"after the flush")  # a's mirror has not noticed yet
        [delivery] = await take(b, "phone", 1, timeout=10.0)
        assert delivery.payload == b"after the flush"


async def test_a_redis_that_may_evict_keys_is_refused_unless_allowed(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    server = redis_server_factory()
    admin = Redis.from_url(server.url)
    try:
        await admin.config_set("maxmemory-policy", "volatile-lru")
        with pytest.raises(UnsafeRedisError, match="volatile-lru"):
            async with router.connect(server.url, node_id="a", prefix=keys.prefix):
                pass
        assert await admin.keys(keys.pattern()) == []  # refused before writing anything
        async with router.connect(
            server.url, node_id="a", prefix=keys.prefix, allow_eviction=True
        ) as node:
            assert node.running
    finally:
        await admin.aclose()


async def test_a_cluster_with_one_evicting_master_is_refused(
    redis_cluster_servers: RedisClusterServers, keys: Keys
) -> None:
    master = Redis.from_url(redis_cluster_servers.nodes[1].node_url)
    try:
        await master.config_set("maxmemory-policy", "allkeys-lfu")
        with pytest.raises(UnsafeRedisError, match="allkeys-lfu"):
            async with router.connect(redis_cluster_servers.url, node_id="a", prefix=keys.prefix):
                pass
    finally:
        await master.config_set("maxmemory-policy", "noeviction")
        await master.aclose()
