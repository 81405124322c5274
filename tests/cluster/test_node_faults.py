"""Nodes keep their promises when Redis misbehaves: nothing a node accepted is dropped
without a retry or a count (issue 14's silent-loss paths), on real Redis and a cluster.

Faults are real Redis errors provoked through Redis itself (a key of the wrong type, a
clock that is not a number: the node's own Lua scripts fail), not mocks of the client.
Where a test plays a peer node, it writes inbox records with the inbox's own format.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from router.cluster.config import NodeConfig
from router.cluster.inbox import Forward, Kick, pack_batch, pack_notice
from router.cluster.membership import Membership
from router.cluster.node import RouterNode
from router.cluster.sessions.adoption import Adoption
from router.cluster.sessions.recovery import InboxRecovery
from router.core.messages import Delivery, Message
from router.core.topics import TopicName
from router.errors import RouteWriteError, StateFailureError
from router.state.channels import Channel, ChannelMessage
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support import waiting
from tests.support.nodes import StartNode, die, roamer_node, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    await waiting.eventually(check, timeout, what)


async def test_a_route_write_that_redis_refuses_is_kept_and_written_later(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    a = await start_node("a")
    routes = keys.node_routes("a")
    await redis_client.set(routes, b"not a hash")  # route_apply.lua now fails: WRONGTYPE
    with pytest.raises(RouteWriteError):
        await a.subscribe("phone", "alerts/#")
    assert a.stats()["route_batches_failed"] >= 1
    assert a.stats()["route_changes_unwritten"] == 1

    await redis_client.delete(routes)  # Redis takes the write again; nobody subscribes again

    async def stored() -> bool:
        return await redis_client.hget(routes, "alerts/#") == b"1"

    await eventually(stored, "the kept route change in a's route set")
    b = await start_node("b")
    await eventually(lambda: "a" in b.mirror.match("alerts/x").nodes, "b routes alerts/x to a")
    assert a.stats()["route_changes_unwritten"] == 0


def forward_record(topic: str, payload: bytes) -> bytes:
    """An inbox record as a peer node writes it: one forward of a fresh message."""
    message = Message(uuid.uuid4().bytes, TopicName(topic), payload)
    return pack_batch([Forward(message)])


async def test_a_record_that_fails_is_retried_and_the_rest_of_its_batch_is_not_lost(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """Silent losses 2 and 3: the inbox reader outlives a failure (supervised, restarted,
    counted) and reads again the records after the one that failed."""
    b = await start_node("b", inbox_poll=0.2)
    await b.subscribe("roamer", "alerts")
    await b.subscribe("phone", "news")
    subscriptions = keys.client_subscriptions("roamer")
    await redis_client.set(subscriptions, b"not a hash")  # b's removal of roamer will fail
    inbox = Channel(redis_client, keys.inbox("b"), 300.0, keys)
    notice = pack_notice(Kick("roamer"))
    await inbox.publish(
        [ChannelMessage("kick:1", notice), ChannelMessage("r2", forward_record("news", b"x"))],
        push=True,
    )
    [delivery] = await take(b, "phone", 1)
    assert delivery.payload == b"x"
    assert b.stats()["task_restarts"] >= 1
    await inbox.aclose()


async def test_a_node_that_cannot_read_its_inbox_stops_claiming_liveness_then_rejoins(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """Silent loss 2: peers stop forwarding to a node whose inbox reader keeps failing
    (it withholds its heartbeat and is purged), and it rejoins once it can read again."""
    a = await start_node("a")
    b = await start_node("b", inbox_poll=0.2)
    await b.subscribe("phone", "news")
    await eventually(lambda: "b" in a.mirror.match("news").nodes, "a routes news to b")
    clock = keys.channel_clock(keys.inbox("b"))
    saved = await redis_client.get(clock)
    await redis_client.set(clock, b"not a clock")  # every read of b's inbox fails now
    await eventually(lambda: not b.health()["ok"], "b withholds its heartbeat")
    assert "inbox" in b.health()["failing"]
    await eventually(lambda: "b" not in a.mirror.match("news").nodes, "a purged b")
    assert b.stats()["heartbeats_withheld"] >= 1

    await redis_client.set(clock, saved if saved is not None else b"0")
    await eventually(lambda: b.health()["ok"], "b claims liveness again")
    await eventually(lambda: "b" in a.mirror.match("news").nodes, "a routes to b again")
    await a.publish("news", b"back")
    [delivery] = await take(b, "phone", 1)
    assert delivery.payload == b"back"


async def test_a_restarted_node_counts_the_backlog_no_client_is_left_for(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Silent loss 5: copies stored for a node that died are read by its restart, before
    any client is back; those it cannot deliver are counted, not dropped unseen."""
    a = await start_node("a", heartbeat_ttl=30.0)  # (a purge would retire b's inbox)
    config = NodeConfig("b", prefix=keys.prefix, heartbeat_interval=0.2, heartbeat_ttl=30.0)
    old = RouterNode(await redis_connect(), config)
    await old.start()
    await old.subscribe("phone", "news")
    await eventually(lambda: "b" in a.mirror.match("news").nodes, "a routes news to b")
    await die(old)  # b dies without goodbye: no purge, its inbox stays
    await a.publish("news", b"while b was away")
    new = await start_node("b")
    await eventually(lambda: new.stats()["copies_unmatched"] == 1, "the backlog copy counted")


