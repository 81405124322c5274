"""The retained store (router.state.retained_store) on fakeredis, a real redis-server and a 3-master
Redis Cluster: EMQX retainer semantics, the sharded layout, cursors, pages, expiry on
Redis server time, and limits."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

import router.state.retained_store
from router.core.topics import matches
from router.errors import (
    InvalidTopicError,
    RetainedArgumentError,
    RetainedBytesFullError,
    RetainedPayloadTooLargeError,
    RetainedStoreFullError,
)
from router.state.keys import Keys
from router.state.retained_store import (
    RetainedConfig,
    RetainedCursor,
    RetainedMessage,
    RetainedStore,
)
from router.state.scripts import RedisClient
from tests.state import test_scripts as state_scripts
from tests.support import waiting

TOPICS = [
    "a",
    "a/b",
    "a/b/c",
    "a/b/c/d",
    "a/x/c",
    "a//c",
    "a/b-1/c",
    "ab/c",
    "/lead",
    "/",
    "$SYS/uptime",
    "$SYS/a/b",
    "sport/tennis/player1",
    "sport/tennis/player1/ranking",
    "ünï/cödé",
    "{x}/y",
    "%7B/y",
]

FILTERS = [
    "#",
    "+",
    "+/#",
    "+/+",
    "+/b/#",
    "+/+/c",
    "a",
    "a/#",
    "a/+",
    "a/+/c",
    "a/b/#",
    "a/b/+",
    "a/+/c/#",
    "a/b/c/d/#",
    "a/b/c/d/e",
    "/#",
    "/+",
    "+/lead",
    "$SYS/#",
    "$SYS/+",
    "$SYS/+/b",
    "sport/tennis/+",
    "sport/#",
    "ünï/+",
    "{x}/#",
    "%7B/+",
    "nothing/#",
]


def topics_of(messages: Iterable[RetainedMessage]) -> list[str]:
    return [m.topic for m in messages]


def store_order(topics: Iterable[str]) -> list[str]:
    """(first level, topic) in byte order: the store's own order."""
    return sorted(topics, key=lambda t: (t.partition("/")[0].encode(), t.encode()))


async def fill(store: RetainedStore, topics: Iterable[str], **options: Any) -> None:
    for topic in topics:
        await store.store(topic, topic.encode(), **options)


@pytest.fixture
def store(redis_client: RedisClient, keys: Keys) -> RetainedStore:
    return RetainedStore(redis_client, keys)


RETAINED_SCRIPTS = [name for name in state_scripts.lua_files() if name.startswith("retained_")]


def test_the_retained_scripts_are_the_ones_the_store_runs() -> None:
    source = Path(router.state.retained_store.__file__).read_text(encoding="utf-8")
    assert set(RETAINED_SCRIPTS) == set(re.findall(r'"(retained_[a-z]+)"', source))


@pytest.mark.parametrize("name", RETAINED_SCRIPTS)
def test_each_retained_script_keeps_the_script_contract(name: str) -> None:
    """The state layer's rule: a KEYS/ARGV/returns header, and locals only."""
    state_scripts.test_each_script_opens_with_its_contract_and_uses_locals_only(name)


# -- one topic ---------------------------------------------------------------------------


async def test_store_get_replace_and_delete_with_an_empty_payload(store: RetainedStore) -> None:
    assert await store.get("home/temp") is None
    assert await store.store("home/temp", b"\x00\xff", qos=2, message_id=b"i" * 16, publisher="p1")
    assert await store.get("home/temp") == RetainedMessage(
        "home/temp", b"\x00\xff", 2, b"i" * 16, "p1", None
    )
    assert not await store.store("home/temp", b"21.5", qos=1)
    assert await store.get("home/temp") == RetainedMessage("home/temp", b"21.5", 1)
    assert await store.size() == 1
    # A retain publish with an empty payload deletes the topic's message.
    assert not await store.store("home/temp", b"")
    assert await store.get("home/temp") is None
    assert await store.size() == 0
    assert not await store.store("home/temp", b"")  # deleting nothing is fine


