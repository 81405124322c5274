"""A channel made anew (FLUSHALL, a restart that lost it) has a new epoch: a subscriber
whose cursor vanished with it resumes before the new channel's first message instead of
at its clock, so nothing stored meanwhile is skipped (issue 14, silent loss 4)."""

from __future__ import annotations

import pytest

from router.errors import SubscriptionNotFoundError
from router.state.channels import Channel
from router.state.keys import Keys
from router.state.scripts import RedisClient

NAME = "epochs"


async def drop_channel(redis: RedisClient, keys: Keys) -> None:
    """What a FLUSHALL does to the channel (its keys share one slot)."""
    base = keys.channel(NAME)
    names = [key async for key in redis.scan_iter(match=base.replace("{", "\\{") + "*")]
    names = [n for n in names if n.decode().startswith(base)]
    if names:
        await redis.delete(*names)


async def test_a_lost_subscriber_of_a_channel_made_anew_misses_nothing(
    redis_client: RedisClient, keys: Keys
) -> None:
    channel = Channel(redis_client, NAME, expire=60, keys=keys)
    assert await channel.add_subscriber("s")
    first = channel.epoch
    await channel.publish([("old-1", b"1"), ("old-2", b"2")])
    await drop_channel(redis_client, keys)
    await channel.publish([("new-1", b"a"), ("new-2", b"b"), ("new-3", b"c")])  # a peer writes
    with pytest.raises(SubscriptionNotFoundError):  # the cursor went with the channel
        await channel.fetch("s", max=10)
    assert await channel.add_subscriber("s", lost=True)
    assert channel.epoch != first
    fetched = await channel.fetch("s", max=10)
    assert [m.content for m in fetched.messages] == [b"a", b"b", b"c"]


async def test_a_lost_cursor_of_the_same_channel_starts_at_its_clock(
    redis_client: RedisClient, keys: Keys
) -> None:
    """Only the cursor went (it expired, or was removed): the channel is the same one, and
    a subscriber created again sees what comes next, as a new one would."""
    channel = Channel(redis_client, NAME, expire=60, keys=keys)
    await channel.add_subscriber("s")
    epoch = channel.epoch
    await channel.publish([("m-1", b"1")])
    await channel.remove_subscriber("s")
    assert await channel.add_subscriber("s", lost=True)
    assert channel.epoch == epoch
    await channel.publish([("m-2", b"2")])
    fetched = await channel.fetch("s", max=10)
    assert [m.content for m in fetched.messages] == [b"2"]
