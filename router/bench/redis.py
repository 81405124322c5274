"""``router bench redis``: the router's Redis state beside raw redis-py, in one run.

What is measured, against one standalone Redis (started here with
:func:`router.ops.embedded_redis.embedded_redis`, or given by URL), through one
``redis.asyncio.Redis`` client with default settings shared by every section (so every
section uses the same kind of connection); one call is in flight at a time everywhere, so
a rate is what one sequential caller gets, Python and Redis time included::

    subscribe_per_s          SubscriptionStore.subscribe: one filter, one round trip each
    subscribe_batched_per_s  SubscriptionStore.subscribe_many: ``subscribe_batch`` filters
                             of one client per call (one script call)
    channel_publish_per_s    Channel.publish: ``publish_batch`` messages per call
                             (one script call: dedup check, body + dedup key, clock, wake-up)
    raw_publish_per_s        the yardstick: redis-py pipeline(transaction=False) with
                             ``publish_batch`` PUBLISH commands of the same payloads per
                             round trip, to a pub/sub channel nobody listens to (PUBLISH's
                             cheapest case: it stores nothing)
    fetch_ack_per_s          Channel.fetch(max=fetch_max) then Channel.ack, until drained

Each message is a 32-hex-digit GUID id and ``payload_bytes`` of random content; filters look
like device fleet subscriptions (``site/S/device/D/telemetry``, 20% with ``+`` or ``#``).

Every timed section runs ``rounds`` times and the fastest round counts (the machine may be
shared and noisy). Each round works under a fresh key prefix and deletes every key it
created; raw and channel publish swap order from round to round.

Memory (first round, from ``MEMORY USAGE key SAMPLES 0``: the key's dictionary entry, the key
name and the value with its encoding overhead, as Redis accounts it):

* ``bytes_per_subscription``: the sum over the batched clients' subscription hashes divided by
  the number of subscriptions (``subscribe_batch`` filters per client; a client with more than
  ``hash-max-listpack-entries`` filters, 128 by default, switches to a hash table and costs
  more per filter);
* ``bytes_per_channel_message``: the sum over every body key and dedup key of the published
  messages, plus the channel clock and the reader's cursor, divided by the message count
  (the two key names per message are 7 bytes longer each than with the default prefix, see
  :data:`PREFIX_STEM`).

MEMORY USAGE does not count the expiry entry each of these keys has (every channel key has a
TTL) nor allocator fragmentation; ``used_memory_per_channel_message`` (the growth of INFO
``used_memory`` across the timed publish of the first round, divided by the message count)
shows the whole cost, noise included.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final

from redis.asyncio import Redis

from router.bench.broker_runs import cut
from router.bench.checks import check_redis
from router.core.guid import GuidGenerator, node_part_for
from router.core.options import SubscriptionOptions, make_options
from router.errors import BenchSetupError
from router.ops.embedded_redis import embedded_redis
from router.state.channels import Channel, ChannelMessage
from router.state.keys import Keys
from router.state.subscriptions import SubscriptionStore

PUBLISH_TARGET_RATIO: Final = 1.0
"""Target: batched channel publish at least this many times the raw pipelined PUBLISH rate."""
SUBSCRIBE_BATCHED_TARGET: Final = 20_000
"""Target: batched subscriptions per second."""
RAW_CHANNEL: Final = "router-bench:raw-publish"
"""The pub/sub channel (not a key) of the yardstick's PUBLISH commands; nobody listens."""
CHANNEL: Final = "bench"
READER: Final = "reader"
CHANNEL_EXPIRE: Final = 600.0
MEMORY_CHUNK: Final = 1000
METRICS: Final = ("telemetry", "status", "cmd", "alert", "config")
PREFIX_STEM: Final = "rb"
"""Key prefixes of a run: this stem, 6 random hex digits and the round number (9 characters,
7 more than the default ``rt``, so each key name here is 7 bytes longer than in production)."""


@dataclass(frozen=True, slots=True)
class RedisBenchConfig:
    """The sizes of one ``router bench redis`` run; every field must be >= 1."""

    subscriptions: int = 5_000
    batched_subscriptions: int = 50_000
    subscribe_batch: int = 100
    messages: int = 50_000
    publish_batch: int = 100
    fetch_max: int = 100
    payload_bytes: int = 256
    rounds: int = 3
    seed: int = 7

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name != "seed" and (type(value) is not int or value < 1):
                raise BenchSetupError(f"{name} must be an int >= 1, not {value!r}")


@dataclass
class _Best:
    """The fastest time of each section over the rounds, and the memory figures."""

    seconds: dict[str, float]
    memory: dict[str, float]

    def record(self, section: str, seconds: float) -> None:
        self.seconds[section] = min(seconds, self.seconds.get(section, float("inf")))