async def test_a_topic_is_not_a_prefix_of_its_neighbours(store: RetainedStore) -> None:
    await fill(store, ["a/b", "a/bc", "a/b/c", "ab"])
    assert (await store.get("a/b")) is not None
    assert await store.delete("a/b") == 1
    assert topics_of((await store.scan()).messages) == ["a/b/c", "a/bc", "ab"]


# -- matching ----------------------------------------------------------------------------


async def test_match_agrees_with_the_topic_rules_for_every_filter(store: RetainedStore) -> None:
    await fill(store, TOPICS)
    for topic_filter in FILTERS:
        expected = store_order(t for t in TOPICS if matches(topic_filter, t))
        batch = await store.match(topic_filter, limit=1000)
        assert topics_of(batch.messages) == expected, topic_filter
        assert batch.cursor is None
    # '#' and '+' at the first level skip '$' topics; '$SYS/#' does not.
    assert "$SYS/uptime" not in topics_of((await store.match("#")).messages)
    assert "$SYS/uptime" in topics_of((await store.match("$SYS/#")).messages)


async def test_match_goes_on_from_a_cursor_in_bounded_batches(store: RetainedStore) -> None:
    topics = [f"s{shard}/t/{i:02}" for shard in range(4) for i in range(12)] + ["$SYS/t/x"]
    await fill(store, topics)
    for topic_filter, limit in [("#", 5), ("+/t/+", 7), ("s2/#", 5), ("s1/t/+", 12)]:
        seen: list[str] = []
        cursor = None
        while True:
            batch = await store.match(topic_filter, cursor, limit=limit)
            assert len(batch.messages) <= limit
            seen += topics_of(batch.messages)
            if batch.cursor is None:
                break
            cursor = batch.cursor
        assert seen == store_order(t for t in topics if matches(topic_filter, t)), topic_filter
    streamed = [m.topic async for m in store.iter_match("+/t/+", batch_size=3)]
    assert streamed == store_order(t for t in topics if not t.startswith("$"))


async def test_a_script_call_looks_at_a_bounded_number_of_topics(
    store: RetainedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router.state.retained_store, "SCAN_BUDGET", 4)
    await fill(store, [f"a/x/{i:02}" for i in range(10)] + ["a/y/1", "a/y/2"])
    batch = await store.match("a/+/1", limit=5)
    assert topics_of(batch.messages) == ["a/y/1"]
    assert batch.examined == 12
    assert await store.delete("a/x/+") == 10
    assert topics_of((await store.scan()).messages) == ["a/y/1", "a/y/2"]


async def test_a_literal_prefix_looks_at_no_topic_outside_it(store: RetainedStore) -> None:
    inside = [f"a/b/{i}" for i in range(6)]
    outside = ["a", "a/b-1/0", "a/ba/0", "a/c/0", "a/c/1", "ab/0", "b/b/0", "/b/0"]
    await fill(store, [*inside, "a/b", *outside])
    plus = await store.match("a/b/+")
    assert topics_of(plus.messages) == inside
    assert plus.examined == len(inside)
    hashed = await store.match("a/b/#")
    assert topics_of(hashed.messages) == ["a/b", *inside]
    assert hashed.examined == len(inside) + 1  # the parent level 'a/b', looked up on its own
    exact = await store.match("a/b/3")
    assert (topics_of(exact.messages), exact.examined) == (["a/b/3"], 1)
    deep = await store.match("a/b/3/#")
    assert (topics_of(deep.messages), deep.examined) == (["a/b/3"], 1)


@pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)
async def test_a_literal_first_level_touches_only_its_own_shard(
    store: RetainedStore, redis_standalone_url: str, keys: Keys
) -> None:
    await fill(store, ["a/b/1", "a/b/2", "a/c/1", "b/b/1", "$SYS/b/1"])
    monitor_client = Redis.from_url(redis_standalone_url)
    marker = f"end-of-{keys.prefix}"
    try:
        async with monitor_client.monitor() as monitor:
            found = await store.match("a/b/+")
            await store.redis.echo(marker)
            commands = []
            while True:
                info = await monitor.next_command()
                if marker in info["command"]:
                    break
                commands.append(info["command"])
    finally:
        await monitor_client.aclose()
    assert topics_of(found.messages) == ["a/b/1", "a/b/2"]
    shard = keys.retained_shard("a")
    touched = [c for c in commands if keys.prefix in c]
    assert touched, commands
    assert all(shard in c for c in touched), touched
    assert not any("{retained}" in c or "{r:b}" in c or "{r:$SYS}" in c for c in commands)
    [scan_range] = [c for c in commands if c.startswith("ZRANGEBYLEX")]
    assert "[a/b/" in scan_range
    assert not any("a/c/" in c for c in commands)


