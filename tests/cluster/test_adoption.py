"""A node that dies with many persistent sessions loses none of what was acknowledged:
its sessions are adopted, without waiting for a handoff it will never write, before
its routes are purged. On real Redis and a 3-master Redis Cluster."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.cluster.sessions.adoption import BATCH
from router.errors import StateUnavailableError
from router.state.keys import Keys
from router.state.session_queue import SessionQueue
from tests.support import waiting
from tests.support.nodes import StartNode, die, take

BOTH = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)
STANDALONE = pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)

SESSIONS = 120


async def fleet_node(redis_connect: Callable[..., Any], keys: Keys, node_id: str) -> RouterNode:
    """A node the test kills, holding ``SESSIONS`` persistent sessions ``s<i>``, each
    subscribed at QoS 1 to ``fleet/<i>``, their clients away (what reaches them is
    queued in Redis: a killed node loses what it held in memory for connected ones)."""
    config = NodeConfig(node_id, prefix=keys.prefix, heartbeat_interval=0.2, heartbeat_ttl=1.0)
    node = RouterNode(await redis_connect(), config)
    await node.start()
    for index in range(SESSIONS):
        await node.connect(f"s{index}", clean_start=False, expiry=600)
        await node.subscribe(f"s{index}", f"fleet/{index}", qos=1, confirm=False)
        await node.put_away(f"s{index}")
    await node.confirm_routes()
    return node


@BOTH
async def test_a_dead_nodes_sessions_get_everything_published_before_during_and_after_adoption(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Before: the dead node was purged first and its sessions adopted after, each
    waiting the whole handoff timeout (here 30 s), so publishes in between found no
    route (lost though acknowledged) and the adoption took minutes."""
    await kill_and_check(start_node, redis_connect, keys)


