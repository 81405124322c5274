"""Opening Redis: standalone, Redis Cluster or behind Sentinel.

``open_redis(url)`` returns a ``redis.asyncio.Redis`` for a standalone server and a
``redis.asyncio.cluster.RedisCluster`` when the server says ``cluster_enabled:1``, so users
give one URL either way; a ``redis+sentinel://`` URL gives a ``Redis`` of the master the
sentinels name, which follows it through failovers (:mod:`router.state.sentinel`). A
cluster must run Redis 7.0 or later: channel wake-ups are shard channels (SPUBLISH /
SSUBSCRIBE, see :mod:`router.state.channels`). Pub/sub needs a plain
connection even on a cluster (redis-py's asyncio cluster client has none; a wake-up
listener connects to the primary of its channel's slot): :func:`pubsub_client` gives it.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from importlib import metadata
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.driver_info import DriverInfo
from redis.exceptions import ResponseError

from router.errors import (
    BadRedisURLError,
    InvalidSettingError,
    UnsafeRedisError,
    UnsupportedServerError,
)
from router.state.failures import translating
from router.state.scripts import RedisClient, turn_batch
from router.state.sentinel import SentinelRedis, following_pool, open_sentinel
from router.state.sentinel_url import is_sentinel_url

log = logging.getLogger(__name__)

#: The oldest Redis a cluster may run: shard channels came with 7.0.
MIN_CLUSTER_VERSION: Final = (7, 0)


def check_cluster_version(version: str) -> None:
    """Raise :class:`UnsupportedServerError` if ``version`` (INFO's ``redis_version``) is
    older than :data:`MIN_CLUSTER_VERSION`; a version that does not parse passes (a
    Redis-compatible server may report its own)."""
    parts = version.split(".")
    if len(parts) < 2 or not all(part.isdigit() for part in parts[:2]):
        return
    if (int(parts[0]), int(parts[1])) < MIN_CLUSTER_VERSION:
        needed = ".".join(map(str, MIN_CLUSTER_VERSION))
        raise UnsupportedServerError(
            f"a Redis Cluster must run Redis {needed} or later (shard channels); "
            f"this one runs {version}"
        )


async def eviction_policies(redis: RedisClient) -> dict[str, str]:
    """The ``maxmemory-policy`` of every master (``INFO memory``; one entry, ``""``, on a
    standalone server), so that a node can refuse a Redis that may evict its keys."""
    with translating:
        return await _eviction_policies(redis)


async def _eviction_policies(redis: RedisClient) -> dict[str, str]:
    if isinstance(redis, RedisCluster):
        replies = await redis.info("memory", target_nodes=RedisCluster.PRIMARIES)
        return {str(node): str(info.get("maxmemory_policy", "")) for node, info in replies.items()}
    info = await redis.info("memory")
    return {"": str(info.get("maxmemory_policy", ""))}


async def check_eviction(redis: RedisClient, allow: bool) -> None:
    """Refuse a Redis that may evict keys (any ``maxmemory-policy`` but ``noeviction``):
    eviction silently drops routes, sessions and queued messages. Raises
    :class:`UnsafeRedisError`; with ``allow``, logs an error and goes on. A server that
    will not say (INFO refused) gets a warning."""
    with translating:
        try:
            policies = await _eviction_policies(redis)
        except ResponseError as exc:
            log.warning("cannot read Redis's maxmemory-policy (%s): it must be noeviction", exc)
            return
    evicting = sorted(
        f"{node or 'the server'}: {p}" for node, p in policies.items() if p and p != "noeviction"
    )
    if not evicting:
        return
    problem = (
        f"Redis may evict the router's keys (maxmemory-policy {', '.join(evicting)}); "
        "set it to noeviction"
    )
    if not allow:
        raise UnsafeRedisError(problem + ", or start with --allow-evicting-redis")
    log.error("%s; running anyway (--allow-evicting-redis): routes and queues may vanish", problem)


#: Redis connections a node opens at most (to each master of a cluster), by default.
DEFAULT_POOL_SIZE: Final = 64


def _plain(url: str, pool_size: int | None = None, **options: Any) -> Redis:
    """A standalone client; with ``pool_size``, over a pool of at most that many
    connections where a caller waits its turn (:func:`pooled`)."""
    try:
        if pool_size is None:
            return Redis.from_url(url, **options)
        return Redis.from_pool(pooled(url, pool_size, **options))
    except ValueError as exc:
        raise BadRedisURLError(f"bad Redis URL {url!r}: {exc}") from None


def pooled(url: str, size: int, **options: Any) -> BlockingConnectionPool:
    """A pool of at most ``size`` connections to the standalone server at ``url``: a
    command that finds every connection busy waits for one (up to the socket timeout,
    else :data:`CONNECT_TIMEOUT` seconds; then redis-py's ConnectionError, which the
    state layer raises as :class:`StateUnavailableError`) instead of failing at once as
    redis-py's default pool does past 100."""
    check_pool_size(size)
    wait = options.get("socket_timeout") or CONNECT_TIMEOUT
    return BlockingConnectionPool.from_url(url, max_connections=size, timeout=wait, **options)


def check_pool_size(size: object) -> int:
    """``size`` if it can size a connection pool (an int >= 1); else
    :class:`InvalidSettingError`."""
    if type(size) is not int or size < 1:
        raise InvalidSettingError(f"a Redis pool size is an int >= 1, not {size!r}")
    return size


#: Set in a task whose Redis calls must not wait behind the node's other work (its
#: heartbeat: a node whose beats queue behind a reconnect storm would judge itself cut off
#: and be purged as dead): see :func:`urgent_client`.
URGENT: Final = ContextVar("router_urgent_redis", default=False)
#: Connections of a node's urgent client (standalone).
URGENT_POOL_SIZE: Final = 2


def urgent_client(redis: RedisClient) -> RedisClient:
    """A client for calls that must not wait for a busy pool (the heartbeat), with the
    same connection settings as ``redis``. On a standalone server (or behind Sentinel): a
    client with a small pool of its own (close it with the node). On a cluster:
    ``redis`` itself, whose calls skip its turns in a task that set :data:`URGENT` (each
    node's pool keeps a few connections for them)."""
    if isinstance(redis, RedisCluster):
        return redis
    pool = redis.connection_pool
    return Redis.from_pool(
        _sibling(pool.connection_class, pool.connection_kwargs, URGENT_POOL_SIZE, like=pool)
    )


class BoundedRedisCluster(RedisCluster):
    """redis-py's asyncio cluster client with at most ``pool_size`` commands under way
    at once (the others wait their turn): its own per-node pools fail a command at once
    (MaxConnectionsError) when full, and a node under a connect storm must queue, not
    refuse. Each node's pool holds ``pool_size`` connections, so no command that got
    its turn finds its node's pool full."""

    def __init__(self, *args: Any, pool_size: int = DEFAULT_POOL_SIZE, **kwargs: Any) -> None:
        kwargs["max_connections"] = check_pool_size(pool_size) + URGENT_POOL_SIZE
        super().__init__(*args, **kwargs)
        self._turns = asyncio.Semaphore(pool_size)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if URGENT.get():  # (the heartbeat: see urgent_client)
            return await super().execute_command(*args, **kwargs)
        async with self._turns:
            return await super().execute_command(*args, **kwargs)


async def open_redis(url: str, pool_size: int = DEFAULT_POOL_SIZE, **options: Any) -> RedisClient:
    """Connect to ``url`` and return the right client for a standalone server or a cluster,
    with at most ``pool_size`` connections (to each cluster node) where commands wait
    their turn when all are busy.

    A ``redis+sentinel://`` or ``rediss+sentinel://`` URL
    (:mod:`router.state.sentinel_url`) gives a client of the master its sentinels name,
    following it through failovers (:mod:`router.state.sentinel`).

    Raises :class:`StateUnavailableError` when the server cannot be reached (or no
    sentinel names the master), :class:`StateAccessError` when it refuses the
    credentials, :class:`BadRedisURLError` for a malformed URL,
    :class:`InvalidSettingError` for a bad pool size and :class:`UnsupportedServerError`
    for a cluster older than Redis 7.0.
    """
    check_pool_size(pool_size)
    options.setdefault("driver_info", DRIVER_INFO)
    with translating:
        if is_sentinel_url(url):
            wait = options.get("socket_timeout") or CONNECT_TIMEOUT
            return await open_sentinel(url, pool_size, wait, subscriber, **options)
        return await _open(url, pool_size, **options)


async def _open(url: str, pool_size: int, **options: Any) -> RedisClient:
    probe = _plain(url, pool_size, **options)
    try:
        info = await probe.info("cluster")
    except ResponseError:
        # A Redis-compatible server without INFO (fakeredis's TCP server) is no cluster.
        # That server closes a connection after an error reply: reconnect and retry.
        await probe.aclose()
        return _plain(url, pool_size, retry=Retry(NoBackoff(), 3), **options)
    except Exception:
        await probe.aclose()
        raise
    if int(info.get("cluster_enabled", 0)) != 1:
        return probe
    try:
        check_cluster_version(str((await probe.info("server")).get("redis_version", "")))
    finally:
        await probe.aclose()
    cluster = BoundedRedisCluster.from_url(url, pool_size=pool_size, **options)
    await cluster.initialize()
    return cluster


def require_replicas(redis: RedisClient, replicas: int, timeout: float) -> None:
    """Make every write of ``redis`` (standalone or Sentinel) wait for ``replicas``
    replicas to acknowledge it, at most ``timeout`` seconds, and fail otherwise
    (:mod:`router.state.turn_batch`). Raises :class:`InvalidSettingError` for a Redis
    Cluster (its failovers are the cluster's: a manual one waits for the replica; WAIT
    per shard is not done here) or a count below 0."""
    if isinstance(redis, RedisCluster):
        raise InvalidSettingError(
            "redis_replicas is for a standalone Redis or one behind Sentinel, not a Redis Cluster"
        )
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise InvalidSettingError(f"redis_replicas must be an int >= 0, not {replicas!r}")
    batch = turn_batch(redis)
    if batch is None:
        raise InvalidSettingError("redis_replicas needs a redis.asyncio client")
    batch.require_replicas(replicas, timeout)


def replicas_behind(redis: RedisClient) -> int:
    """How many pipelines of writes through ``redis`` failed because fewer replicas than
    :func:`require_replicas` asked for acknowledged them (0 when none are required)."""
    batch = turn_batch(redis) if isinstance(redis, Redis) else None
    return batch.replicas_behind if batch is not None else 0


def failovers_followed(redis: RedisClient) -> int:
    """How many times the master of ``redis`` moved and its connections followed it (a
    client behind Sentinel: :mod:`router.state.sentinel`); 0 for any other client."""
    return redis.sentinels.moves if isinstance(redis, SentinelRedis) else 0


async def refresh_slot_map(redis: RedisClient) -> None:
    """Read a cluster's slot map again (after the node it names for a slot could not be
    reached: a failover may have moved the slot); nothing on a standalone server.

    redis-py refreshes its map by itself only when one of its own commands fails; a
    plain connection made from the map (a pub/sub listener, see :func:`pubsub_client`)
    must ask, or it tries the dead node until something else happens to refresh it.
    Raises :class:`StateUnavailableError` when no node answers.
    """
    if not isinstance(redis, RedisCluster):
        return
    with translating:  # (no node answered, a RedisClusterException: unavailable)
        await redis.nodes_manager.initialize()


# Connection keyword arguments that a pool adds for itself and a new pool must not get.
_POOL_INTERNALS: Final = frozenset(
    {"maint_notifications_pool_handler", "himport_registry", "connection_pool"}
)


def _sibling(
    connection_class: Any,
    source: dict[str, Any],
    max_connections: int | None = None,
    like: ConnectionPool | None = None,
) -> ConnectionPool:
    """A new pool of ``connection_class`` connections with the settings of ``source``
    (less what a pool adds for itself); when ``like`` is a pool behind Sentinel, one to
    the same master, followed through failovers as ``like`` is."""
    kwargs = {
        name: value
        for name, value in source.items()
        if name not in _POOL_INTERNALS and not name.startswith("orig_")
    }
    if isinstance(like, SentinelConnectionPool):
        return following_pool(like, max_connections, **kwargs)
    return ConnectionPool(
        connection_class=connection_class, max_connections=max_connections, **kwargs
    )


CONNECT_TIMEOUT: Final = 10.0
DRIVER_INFO: Final = DriverInfo(lib_version=metadata.version("redis"))
"""What every connection tells the server in CLIENT SETINFO, read once: redis-py reads its
own version from the package metadata (``importlib.metadata``) for each connection it
makes without one, which was 18% of a node's CPU while 600 clients resumed their
sessions at once (each resume's wait subscribes on a connection of its own; a sampling
profile with py-spy)."""


async def _as_it_came(response: Any) -> Any:
    return response


def subscriber(client: Redis, **options: Any) -> PubSub:
    """``client.pubsub(**options)`` that hands each message on as it came.

    redis-py 8's own handler of pub/sub messages builds a debug log line for each one,
    ``str()`` of the whole message, payload included, whether or not debug logging is on:
    with inbox announcements that carry their batch, that was 12% of a receiving node's
    CPU (a sampling profile of ``router bench mqtt``). Every subscription goes through here.
    """
    return client.pubsub(push_handler_func=_as_it_came, **options)


def pubsub_client(redis: RedisClient, key: str | None = None) -> Redis:
    """A plain client of its own for a pub/sub subscription on ``redis``'s deployment.

    Same connection settings (address, credentials, TLS, ...) except: no socket timeout
    (a subscriber waits as long as it likes; reads use explicit timeouts) and no hidden
    retries (a silent reconnect could lose messages; the reader sees the error instead).
    On a cluster every node sees every PUBLISH: the node serving ``key`` is used, or the
    default node. Behind Sentinel: the master, and a failover closes the connection (the
    listener subscribes again, on the new master: :mod:`router.state.sentinel`).
    """
    connection_class: Any
    pool: ConnectionPool | None = None
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(key) if key is not None else None
        if node is None:
            node = redis.get_default_node() or redis.get_nodes()[0]
        connection_class, source = node.connection_class, node.connection_kwargs
    else:
        pool = redis.connection_pool
        connection_class, source = pool.connection_class, pool.connection_kwargs
    settings = {
        **source,
        "socket_connect_timeout": (
            source.get("socket_connect_timeout") or source.get("socket_timeout") or CONNECT_TIMEOUT
        ),
        "socket_timeout": None,
        "retry": Retry(NoBackoff(), 0),
    }
    return Redis.from_pool(_sibling(connection_class, settings, like=pool))