async def test_shared_or_invalid_filters_are_refused(store: RetainedStore) -> None:
    await fill(store, ["a/b"])
    for bad in ["$share/g/a/#", "a/#/b", "a+", "", "$share/g"]:
        with pytest.raises(InvalidTopicError):
            await store.match(bad)
        with pytest.raises(InvalidTopicError):
            await store.delete(bad)
    with pytest.raises(RetainedArgumentError):
        await store.match("a/#", limit=0)
    with pytest.raises(RetainedArgumentError):
        await store.match("a/#", RetainedCursor("b"))
    assert await store.size() == 1


# -- deleting ----------------------------------------------------------------------------


async def test_a_wildcard_delete_removes_every_match_and_nothing_else(
    store: RetainedStore,
) -> None:
    await fill(store, TOPICS)
    removed = [t for t in TOPICS if matches("+/+/c", t)]
    assert await store.delete("+/+/c") == len(removed)
    left = store_order(t for t in TOPICS if t not in removed)
    assert topics_of((await store.scan(limit=100)).messages) == left
    assert await store.size() == len(left)
    assert await store.delete("#") == len([t for t in left if not t.startswith("$")])
    assert topics_of((await store.scan()).messages) == ["$SYS/a/b", "$SYS/uptime"]
    assert await store.clean() == 2
    assert await store.size() == 0
    assert (await store.page(1)).messages == []


# -- paging and scanning -----------------------------------------------------------------


async def test_pages_through_the_whole_store_with_has_next(store: RetainedStore) -> None:
    topics = [f"{level}/{i}" for level in ("a", "b", "$SYS", "c") for i in range(6)] + ["d"]
    await fill(store, topics)
    ordered = store_order(topics)
    pages = [await store.page(n, limit=10) for n in (1, 2, 3, 4)]
    assert [topics_of(p.messages) for p in pages] == [
        ordered[:10],
        ordered[10:20],
        ordered[20:],
        [],
    ]
    assert [p.has_next for p in pages] == [True, True, False, False]
    exact = await store.page(5, limit=5)
    assert (topics_of(exact.messages), exact.has_next) == (ordered[20:25], False)
    assert (await store.page(4, limit=6)).has_next  # the page ends where shard 'c' ends
    with pytest.raises(RetainedArgumentError):
        await store.page(0)


async def test_scan_yields_every_topic_in_bounded_batches(store: RetainedStore) -> None:
    await fill(store, TOPICS)
    batches = [batch async for batch in store.iter_batches(batch_size=4)]
    assert all(1 <= len(batch) <= 4 for batch in batches)
    assert [m.topic for batch in batches for m in batch] == store_order(TOPICS)
    assert await store.size() == len(TOPICS)


async def test_concurrent_creates_of_one_topic_count_once(redis_connect: Any, keys: Keys) -> None:
    stores = [RetainedStore(await redis_connect(), keys) for _ in range(4)]
    created = await asyncio.gather(
        *(s.store("race/t", str(i).encode()) for i, s in enumerate(stores * 3))
    )
    assert sum(created) == 1
    assert await stores[0].size() == 1
    assert (await stores[0].page(1)).messages[0].topic == "race/t"


# -- expiry ------------------------------------------------------------------------------


async def set_expiry(store: RetainedStore, topic: str, ms_from_now: int) -> None:
    """Move a stored message's expiry to ``ms_from_now`` on the server's clock."""
    expiry_key = store.keys.retained_shard_keys(topic.partition("/")[0])[2]
    script = (
        "local t = redis.call('TIME') "
        "local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2]) "
        "redis.call('ZADD', KEYS[1], string.format('%.0f', at), ARGV[1])"
    )
    await store.redis.eval(script, 1, expiry_key, topic, str(ms_from_now))


