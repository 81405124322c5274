"""ChannelFollower: pushed messages without a round trip, catch-up reads, background acks."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from itertools import pairwise

import pytest

from router.cluster.follower import ChannelFollower, clock_after
from router.state import wakeups
from router.state.channels import CLOCK_LIMIT, Channel, parse_announcement
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.state.test_channels import EXPIRE, NAME
from tests.support.waiting import eventually


@pytest.fixture
async def channel(redis_client: RedisClient, keys: Keys) -> AsyncIterator[Channel]:
    ch = Channel(redis_client, NAME, expire=EXPIRE, keys=keys)
    await ch.add_subscriber("s")
    try:
        yield ch
    finally:
        await ch.aclose()


@pytest.fixture
async def follower(channel: Channel) -> AsyncIterator[ChannelFollower]:
    follower = ChannelFollower(channel, "s", max_fetch=4, poll=0.5, ack_interval=0.0)
    try:
        yield follower
    finally:
        await follower.close()


async def cursor(redis: RedisClient, keys: Keys) -> int:
    return int(await redis.get(keys.channel_cursor(NAME, "s")))


def test_clock_after_follows_iteration_order_across_the_wrap() -> None:
    assert clock_after(2, 1) and not clock_after(1, 2) and not clock_after(1, 1)
    assert clock_after(-CLOCK_LIMIT, CLOCK_LIMIT)
    assert not clock_after(CLOCK_LIMIT, -CLOCK_LIMIT)


def test_announcements_parse_and_refuse_garbage() -> None:
    clock_only = parse_announcement(b"17")
    assert clock_only is not None and (clock_only.first, clock_only.last) == (17, 17)
    assert not clock_only.pushed and clock_only.messages == ()
    pushed = parse_announcement(b"P9:4:1:aX5:1:bYZ")
    assert pushed is not None and (pushed.first, pushed.last) == (9, 10)
    assert [(m.id, m.content, m.clock) for m in pushed.messages] == [
        ("a", b"X", 9),
        ("b", b"YZ", 10),
    ]
    wrapped = parse_announcement(f"P{CLOCK_LIMIT}:3:1:a3:1:b".encode())
    assert wrapped is not None and [m.clock for m in wrapped.messages] == [
        CLOCK_LIMIT,
        -CLOCK_LIMIT,
    ]
    for garbage in (b"", b"x", b"P", b"P1", b"P1:", b"P1:9:1:a", b"Px:3:1:a", b"01"):
        assert parse_announcement(garbage) is None, garbage


async def test_pushed_messages_arrive_without_reading_redis(
    channel: Channel, follower: ChannelFollower
) -> None:
    waiting = asyncio.create_task(follower.next())
    await eventually(lambda: follower.reads == 1, 5, "the first read")
    await channel.publish([("a", b"1"), ("b", b"2")], push=True)
    got = await asyncio.wait_for(waiting, 5)
    assert [(m.id, m.content) for m in got] == [("a", b"1"), ("b", b"2")]
    assert follower.reads == 1 and follower.pushed == 2


async def test_clock_only_announcements_are_read_from_redis(
    channel: Channel, follower: ChannelFollower
) -> None:
    waiting = asyncio.create_task(follower.next())
    await eventually(lambda: follower.reads == 1, 5, "the first read")
    await channel.publish([("a", b"1")])
    assert [m.id for m in await asyncio.wait_for(waiting, 5)] == ["a"]
    assert follower.reads == 2 and follower.pushed == 0


async def test_done_acknowledges_in_the_background(
    channel: Channel, follower: ChannelFollower, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.publish([("a", b"1"), ("b", b"2")], push=True)
    got = await asyncio.wait_for(follower.next(), 5)
    assert [m.id for m in got] == ["a", "b"]
    assert await cursor(redis_client, keys) == 0  # handed on, not yet handled
    follower.done()
    await eventually(lambda: _at(redis_client, keys, 2), 5, "the cursor at clock 2")


async def _at(redis: RedisClient, keys: Keys, clock: int) -> bool:
    return await cursor(redis, keys) == clock


async def test_a_new_follower_gets_what_was_handed_on_but_not_handled(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    first = ChannelFollower(channel, "s", ack_interval=0.0)
    await channel.publish([("a", b"1")], push=True)
    assert [m.id for m in await asyncio.wait_for(first.next(), 5)] == ["a"]
    first.done()
    await channel.publish([("b", b"2")], push=True)
    assert [m.id for m in await asyncio.wait_for(first.next(), 5)] == ["b"]
    await first.close()  # "b" was never reported handled
    assert await cursor(redis_client, keys) == 1
    second = ChannelFollower(channel, "s")
    try:
        assert [m.id for m in await asyncio.wait_for(second.next(), 5)] == ["b"]
    finally:
        await second.close()


@pytest.mark.parametrize("backlog", [3, 10_000])
async def test_every_message_arrives_in_clock_order_whatever_the_announcements(
    channel: Channel, redis_client: RedisClient, monkeypatch: pytest.MonkeyPatch, backlog: int
) -> None:
    """Pushing and clock-only publishers interleave, the consumer is slow at times and (with
    a backlog of 3) announcements are dropped: nothing is lost and clocks only increase."""
    monkeypatch.setattr(wakeups, "ANNOUNCEMENT_BACKLOG", backlog)
    rng = random.Random(backlog)
    follower = ChannelFollower(channel, "s", max_fetch=3, poll=0.2, ack_interval=0.0)
    expected = [f"m{i}" for i in range(300)]
    seen: list[str] = []
    clocks: list[int] = []

    async def publish() -> None:
        position = 0
        while position < len(expected):
            size = rng.randint(1, 5)
            batch = [(i, b"x") for i in expected[position : position + size]]
            position += size
            await channel.publish(batch, push=rng.random() < 0.8)
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    async def consume() -> None:
        while set(seen) != set(expected):
            for message in await follower.next():
                if message.id not in seen:
                    seen.append(message.id)
                clocks.append(message.clock)
            follower.done()
            if rng.random() < 0.2:
                await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(asyncio.gather(publish(), consume()), 30)
    finally:
        await follower.close()
    assert seen == expected
    assert all(clock_after(b, a) for a, b in pairwise(clocks))
