"""Channel clocks: acks, the wrap at +-(2^53-1), corrupt state and bad calls, on every backend.

Ack handles for arbitrary clocks are made with ``Channel._handle`` (the checksum the channel
itself issues), so the validity rules can be checked position by position.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import count
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from router.errors import CorruptStateError, MalformedAckHandleError, ScriptError
from router.state.channels import CLOCK_LIMIT, Channel, Published, next_clock
from router.state.keys import Keys
from router.state.scripts import RedisClient, Scripts
from tests.state.test_channels import (
    EXPIRE,
    NAME,
    TTL_MS,
    clocks,
    get_int,
    ids,
    plant_clock,
    snapshot,
)

MAX = CLOCK_LIMIT
MIN = -CLOCK_LIMIT


@pytest.fixture
async def channel(redis_client: RedisClient, keys: Keys) -> AsyncIterator[Channel]:
    ch = Channel(redis_client, NAME, expire=EXPIRE, keys=keys)
    try:
        yield ch
    finally:
        await ch.aclose()


def test_next_clock_wraps() -> None:
    assert next_clock(0) == 1
    assert next_clock(-1) == 0
    assert next_clock(MAX - 1) == MAX
    assert next_clock(MAX) == MIN
    assert next_clock(MIN) == MIN + 1


# -- acks ----------------------------------------------------------------------------

ACK_CASES = [
    # cursor, clock, ack, valid
    (5, 10, 6, True),
    (5, 10, 10, True),
    (5, 10, 5, False),  # at the cursor: already acknowledged
    (5, 10, 4, False),
    (5, 10, 11, False),  # beyond the clock
    (5, 10, -3, False),
    (7, 7, 7, False),
    (7, 7, 8, False),
    (-10, -5, -7, True),
    (-10, -5, -10, False),
    (-10, -5, -4, False),
    # after a wrap (clock < cursor): cursor < ack or ack <= clock
    (MAX - 1, MIN + 1, MAX, True),
    (MAX - 1, MIN + 1, MIN, True),
    (MAX - 1, MIN + 1, MIN + 1, True),
    (MAX - 1, MIN + 1, MAX - 1, False),
    (MAX - 1, MIN + 1, MAX - 2, False),
    (MAX - 1, MIN + 1, MIN + 2, False),
    (MAX - 1, MIN + 1, 0, False),
    (MAX, MIN, MIN, True),
    (MAX, MIN, MAX, False),
]


@pytest.mark.parametrize(
    "case", ACK_CASES, ids=lambda case: "cursor={},clock={},ack={}".format(*case)
)
async def test_ack_rules(
    channel: Channel, redis_client: RedisClient, keys: Keys, case: tuple[int, int, int, bool]
) -> None:
    cursor, clock, ack, valid = case
    clock_key, cursor_key = keys.channel_clock(NAME), keys.channel_cursor(NAME, "s")
    await redis_client.set(clock_key, str(clock), px=30_000)
    await redis_client.set(cursor_key, str(cursor), px=30_000)
    assert await channel.ack("s", channel.handle("s", ack)) is valid
    assert await get_int(redis_client, clock_key) == clock
    if valid:
        assert await get_int(redis_client, cursor_key) == ack
        for key in (clock_key, cursor_key):
            assert TTL_MS - 2000 < await redis_client.pttl(key) <= TTL_MS
    else:  # stale: a successful no-op, no value and no TTL changed
        assert await get_int(redis_client, cursor_key) == cursor
        for key in (clock_key, cursor_key):
            assert 25_000 < await redis_client.pttl(key) <= 30_000


async def test_stale_ack_after_a_newer_one_changes_nothing(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([("a", b"1"), ("b", b"2")])
    early = await channel.fetch("s", max=1)
    late = await channel.fetch("s", max=2)
    assert early.ack_handle is not None and late.ack_handle is not None
    assert await channel.ack("s", late.ack_handle) is True
    await redis_client.pexpire(keys.channel_cursor(NAME, "s"), 20_000)
    before = await snapshot(redis_client, keys)
    assert await channel.ack("s", early.ack_handle) is False
    assert await channel.ack("s", late.ack_handle) is False
    assert await snapshot(redis_client, keys) == before
    assert await redis_client.pttl(keys.channel_cursor(NAME, "s")) <= 20_000


async def test_tampered_and_foreign_handles_are_refused(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.add_subscriber("s")
    await channel.add_subscriber("t")
    await channel.publish([("a", b"1"), ("b", b"2"), ("c", b"3")])
    handle = (await channel.fetch("s", max=2)).ack_handle
    assert handle is not None and handle.startswith("2:")
    clock, digest = handle.split(":")
    flipped = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    # Never used for a long poll, so they hold no connection to close.
    other_channel = Channel(redis_client, "other", expire=EXPIRE, keys=keys)
    other_namespace = Channel(redis_client, NAME, expire=EXPIRE, keys=Keys(prefix="elsewhere"))
    bad: list[Any] = [
        f"{clock}:{flipped}",
        f"3:{digest}",
        f"-2:{digest}",
        f"02:{digest}",
        f"{clock}:{digest.upper()}",
        f" {handle}",
        handle + ":",
        handle[:-1],
        channel.handle("t", 2),
        other_channel.handle("s", 2),
        other_namespace.handle("s", 2),
        f"{MAX + 1}:{digest}",
        "",
        "2",
        ":",
        "garbage",
        None,
        2,
        handle.encode(),
    ]
    before = await snapshot(redis_client, keys)
    for candidate in bad:
        with pytest.raises(MalformedAckHandleError):
            await channel.ack("s", candidate)
    assert await snapshot(redis_client, keys) == before
    # The genuine handle still works, and only for its own subscriber.
    with pytest.raises(MalformedAckHandleError):
        await channel.ack("t", handle)
    assert await channel.ack("s", handle) is True
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == 2
    assert await get_int(redis_client, keys.channel_cursor(NAME, "t")) == 0


# -- the wrap ------------------------------------------------------------------------


async def test_clock_wraps_from_max_to_min(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await plant_clock(redis_client, keys, MAX - 2, "s")
    published = await channel.publish([(f"m{i}", b"x") for i in range(4)])
    assert [p.clock for p in published] == [MAX - 1, MAX, MIN, MIN + 1]
    assert await get_int(redis_client, keys.channel_clock(NAME)) == MIN + 1
    assert await redis_client.exists(keys.channel_body(NAME, MIN)) == 1
    result = await channel.fetch("s")
    assert clocks(result) == [MAX - 1, MAX, MIN, MIN + 1]
    assert ids(result) == ["m0", "m1", "m2", "m3"]
    assert result.more is False
    # A duplicate after the wrap reports its original (negative) clock.
    assert await channel.publish([("m2", b"again")]) == [Published("m2", MIN, True)]


async def test_ack_handle_after_a_batch_across_the_wrap_is_the_last_clock(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await plant_clock(redis_client, keys, MAX - 1, "s")
    await channel.publish([(f"m{i}", b"x") for i in range(5)])  # MAX, MIN .. MIN+3
    batch = await channel.fetch("s", max=3)
    assert clocks(batch) == [MAX, MIN, MIN + 1] and batch.more is True
    assert batch.ack_handle is not None
    assert batch.ack_handle.startswith(f"{MIN + 1}:")  # not MAX, the numerically largest
    assert await channel.ack("s", batch.ack_handle) is True
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == MIN + 1
    rest = await channel.fetch("s", max=3)
    assert clocks(rest) == [MIN + 2, MIN + 3] and rest.more is False  # nothing redelivered
    assert rest.ack_handle is not None
    assert await channel.ack("s", rest.ack_handle) is True
    assert (await channel.fetch("s")).messages == ()


async def test_subscriber_and_expired_run_across_the_wrap(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await plant_clock(redis_client, keys, MAX - 3)
    assert await channel.add_subscriber("s") is True
    assert await get_int(redis_client, keys.channel_cursor(NAME, "s")) == MAX - 3
    await channel.publish([(f"m{i}", b"x") for i in range(6)])  # MAX-2 .. MIN+2
    for clock in (MAX - 2, MAX - 1, MAX, MIN):
        await redis_client.delete(keys.channel_body(NAME, clock))
    result = await channel.fetch("s", max=1)
    assert clocks(result) == [MIN + 1] and result.more is True
    assert result.ack_handle is not None
    await channel.ack("s", result.ack_handle)
    assert clocks(await channel.fetch("s", max=1)) == [MIN + 2]


# -- corrupt state -------------------------------------------------------------------

CORRUPT = [b"abc", b"1.5", b"1e3", b"", b"-", b" 1", b"0x10", str(MAX + 1).encode(), b"9" * 20]


@pytest.mark.parametrize("value", CORRUPT)
async def test_corrupt_clock_is_reported_and_changes_nothing(
    channel: Channel, redis_client: RedisClient, keys: Keys, value: bytes
) -> None:
    await plant_clock(redis_client, keys, 3, "s")
    await redis_client.set(keys.channel_clock(NAME), value, ex=EXPIRE)
    before = await snapshot(redis_client, keys)
    with pytest.raises(CorruptStateError):
        await channel.add_subscriber("new")
    with pytest.raises(CorruptStateError):
        await channel.publish([("m", b"x")])
    with pytest.raises(CorruptStateError):
        await channel.fetch("s")
    with pytest.raises(CorruptStateError):
        await channel.ack("s", channel.handle("s", 4))
    assert await snapshot(redis_client, keys) == before


@pytest.mark.parametrize("value", [b"abc", str(MIN - 1).encode()])
async def test_corrupt_cursor_is_reported_and_changes_nothing(
    channel: Channel, redis_client: RedisClient, keys: Keys, value: bytes
) -> None:
    await channel.add_subscriber("s")
    await channel.publish([("m", b"x")])
    await redis_client.set(keys.channel_cursor(NAME, "s"), value, ex=EXPIRE)
    before = await snapshot(redis_client, keys)
    with pytest.raises(CorruptStateError):
        await channel.add_subscriber("s")
    with pytest.raises(CorruptStateError):
        await channel.fetch("s")
    with pytest.raises(CorruptStateError):
        await channel.ack("s", channel.handle("s", 1))
    assert await snapshot(redis_client, keys) == before


async def test_wrong_type_clock_is_corrupt(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await redis_client.hset(keys.channel_clock(NAME), "f", "v")
    await redis_client.set(keys.channel_cursor(NAME, "s"), "0")
    before = await snapshot(redis_client, keys)
    with pytest.raises(CorruptStateError):
        await channel.publish([("m", b"x")])
    with pytest.raises(CorruptStateError):
        await channel.fetch("s")
    with pytest.raises(CorruptStateError):
        await channel.add_subscriber("t")
    assert await snapshot(redis_client, keys) == before


async def test_corrupt_dedup_entry_stores_nothing(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    await channel.publish([("a", b"1")])
    (dedup,) = keys.channel_dedup(NAME, ["b"])
    await redis_client.set(dedup, b"not a clock", ex=EXPIRE)
    before = await snapshot(redis_client, keys)
    with pytest.raises(CorruptStateError):
        await channel.publish([("c", b"3"), ("b", b"2")])
    assert await snapshot(redis_client, keys) == before


# -- bad script calls ----------------------------------------------------------------


def same_slot_channel(keys: Keys, name: str) -> str:
    """Another channel whose keys land in the same cluster slot as ``name``'s."""
    slot = key_slot(keys.channel(name).encode())
    for i in count():
        other = f"other{i}"
        if key_slot(keys.channel(other).encode()) == slot:
            return other
    raise AssertionError("unreachable")


