"""Subscriptions, routes and retained messages read from Redis in bounded batches.

Nothing here blocks Redis: key names come from SCAN (``count`` keys examined per call, on
every primary of a cluster), and values are read ``batch`` entities at a time. Each entity
is read consistently on its own:

* a client's subscriptions with one HGETALL of its hash (all of them at one instant);
* a node's routes with the ``route_snapshot`` script (routes, generation and version
  together);
* retained messages through :meth:`RetainedStore.iter_batches` (each message whole).

SCAN may return a key twice while Redis rehashes; the readers remember the entities they
yielded, so each appears once (memory grows with the number of clients, not subscriptions).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final, NamedTuple

from redis.asyncio.cluster import RedisCluster

from router.state.keys import Keys
from router.state.retained_store import RetainedStore
from router.state.routes import RouteStore
from router.state.scripts import RedisClient
from router.state.subscriptions import unpack_options

SCAN_COUNT: Final = 1000
DEFAULT_BATCH: Final = 1000


class SubscriptionRecord(NamedTuple):
    """One stored subscription, flat (the ``subscriptions`` table's columns)."""

    client_id: str
    filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_identifier: int | None


class RouteRecord(NamedTuple):
    """One route of a node's route set (the ``routes`` table's columns)."""

    node_id: str
    route: str
    members: int
    generation: str | None
    version: int


class RetainedRecord(NamedTuple):
    """One retained message (the ``retained`` table's columns)."""

    topic: str
    payload: bytes
    qos: int
    message_id: bytes
    publisher: str | None
    expiry_interval: int | None


async def _scan(redis: RedisClient, pattern: str) -> AsyncIterator[str]:
    options: dict[str, Any] = {"match": pattern, "count": SCAN_COUNT}
    if isinstance(redis, RedisCluster):
        options["target_nodes"] = RedisCluster.PRIMARIES
    async for raw in redis.scan_iter(**options):
        if isinstance(raw, bytes):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
        else:
            yield str(raw)


async def _chunks(keys: AsyncIterator[str], size: int) -> AsyncIterator[list[str]]:
    chunk: list[str] = []
    async for key in keys:
        chunk.append(key)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def subscription_batches(
    redis: RedisClient, keys: Keys, *, batch: int = DEFAULT_BATCH
) -> AsyncIterator[list[SubscriptionRecord]]:
    """Every client's subscriptions, about ``batch`` clients at a time (one pipeline of
    HGETALLs each). Raises :class:`CorruptStateError` for stored options the router did
    not write."""
    seen: set[str] = set()
    async for chunk in _chunks(_scan(redis, keys.client_subscriptions_pattern()), batch):
        clients = []
        for key in chunk:
            client_id = keys.client_of_subscriptions_key(key)
            if client_id is not None and client_id not in seen:
                seen.add(client_id)
                clients.append((client_id, key))
        if not clients:
            continue
        pipe = redis.pipeline(transaction=False)
        for _, key in clients:
            pipe.hgetall(key)
        replies = await pipe.execute()
        records = []
        for (client_id, _), stored in zip(clients, replies, strict=True):
            for raw_filter, packed in sorted(stored.items()):
                options = unpack_options(bytes(packed))
                records.append(
                    SubscriptionRecord(
                        client_id,
                        bytes(raw_filter).decode("utf-8"),
                        options.qos,
                        options.no_local,
                        options.retain_as_published,
                        options.retain_handling,
                        options.subscription_identifier,
                    )
                )
        if records:
            yield records


async def route_batches(
    redis: RedisClient, keys: Keys, *, batch: int = DEFAULT_BATCH
) -> AsyncIterator[list[RouteRecord]]:
    """Every node's route set, one node (one ``route_snapshot`` script) at a time, in
    lists of about ``batch`` routes."""
    store = RouteStore(redis, keys)
    seen: set[str] = set()
    records: list[RouteRecord] = []
    async for key in _scan(redis, keys.node_keys_pattern()):
        node_id = keys.node_of_key(key)
        if node_id is None or node_id in seen:
            continue
        seen.add(node_id)
        snapshot = await store.snapshot(node_id)
        records += [
            RouteRecord(node_id, route, members, snapshot.generation, snapshot.version)
            for route, members in sorted(snapshot.routes.items())
        ]
        if len(records) >= batch:
            yield records
            records = []
    if records:
        yield records


async def retained_batches(
    redis: RedisClient, keys: Keys, *, batch: int = DEFAULT_BATCH
) -> AsyncIterator[list[RetainedRecord]]:
    """Every visible retained message, ``batch`` at a time."""
    store = RetainedStore(redis, keys)
    async for messages in store.iter_batches(batch_size=batch):
        yield [
            RetainedRecord(m.topic, m.payload, m.qos, m.message_id, m.publisher, m.expiry_interval)
            for m in messages
        ]
