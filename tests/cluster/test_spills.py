"""The copies of many away sessions reach their Redis queues together (a group commit),
and a group Redis refuses is tried again without losing a copy; on real Redis and a
3-master Redis Cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from router.cluster.node import RouterNode
from router.cluster.sessions.local_sessions import ClientSession
from router.cluster.sessions.spills import GROUP, WRITERS, Spills
from router.core.messages import Delivery
from router.errors import RouterError, StateUnavailableError
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_queue import SessionQueue
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

SESSIONS = 300


async def away_sessions(start_node: StartNode, count: int) -> RouterNode:
    """Node a with ``count`` persistent sessions ``s<i>`` on ``fleet/all`` (QoS 1), away."""
    a = await start_node("a")
    for index in range(count):
        await a.connect(f"s{index}", clean_start=False, expiry=600)
        await a.subscribe(f"s{index}", "fleet/all", qos=1, confirm=False)
        await a.put_away(f"s{index}")
    return a


async def test_copies_for_many_away_sessions_go_to_redis_in_a_few_steps(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, each away session's spiller wrote its copies in calls of its own: a
    publish matching 300 away sessions cost 300 round trips (and a backlog read each)."""
    steps: list[int] = []
    append_each = SessionQueue.append_each

    async def counted(
        batches: Sequence[tuple[SessionQueue, Sequence[Delivery]]], *bounds: Any
    ) -> list[tuple[int, int] | RouterError]:
        steps.append(len(batches))
        return await append_each(batches, *bounds)

    a = await away_sessions(start_node, SESSIONS)
    monkeypatch.setattr(SessionQueue, "append_each", staticmethod(counted))
    for sequence in range(3):
        await a.publish("fleet/all", f"{sequence}".encode(), qos=1)
    await waiting.eventually(
        lambda: a.stats()["session_queued"] == 3 * SESSIONS, 10.0, "every copy queued"
    )
    assert sum(steps) <= 3 * SESSIONS
    assert len(steps) <= 3 * SESSIONS // 100  # (groups of up to 200)
    b = await start_node("b")
    for index in range(SESSIONS):
        assert await b.connect(f"s{index}", clean_start=False, expiry=600)
        got = await take(b, f"s{index}", 3)
        assert [d.payload for d in got] == [b"0", b"1", b"2"], f"s{index}"


async def test_a_group_redis_refuses_is_written_again_in_order(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = 0
    append_each = SessionQueue.append_each

    async def refuse_twice(*args: Any) -> list[tuple[int, int] | RouterError]:
        nonlocal refused
        if refused < 2:
            refused += 1
            raise StateUnavailableError(RedisConnectionError("refused by the test"))
        return await append_each(*args)

    a = await away_sessions(start_node, 20)
    monkeypatch.setattr(SessionQueue, "append_each", staticmethod(refuse_twice))
    for sequence in range(4):
        await a.publish("fleet/all", f"{sequence}".encode(), qos=1)
    await waiting.eventually(lambda: a.stats()["session_queued"] == 80, 10.0, "every copy queued")
    assert refused == 2
    for index in range(20):
        assert await a.connect(f"s{index}", clean_start=False, expiry=600)
        got = await take(a, f"s{index}", 4)
        assert [d.payload for d in got] == [b"0", b"1", b"2", b"3"], f"s{index}"


AT_ONCE = GROUP * WRITERS + GROUP // 2
"""Sessions spilling at once in the writers test: enough for every writer to run."""
ROUNDS = 3


def numbered(session: int, seq: int) -> Delivery:
    return Delivery(f"fleet/{session}", f"{seq}".encode(), 1, False, f"{session}:{seq}".encode())


async def test_many_sessions_spilling_at_once_keep_each_ones_order(
    redis_client: RedisClient, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each session spills ``ROUNDS`` copies one after the other (as its spiller does:
    the next once the last is in); the groups of all of them are written by several
    writers at the same time, and every queue reads back complete and in order."""
    spills = Spills(1_000, "drop_oldest")
    at_once = most = 0
    append_each = SessionQueue.append_each

    async def counted(*group: Any) -> list[tuple[int, int] | RouterError]:
        nonlocal at_once, most  # (each group is one call, by one writer)
        at_once += 1
        most = max(most, at_once)
        try:
            return await append_each(*group)
        finally:
            at_once -= 1

    monkeypatch.setattr(SessionQueue, "append_each", staticmethod(counted))
    queues = [SessionQueue(redis_client, keys, f"w{i}", 600) for i in range(AT_ONCE)]
    await SessionQueue.ensure_each(queues)

    async def spill(index: int, queue: SessionQueue) -> None:
        session = ClientSession(queue.client_id, 1_000, "drop_oldest")
        for seq in range(ROUNDS):
            assert await spills.write_together(queue, [numbered(index, seq)], session)

    await asyncio.gather(*(spill(i, q) for i, q in enumerate(queues)))

    assert most > 1, "the spills were written by one writer at a time"
    assert spills.queued == AT_ONCE * ROUNDS
    for queue in queues:
        drained = await queue.drain()
        assert [d.payload for d in drained.deliveries] == [b"0", b"1", b"2"], queue.client_id
        await queue.aclose()