async def test_publish_script_refuses_a_batch_mixing_channels(
    channel: Channel, redis_client: RedisClient, keys: Keys
) -> None:
    other = same_slot_channel(keys, NAME)
    scripts = Scripts(redis_client)
    with pytest.raises(ScriptError, match="mix channels"):
        await scripts.run(
            "channel_publish",
            [
                keys.channel_clock(NAME),
                keys.channel_bodies(NAME),
                *keys.channel_dedup(NAME, ["a"]),
                *keys.channel_dedup(other, ["b"]),
            ],
            [channel.ttl, keys.channel_wakeup(NAME), 0, "PUBLISH", "a", b"1", "b", b"2"],
        )
    assert await snapshot(redis_client, keys) == {}
    assert await snapshot(redis_client, keys, other) == {}


# script -> (key roles, bad ARGV lists): missing, extra and malformed arguments.
BAD_SCRIPT_CALLS: dict[str, tuple[list[str], list[list[str]]]] = {
    "channel_add_subscriber": (
        ["clock", "cursor", "epoch"],
        [[], ["61"], ["61", "", "x"], ["0", ""], ["-5", ""], ["1.5", ""]],
    ),
    "channel_ack": (["clock", "cursor"], [["6"], ["6", "61", "x"], ["6", "0"], ["6", "ttl"]]),
    "channel_fetch": (
        ["clock", "cursor", "bodies", "epoch"],
        [
            ["10", "61", "20"],
            ["10", "61", "20", "", "x"],
            ["0", "61", "20", ""],
            ["10", "61", "5", ""],  # budget < max
            ["10", "61", "20", "abc"],
            ["10", "61", "20", str(MAX + 1)],
        ],
    ),
    "channel_publish": (
        ["clock", "bodies", "dedup"],
        [
            ["61", "wake", "0", "PUBLISH", "m"],
            ["61", "wake", "0", "PUBLISH", "m", "x", "y"],
            ["61", "wake", "-1", "PUBLISH", "m", "x"],
            ["61", "wake", "0", "m", "x"],  # no announce command
            ["61", "wake", "0", "EVAL", "m", "x"],  # not an announce command
            ["0", "wake", "0", "PUBLISH", "m", "x"],
            ["61"],
        ],
    ),
}


