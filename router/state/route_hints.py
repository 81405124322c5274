"""Route hints: how a node tells the others that its route set changed, over pub/sub.

A hint is a node id published on the namespace's route-hints channel
(:meth:`Keys.route_hints <router.state.keys.Keys.route_hints>`); a node that hears it
reads that node's change stream (:mod:`router.state.routes`). Pub/sub is fire-and-forget:
a hint is never the data, and a lost one costs a reader at most its refresh interval
(:mod:`router.cluster.mirror_sync`). The same connection also hears the departures
channel (:meth:`Keys.node_departures <router.state.keys.Keys.node_departures>`), where a
node that retired (:meth:`NodeRegistry.retire
<router.state.node_registry.NodeRegistry.retire>`) publishes its id so that a peer looks
at the registry at once, and the other channels a node names (its route acks channel,
:mod:`router.state.route_acks`).

The listener has a connection of its own, without socket timeout or hidden retries (see
:func:`~router.state.connection.pubsub_client`); on a Redis Cluster it connects to the
node the client's slot map names as its default one (any node hears every PUBLISH). When
the connection fails, :meth:`RouteHints.message` raises and the next call subscribes
again on a new connection, where the slot map says after reading it again: the node it
reached may be gone for good (a cluster failed it over).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from router.errors import StateFailureError
from router.state.connection import pubsub_client, refresh_slot_map, subscriber
from router.state.failures import REDIS_ERRORS, translating
from router.state.keys import Keys
from router.state.reads import command
from router.state.scripts import RedisClient


class Heard(NamedTuple):
    """A message on one of the listener's channels: the channel's name and the data."""

    channel: str
    data: bytes


class RouteHints:
    """Sends route hints and departures, and hears them (with the ``also`` channels) on a
    connection of its own (see the module docstring). Every method raises
    :class:`StateFailureError` (:mod:`router.state.failures`) when Redis fails it."""

    def __init__(self, redis: RedisClient, keys: Keys, also: tuple[str, ...] = ()) -> None:
        self._redis = redis
        self.channel = keys.route_hints()
        self.departures = keys.node_departures()
        self._channels = (self.channel, self.departures, *also)
        self._client: Redis | None = None
        self._pubsub: PubSub | None = None
        self._failed = False  # (the next subscription reads a cluster's slot map first)
        self.subscriptions = 0  # successful subscriptions so far (each a new connection)
        self._listening = False  # the latest subscription succeeded and was not closed

    async def announce(self, node_id: str) -> None:
        """Publish the hint that ``node_id``'s route set changed."""
        with translating:
            await command(self._redis, "PUBLISH", self.channel, node_id)

    async def depart(self, node_id: str) -> None:
        """Publish that ``node_id`` retired: its sessions await a live node's adoption."""
        with translating:
            await command(self._redis, "PUBLISH", self.departures, node_id)

    async def subscribe(self) -> None:
        """Subscribe to the channels on a new connection (the old one, if any, is closed)."""
        await self.close()
        if self._failed:
            with contextlib.suppress(StateFailureError):  # (the subscription says)
                await refresh_slot_map(self._redis)
        self._failed = False
        try:
            with translating:
                self._client = pubsub_client(self._redis)
                self._pubsub = subscriber(self._client, ignore_subscribe_messages=True)
                await self._pubsub.subscribe(*self._channels)
        except StateFailureError:
            await self._failure()
            raise
        self.subscriptions += 1
        self._listening = True

    @property
    def listening(self) -> int | None:
        """The number of the subscription that hears the channels now (None while there
        is none): the same number before and after some work means no hint was missed
        in between."""
        return self.subscriptions if self._listening else None

    async def message(self, timeout: float) -> Heard | None:
        """The next message, waiting up to ``timeout`` seconds (None if none came);
        subscribes first when not subscribed. Raises :class:`StateFailureError` when the
        connection failed (it is closed: the next call subscribes anew)."""
        if self._pubsub is None:
            await self.subscribe()
        assert self._pubsub is not None
        try:
            with translating:
                reply = await self._pubsub.get_message(timeout=timeout)
        except StateFailureError:
            await self._failure()
            raise
        if reply is None or reply.get("type") != "message":
            return None
        channel, data = reply.get("channel"), reply["data"]
        name = channel.decode("utf-8", "replace") if isinstance(channel, bytes) else str(channel)
        return Heard(name, data if isinstance(data, bytes) else str(data).encode())

    async def _failure(self) -> None:
        self._failed = True
        await self.close()

    async def close(self) -> None:
        """Close the listener's connection, if any (best effort: it may be broken)."""
        self._listening = False
        pubsub, self._pubsub = self._pubsub, None
        client, self._client = self._client, None
        if pubsub is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
        if client is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await client.aclose()
