"""A session's queue in Redis keeps deliveries and the markers of a move in their order:
the handoff marker (with the inbound QoS 2 ids, and whether a tail follows) and the tail
end marker; on real Redis and the 3-master cluster."""

from __future__ import annotations

import pytest

from router.core.messages import Delivery
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_queue import READER, Handoff, SessionQueue

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


def copy(n: int) -> Delivery:
    return Delivery("news", str(n).encode(), 1, False, bytes([n]) * 16)


async def test_a_move_reads_back_in_order_with_its_markers(
    redis_client: RedisClient, keys: Keys
) -> None:
    queue = SessionQueue(redis_client, keys, "roamer", 600)
    await queue.ensure()
    await queue.append([copy(1)], 100, "drop_oldest")
    await queue.mark_handoff(7, [3, 5], tail=True)
    await queue.append([copy(2)], 100, "drop_oldest")
    await queue.mark_tail_end(7)
    await queue.mark_handoff(8)

    drained = await queue.drain()
    await queue.aclose()

    assert [d.payload for d in drained.deliveries] == [b"1", b"2"]
    assert drained.handoffs == [Handoff(7, (3, 5), tail=True), Handoff(8, ())]
    assert drained.tail_ends == (7,)
    assert not drained.more


async def test_a_handoff_marker_is_known_to_be_there_before_and_after_it_is_read(
    redis_client: RedisClient, keys: Keys
) -> None:
    queue = SessionQueue(redis_client, keys, "roamer", 600)
    await queue.ensure()
    assert not await queue.handed_off(7)
    await queue.mark_handoff(7, tail=True)
    assert await queue.handed_off(7)
    await queue.drain()
    assert await queue.handed_off(7)
    assert not await queue.handed_off(8)
    await queue.aclose()


async def test_the_queue_limit_never_drops_a_marker_nor_what_comes_after_it(
    redis_client: RedisClient, keys: Keys
) -> None:
    """drop_oldest makes room from the oldest copies before the first marker only: the
    new owner of a moved session reads up to its handoff marker (a marker dropped made
    it wait ``handoff_timeout`` for it); the queue holds more than its limit meanwhile."""
    queue = SessionQueue(redis_client, keys, "roamer", 600)
    await queue.ensure()
    await queue.append([copy(n) for n in range(1, 4)], 3, "drop_oldest")
    await queue.mark_handoff(7, tail=True)
    stored, dropped = await queue.append([copy(4), copy(5)], 3, "drop_oldest")
    assert (stored, dropped) == (2, 3)  # copies 1 to 3 made room (the marker counts)
    stored, dropped = await queue.append([copy(6)], 3, "drop_oldest")
    assert (stored, dropped) == (1, 0)  # the marker is the oldest: four wait

    drained = await queue.drain()
    await queue.aclose()

    assert drained.handoffs == [Handoff(7, (), tail=True)]
    assert [d.payload for d in drained.deliveries] == [b"4", b"5", b"6"]


async def test_queues_made_together_keep_the_readers_they_have_and_make_the_others(
    redis_client: RedisClient, keys: Keys
) -> None:
    """An adoption makes the dead node's queues together: readers that exist are only
    read (their backlog stays), a missing one is made at the clock."""
    kept, lost = (
        SessionQueue(redis_client, keys, "kept", 600),
        SessionQueue(redis_client, keys, "lost", 600),
    )
    for queue in (kept, lost):
        await queue.ensure()
        await queue.append([copy(1), copy(2)], 100, "drop_oldest")
    await redis_client.delete(keys.channel_cursor(keys.client_queue("lost"), READER))
    again = [SessionQueue(redis_client, keys, c, 600) for c in ("kept", "lost", "new")]
    await SessionQueue.ensure_each(again)
    assert [await queue.backlog() for queue in again] == [2, 0, 0]
    assert [d.payload for d in (await again[0].drain()).deliveries] == [b"1", b"2"]
    assert all(queue.channel.epoch for queue in again)
    for queue in (kept, lost, *again):
        await queue.aclose()
