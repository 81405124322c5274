"""Wake-ups of channel readers: the pub/sub announcements of channel publishes.

A publish that stored something announces it on the channel's wake-up channel (see
``lua/channel_publish.lua``): the new clock, or with ``push`` the stored bodies themselves
(:func:`~router.state.channels.parse_announcement` reads both forms). :class:`WakeUps` is
the one subscription a :class:`~router.state.channels.Channel` shares between its long
polls and its follower.

It lives on a connection of its own, without socket timeout or hidden retries (redis-py's
defaults, 5 s and silent reconnects, must not govern a reader that sits idle for a whole
wait; its reads carry explicit timeouts instead). On a Redis Cluster the wake-up channel
is a *shard channel* (SPUBLISH / SSUBSCRIBE, in the slot of the channel's keys): an
announcement stays on the shard that serves the channel instead of crossing the whole
cluster bus, and the listener is a plain ``redis.asyncio.Redis`` connection to that
shard's primary. When the slot moves, the server ends the subscription and the listener
subscribes again where it went; when that primary dies, the listener reads the slot map
again until the failover has named its successor.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Final

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    MovedError,
    TimeoutError as RedisTimeoutError,
)

from router.state.connection import pubsub_client, refresh_slot_map, subscriber
from router.state.failures import translating
from router.state.scripts import RedisClient

ANNOUNCEMENT_BACKLOG: Final = 10_000
"""Announcements kept for a follower that has not taken them; past that they are dropped
and the follower catches up by fetching."""
SUBSCRIBE_TIMEOUT: Final = 10.0
"""Seconds to wait for the confirmation of the wake-up subscription."""
LISTEN_SLICE: Final = 15.0
"""After this many quiet seconds the wake-up reader PINGs; no answer in as many more
seconds means the connection is dead."""


class WakeUps:
    """The wake-up subscription shared by the long polls of one Channel.

    ``arm()`` makes sure the subscription is confirmed by the server and returns the current
    wake-up generation; ``wait(generation, timeout)`` returns True as soon as a wake-up
    arrived after that generation, False on timeout. Reconnects are not hidden: when the
    reader fails, every waiter is woken (a wake-up may have been lost, so they fetch again)
    and the next ``arm()`` subscribes afresh.

    With ``keep`` set (one follower of the channel sets it), every announcement's data is
    also kept, in arrival order, in ``announcements``; ``lost`` becomes True when some may
    be missing (the reader failed, or more than :data:`ANNOUNCEMENT_BACKLOG` piled up and
    were dropped). The follower clears ``lost`` when it has caught up by other means.
    """

    def __init__(self, redis: RedisClient, channel: str) -> None:
        self._redis = redis
        self._channel = channel
        self._sharded = isinstance(redis, RedisCluster)  # a shard channel (see the module)
        self.keep = False
        self.announcements: deque[bytes] = deque()
        self.lost = False
        self._generation = 0
        self._event = asyncio.Event()
        self._starting: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._client: Redis | None = None
        self._pubsub: PubSub | None = None

    @property
    def listening(self) -> bool:
        """True while the wake-up subscription is up and no wake-up is known to be lost
        since the follower last caught up (a wake-up published now reaches it)."""
        return self._pubsub is not None and not self.lost

    async def arm(self) -> int:
        """Subscribe (once) and return the generation to pass to :meth:`wait`. Raises
        :class:`~router.errors.StateUnavailableError` (or another failure, as
        :mod:`router.state.failures` says) when the subscription cannot be made."""
        starting = self._starting
        if starting is None or (
            starting.done() and (starting.cancelled() or starting.exception() is not None)
        ):
            starting = self._starting = asyncio.ensure_future(self._start())
        # Shielded: a cancelled long poll must not cancel the subscription others wait for.
        with translating:
            await asyncio.shield(starting)
        return self._generation

    async def wait(self, generation: int, timeout: float) -> bool:
        """Wait until a wake-up newer than ``generation``; False when ``timeout`` ran out."""
        if self._generation != generation:
            return True
        event = self._event
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def _keep(self, data: bytes) -> None:
        if len(self.announcements) >= ANNOUNCEMENT_BACKLOG:
            self.announcements.clear()
            self.lost = True
        self.announcements.append(data)

    def _wake(self) -> None:
        self._generation += 1
        self._event.set()
        self._event = asyncio.Event()

    async def _start(self) -> None:
        redis = self._redis
        if not isinstance(redis, RedisCluster):
            await self._subscribe()
            return
        await redis.initialize()  # the slot map picks the listener's node
        try:
            await self._subscribe()
        except (MovedError, RedisConnectionError, RedisTimeoutError):
            # The slot moved since the client read the map (the old owner ended our shard
            # subscription, or refused it), or the node the map names is gone (a failover:
            # nothing else may refresh the map meanwhile, this listener reads no key):
            # read the map again and subscribe where the slot is now.
            await refresh_slot_map(redis)
            await self._subscribe()

    async def _subscribe(self) -> None:
        if self._client is None:
            # The node serving the channel's slot.
            self._client = pubsub_client(self._redis, self._channel)
        pubsub = subscriber(self._client)
        confirmation = "ssubscribe" if self._sharded else "subscribe"
        try:
            if self._sharded:
                await pubsub.ssubscribe(self._channel)
            else:
                await pubsub.subscribe(self._channel)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + SUBSCRIBE_TIMEOUT
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise RedisTimeoutError("no confirmation of the wake-up subscription")
                reply = await pubsub.get_message(timeout=remaining)
                if reply is not None and reply["type"] == confirmation:
                    break
        except BaseException:
            # Start over on a new client next time (on a cluster, the slot may have moved).
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await client.aclose()
            raise
        self._pubsub = pubsub
        self._reader = asyncio.create_task(self._read(pubsub))

    async def _read(self, pubsub: PubSub) -> None:
        try:
            pinged = False
            while True:
                reply = await pubsub.get_message(timeout=LISTEN_SLICE)
                if reply is not None:
                    pinged = False  # any reply shows the connection is alive
                    kind = reply["type"]
                    if kind in ("message", "smessage"):
                        if self.keep:
                            self._keep(reply["data"])
                        self._wake()
                    elif kind == "sunsubscribe":  # the server moved the slot elsewhere
                        raise RedisConnectionError("the wake-up channel's slot moved")
                elif pinged:
                    raise RedisConnectionError("the wake-up connection stopped answering")
                else:
                    await pubsub.ping()
                    pinged = True
        except asyncio.CancelledError:
            raise
        except Exception:
            # The connection failed: forget it; waiters fetch again (a wake-up may have been
            # lost) and the next arm() subscribes on a new client (on a cluster, possibly
            # another node).
            self.lost = True
            client = None
            if self._pubsub is pubsub:
                self._pubsub = None
                self._starting = None
                client, self._client = self._client, None
            self._wake()
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                if client is not None:
                    await client.aclose()

    async def aclose(self) -> None:
        """Stop the reader and close the listener connection (idempotent)."""
        for task in (self._starting, self._reader):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            elif task is not None and not task.cancelled():
                task.exception()  # retrieved: a failed start was already reported to a caller
        self._starting = self._reader = None
        with translating:
            if self._pubsub is not None:
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
                self._pubsub = None
            if self._client is not None:
                await self._client.aclose()
                self._client = None