async def test_expiry_is_reduced_by_the_time_stored(store: RetainedStore) -> None:
    await store.store("s/t", b"x", expiry_interval=100)
    assert 99 <= ((await store.get("s/t")) or RetainedMessage("", b"")).expiry_interval <= 100
    await set_expiry(store, "s/t", 4_200)  # as if stored about 96 s ago
    assert (await store.get("s/t")) == RetainedMessage("s/t", b"x", expiry_interval=5)
    assert (await store.match("s/#")).messages[0].expiry_interval == 5
    # Replacing without an expiry keeps the new message forever.
    await store.store("s/t", b"y")
    assert (await store.get("s/t")) == RetainedMessage("s/t", b"y")


async def test_an_expired_message_is_invisible_before_it_is_cleared(
    store: RetainedStore,
) -> None:
    await fill(store, ["s/live", "s/old", "t/old"], expiry_interval=3600)
    await set_expiry(store, "s/old", -1)
    await set_expiry(store, "t/old", -1)
    assert await store.get("s/old") is None
    assert topics_of((await store.match("#")).messages) == ["s/live"]
    assert topics_of((await store.page(1)).messages) == ["s/live"]
    assert await store.size() == 3  # stored until cleared, as EMQX counts
    run = await store.clear_expired(limit=1)
    assert (run.removed, run.cursor) == (1, "s")
    run = await store.clear_expired(run.cursor, max_shards=1)
    assert (run.removed, run.cursor) == (0, "t")
    run = await store.clear_expired(run.cursor)
    assert (run.removed, run.cursor) == (1, None)
    assert await store.size() == 1
    assert topics_of((await store.scan()).messages) == ["s/live"]


async def test_a_message_expires_on_redis_time(store: RetainedStore) -> None:
    await store.store("s/brief", b"x", expiry_interval=1)
    await store.store("s/stays", b"y")
    await waiting.eventually(lambda: _is_gone(store, "s/brief"), 5.0, "s/brief to expire after 1 s")
    assert topics_of((await store.match("s/+")).messages) == ["s/stays"]


async def _is_gone(store: RetainedStore, topic: str) -> bool:
    return await store.get(topic) is None


async def test_clearing_expired_messages_is_bounded_per_call(store: RetainedStore) -> None:
    topics = [f"{level}/{i}" for level in ("e1", "e2", "e3") for i in range(5)]
    await fill(store, topics, expiry_interval=3600)
    for topic in topics:
        await set_expiry(store, topic, -1)
    runs = []
    cursor = None
    while True:
        run = await store.clear_expired(cursor, limit=4, max_shards=2)
        assert run.removed <= 4
        runs.append(run.removed)
        if run.cursor is None:
            break
        cursor = run.cursor
    assert sum(runs) == 15 and len(runs) >= 4
    assert await store.size() == 0


# -- limits and bad input ----------------------------------------------------------------


async def test_a_payload_above_the_limit_is_refused(redis_client: RedisClient, keys: Keys) -> None:
    store = RetainedStore(redis_client, keys, RetainedConfig(max_payload=4))
    assert await store.store("p/t", b"1234")
    with pytest.raises(RetainedPayloadTooLargeError) as refused:
        await store.store("p/t", b"12345")
    assert (refused.value.size, refused.value.max_payload) == (5, 4)
    assert (await store.get("p/t")) == RetainedMessage("p/t", b"1234")


