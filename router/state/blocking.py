"""Blocking Redis clients, for work that runs outside an event loop (a Spark executor).

:func:`blocking_client` asks the server whether it is a cluster and answers with the
client that fits. Its cluster client closes every connection it opened: redis-py's
blocking ``RedisCluster`` (8.1) made with ``from_url`` gives each node a connection pool
that the node's ``close`` leaves open: sockets left to the garbage collector, which warns
of each (a ``ResourceWarning``, an error in the tests) whenever it happens to run.
"""

from __future__ import annotations

import redis


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


BlockingClient = redis.Redis | BlockingRedisCluster
"""A blocking client of a standalone server or of a cluster, as the server says."""


def blocking_client(url: str) -> BlockingClient:
    """A blocking client for ``url``: a :class:`BlockingRedisCluster` when the server
    says ``cluster_enabled:1``. The caller closes it."""
    plain = redis.Redis.from_url(url)
    try:
        if int(plain.info("cluster").get("cluster_enabled", 0)) != 1:
            return plain
    except BaseException:
        plain.close()
        raise
    plain.close()
    return BlockingRedisCluster(url=url)
