"""Blocking Redis clients, for work that runs outside an event loop (a Spark executor).

:func:`blocking_client` asks the server whether it is a cluster and answers with the
client that fits; for a ``redis+sentinel://`` URL (:mod:`router.state.sentinel_url`), a
client of the master the sentinels name (redis-py's blocking ``Sentinel``; a short job
does not follow failovers as a node does, its connections ask the sentinels when they
connect). Its cluster client closes every connection it opened: redis-py's
blocking ``RedisCluster`` (8.1) made with ``from_url`` gives each node a connection pool
that the node's ``close`` leaves open: sockets left to the garbage collector, which warns
of each (a ``ResourceWarning``, an error in the tests) whenever it happens to run.
"""

from __future__ import annotations

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from router.state.sentinel_url import SentinelURL, is_sentinel_url


class BlockingRedisCluster(redis.RedisCluster):
    """redis-py's blocking cluster client whose :meth:`close` closes every connection it
    opened, to every node it knows."""

    def close(self) -> None:
        manager = getattr(self, "nodes_manager", None)  # (an __init__ that failed has none)
        nodes = [] if manager is None else list(manager.nodes_cache.values())
        try:
            super().close()
        finally:
            for node in nodes:
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()


class BlockingSentinelRedis(redis.Redis):
    """A blocking client of a master behind Sentinel whose :meth:`close` also closes
    its connections to the sentinels."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            manager: Sentinel = getattr(self.connection_pool, "sentinel_manager")  # noqa: B009
            for sentinel in manager.sentinels:
                sentinel.close()


BlockingClient = redis.Redis | BlockingRedisCluster
"""A blocking client of a standalone server, of a cluster (as the server says), or of a
master behind Sentinel."""


def blocking_client(url: str) -> BlockingClient:
    """A blocking client for ``url``: a :class:`BlockingRedisCluster` when the server
    says ``cluster_enabled:1``, a :class:`BlockingSentinelRedis` for a Sentinel URL
    (:class:`~router.errors.BadRedisURLError` when malformed). The caller closes it."""
    if is_sentinel_url(url):
        parsed = SentinelURL.parse(url)
        sentinels = Sentinel(  # type: ignore[no-untyped-call]
            list(parsed.sentinels), sentinel_kwargs=parsed.sentinel_options()
        )
        pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            parsed.master, sentinels, **parsed.master_options()
        )
        client = BlockingSentinelRedis(connection_pool=pool)
        client.auto_close_connection_pool = True  # (the client owns its pool)
        return client
    plain = redis.Redis.from_url(url)
    try:
        if int(plain.info("cluster").get("cluster_enabled", 0)) != 1:
            return plain
    except BaseException:
        plain.close()
        raise
    plain.close()
    return BlockingRedisCluster(url=url)