def topic_filter(client: int, index: int) -> str:
    """The ``index``-th filter of client number ``client``: 70% exact, 20% ``+``, 10% ``#``."""
    base = f"site/{client % 100}/device/{index}"
    kind = index % 10
    if kind < 7:
        return f"{base}/{METRICS[index % len(METRICS)]}"
    return f"{base}/+" if kind < 9 else f"{base}/#"


def subscription_batches(
    count: int, batch: int, label: str, options: SubscriptionOptions
) -> list[tuple[str, list[tuple[str, SubscriptionOptions]]]]:
    """``count`` subscriptions as (client id, filters) with ``batch`` filters per client."""
    batches: list[tuple[str, list[tuple[str, SubscriptionOptions]]]] = []
    for first in range(0, count, batch):
        client = first // batch
        items = [(topic_filter(client, i), options) for i in range(min(batch, count - first))]
        batches.append((f"{label}-{client}", items))
    return batches


def message_batches(config: RedisBenchConfig) -> list[list[ChannelMessage]]:
    """The channel messages in publish batches: GUID ids, seeded random content."""
    rng = random.Random(config.seed)
    guids = GuidGenerator(node_part_for("router-bench", config.seed))
    messages = [
        ChannelMessage(guids.new_hex(), rng.randbytes(config.payload_bytes))
        for _ in range(config.messages)
    ]
    size = config.publish_batch
    return [messages[i : i + size] for i in range(0, len(messages), size)]


async def _timed(action: Callable[[], Awaitable[None]]) -> float:
    gc.collect()
    start = time.perf_counter()
    await action()
    return time.perf_counter() - start


async def _memory_usage(redis: Redis, keys: Iterable[str]) -> int:
    """The sum of ``MEMORY USAGE key SAMPLES 0`` over ``keys`` (a missing key counts 0)."""
    total = 0
    names = list(keys)
    for first in range(0, len(names), MEMORY_CHUNK):
        pipe = redis.pipeline(transaction=False)
        for name in names[first : first + MEMORY_CHUNK]:
            pipe.memory_usage(name, samples=0)
        total += sum(int(size or 0) for size in await pipe.execute())
    return total


async def _used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


async def _delete_namespace(redis: Redis, keys: Keys) -> None:
    """Delete every key under ``keys``' prefix."""
    batch: list[bytes] = []
    async for name in redis.scan_iter(match=keys.pattern(), count=1000):
        batch.append(name)
        if len(batch) >= MEMORY_CHUNK:
            await redis.unlink(*batch)
            batch = []
    if batch:
        await redis.unlink(*batch)


class _Round:
    """One round of every section under a fresh key prefix."""

    def __init__(self, redis: Redis, config: RedisBenchConfig, number: int) -> None:
        self.redis = redis
        self.config = config
        self.number = number
        self.keys = Keys(f"{PREFIX_STEM}{uuid.uuid4().hex[:6]}{number}")
        self.store = SubscriptionStore(redis, self.keys)

    async def run(self, best: _Best, messages: list[list[ChannelMessage]]) -> None:
        config = self.config
        options = make_options(qos=1)
        single = subscription_batches(config.subscriptions, config.subscribe_batch, "s", options)
        batched = subscription_batches(
            config.batched_subscriptions, config.subscribe_batch, "b", options
        )
        best.record("subscribe", await _timed(lambda: self._subscribe_single(single)))
        best.record("subscribe_batched", await _timed(lambda: self._subscribe_batched(batched)))
        if self.number == 0:
            size = await _memory_usage(
                self.redis, (self.keys.client_subscriptions(c) for c, _ in batched)
            )
            best.memory["bytes_per_subscription"] = size / config.batched_subscriptions
        async with Channel(self.redis, CHANNEL, CHANNEL_EXPIRE, self.keys) as channel:
            await channel.add_subscriber(READER)
            raw_first = self.number % 2 == 0
            if raw_first:
                best.record("raw_publish", await _timed(lambda: self._raw_publish(messages)))
            before = await _used_memory(self.redis)
            best.record("channel_publish", await _timed(lambda: _publish(channel, messages)))
            grown = await _used_memory(self.redis) - before
            if not raw_first:
                best.record("raw_publish", await _timed(lambda: self._raw_publish(messages)))
            await self._check_published()
            if self.number == 0:
                await self._channel_memory(best, messages, grown)
            best.record("fetch_ack", await _timed(lambda: _drain(channel, config)))

    async def _subscribe_single(
        self, batches: list[tuple[str, list[tuple[str, SubscriptionOptions]]]]
    ) -> None:
        subscribe = self.store.subscribe
        for client, items in batches:
            for item_filter, options in items:
                await subscribe(client, item_filter, options)

    async def _subscribe_batched(
        self, batches: list[tuple[str, list[tuple[str, SubscriptionOptions]]]]
    ) -> None:
        subscribe_many = self.store.subscribe_many
        for client, items in batches:
            await subscribe_many(client, items)

    async def _raw_publish(self, batches: list[list[ChannelMessage]]) -> None:
        redis = self.redis
        for batch in batches:
            pipe = redis.pipeline(transaction=False)
            for message in batch:
                pipe.publish(RAW_CHANNEL, message.content)
            await pipe.execute()

    async def _check_published(self) -> None:
        clock = await self.redis.get(self.keys.channel_clock(CHANNEL))
        if clock is None or int(clock) != self.config.messages:
            raise AssertionError(f"the channel clock is {clock!r}, not {self.config.messages}")

    async def _channel_memory(
        self, best: _Best, batches: list[list[ChannelMessage]], grown: int
    ) -> None:
        keys, count = self.keys, self.config.messages
        ids = [message.id for batch in batches for message in batch]
        names = [keys.channel_body(CHANNEL, clock) for clock in range(1, count + 1)]
        names += keys.channel_dedup(CHANNEL, ids)
        names += [keys.channel_clock(CHANNEL), keys.channel_cursor(CHANNEL, READER)]
        best.memory["bytes_per_channel_message"] = await _memory_usage(self.redis, names) / count
        best.memory["used_memory_per_channel_message"] = grown / count


