"""Channel clocks (router/state/channels.py): the contract, on fakeredis, Redis and Redis Cluster.

Every test runs once per backend (``redis_client`` is parametrized). State is read back from
Redis with plain commands, so each test checks what is stored, not only what is returned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from router.errors import (
    ChannelArgumentError,
    CorruptStateError,
    InvalidIdError,
    SubscriptionNotFoundError,
)
from router.state import channels as channels_module
from router.state.channels import CLOCK_LIMIT, Channel, ChannelMessage, FetchedMessage, Published
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support.waiting import eventually

MAX = CLOCK_LIMIT
NAME = "inbox"
EXPIRE = 60
TTL_MS = (EXPIRE + 1) * 1000  # ceil(expire + CLOCK_DRIFT_MARGIN) seconds


@pytest.fixture
async def channel(redis_client: RedisClient, keys: Keys) -> AsyncIterator[Channel]:
    ch = Channel(redis_client, NAME, expire=EXPIRE, keys=keys)
    try:
        yield ch
    finally:
        await ch.aclose()


async def get_int(redis: RedisClient, key: str) -> int | None:
    value = await redis.get(key)
    return None if value is None else int(value)


async def snapshot(redis: RedisClient, keys: Keys, name: str = NAME) -> dict[bytes, Any]:
    """Every key of the namespace with its value (or type) and whether it has a TTL."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(keys.channel(name))
        found = [
            k async for k in redis.scan_iter(match=keys.pattern(), count=1000, target_nodes=node)
        ]
    else:
        found = [k async for k in redis.scan_iter(match=keys.pattern(), count=1000)]
    state: dict[bytes, Any] = {}
    for key in sorted(found):
        kind = await redis.type(key)
        value = await redis.get(key) if kind == b"string" else kind
        state[key] = (value, await redis.pttl(key) > 0)
    return state


async def plant_clock(redis: RedisClient, keys: Keys, clock: int, *subscribers: str) -> None:
    """Set the channel clock (and cursors) as if the channel had reached ``clock``."""
    await redis.set(keys.channel_clock(NAME), str(clock), ex=EXPIRE)
    for subscriber in subscribers:
        await redis.set(keys.channel_cursor(NAME, subscriber), str(clock), ex=EXPIRE)


def ids(result: Any) -> list[str]:
    return [m.id for m in result.messages]


def clocks(result: Any) -> list[int]:
    return [m.clock for m in result.messages]


# -- subscribers ---------------------------------------------------------------------