async def test_a_persistent_session_outlives_its_node(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Node a dies holding a persistent session: the node that purges it adopts the
    session, recovers the copies stored in a's inbox meanwhile, queues what comes next,
    and the client resumes on a third node with all of it, in order."""
    a = await roamer_node(redis_connect, keys, "a", 1.0)
    b = await start_node("b", handoff_timeout=0.5)
    await eventually(lambda: "a" in b.mirror.match("news").nodes, "b routes news to a")
    await die(a)  # a dies without goodbye: no purge, its inbox stays
    await b.publish("news", b"while a lay dead", qos=1)  # stored in a's inbox
    await eventually(lambda: b.stats()["sessions_adopted"] == 1, "b adopted a's session")
    assert b.stats()["copies_recovered"] == 1
    await b.publish("news", b"after the adoption", qos=1)
    c = await start_node("c")
    assert await c.connect("roamer", clean_start=False, expiry=600)  # session present
    got = await take(c, "roamer", 2)
    assert [d.payload for d in got] == [b"while a lay dead", b"after the adoption"]


async def test_a_client_back_before_its_dead_node_is_purged_gets_what_waited_there(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """The client resumes on c before anyone purged a (a long TTL): no handoff comes
    from a, so c recovers the client's copies from a's inbox itself."""
    a = await roamer_node(redis_connect, keys, "a", 30.0)
    b = await start_node("b", heartbeat_ttl=30.0)
    await eventually(lambda: "a" in b.mirror.match("news").nodes, "b routes news to a")
    await die(a)  # a dies without goodbye
    await b.publish("news", b"stored in a's inbox", qos=1)
    c = await start_node("c", heartbeat_ttl=30.0, handoff_timeout=0.5)
    assert await c.connect("roamer", clean_start=False, expiry=600)
    await eventually(lambda: "c" in b.mirror.match("news").nodes, "b routes news to c")
    await b.publish("news", b"routed to c", qos=1)
    got = await take(c, "roamer", 2)
    assert [d.payload for d in got] == [b"stored in a's inbox", b"routed to c"]


async def test_a_client_that_resumed_elsewhere_before_its_node_restarted_gets_the_backlog(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Found by `router bench soak`: a dies; the client resumes on c, which waits for a
    handoff; a restarts under its id meanwhile and reads its inbox's backlog (no client
    for it). c must still recover the copies stored in a's inbox before its claim."""
    await kill_a_with_a_copy_in_its_inbox(start_node, redis_connect, keys)
    c = await start_node("c", heartbeat_ttl=30.0, handoff_timeout=2.0)
    resume = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))
    await restart_a_once_c_claimed_roamer(start_node, c)
    await c_got_the_copy(c, resume)


