"""Script calls of one loop turn go to a standalone server in one pipeline, and each
caller still sees its own reply, its own refusal, or the error that failed them all; the
batched reads of plain commands go through the same packing and answer as redis-py's
pipeline does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Connection, Redis
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    DataError,
    ResponseError,
    TimeoutError as RedisTimeoutError,
)

from router.errors import ScriptError, StateFailureError
from router.state.keys import Keys
from router.state.reads import command, commands_each, read_each
from router.state.scripts import Scripts, turn_batch
from router.state.turn_batch import BATCH_LIMIT, TurnBatch, pack_evalsha

# INCR KEYS[1] by ARGV[1]; refuses 'no' as the increment, as the router's scripts refuse.
COUNT = """
if ARGV[1] == 'no' then
  return redis.error_reply('ROUTER_INVALID no increment')
end
return redis.call('INCRBY', KEYS[1], ARGV[1])
"""


@pytest.fixture
async def redis(redis_standalone_url: str, keys: Keys) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_standalone_url)
    try:
        yield client
    finally:
        await client.delete(f"{keys.prefix}:n")
        await client.aclose()


@dataclass
class Counter:
    """COUNT on one key, called through a batch of its own."""

    batch: TurnBatch
    sha: str
    key: str

    async def add(self, by: object = 1) -> Any:
        return await self.batch.evalsha(self.sha, [self.key], [by])


@pytest.fixture
async def counter(redis: Redis, keys: Keys) -> Counter:
    return Counter(TurnBatch(redis), await redis.script_load(COUNT), f"{keys.prefix}:n")


async def test_the_calls_of_one_turn_share_one_pipeline_and_keep_their_order(
    counter: Counter,
) -> None:
    replies = await asyncio.gather(*(counter.add() for _ in range(300)))
    assert replies == list(range(1, 301))  # (each caller its own reply, in call order)
    assert counter.batch.pipelines == 1


async def test_a_turn_of_more_calls_than_the_limit_sends_several_pipelines(
    counter: Counter,
) -> None:
    calls = BATCH_LIMIT * 2 + 1
    replies = await asyncio.gather(*(counter.add() for _ in range(calls)))
    assert sorted(replies) == list(range(1, calls + 1))
    assert counter.batch.pipelines == 3


async def test_a_refusal_reaches_its_own_caller_only(counter: Counter) -> None:
    first, refused, last = await asyncio.gather(counter.add(), counter.add("no"), counter.add())
    assert (first, last) == (1, 2)
    assert isinstance(refused, ResponseError)
    assert counter.batch.pipelines == 1


async def test_a_call_cancelled_before_its_turn_ends_is_not_sent(
    counter: Counter, redis: Redis
) -> None:
    cancelled = asyncio.ensure_future(counter.add(100))
    kept = asyncio.ensure_future(counter.add())
    await asyncio.sleep(0)  # (both calls are waiting for the end of the turn)
    cancelled.cancel()
    assert await kept == 1
    assert int(await redis.get(counter.key)) == 1  # (the cancelled increment never ran)


async def test_a_lost_connection_fails_every_call_of_the_pipeline(keys: Keys) -> None:
    unreachable = Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    batch = TurnBatch(unreachable)
    try:
        results = await asyncio.gather(
            *(batch.evalsha("0" * 40, [f"{keys.prefix}:n"], [1]) for _ in range(3)),
            return_exceptions=True,
        )
    finally:
        await unreachable.aclose()
    assert all(isinstance(result, RedisConnectionError) for result in results)


@dataclass
class Claims:
    """``client_claim`` on one client's keys through the client's :class:`Scripts`, the
    script loaded (its first call is not batched) and the keys deleted afterwards."""

    scripts: Scripts
    batch: TurnBatch
    client_keys: list[str]

    def call(self, node: str) -> tuple[list[str], list[str]]:
        return self.client_keys, [node, "keep", "", "shared"]

    async def claim(self, node: str) -> Any:
        return await self.scripts.run("client_claim", *self.call(node))


@pytest.fixture
async def claims(redis: Redis, keys: Keys) -> AsyncIterator[Claims]:
    batch = turn_batch(redis)
    assert batch is not None
    made = Claims(Scripts(redis), batch, [f"{keys.prefix}:{{c:x}}:{part}" for part in range(8)])
    await made.claim("n0")
    try:
        yield made
    finally:
        await redis.delete(*made.client_keys)


async def test_scripts_batch_a_standalone_clients_calls_and_raise_refusals(
    claims: Claims,
) -> None:
    before = claims.batch.pipelines
    made = await asyncio.gather(*(claims.claim("n1") for _ in range(5)))
    assert len({claim[2] for claim in made}) == 5  # (five claims, one after another)
    assert claims.batch.pipelines == before + 1
    with pytest.raises(ScriptError):
        await claims.claim("")


async def test_scripts_load_a_flushed_script_again_and_go_on(claims: Claims, redis: Redis) -> None:
    await redis.script_flush()
    assert int((await claims.claim("n1"))[2]) > 0


@pytest.mark.parametrize(
    "args",
    [
        ["n1", "keep", "", "shared"],
        [0, -1, 2**53, 1.5, 0.1, 1e-07],
        [b"\x00\xff", bytearray(b"ab"), memoryview(b"cd"), "ü{}%\r\n"],
    ],
)
def test_calls_are_packed_byte_for_byte_as_redis_py_packs_them(args: list[object]) -> None:
    keys = ["rt:{c:ü}:subs", "rt:{c:ü}:owner"]
    expected = b"".join(
        bytes(chunk) for chunk in Connection().pack_command("EVALSHA", "a" * 40, 2, *keys, *args)
    )
    assert pack_evalsha("a" * 40, keys, args) == expected


@pytest.mark.parametrize("value", [True, None, object(), [1]])
def test_a_value_redis_cannot_take_is_refused_before_anything_is_sent(value: object) -> None:
    with pytest.raises(DataError):
        pack_evalsha("a" * 40, ["k"], [value])


async def test_run_many_sends_its_calls_at_once_and_returns_refusals_in_place(
    claims: Claims,
) -> None:
    before = claims.batch.pipelines
    good, bad = claims.call("n2"), claims.call("")
    first, refused, last = await claims.scripts.run_many("client_claim", [good, bad, good])
    assert isinstance(refused, ScriptError)
    assert int(last[2]) > int(first[2])
    assert claims.batch.pipelines == before + 1


async def test_batched_reads_go_through_the_batch_and_answer_as_redis_pys_pipeline(
    redis: Redis, keys: Keys
) -> None:
    hash_key, count_key = f"{keys.prefix}:h", f"{keys.prefix}:n"
    await redis.hset(hash_key, mapping={"a": "1", "b": b"\xff"})
    calls: list[tuple[Any, ...]] = [
        ("HGETALL", hash_key),
        ("HGETALL", f"{keys.prefix}:none"),
        ("HMGET", hash_key, "a", "z"),
        ("GET", f"{keys.prefix}:none"),
        ("INCRBY", count_key, 3),
        ("EXPIRE", count_key, 100),
        ("EXPIRE", f"{keys.prefix}:none", 5),
    ]
    try:
        pipe = redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call)
        expected = await pipe.execute()
        await redis.delete(count_key)
        batch = turn_batch(redis)
        assert batch is not None
        before = batch.pipelines
        replies = await commands_each(redis, [calls[:3], calls[3:]])
        assert batch.pipelines == before + 1  # (hiredis-packed: redis-py's pipeline skipped)
        assert [*replies[0], *replies[1]] == expected  # (response callbacks applied: a dict,
        assert isinstance(replies[1][2], bool)  # a bool, as redis-py's own pipeline gives)
    finally:
        await redis.delete(hash_key, count_key)


async def test_a_batched_read_with_an_error_reply_raises_it_once_the_others_ran(
    redis: Redis, keys: Keys
) -> None:
    text, count = f"{keys.prefix}:text", f"{keys.prefix}:n"
    await redis.set(text, "x")
    try:
        with pytest.raises(StateFailureError, match="WRONGTYPE"):
            await commands_each(redis, [[("INCRBY", count, 1)], [("HGETALL", text)]])
        assert await redis.get(count) == b"1"
    finally:
        await redis.delete(text)


async def test_batched_reads_of_a_single_connection_client_use_redis_pys_pipeline(
    redis_standalone_url: str, keys: Keys
) -> None:
    client = Redis.from_url(redis_standalone_url, single_connection_client=True)
    try:
        await client.set(f"{keys.prefix}:text", "x")
        assert await read_each(client, "GET", [f"{keys.prefix}:text", f"{keys.prefix}:no"]) == [
            b"x",
            None,
        ]
    finally:
        await client.delete(f"{keys.prefix}:text")
        await client.aclose()


async def test_replies_late_past_the_socket_timeout_fail_the_pipeline_and_drop_its_connection(
    redis_standalone_url: str, redis: Redis, keys: Keys
) -> None:
    slow = Redis.from_url(redis_standalone_url, socket_timeout=0.2)
    batch = TurnBatch(slow)
    try:
        assert await batch.commands_now([("PING",)]) == [b"PONG"]  # (as the server says it)
        await redis.execute_command("CLIENT", "PAUSE", 1000, "ALL")
        with pytest.raises(RedisTimeoutError):
            await batch.commands_now([("GET", f"{keys.prefix}:n")] * 3)
        await redis.execute_command("CLIENT", "UNPAUSE")
        assert await batch.commands_now([("INCRBY", f"{keys.prefix}:n", 2)]) == [2]
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
        await slow.aclose()


async def test_single_commands_of_one_turn_share_the_scripts_pipeline_and_answer_as_redis_py(
    counter: Counter, redis: Redis, keys: Keys
) -> None:
    hash_key = f"{keys.prefix}:h"
    await redis.hset(hash_key, "a", "1")
    batch = turn_batch(redis)
    assert batch is not None
    try:
        before = batch.pipelines
        found, expired, missing, script_reply = await asyncio.gather(
            command(redis, "HGETALL", hash_key),
            command(redis, "EXPIRE", hash_key, 100),
            command(redis, "GET", f"{keys.prefix}:none"),
            Counter(batch, counter.sha, counter.key).add(5),
        )
        assert batch.pipelines == before + 1
        assert (found, expired, missing, script_reply) == ({b"a": b"1"}, True, None, 5)
    finally:
        await redis.delete(hash_key)


async def test_a_single_command_refused_fails_alone(redis: Redis, keys: Keys) -> None:
    text, count = f"{keys.prefix}:text", f"{keys.prefix}:n"
    await redis.set(text, "x")
    try:
        wrong, refused, counted = await asyncio.gather(
            command(redis, "HGETALL", text),
            command(redis, "INCRBY", count, object()),  # type: ignore[arg-type]
            command(redis, "INCRBY", count, 4),
            return_exceptions=True,
        )
        assert isinstance(wrong, StateFailureError) and "WRONGTYPE" in str(wrong)
        assert isinstance(refused, StateFailureError)  # (DataError, before anything is sent)
        assert counted == 4
    finally:
        await redis.delete(text)