async def test_subscriber_on_missing_channel_sets_clock_zero(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    assert await channel.add_subscriber("s") is True
    assert await get_int(redis_client, keys.channel_clock(NAME)) == 0
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == 0
    for key in (keys.channel_clock(NAME), keys.channel_cursor(NAME, "s")):
        assert TTL_MS - 2000 < await redis_client.pttl(key) <= TTL_MS
    result = await channel.fetch("s")
    assert result.messages == () and result.ack_handle is None and result.more is False


async def test_first_message_gets_clock_one(channel: Channel, redis_client: RedisClient) -> None:
    assert await channel.publish([("m1", b"a"), ("m2", b"b")]) == [
        Published("m1", 1, False),
        Published("m2", 2, False),
    ]
    assert await get_int(redis_client, channel.keys.channel_clock(NAME)) == 2


async def test_new_subscriber_starts_at_current_clock(channel: Channel) -> None:
    await channel.add_subscriber("old")
    await channel.publish([("m1", b"1"), ("m2", b"2"), ("m3", b"3")])
    assert await channel.add_subscriber("new") is True
    assert (await channel.fetch("new")).messages == ()
    await channel.publish([("m4", b"4")])
    assert ids(await channel.fetch("new")) == ["m4"]
    assert ids(await channel.fetch("old")) == ["m1", "m2", "m3", "m4"]


async def test_recreate_changes_neither_cursor_nor_ttl(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([("m1", b"1"), ("m2", b"2")])
    cursor_key, clock_key = keys.channel_cursor(NAME, "s"), keys.channel_clock(NAME)
    await redis_client.pexpire(cursor_key, 50_000)
    await redis_client.pexpire(clock_key, 40_000)
    assert await channel.add_subscriber("s") is False
    assert await get_int(redis_client, cursor_key) == 0
    assert 45_000 < await redis_client.pttl(cursor_key) <= 50_000
    assert 35_000 < await redis_client.pttl(clock_key) <= 40_000
    assert ids(await channel.fetch("s")) == ["m1", "m2"]


async def test_remove_subscriber(channel: Channel, redis_client: RedisClient, keys: Keys) -> None:
    assert await channel.remove_subscriber("never") is False
    await channel.add_subscriber("s")
    assert await channel.remove_subscriber("s") is True
    assert await redis_client.exists(keys.channel_cursor(NAME, "s")) == 0
    with pytest.raises(SubscriptionNotFoundError):
        await channel.fetch("s")


async def test_cursor_without_clock_is_recreated(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await plant_clock(redis_client, keys, 7, "s")
    await redis_client.delete(keys.channel_clock(NAME))
    with pytest.raises(SubscriptionNotFoundError):
        await channel.fetch("s")
    assert await channel.add_subscriber("s") is True
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == 0
    assert await get_int(redis_client, keys.channel_clock(NAME)) == 0


async def test_subscribed_reads_what_add_subscriber_would_leave_as_it_is(
    redis_client: RedisClient, keys: Keys
) -> None:
    made, fresh, corrupt = (Channel(redis_client, n, EXPIRE, keys) for n in ("a", "b", "c"))
    await made.add_subscriber("s")
    await made.publish([("m1", b"1"), ("m2", b"2")])
    await corrupt.add_subscriber("s")
    stored = await snapshot(redis_client, keys, "a")
    reader = Channel(redis_client, "a", EXPIRE, keys)  # (a new object: learns the epoch)
    assert await Channel.subscribed([reader, fresh], "s") == [await made.position("s"), None]
    assert reader.epoch == made.epoch is not None and fresh.epoch is None
    assert await snapshot(redis_client, keys, "a") == stored  # (read, nothing written)
    assert await redis_client.exists(keys.channel_clock("b")) == 0
    await redis_client.set(keys.channel_cursor("c", "s"), "not a clock")
    with pytest.raises(CorruptStateError):
        await Channel.subscribed([corrupt], "s")


# -- publish -------------------------------------------------------------------------


async def test_publish_sets_ttl_on_every_key(redis_client: RedisClient, keys: Keys) -> None:
    async with Channel(redis_client, NAME, expire=2.5, keys=keys) as channel:
        assert channel.ttl == 4  # ceil(2.5 + 1)
        await channel.publish([("m1", b"x")])
        for key in (
            keys.channel_clock(NAME),
            keys.channel_body(NAME, 1),
            *keys.channel_dedup(NAME, ["m1"]),
        ):
            assert 3000 < await redis_client.pttl(key) <= 4000


async def test_duplicates_store_nothing_and_report_the_original_clock(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([("a", b"first"), ("b", b"second")])
    before = await snapshot(redis_client, keys)
    assert await channel.publish([("b", b"again"), ("a", b"again")]) == [
        Published("b", 2, True),
        Published("a", 1, True),
    ]
    assert await snapshot(redis_client, keys) == before
    # Within one batch, a repeated id is a duplicate of its first occurrence.
    assert await channel.publish([("c", b"1"), ("c", b"2"), ("a", b"3"), ("d", b"4")]) == [
        Published("c", 3, False),
        Published("c", 3, True),
        Published("a", 1, True),
        Published("d", 4, False),
    ]
    result = await channel.fetch("s")
    assert [(m.id, m.content) for m in result.messages] == [
        ("a", b"first"),
        ("b", b"second"),
        ("c", b"1"),
        ("d", b"4"),
    ]


async def test_id_is_new_again_after_the_dedup_window(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.publish([("a", b"1")])
    (dedup,) = keys.channel_dedup(NAME, ["a"])
    await redis_client.pexpire(dedup, 1)  # the window ends
    await eventually(lambda: _absent(redis_client, dedup), 5, "the dedup key to expire")
    assert await channel.publish([("a", b"2")]) == [Published("a", 2, False)]


async def test_empty_batch_is_a_noop(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    assert await channel.publish([]) == []
    assert await snapshot(redis_client, keys) == {}


async def test_binary_payloads_round_trip(channel: Channel) -> None:
    await channel.add_subscriber("s")
    every_byte = bytes(range(256))
    batch = [ChannelMessage("all", every_byte)] + [
        ChannelMessage(f"b{i}", bytes([i])) for i in range(256)
    ]
    batch.append(ChannelMessage("bytearray", bytearray(b"\x00\xff")))  # type: ignore[arg-type]
    batch.append(ChannelMessage("{ü}:x:1", b"12:not-a-prefix"))
    await channel.publish(batch)
    result = await channel.fetch("s", max=1000)
    assert [(m.id, m.content) for m in result.messages] == [(m.id, bytes(m.content)) for m in batch]
    assert result.messages[0] == FetchedMessage("all", every_byte, 1)


async def test_bad_messages_are_refused_before_redis(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    with pytest.raises(ChannelArgumentError):
        await channel.publish([("a", "text")])  # type: ignore[list-item]
    with pytest.raises(ChannelArgumentError):
        await channel.publish([("a",)])  # type: ignore[list-item]
    with pytest.raises(ChannelArgumentError):
        await channel.publish([("a", b"x", b"y")])  # type: ignore[list-item]
    with pytest.raises(InvalidIdError):
        await channel.publish([("", b"x")])
    with pytest.raises(InvalidIdError):
        await channel.publish([(b"id", b"x")])  # type: ignore[list-item]
    assert await snapshot(redis_client, keys) == {}


# -- fetch ---------------------------------------------------------------------------


async def test_fetch_pages_with_more_and_never_moves_the_cursor(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([(f"m{i}", b"x") for i in range(1, 6)])
    first = await channel.fetch("s", max=2)
    assert clocks(first) == [1, 2] and first.more is True
    assert await channel.fetch("s", max=2) == first  # redelivered: the cursor did not move
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == 0
    assert first.ack_handle is not None
    assert await channel.ack("s", first.ack_handle) is True
    second = await channel.fetch("s", max=2)
    assert clocks(second) == [3, 4] and second.more is True
    assert second.ack_handle is not None
    await channel.ack("s", second.ack_handle)
    last = await channel.fetch("s", max=2)
    assert clocks(last) == [5] and last.more is False
    exact = await channel.fetch("s", max=1)
    assert clocks(exact) == [5] and exact.more is False  # stopped at the channel clock


async def test_fetch_extends_clock_and_cursor_ttl(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    for key in (keys.channel_clock(NAME), keys.channel_cursor(NAME, "s")):
        await redis_client.pexpire(key, 5_000)
    await channel.fetch("s")
    for key in (keys.channel_clock(NAME), keys.channel_cursor(NAME, "s")):
        assert TTL_MS - 2000 < await redis_client.pttl(key) <= TTL_MS


async def test_fetch_skips_expired_and_corrupt_bodies(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([(f"m{i}", b"x") for i in range(1, 8)])
    await redis_client.delete(keys.channel_body(NAME, 2))  # expired
    await redis_client.set(keys.channel_body(NAME, 3), b"garbage")
    await redis_client.set(keys.channel_body(NAME, 4), b"99:short")
    await redis_client.delete(keys.channel_body(NAME, 5))
    await redis_client.rpush(keys.channel_body(NAME, 5), b"a list")  # wrong type
    result = await channel.fetch("s", max=2)
    assert ids(result) == ["m1", "m6"] and result.more is True
    result = await channel.fetch("s", max=10)
    assert ids(result) == ["m1", "m6", "m7"] and result.more is False
    assert result.ack_handle is not None and result.ack_handle.startswith("7:")


async def test_run_of_expired_clocks_longer_than_max_does_not_stall(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([(f"m{i}", b"x") for i in range(1, 11)])
    for clock in range(1, 9):
        await redis_client.delete(keys.channel_body(NAME, clock))
    result = await channel.fetch("s", max=3)
    assert clocks(result) == [9, 10] and result.more is False
    # All expired up to the channel clock: nothing to return, but the handle skips them.
    for clock in (9, 10):
        await redis_client.delete(keys.channel_body(NAME, clock))
    result = await channel.fetch("s", max=3)
    assert result.messages == () and result.more is False and result.ack_handle is not None
    assert await channel.ack("s", result.ack_handle) is True
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == 10


async def test_gap_wider_than_one_scan_is_crossed_in_one_fetch(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await plant_clock(redis_client, keys, 100, "s")
    await redis_client.set(keys.channel_clock(NAME), str(100 + 3 * channels_module.SCAN_SLACK))
    (published,) = await channel.publish([("late", b"x")])
    result = await channel.fetch("s", max=1)
    assert ids(result) == ["late"] and result.more is False
    assert result.messages[0].clock == published.clock


async def test_gap_beyond_the_scan_limit_is_skipped_by_acking(
    channel: Channel, redis_client: RedisClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channels_module, "SCAN_SLACK", 5)
    monkeypatch.setattr(channels_module, "MAX_SCAN_CALLS", 2)
    await plant_clock(redis_client, keys, 0, "s")
    await redis_client.set(keys.channel_clock(NAME), "40")
    await channel.publish([("late", b"x")])
    rounds = 0
    while True:
        result = await channel.fetch("s", max=2)
        if result.messages:
            break
        rounds += 1
        assert result.more is True and result.ack_handle is not None and rounds < 10
        assert await channel.ack("s", result.ack_handle) is True
    assert ids(result) == ["late"] and clocks(result) == [41]
    assert rounds == 2  # 14 clocks a fetch (2 calls of max 2 + slack 5): 1..14, 15..28


async def test_missing_cursor_or_clock(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    with pytest.raises(SubscriptionNotFoundError):
        await channel.fetch("nobody")
    await channel.add_subscriber("s")
    await channel.publish([("m", b"x")])
    handle = (await channel.fetch("s")).ack_handle
    assert handle is not None
    await redis_client.delete(keys.channel_clock(NAME))
    with pytest.raises(SubscriptionNotFoundError):
        await channel.fetch("s")
    with pytest.raises(SubscriptionNotFoundError):
        await channel.ack("s", handle)
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == 0


async def test_fetch_argument_checks(channel: Channel) -> None:
    await channel.add_subscriber("s")
    for bad in (0, -1, channels_module.MAX_FETCH + 1, 1.5, True):
        with pytest.raises(ChannelArgumentError):
            await channel.fetch("s", max=bad)  # type: ignore[arg-type]
    for wait in (-1, float("nan"), float("inf"), "1"):
        with pytest.raises(ChannelArgumentError):
            await channel.fetch("s", wait=wait)  # type: ignore[arg-type]
    for expire in (0, -1, float("inf"), "60", None):
        with pytest.raises(ChannelArgumentError):
            Channel(channel._redis, NAME, expire=expire)  # type: ignore[arg-type]


async def _absent(redis: RedisClient, key: str) -> bool:
    return not await redis.exists(key)
