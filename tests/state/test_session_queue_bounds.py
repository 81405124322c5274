"""A session queue's limit holds while an append skips reading the backlog it can bound.

The spiller's :class:`SessionQueue` keeps the reader's cursor it last read and the
clock its last append reached: while their difference is within the limit, an append
needs no read before it (``drop_newest``) nor after it (``drop_oldest``). Random
interleavings of appends (the spiller's object, and fresh ones as a recovery or a
handoff writes), drains (a resuming node) and the queue lost in Redis and made again,
checked against a model of what the client must read; on a real Redis.
"""

from __future__ import annotations

import asyncio
from itertools import count
from typing import Literal
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from redis.asyncio import Redis

from router.core.messages import Delivery
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_queue import SessionQueue, pack_delivery
from tests.conftest import delete_namespace

LIMIT = 5

Step = tuple[Literal["spill", "copies", "drain", "lost"], int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("spill"), st.integers(1, 4)),
        st.tuples(st.just("copies"), st.integers(1, 3)),
        st.tuples(st.just("drain"), st.integers(1, 6)),
        st.tuples(st.just("lost"), st.just(0)),
    ),
    max_size=30,
)


def copy(n: int) -> Delivery:
    return Delivery("news", str(n).encode(), 1, False, n.to_bytes(16, "big"))


async def replay(
    client: RedisClient,
    keys: Keys,
    plan: list[Step],
    overflow: Literal["drop_oldest", "drop_newest"],
) -> None:
    spiller = SessionQueue(client, keys, "roamer", 600)
    reader = SessionQueue(client, keys, "roamer", 600)
    model: list[int] = []
    serial = count(1)
    await spiller.ensure()
    try:
        for action, n in plan:
            if action in ("spill", "copies"):
                batch = [next(serial) for _ in range(n)]
                queue = spiller if action == "spill" else SessionQueue(client, keys, "roamer", 600)
                stored, dropped = await queue.append([copy(i) for i in batch], LIMIT, overflow)
                if overflow == "drop_oldest":
                    model += batch
                    expected_dropped = max(len(model) - LIMIT, 0)
                    del model[:expected_dropped]
                    assert (stored, dropped) == (n, expected_dropped)
                else:
                    room = max(LIMIT - len(model), 0)
                    model += batch[:room]
                    assert (stored, dropped) == (min(n, room), n - min(n, room))
                assert await reader.backlog() == len(model) <= LIMIT
            elif action == "drain":
                drained = await reader.drain(max=n)
                assert [int(d.payload) for d in drained.deliveries] == model[:n]
                del model[:n]
            else:
                await delete_namespace(client, keys)
                await spiller.ensure()  # (the node restores what Redis lost)
                model.clear()
        drained = await reader.drain(max=100)
        assert [int(d.payload) for d in drained.deliveries] == model
    finally:
        await spiller.aclose()
        await reader.aclose()


@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
def test_the_limit_holds_in_any_order_of_appends_reads_and_losses(
    overflow: Literal["drop_oldest", "drop_newest"], redis_standalone_url: str
) -> None:
    with asyncio.Runner() as runner:
        client = Redis.from_url(redis_standalone_url)

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(plan=steps)
        def check(plan: list[Step]) -> None:
            keys = Keys(prefix=f"qb{uuid4().hex[:10]}")
            try:
                runner.run(replay(client, keys, plan, overflow))
            finally:
                runner.run(delete_namespace(client, keys))

        try:
            check()
        finally:
            runner.run(client.aclose())


@pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)
async def test_an_append_with_room_known_reads_no_backlog(
    redis_client: RedisClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, every append read the backlog (a second round trip per spilled copy)."""
    queue = SessionQueue(redis_client, keys, "roamer", 600)
    await queue.ensure()
    reads = 0
    position = queue.channel.position

    async def counted(subscriber: str) -> tuple[int, int] | None:
        nonlocal reads
        reads += 1
        return await position(subscriber)

    monkeypatch.setattr(queue.channel, "position", counted)
    for n in range(1, 4):
        await queue.append([copy(n)], 3, "drop_oldest")
    assert reads == 1  # the first append learns the cursor; the next two know the room
    await queue.append([copy(4)], 3, "drop_oldest")
    assert reads == 2  # past the limit: read, and the oldest made room
    drained = await queue.drain()
    await queue.aclose()
    assert [d.payload for d in drained.deliveries] == [b"2", b"3", b"4"]


# -- bytes -------------------------------------------------------------------------------

MAX_BYTES = 400

sized_steps = st.lists(
    st.one_of(
        st.tuples(st.just("spill"), st.lists(st.integers(1, 300), min_size=1, max_size=4)),
        st.tuples(st.just("drain"), st.integers(1, 6)),
    ),
    max_size=25,
)


def sized_copy(n: int, size: int) -> Delivery:
    return Delivery("news", str(n).encode().ljust(size, b"."), 1, False, n.to_bytes(16, "big"))


def packed_size(delivery: Delivery) -> int:
    return len(pack_delivery(delivery))


async def replay_bytes(
    client: RedisClient,
    keys: Keys,
    plan: list[tuple[str, object]],
    overflow: Literal["drop_oldest", "drop_newest"],
    together: bool,
) -> None:
    spiller = SessionQueue(client, keys, "roamer", 600)
    reader = SessionQueue(client, keys, "roamer", 600)
    model: list[Delivery] = []
    serial = count(1)
    await spiller.ensure()
    try:
        for action, value in plan:
            if action == "spill":
                assert isinstance(value, list)
                batch = [sized_copy(next(serial), size) for size in value]
                if together:
                    [outcome] = await SessionQueue.append_each(
                        [(spiller, batch)], LIMIT, overflow, MAX_BYTES
                    )
                    assert isinstance(outcome, tuple)
                    stored, dropped = outcome
                else:
                    stored, dropped = await spiller.append(batch, LIMIT, overflow, MAX_BYTES)
                before = len(model)
                if overflow == "drop_oldest":
                    model += batch
                    del model[: max(len(model) - LIMIT, 0)]
                    while len(model) > 1 and sum(map(packed_size, model)) > MAX_BYTES:
                        del model[0]
                    assert stored == len(batch)
                else:
                    room = max(LIMIT - len(model), 0)
                    held = sum(map(packed_size, model))
                    for delivery in batch[:room]:
                        if held + packed_size(delivery) > MAX_BYTES and (
                            held or len(model) > before
                        ):
                            break
                        model.append(delivery)
                        held += packed_size(delivery)
                    assert stored == len(model) - before
                assert stored + before - dropped == len(model) or overflow == "drop_newest"
                assert await reader.queued_bytes() == sum(map(packed_size, model))
                assert len(model) == 1 or sum(map(packed_size, model)) <= MAX_BYTES
            else:
                assert isinstance(value, int)
                drained = await reader.drain(max=value)
                assert drained.deliveries == model[:value]
                del model[:value]
                assert await reader.queued_bytes() == sum(map(packed_size, model))
        drained = await reader.drain(max=100)
        assert drained.deliveries == model
        assert await reader.queued_bytes() == 0
    finally:
        await spiller.aclose()
        await reader.aclose()


@pytest.mark.parametrize("together", [False, True], ids=["append", "append_each"])
@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
def test_the_byte_bound_holds_in_any_order_of_appends_and_reads(
    overflow: Literal["drop_oldest", "drop_newest"], together: bool, redis_standalone_url: str
) -> None:
    with asyncio.Runner() as runner:
        client = Redis.from_url(redis_standalone_url)

        @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(plan=sized_steps)
        def check(plan: list[tuple[str, object]]) -> None:
            keys = Keys(prefix=f"qb{uuid4().hex[:10]}")
            try:
                runner.run(replay_bytes(client, keys, plan, overflow, together))
            finally:
                runner.run(delete_namespace(client, keys))

        try:
            check()
        finally:
            runner.run(client.aclose())