async def kill_a_with_a_copy_in_its_inbox(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """a serves roamer's persistent session (``news``, QoS 1) and dies; b stores a copy
    for roamer in a's inbox."""
    old = await roamer_node(redis_connect, keys, "a", 30.0)
    b = await start_node("b", heartbeat_ttl=30.0)
    await eventually(lambda: "a" in b.mirror.match("news").nodes, "b routes news to a")
    await die(old)
    await b.publish("news", b"stored in a's inbox", qos=1)


async def restart_a_once_c_claimed_roamer(start_node: StartNode, c: RouterNode) -> None:
    """Once c claimed roamer's session, a restarts under its id and reads its backlog
    (roamer is not its client now: the copy is unmatched there)."""

    async def claimed_by_c() -> bool:
        [owner] = await c.subscriptions.owners(["roamer"])
        return owner is not None and owner.node_id == "c"

    await eventually(claimed_by_c, "c claimed the session")
    restarted = await start_node("a", heartbeat_ttl=30.0)
    await eventually(lambda: restarted.stats()["copies_unmatched"] == 1, "a read its backlog")


async def c_got_the_copy(c: RouterNode, resume: asyncio.Future[bool]) -> None:
    assert await resume
    [delivery] = await take(c, "roamer", 1)
    assert delivery.payload == b"stored in a's inbox"


async def test_a_session_whose_away_mark_redis_refused_is_put_away_once_redis_takes_it(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """Found by the model-based session test: a connection ended while Redis refused the
    session's away mark (just after a restart of Redis). The session stayed away in the
    node's memory only, with no spiller: QoS 1 copies published to it stayed in memory and
    were lost with the node. The node goes on marking it away until Redis takes it, then
    queues its copies in Redis, where a resume on another node finds them."""
    a = await start_node("a")
    await a.connect("roamer", clean_start=False, expiry=600)
    await a.subscribe("roamer", "news", qos=1)
    session = keys.client_session("roamer")
    saved = await redis_client.dump(session)
    await redis_client.delete(session)
    await redis_client.set(session, b"not a hash")  # session_mark.lua fails: WRONGTYPE
    with pytest.raises(StateFailureError):
        await a.put_away("roamer")
    await a.publish("news", b"while Redis refused the mark", qos=1)
    assert saved is not None
    await redis_client.restore(session, 0, saved, replace=True)
    await eventually(lambda: a.stats()["session_queued"] == 1, "a queued the copy in Redis")
    await die(a)
    b = await start_node("b", handoff_timeout=2.0)
    assert await b.connect("roamer", clean_start=False, expiry=600)
    [delivery] = await take(b, "roamer", 1)
    assert delivery.payload == b"while Redis refused the mark"


async def test_a_resume_that_takes_a_restarted_node_for_dead_recovers_from_its_mark(
    start_node: StartNode,
    redis_connect: Callable[..., Any],
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by `router bench soak` (61 acknowledged messages lost): a dies; c, whose last
    round found a dead, resumes a's client without waiting for a handoff and reads a's
    inbox for it; a restarts under its id meanwhile and reads its backlog (no client for
    it: c claimed it), moving its cursor. c read from that cursor, not from its mark made
    before the claim, and found nothing."""

    async def judged_before_the_restart(self: Membership) -> None:
        self.dead = frozenset({"a"})  # (no adoption, no purge: a's inbox stays routed)

    monkeypatch.setattr(Membership, "purge_dead", judged_before_the_restart)
    await kill_a_with_a_copy_in_its_inbox(start_node, redis_connect, keys)
    c = await start_node("c", heartbeat_ttl=30.0)
    await eventually(lambda: "a" in c._membership.dead, "c judged a dead")
    restart_read = asyncio.Event()
    recover_for = InboxRecovery.recover_for

    async def after_the_restart(self: InboxRecovery, *args: Any) -> list[Delivery]:
        await restart_read.wait()
        return await recover_for(self, *args)

    monkeypatch.setattr(InboxRecovery, "recover_for", after_the_restart)
    resume = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))
    await restart_a_once_c_claimed_roamer(start_node, c)
    restart_read.set()
    await c_got_the_copy(c, resume)


async def test_a_node_restarted_under_its_id_keeps_its_persistent_sessions(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Found by `router bench soak`: a node that dies and restarts under its id before
    its persistent client is back adopts that session again: the copies stored while it
    was down and those routed to it after the restart wait for the client, which gets
    them on any node."""
    old = await roamer_node(redis_connect, keys, "a", 30.0)
    b = await start_node("b", heartbeat_ttl=30.0)
    await eventually(lambda: "a" in b.mirror.match("news").nodes, "b routes news to a")
    await die(old)
    await b.publish("news", b"while a was down", qos=1)
    restarted = await start_node("a", heartbeat_ttl=30.0)
    await eventually(lambda: restarted.stats()["sessions_adopted"] == 1, "a adopted its session")
    await eventually(lambda: "a" in b.mirror.match("news").nodes, "b routes news to a again")
    await b.publish("news", b"after the restart", qos=1)
    c = await start_node("c", heartbeat_ttl=30.0)
    assert await c.connect("roamer", clean_start=False, expiry=600)
    got = await take(c, "roamer", 2)
    assert [d.payload for d in got] == [b"while a was down", b"after the restart"]


async def test_a_node_whose_start_outlasts_the_ttl_is_not_purged_while_it_starts(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by `router bench soak`: a node restarted under a load of reconnecting
    clients took longer than its heartbeat TTL to start; its first heartbeat came only
    after, so a peer purged it while it started (and adopted its sessions, while their
    clients came back to it). It beats from its registration on."""
    a = await start_node("a")
    await waiting.eventually(a.liveness.steady, 5, "a may judge others")
    slow = 2.5 * a.config.heartbeat_ttl

    async def slow_adoption(self: Any) -> None:
        await asyncio.sleep(slow)  # (a long adoption of its previous incarnation's sessions)

    monkeypatch.setattr(Adoption, "adopt_own", slow_adoption)
    b = await start_node("b")
    assert a.stats()["nodes_purged"] == 0
    assert b.stats()["nodes_purged"] == 0 and b.running
    assert {node.node_id for node in await a.registry.live_nodes()} == {"a", "b"}


async def test_a_node_that_starts_after_another_died_routes_to_it_until_it_is_purged(
    start_node: StartNode,
    redis_connect: Callable[..., Any],
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the model-based session test: a node that started after b's heartbeat
    expired, and before anyone purged b, did not load b's routes, so a QoS 1 message for
    b's persistent session went nowhere (published on it, acknowledged, never queued).
    Now it goes to b's inbox, and the session's resume recovers it from there."""
    b = await roamer_node(redis_connect, keys, "b", heartbeat_ttl=0.6)
    await die(b)

    async def b_expired() -> bool:
        return "b" in {node.node_id for node in await b.registry.dead_nodes()}

    await eventually(b_expired, "b's heartbeat expired")

    async def no_purge(self: Membership) -> None:
        return None

    monkeypatch.setattr(Membership, "purge_dead", no_purge)  # (b stays unpurged)
    c = await start_node("c", handoff_timeout=0.5)

    result = await c.publish("news", b"while b lies dead", qos=1)

    assert result.nodes == ["b"]
    assert await c.connect("roamer", clean_start=False, expiry=600)
    [delivery] = await take(c, "roamer", 1)
    assert delivery.payload == b"while b lies dead"
