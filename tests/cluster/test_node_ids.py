"""Message ids on running nodes: increasing per node, distinct across nodes, what dedup uses."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Forward
from router.cluster.node import RouterNode
from router.core import guid
from router.core.messages import Message, Outgoing
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def publish_ids(node: RouterNode, count: int) -> list[bytes]:
    batch = [Outgoing(f"t/{index}", b"") for index in range(count)]
    results = await node.publish_many(batch)
    results.append(await node.publish("t/last", b""))
    return [result.message_id for result in results]


async def test_ids_of_one_node_strictly_increase(start_node: StartNode) -> None:
    node = await start_node("a")
    ids = await publish_ids(node, 5_000)
    assert all(a < b for a, b in itertools.pairwise(ids))  # bytes order is numeric order
    assert len({guid.parse(i).node for i in ids}) == 1


async def test_two_nodes_and_a_restart_never_share_ids(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    from_a, from_b = await asyncio.gather(publish_ids(a, 5_000), publish_ids(b, 5_000))
    assert not set(from_a) & set(from_b)
    await a.stop()
    again = await start_node("a")  # the same node id, a new incarnation: a new node part
    from_again = await publish_ids(again, 100)
    nodes = {guid.parse(ids[0]).node for ids in (from_a, from_b, from_again)}
    assert len(nodes) == 3
    assert not set(from_again) & (set(from_a) | set(from_b))


async def test_forwarding_deduplicates_on_the_message_id(
    start_node: StartNode, redis_connect: Any, keys: Keys
) -> None:
    b = await start_node("b")
    await b.subscribe("c", "t/#")
    ids = guid.GuidGenerator(guid.node_part_for("sender", "test"))
    first, second = (Message(ids.new_bytes(), "t/x", b"same payload") for _ in range(2))
    sender = Forwarder(await redis_connect(), keys, expire=60)
    try:
        # Two batches with different batch ids (the channel stores both); the first
        # message is in both, as when a sender retries after a lost answer.
        await sender.send("b", [Forward(first)])
        await sender.send("b", [Forward(first), Forward(second)])
        await waiting.eventually(
            lambda: b.stats()["received"] + b.stats()["duplicates_dropped"] == 3,
            5.0,
            "both batches dispatched",
        )
    finally:
        await sender.stop()
    got = await take(b, "c", 2)
    assert [d.message_id for d in got] == [first.id, second.id]  # same content, two ids
    assert b.stats()["duplicates_dropped"] == 1
    assert b.sessions.session("c").pending() == 0


async def test_a_batch_that_cannot_be_packed_fails_its_senders_and_the_next_goes(
    start_node: StartNode, redis_connect: Any, keys: Keys
) -> None:
    """Before, a bug in a send (here a payload that is not bytes: msgpack cannot pack it)
    ended the node's outbox: its senders, and every later one, waited forever. Now the
    bug reaches the senders of its batch, with its type, and the next send goes."""
    b = await start_node("b")
    await b.subscribe("c", "t/#")
    ids = guid.GuidGenerator(guid.node_part_for("sender", "test"))
    unpackable: Any = object()
    bad, good = Message(ids.new_bytes(), "t/x", unpackable), Message(ids.new_bytes(), "t/x", b"ok")
    sender = Forwarder(await redis_connect(), keys, expire=60)
    try:
        with pytest.raises(TypeError):
            await asyncio.wait_for(sender.send("b", [Forward(bad)]), 5.0)
        await asyncio.wait_for(sender.send("b", [Forward(good)]), 5.0)
    finally:
        await sender.stop()
    [got] = await take(b, "c", 1)
    assert got.message_id == good.id
