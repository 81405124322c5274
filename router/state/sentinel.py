"""Redis behind Sentinel: the master's client, and following the master through a failover.

:func:`open_sentinel` asks the sentinels of a ``redis+sentinel://`` URL
(:mod:`router.state.sentinel_url`) where the master is, through redis-py's
:class:`~redis.asyncio.sentinel.Sentinel`, and returns a :class:`SentinelRedis`: a
``redis.asyncio.Redis`` over a bounded pool (a caller waits its turn, as on a standalone
server) whose connections go to whichever server the sentinels call the master when they
connect (redis-py's ``SentinelManagedConnection``; one that meets READONLY, its server
demoted, hangs up and asks again).

redis-py asks only when it opens a connection. After ``SENTINEL FAILOVER`` the old master
keeps serving the connections it has until the sentinels make it a replica (about 8 s
later: Sentinel waits four publish periods before it reconfigures a master that came
back), while new connections go to the new master: the node would write to both, and
what went to the old one is lost when it becomes a replica. So the client *follows* the
master: it listens to every sentinel's announcements of a switch (``+switch-master``) and
asks the one that announced at once, asks every :data:`FOLLOW_INTERVAL` seconds besides
(each connect asks too), and when the answer changed it closes every connection of every
pool made for this master (its commands', the node's urgent client's, each pub/sub listener's:
:func:`following_pool`), in use or not. Their users meet that as they meet a restart of
Redis: a command fails with :class:`~router.errors.StateUnavailableError` (its caller
tries again, on the new master), a listener subscribes again and reads what it missed.
Failovers followed are counted (:attr:`FollowingSentinel.moves`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Any, Final

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    RedisError,
    TimeoutError as RedisTimeoutError,
)

from router.state.sentinel_url import SentinelURL

log = logging.getLogger(__name__)

#: Seconds between two questions to the sentinels about where the master is (each
#: sentinel's announcement of a switch makes the client ask at once).
FOLLOW_INTERVAL: Final = 1.0
#: The channel on which a sentinel announces a failover done:
#: ``+switch-master NAME OLD_IP OLD_PORT NEW_IP NEW_PORT``.
SWITCH_CHANNEL: Final = "+switch-master"
#: Quiet seconds after which a sentinel's announcement listener PINGs it.
LISTEN_SLICE: Final = 15.0
#: How a task of the client is stopped: cancelled again every RECANCEL_INTERVAL seconds
#: until it ends, for at most STOP_TIMEOUT seconds.
RECANCEL_INTERVAL: Final = 0.05
STOP_TIMEOUT: Final = 5.0

Address = tuple[str, int]
#: Makes a pub/sub of a client (:func:`router.state.connection.subscriber`).
Subscriber = Callable[[Redis], PubSub]


class FollowingSentinel(Sentinel):
    """redis-py's Sentinel that remembers the master it found last and, when a later
    answer names another, closes every connection of the pools it follows (see the
    module docstring)."""

    def __init__(self, sentinels: list[Address], subscriber: Subscriber, **options: Any) -> None:
        super().__init__(sentinels, **options)  # type: ignore[no-untyped-call]
        self._subscriber = subscriber
        self.pools: weakref.WeakSet[SentinelConnectionPool] = weakref.WeakSet()
        self.master: Address | None = None
        self.moves = 0  # failovers followed
        self.misses = 0  # questions no sentinel answered
        self.addresses = [f"{host}:{port}" for host, port in sentinels]

    async def discover_master(self, service_name: str) -> Address:
        """The master's address, as redis-py's; a new one closes the followed pools'
        connections first. Raises redis-py's MasterNotFoundError (a ConnectionError)
        when no sentinel names a master in good standing."""
        try:
            found = await super().discover_master(service_name)
        except MasterNotFoundError as exc:  # (redis-py's message holds each client's repr)
            asked = ", ".join(self.addresses)
            raise MasterNotFoundError(
                f"no sentinel ({asked}) answered with a master {service_name!r} in good standing"
            ) from exc
        address = (str(found[0]), int(found[1]))
        previous, self.master = self.master, address
        if previous is not None and previous != address:
            self.moves += 1
            log.warning(
                "Redis master %r moved from %s:%s to %s:%s: reconnecting",
                service_name,
                *previous,
                *address,
            )
            for pool in list(self.pools):
                pool.master_address = address
                with contextlib.suppress(RedisError, OSError):
                    await pool.disconnect(inuse_connections=True)
        return address

    def follow(self, service_name: str, interval: float) -> list[asyncio.Task[None]]:
        """Start following the master: tasks (the caller stops them) that ask where it
        is every ``interval`` seconds, and at once when a sentinel announces a switch of
        ``service_name`` (that sentinel is asked first: it knows). Sentinels that do not
        answer are counted in :attr:`misses`, never raised."""
        switched = asyncio.Event()
        listeners = [
            asyncio.create_task(
                self._listen(sentinel, service_name, switched, interval),
                name="hear-redis-sentinel",
            )
            for sentinel in list(self.sentinels)
        ]
        asker = asyncio.create_task(
            self._ask(service_name, switched, interval), name="follow-redis-master"
        )
        return [asker, *listeners]

    async def _ask(self, service_name: str, switched: asyncio.Event, interval: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await switched.wait()
            switched.clear()
            try:
                await self.discover_master(service_name)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                self.misses += 1
                log.debug("no sentinel named the master %r: %s", service_name, exc)

    async def _listen(
        self, sentinel: Redis, service_name: str, switched: asyncio.Event, interval: float
    ) -> None:
        """Hear ``sentinel``'s announcements of a switch of ``service_name``: put it
        first and set ``switched``. Pings it after :data:`LISTEN_SLICE` quiet seconds
        (no answer in as many more: it failed); after a failure, listens again
        ``interval`` seconds later."""
        name = service_name.encode()
        while True:
            pubsub = self._subscriber(sentinel)
            try:
                await pubsub.subscribe(SWITCH_CHANNEL)
                pinged = False
                while True:
                    message = await pubsub.get_message(timeout=LISTEN_SLICE)
                    if message is None and pinged:
                        raise RedisConnectionError("the sentinel stopped answering")
                    if message is None:
                        await pubsub.ping()
                    elif message["type"] == "message" and message["data"].split()[0] == name:
                        self._ask_first(sentinel)
                        switched.set()
                    pinged = message is None
            except (RedisError, OSError) as exc:
                log.debug("lost a sentinel's announcements (%s); listening again", exc)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(interval)

    def _ask_first(self, sentinel: Redis) -> None:
        """Ask ``sentinel`` first from now on (redis-py's discovery does so with the
        last one that answered)."""
        if sentinel in self.sentinels:
            at = self.sentinels.index(sentinel)
            self.sentinels[0], self.sentinels[at] = self.sentinels[at], self.sentinels[0]


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until they ended, cancelling again every
    :data:`RECANCEL_INTERVAL` seconds (a redis-py pub/sub read may swallow a
    cancellation), for at most :data:`STOP_TIMEOUT` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_TIMEOUT
    pending = {task for task in tasks if not task.done()}
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_INTERVAL)
    for task in pending:
        log.error("task %s did not stop within %.1f s", task.get_name(), STOP_TIMEOUT)


class MasterPool(SentinelConnectionPool, BlockingConnectionPool):
    """Connections to the master, at most ``max_connections``: a caller that finds all
    busy waits up to ``timeout`` seconds for one (redis-py's BlockingConnectionPool),
    each connecting where the sentinels say (its SentinelConnectionPool)."""


class SentinelRedis(Redis):
    """The client of a master behind Sentinel (:func:`open_sentinel`): a plain
    ``redis.asyncio.Redis`` whose :meth:`aclose` also stops following the master and
    closes the connections to the sentinels."""

    def __init__(self, pool: MasterPool, sentinels: FollowingSentinel) -> None:
        super().__init__(connection_pool=pool)
        self.auto_close_connection_pool = True  # (as Redis.from_pool: the client owns it)
        self.service_name: str = pool.service_name  # the master's name at the sentinels
        self.sentinels = sentinels
        self._following: list[asyncio.Task[None]] = []

    def follow(self, interval: float) -> None:
        """Start following the master (see the module docstring), until :meth:`aclose`."""
        self._following = self.sentinels.follow(self.service_name, interval)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        following, self._following = self._following, []
        await _stop(following)
        try:
            await super().aclose(close_connection_pool)
        finally:
            await self.sentinels.aclose()


async def open_sentinel(
    url: str, pool_size: int, wait: float, subscriber: Subscriber, **options: Any
) -> SentinelRedis:
    """A client of the master the sentinels of ``url`` name, over a pool of at most
    ``pool_size`` connections where a caller waits up to ``wait`` seconds for its turn,
    hearing the sentinels' announcements through pub/subs that ``subscriber`` makes;
    ``options`` are connection settings (``socket_timeout``...; the ``socket_*`` ones
    apply to the sentinels too). Answers one PING before it returns, and follows the
    master from then on.

    Raises :class:`~router.errors.BadRedisURLError` for a malformed URL, and redis-py's
    errors (the caller translates them): MasterNotFoundError (a ConnectionError) when no
    sentinel answers or none knows the master, its other errors when the master refuses.
    """
    parsed = SentinelURL.parse(url)
    sentinel_options = {k: v for k, v in options.items() if k.startswith("socket_")}
    # A sentinel that does not answer is passed over at once, for the next one (redis-py's
    # default retries would spend seconds on it, at every question).
    sentinel_options["retry"] = Retry(NoBackoff(), 0)
    manager = FollowingSentinel(
        list(parsed.sentinels),
        subscriber,
        sentinel_kwargs=sentinel_options | parsed.sentinel_options(),
    )
    pool = MasterPool(  # type: ignore[no-untyped-call]
        parsed.master,
        manager,
        max_connections=pool_size,
        timeout=wait,
        **{**parsed.master_options(), **options},
    )
    manager.pools.add(pool)
    client = SentinelRedis(pool, manager)
    try:
        await client.ping()
    except BaseException:
        await client.aclose()
        raise
    client.follow(FOLLOW_INTERVAL)
    return client


def following_pool(
    pool: SentinelConnectionPool, max_connections: int | None = None, **connection_kwargs: Any
) -> SentinelConnectionPool:
    """A new pool of connections to ``pool``'s master with ``connection_kwargs`` (those of
    ``pool``, adjusted by the caller), followed through failovers as ``pool`` is: for
    the node's urgent client and its pub/sub listeners."""
    manager: FollowingSentinel = pool.sentinel_manager
    sibling = SentinelConnectionPool(  # type: ignore[no-untyped-call]
        pool.service_name,
        manager,
        connection_class=pool.connection_class,
        max_connections=max_connections,
        **connection_kwargs,
    )
    manager.pools.add(sibling)
    return sibling