async def test_a_full_store_refuses_new_topics_but_replaces_old_ones(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = RetainedStore(redis_client, keys, RetainedConfig(max_count=2))
    await fill(store, ["a/1", "b/1"])
    with pytest.raises(RetainedStoreFullError) as full:
        await store.store("c/1", b"x")
    assert (full.value.topic, full.value.max_count) == ("c/1", 2)
    assert not await store.store("a/1", b"new")
    assert (await store.get("a/1")) == RetainedMessage("a/1", b"new")
    assert await store.get("c/1") is None
    assert await store.size() == 2
    await store.delete("b/1")
    assert await store.store("c/1", b"x")
    unlimited = RetainedStore(redis_client, keys, RetainedConfig(max_count=0))
    await fill(unlimited, [f"d/{i}" for i in range(5)])
    assert await unlimited.size() == 7


async def bytes_held(redis_client: RedisClient, keys: Keys) -> int:
    """What the shards really hold: the packed messages' lengths, summed."""
    total = 0
    async for key in redis_client.scan_iter(match=f"{keys.prefix}:{{r:*}}:messages"):
        for value in (await redis_client.hgetall(key)).values():
            total += len(value)
    return total


async def test_the_store_counts_the_bytes_its_messages_hold(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = RetainedStore(redis_client, keys)
    await store.store("a/1", b"x" * 100)
    await store.store("b/1", b"y" * 10, expiry_interval=3600)
    assert await store.stored_bytes() == await bytes_held(redis_client, keys) > 110
    await store.store("a/1", b"z" * 100)  # (the same size: the count stays)
    await store.store("a/1", b"z" * 400)
    await store.store("a/1", b"z" * 50)
    assert await store.stored_bytes() == await bytes_held(redis_client, keys)
    await set_expiry(store, "b/1", -1)
    assert (await store.clear_expired()).removed == 1
    assert await store.stored_bytes() == await bytes_held(redis_client, keys)
    await store.store("a/2", b"w")
    assert await store.delete("a/#") == 2
    assert await store.stored_bytes() == 0 == await bytes_held(redis_client, keys)


async def test_a_store_past_its_bytes_refuses_growth_but_not_replacements(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = RetainedStore(redis_client, keys, RetainedConfig(max_bytes=1000))
    await store.store("a/1", b"x" * 600)
    with pytest.raises(RetainedBytesFullError) as full:
        await store.store("b/1", b"y" * 600)  # a new topic
    assert (full.value.topic, full.value.max_bytes) == ("b/1", 1000)
    assert isinstance(full.value, RetainedStoreFullError)  # (refused as a full store is)
    with pytest.raises(RetainedBytesFullError):
        await store.store("a/1", b"x" * 1200)  # a replacement that grows
    await store.store("a/1", b"q" * 600)  # the same size: goes
    await store.store("a/1", b"s" * 300)  # smaller: goes, and frees room
    assert await store.store("b/1", b"y" * 600)
    assert await store.size() == 2  # (the refused topic gave its reserved room back)
    assert await store.get("a/1") == RetainedMessage("a/1", b"s" * 300)
    held = await bytes_held(redis_client, keys)
    assert await store.stored_bytes() == held <= 1000


async def test_bad_input_is_refused_and_changes_nothing(store: RetainedStore) -> None:
    for topic in ["a/+", "a/#", "", "a\x00b"]:
        with pytest.raises(InvalidTopicError):
            await store.store(topic, b"x")
        if topic:
            with pytest.raises(InvalidTopicError):
                await store.get(topic)
    for options in [{"qos": 3}, {"expiry_interval": 0}, {"expiry_interval": 2**32}]:
        with pytest.raises(RetainedArgumentError):
            await store.store("a/b", b"x", **options)
    with pytest.raises(TypeError):
        await store.store("a/b", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.store("a/b", b"x", message_id="not bytes")  # type: ignore[arg-type]
    assert await store.size() == 0
    assert (await store.scan()).messages == []


def test_limits_validate_themselves() -> None:
    from router.errors import InvalidSettingError

    for bad in [{"max_count": -1}, {"max_payload": 1.5}, {"clear_interval": -1}, {"max_bytes": -1}]:
        with pytest.raises(InvalidSettingError):
            RetainedConfig(**bad)


async def test_hostile_first_levels_get_shards_of_their_own(store: RetainedStore) -> None:
    levels = ["{", "}", "{}", "%7B", "%", "r:x}", "", " ", "☃"]
    topics = [f"{level}/t" for level in levels]
    await fill(store, topics)
    assert topics_of((await store.match("+/t", limit=100)).messages) == store_order(topics)
    for topic in topics:
        assert (await store.get(topic)) == RetainedMessage(topic, topic.encode())
        assert topics_of((await store.match(topic.partition("/")[0] + "/#")).messages) == [topic]
    assert await store.delete("{/t") == 1
    assert await store.size() == len(levels) - 1