async def _publish(channel: Channel, batches: list[list[ChannelMessage]]) -> None:
    publish = channel.publish
    for batch in batches:
        await publish(batch)


async def _drain(channel: Channel, config: RedisBenchConfig) -> None:
    """Fetch and ack until the reader has everything; checks that it got every message."""
    fetch, ack, received = channel.fetch, channel.ack, 0
    while True:
        result = await fetch(READER, max=config.fetch_max)
        received += len(result.messages)
        if result.ack_handle is not None:
            await ack(READER, result.ack_handle)
        if not result.more:
            break
    if received != config.messages:
        raise AssertionError(f"fetched {received} messages, not {config.messages}")


async def run_async(url: str, config: RedisBenchConfig) -> dict[str, Any]:
    """Every section against the standalone Redis at ``url``; the object ``--json`` prints.

    Raises :class:`BenchSetupError` for a Redis Cluster node, redis-py's errors when the
    server cannot be reached.
    """
    redis = Redis.from_url(url)
    try:
        info = await redis.info()
        if int(info.get("cluster_enabled", 0)) == 1:
            raise BenchSetupError("router bench redis measures a standalone Redis, not a cluster")
        messages = message_batches(config)
        best = _Best({}, {})
        for number in range(config.rounds):
            current = _Round(redis, config, number)
            try:
                await current.run(best, messages)
            finally:
                await _delete_namespace(redis, current.keys)
    finally:
        await redis.aclose()
    return _report(config, str(info.get("redis_version", "?")), best)


def _report(config: RedisBenchConfig, version: str, best: _Best) -> dict[str, Any]:
    seconds = best.seconds
    channel = config.messages / seconds["channel_publish"]
    raw = config.messages / seconds["raw_publish"]
    single = config.subscriptions / seconds["subscribe"]
    batched = config.batched_subscriptions / seconds["subscribe_batched"]
    ratio = channel / raw
    return {
        "redis_version": version,
        "rounds": config.rounds,
        "payload_bytes": config.payload_bytes,
        "subscriptions": config.subscriptions,
        "batched_subscriptions": config.batched_subscriptions,
        "subscribe_batch": config.subscribe_batch,
        "messages": config.messages,
        "publish_batch": config.publish_batch,
        "fetch_max": config.fetch_max,
        "subscribe_per_s": round(single),
        "subscribe_batched_per_s": round(batched),
        "subscribe_batched_speedup": cut(batched / single),
        "channel_publish_per_s": round(channel),
        "raw_publish_per_s": round(raw),
        "publish_ratio": cut(ratio),
        "fetch_ack_per_s": round(config.messages / seconds["fetch_ack"]),
        "bytes_per_subscription": round(best.memory["bytes_per_subscription"], 1),
        "bytes_per_channel_message": round(best.memory["bytes_per_channel_message"], 1),
        "used_memory_per_channel_message": round(best.memory["used_memory_per_channel_message"], 1),
        "publish_target_met": ratio >= PUBLISH_TARGET_RATIO,
        "subscribe_target_met": batched >= SUBSCRIBE_BATCHED_TARGET,
    }


def run(url: str | None = None, config: RedisBenchConfig | None = None) -> dict[str, Any]:
    """Run the benchmark against ``url``, or a redis-server started for the run when None.

    Raises :class:`BenchSetupError` for a ``url`` that is malformed or does not answer."""
    config = config if config is not None else RedisBenchConfig()
    if url is not None:
        check_redis(url)
        return asyncio.run(run_async(url, config))
    with embedded_redis() as embedded:
        return asyncio.run(run_async(embedded, config))


__all__ = [
    "PUBLISH_TARGET_RATIO",
    "SUBSCRIBE_BATCHED_TARGET",
    "BenchSetupError",
    "RedisBenchConfig",
    "run",
    "run_async",
]