@STANDALONE
async def test_adopted_sessions_go_away_one_by_one_when_redis_refuses_them_together(
    start_node: StartNode,
    redis_connect: Callable[..., Any],
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adoption makes the queues of a batch of sessions in pipelined steps while it
    waits for the mirrors, and puts the batch away together; a batch whose queues Redis
    refused then (both of its two batches) is tried again at the put away, and refused
    there too (both again), put away session by session: nothing is lost."""
    refused = 0
    ensure_each = SessionQueue.ensure_each

    async def refuse_four_times(queues: list[SessionQueue]) -> None:
        nonlocal refused
        if refused < 4:
            refused += 1
            raise StateUnavailableError(RedisConnectionError("refused by the test"))
        await ensure_each(queues)

    monkeypatch.setattr(SessionQueue, "ensure_each", staticmethod(refuse_four_times))
    await kill_and_check(start_node, redis_connect, keys)
    assert refused == 4


async def kill_and_check(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Kill a node with ``SESSIONS`` away sessions while another publishes to each;
    every acknowledged message reaches each session's client on a third node."""
    a = await fleet_node(redis_connect, keys, "a")
    b = await start_node("b", handoff_timeout=30.0)
    await waiting.eventually(
        lambda: "a" in b.mirror.match(f"fleet/{SESSIONS - 1}").nodes, 10.0, "b routes to a"
    )
    acked: list[tuple[int, bytes]] = []
    adopted = asyncio.Event()

    async def publish_rounds() -> None:
        sequence = 0
        while not adopted.is_set():
            for index in range(SESSIONS):
                payload = f"{sequence}".encode()
                await b.publish(f"fleet/{index}", payload, qos=1)
                acked.append((index, payload))
            sequence += 1
            await asyncio.sleep(0.05)  # (a round every 50 ms: the nodes share this loop)

    publisher = asyncio.create_task(publish_rounds())
    try:
        await waiting.eventually(lambda: len(acked) >= SESSIONS, 10.0, "a round before the kill")
        await waiting.eventually(
            lambda: a.stats()["session_queued"] >= SESSIONS, 10.0, "a queued the first round"
        )
        assert b.stats()["adoption_last_finished_ms"] == 0  # (none yet)
        died_ms = time.time() * 1000
        await die(a)
        await waiting.eventually(
            lambda: b.stats()["sessions_adopted"] == SESSIONS, 20.0, "b adopted every session"
        )
        await waiting.eventually(lambda: b.stats()["nodes_purged"] == 1, 10.0, "a purged")
        adopted.set()
        stats = b.stats()  # (the adoption's end and length, as /metrics shows them)
        assert died_ms < stats["adoption_last_finished_ms"] <= time.time() * 1000
        assert 0 < stats["adoption_last_took_ms"] < stats["adoption_last_finished_ms"] - died_ms
        await publisher
    finally:
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher
    assert b.stats()["unrouted"] == 0
    c = await start_node("c")
    for index in range(SESSIONS):
        assert await c.connect(f"s{index}", clean_start=False, expiry=600)
    for index in range(SESSIONS):
        wanted = [payload for i, payload in acked if i == index]
        got = await take(c, f"s{index}", len(wanted))
        assert [d.payload for d in got] == wanted, f"s{index}"


LATE = 3.0
"""Seconds the publisher's forwards to the dying node take in the fence test: longer than
the adopter's grace and its wait from the death to its read of the dead node's inbox
(the heartbeat TTL, 2 s, and the grace), shorter than the bound of the wait for acks."""


@BOTH
async def test_a_copy_on_its_way_to_the_dead_node_when_it_is_adopted_reaches_the_session(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher matched a copy against the routes of the dying node, and its write to
    that node's inbox is slow (here held back ``LATE`` seconds: a retried forward, a
    busy Redis). Either live node may adopt the session. Before: the adopter waited a
    fixed grace after every mirror acked its routes, read the dead node's inbox before
    the copy was there, and the session never got it, though the publish was
    acknowledged. Now a mirror acks a route change only once the copies its node matched
    before it are stored, and the adopter waits for its own, so it reads after."""
    ttl = {"heartbeat_interval": 0.2, "heartbeat_ttl": 2.0, "handoff_grace": 0.2}
    a = await start_node("a", **ttl)
    await a.connect("s", clean_start=False, expiry=600)
    await a.subscribe("s", "t", qos=1)
    await a.put_away("s")
    b = await start_node("b", **ttl)
    p = await start_node("p", **ttl)
    await waiting.eventually(lambda: "a" in p.mirror.match("t").nodes, 10.0, "p routes to a")
    await p.publish("t", b"before", qos=1)
    await waiting.eventually(
        lambda: a.stats()["session_queued"] == 1, 10.0, "a queued the first copy"
    )
    send = p._forwarder.send

    def late_to_a(node_id: str, forwards: list[Any]) -> asyncio.Future[None]:
        if node_id != "a":
            return send(node_id, forwards)

        async def late() -> None:
            await asyncio.sleep(LATE)
            await send(node_id, forwards)

        return asyncio.ensure_future(late())

    monkeypatch.setattr(p._forwarder, "send", late_to_a)
    await die(a)
    publish = asyncio.create_task(p.publish("t", b"on its way", qos=1))
    await waiting.eventually(
        lambda: sum(n.stats()["sessions_adopted"] for n in (b, p)) == 1, 15.0, "adopted"
    )
    assert (await publish).nodes == ["a"]  # (acknowledged, matched to the dead node)
    assert await b.connect("s", clean_start=False, expiry=600)
    got = await take(b, "s", 2)
    assert [d.payload for d in got] == [b"before", b"on its way"]


@BOTH
async def test_a_dead_node_s_clean_sessions_leave_no_key_behind(
    start_node: StartNode, redis_connect: Callable[..., Any]
) -> None:
    """Before, the adoption skipped the sessions of Session Expiry 0 and nothing else
    removed them: a killed node's clean clients stayed listed as connected, their
    subscriptions, claim and description in Redis for good. Now they are removed (fenced
    by the dead claim: a client that came back elsewhere keeps its new session), and the
    persistent session beside them is adopted as before."""
    ttl = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    a = await start_node("a", **ttl)
    clean = [f"clean-{index}" for index in range(30)]
    for client_id in clean:
        await a.connect(client_id, clean_start=True, expiry=0)
        await a.subscribe(client_id, f"clean/{client_id}", qos=1, confirm=False)
    await a.connect("kept", clean_start=False, expiry=600)
    await a.subscribe("kept", "kept/x", qos=1)
    b = await start_node("b", **ttl)
    await die(a)
    assert await b.connect("clean-0", clean_start=False, expiry=0) is False  # (came back)
    await b.subscribe("clean-0", "clean/again", qos=1)
    await waiting.eventually(lambda: b.stats()["sessions_adopted"] == 1, 15.0, "adopted")
    redis = await redis_connect()
    left = [c for c in clean[1:] if await redis.exists(*b.keys.client_keys(c))]
    assert left == []
    assert b.stats()["dead_clean_sessions_removed"] == len(clean) - 1
    assert list(await b.subscriptions.subscriptions("clean-0")) == ["clean/again"]
    assert await b.connect("kept", clean_start=False, expiry=600) is True


@STANDALONE
async def test_every_clean_session_a_dead_node_leaves_is_counted_when_batches_overlap(
    start_node: StartNode, redis_connect: Callable[..., Any]
) -> None:
    """Before, the count of a dead node's clean sessions removed was added as
    ``self.clean_sessions_removed += sum(await ...)``: each batch read the count before
    its removal's await and wrote it back after, so batches removing at the same time
    undid each other's additions (``router bench fleet --kill``: 1,000 clean sessions
    removed, 325 counted). The keys went; the figure lied."""
    ttl = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    a = await start_node("a", **ttl)
    clean = [f"clean-{index}" for index in range(2 * BATCH + 50)]  # (three batches)
    for client_id in clean:
        await a.connect(client_id, clean_start=True, expiry=0)
        await a.subscribe(client_id, f"clean/{client_id}", qos=1, confirm=False)
    await a.connect("kept", clean_start=False, expiry=600)
    b = await start_node("b", **ttl)
    await die(a)
    await waiting.eventually(lambda: b.stats()["sessions_adopted"] == 1, 15.0, "adopted")
    redis = await redis_connect()
    assert [c for c in clean if await redis.exists(*b.keys.client_keys(c))] == []
    assert b.stats()["dead_clean_sessions_removed"] == len(clean)


@STANDALONE
async def test_a_session_connected_again_under_another_expiry_is_adopted_by_the_new_one(
    start_node: StartNode, redis_connect: Callable[..., Any]
) -> None:
    """Before, a client attached to a node that connected there again kept its session
    with the new Session Expiry Interval in the node's memory only: Redis still told the
    old one, which the adopter reads. So when the node died, a session made clean (0)
    was adopted as persistent (a graceful stop removed it), and one made persistent
    (600 s) was removed as clean (found by tests/cluster/test_session_model.py)."""
    ttl = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    a = await start_node("a", **ttl)
    await a.connect("made-clean", clean_start=False, expiry=600)
    await a.subscribe("made-clean", "x/1", qos=1)
    await a.connect("made-clean", clean_start=False, expiry=0)
    await a.connect("made-kept", clean_start=True, expiry=0)
    await a.subscribe("made-kept", "x/2", qos=1)
    await a.connect("made-kept", clean_start=False, expiry=600)
    b = await start_node("b", **ttl)
    await die(a)
    await waiting.eventually(lambda: b.stats()["nodes_purged"] == 1, 15.0, "a adopted")
    redis = await redis_connect()
    assert await redis.exists(*b.keys.client_keys("made-clean")) == 0
    assert b.stats()["sessions_adopted"] == 1
    assert await b.connect("made-kept", clean_start=False, expiry=600) is True
    assert list(await b.subscriptions.subscriptions("made-kept")) == ["x/2"]


@BOTH
async def test_a_node_that_stops_leaves_no_key_of_its_clean_sessions(
    start_node: StartNode, redis_connect: Callable[..., Any]
) -> None:
    """Before, a node that stopped gracefully left its embedded clients' clean sessions
    (subscriptions, claim, description) in Redis for good: `router reconcile` found them
    as ghost clients of an unregistered node. Now they go with it; a persistent session
    away stays for its client."""
    a = await start_node("a")
    clean = [f"worker-{index}" for index in range(20)]
    for client_id in clean:
        await a.subscribe(client_id, f"jobs/{client_id}", confirm=False)
    await a.connect("kept", clean_start=False, expiry=600)
    await a.subscribe("kept", "kept/x", qos=1)
    await a.put_away("kept", expiry=600)
    await a.stop()
    redis = await redis_connect()
    assert [c for c in clean if await redis.exists(*a.keys.client_keys(c))] == []
    assert await redis.exists(a.keys.client_session("kept")) == 1