@pytest.mark.parametrize("script", sorted(BAD_SCRIPT_CALLS))
async def test_scripts_refuse_missing_or_bad_argv(
    redis_client: RedisClient, keys: Keys, script: str
) -> None:
    await plant_clock(redis_client, keys, 5, "s")
    names = {
        "clock": keys.channel_clock(NAME),
        "cursor": keys.channel_cursor(NAME, "s"),
        "bodies": keys.channel_bodies(NAME),
        "dedup": keys.channel_dedup(NAME, ["m"])[0],
        "epoch": keys.channel_epoch(NAME),
    }
    key_roles, bad_calls = BAD_SCRIPT_CALLS[script]
    script_keys = [names[role] for role in key_roles]
    scripts = Scripts(redis_client)
    before = await snapshot(redis_client, keys)
    for bad in bad_calls:
        with pytest.raises(ScriptError):
            await scripts.run(script, script_keys, bad)
    assert await snapshot(redis_client, keys) == before


async def test_ack_script_refuses_a_non_clock(redis_client: RedisClient, keys: Keys) -> None:
    await plant_clock(redis_client, keys, 5, "s")
    before = await snapshot(redis_client, keys)
    for ack in ("x", "1.5", str(MAX + 1), ""):
        with pytest.raises(MalformedAckHandleError):
            await Scripts(redis_client).run(
                "channel_ack",
                [keys.channel_clock(NAME), keys.channel_cursor(NAME, "s")],
                [ack, "61"],
            )
    assert await snapshot(redis_client, keys) == before


@pytest.mark.parametrize("redis_backend", ["cluster"], indirect=True)
async def test_channels_on_every_master(redis_client: RedisClient, keys: Keys) -> None:
    assert isinstance(redis_client, RedisCluster)
    by_node: dict[str, str] = {}
    for i in count():
        name = f"ch{i}"
        node = redis_client.get_node_from_key(keys.channel(name))
        assert node is not None
        by_node.setdefault(node.name, name)
        if len(by_node) == len(redis_client.get_primaries()):
            break
    assert len(by_node) == 3
    for name in by_node.values():
        async with Channel(redis_client, name, expire=EXPIRE, keys=keys) as channel:
            await channel.add_subscriber("s")
            assert [p.clock for p in await channel.publish([("a", b"1"), ("a", b"2")])] == [1, 1]
            result = await channel.fetch("s", wait=1)
            assert ids(result) == ["a"] and result.ack_handle is not None
            assert await channel.ack("s", result.ack_handle) is True
            assert await channel.remove_subscriber("s") is True
