"""A persistent session that moves between two live nodes loses nothing in the move,
even when a publishing node's route mirror has not caught up with the move yet.

The window (found by a 10-minute ``router bench soak``): the new node writes its routes,
claims the session and tells the old node; a publishing node whose mirror still routes
the client's filters to the old node sends its copy there. The old node keeps the
session's filters for ``handoff_grace`` seconds after it handed the session on and queues
what matches behind everything else, ahead of its handoff marker; the new node delivers a
copy that reached it both ways once. On real Redis and the 3-master cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Notice
from router.cluster.node import RouterNode
from router.errors import StateUnavailableError
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_queue import SessionQueue
from tests.support import waiting
from tests.support.nodes import StartNode, die, roamer_node, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

GRACE = 2.0


def hold_back(node: RouterNode, peer: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make ``node``'s mirror ignore ``peer``'s route changes (hints and refreshes) until
    the returned function is called; that call has the mirror read them."""
    request = node._sync.request
    held = [True]

    def held_request(node_id: str) -> None:
        if node_id != peer or not held[0]:
            request(node_id)

    monkeypatch.setattr(node._sync, "request", held_request)

    def release() -> None:
        held[0] = False
        request(peer)

    return release


async def move_started(
    start_node: StartNode, grace: float = GRACE
) -> tuple[RouterNode, RouterNode, RouterNode]:
    """Nodes a (the publisher's), b (the session's, with a handoff ``grace``) and c, every
    mirror caught up; the persistent session of ``roamer`` subscribes to ``news`` on b."""
    a = await start_node("a")
    b = await start_node("b", handoff_grace=grace)
    c = await start_node("c")
    await b.connect("roamer", clean_start=False, expiry=600)
    await b.subscribe("roamer", "news", qos=1)
    await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5, "a routes to b")
    await waiting.eventually(lambda: "c" in a.mirror.nodes(), 5, "a knows c")
    return a, b, c


async def test_a_copy_sent_to_the_old_node_during_a_move_reaches_the_session(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = await move_started(start_node)
    release = hold_back(a, "c", monkeypatch)
    resumed = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))
    await waiting.eventually(lambda: not b.serves("roamer"), 5, "b handed the session on")

    late = await a.publish("news", b"late", qos=1)  # a still routes news to b alone

    assert late.nodes == ["b"]
    assert await resumed  # the session was present
    release()
    await waiting.eventually(
        lambda: a.mirror.match("news").nodes.keys() == {"c"}, 5, "a routes news to c alone"
    )
    await a.publish("news", b"after", qos=1)
    got = await take(c, "roamer", 2)
    assert [d.payload for d in got] == [b"late", b"after"]
    assert b.stats()["copies_unmatched"] == 0


SHORT_GRACE = 0.2
"""b's grace in the lagging-mirror test: shorter than a's lag there, shorter than the
heartbeat TTL (1 s) that bounds the move's fence."""


async def test_a_copy_from_a_mirror_lagging_the_move_longer_than_the_grace_reaches_it(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: b kept the session's routes for a fixed grace. a's mirror, held back longer
    than that, went on routing news to b alone (or, once it saw b's routes go, to nobody),
    and the copy was lost though acknowledged. Now b keeps the routes, and queues what
    reaches them, until every mirror acked c's routes (the move's fence, within the
    heartbeat TTL)."""
    a, b, c = await move_started(start_node, SHORT_GRACE)
    release = hold_back(a, "c", monkeypatch)
    resumed = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))
    await waiting.eventually(lambda: not b.serves("roamer"), 5, "b handed the session on")
    await asyncio.sleep(3 * SHORT_GRACE)  # (past the fixed grace: nothing to wait on)

    late = await a.publish("news", b"late", qos=1)

    assert await resumed
    release()
    got = await take(c, "roamer", 1)
    assert [d.payload for d in got] == [b"late"]
    assert late.nodes == ["b"]


async def test_a_copy_that_reached_both_nodes_during_a_move_is_delivered_once(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a routes news to both b and c for a moment: the copy goes both ways, into b's
    grace (held open here until the copy is published: the move's fence would end it as
    soon as a routes to c) and to c directly; c delivers it once."""
    a, b, c = await move_started(start_node)
    published = asyncio.Event()
    fence = b._keeper.fence
    assert fence is not None

    async def after_the_publish(client_id: str, epoch: int, timeout: float) -> bool:
        await published.wait()
        return await fence(client_id, epoch, timeout)

    monkeypatch.setattr(b._keeper, "fence", after_the_publish)
    resumed = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))
    await waiting.eventually(
        lambda: a.mirror.match("news").nodes.keys() == {"b", "c"}, 5, "a routes news to both"
    )

    both = await a.publish("news", b"both", qos=1)
    published.set()

    assert sorted(both.nodes) == ["b", "c"]
    assert await resumed
    [delivery] = await take(c, "roamer", 1)
    assert delivery.payload == b"both"
    assert c.sessions.session("roamer").pending() == 0
    assert b.stats()["session_queued"] == 1  # (its copy came through b's grace too)
    await waiting.eventually(
        lambda: a.mirror.match("news").nodes.keys() == {"c"}, 5, "b's route gone after its grace"
    )


async def test_copies_sent_to_an_old_node_that_died_in_its_grace_are_recovered_from_its_inbox(
    start_node: StartNode,
    redis_connect: Callable[..., Any],
    redis_client: RedisClient,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """b hands the session on (its handoff marker says a tail follows) and dies before
    its tail end: c waits ``handoff_timeout`` for it, then recovers from b's inbox the
    copies that were routed there, ahead of those it held back meanwhile."""
    b = await roamer_node(redis_connect, keys, "b", 30.0)
    a = await start_node("a", heartbeat_ttl=30.0)
    c = await start_node("c", heartbeat_ttl=30.0, handoff_timeout=1.0)
    await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5, "a routes to b")
    await waiting.eventually(lambda: "c" in a.mirror.nodes(), 5, "a knows c")
    release = hold_back(a, "c", monkeypatch)
    await die(b)  # (no purge: a keeps routing news to b's inbox)
    resumed = asyncio.ensure_future(c.connect("roamer", clean_start=False, expiry=600))

    async def claim_of_c() -> int | None:
        [owner] = await c.subscriptions.owners(["roamer"])
        return owner.epoch if owner is not None and owner.node_id == "c" else None

    await waiting.eventually(claim_of_c, 5, "c claimed the session")
    epoch = await claim_of_c()
    assert epoch is not None
    queue = SessionQueue(redis_client, keys, "roamer", 600)
    await queue.mark_handoff(epoch, tail=True)  # what b wrote before it died
    await queue.aclose()
    assert await resumed

    await a.publish("news", b"late", qos=1)  # stored in dead b's inbox
    release()
    await waiting.eventually(lambda: "c" in a.mirror.match("news").nodes, 5, "a routes to c")
    await a.publish("news", b"after", qos=1)
    got = await take(c, "roamer", 2)
    assert [d.payload for d in got] == [b"late", b"after"]


MOVED = 20
HEARTBEAT = 0.5  # (each heartbeat runs the claims' audit)
NOTICE_DELAY = HEARTBEAT / 2  # (an audit comes between claim and notice half the time)


async def test_a_live_node_hands_on_every_session_resumed_elsewhere(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of many away sessions resumed on another node is handed on by its live old
    node, also when the takeover notice comes a while after the claim: none waits for a
    handoff that is not coming (``handoffs_missed``). The old node's heartbeat audit used
    to see the new claim in Redis before the notice and close its copy without a
    handoff: the resume then waited its whole ``handoff_timeout`` (5 s) and recovered the
    copies from the old node's inbox."""
    notify = Forwarder.notify

    async def late(self: Forwarder, node_id: str, notice: Notice) -> None:
        await asyncio.sleep(NOTICE_DELAY)
        await notify(self, node_id, notice)

    a = await start_node("a", heartbeat_interval=HEARTBEAT, heartbeat_ttl=5 * HEARTBEAT)
    for index in range(MOVED):
        await a.connect(f"s{index}", clean_start=False, expiry=600)
        await a.subscribe(f"s{index}", "fleet/all", qos=1, confirm=False)
        await a.put_away(f"s{index}")
    await a.publish("fleet/all", b"queued", qos=1)
    await waiting.eventually(
        lambda: a.stats()["session_queued"] == MOVED, 10.0, "a copy queued for each session"
    )
    b = await start_node("b", heartbeat_interval=HEARTBEAT, heartbeat_ttl=5 * HEARTBEAT)
    monkeypatch.setattr(Forwarder, "notify", late)
    for index in range(MOVED):
        assert await b.connect(f"s{index}", clean_start=False, expiry=600)
        assert [d.payload for d in await take(b, f"s{index}", 1)] == [b"queued"], index
    assert b.stats()["handoffs_missed"] == 0


async def test_a_handoff_whose_write_redis_fails_once_is_written_again(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the model-based session test: the old node's handoff met a pooled
    connection that a restart of Redis had closed; its write of what the old connection
    held failed once and the handoff gave up, dropping those copies (a publisher on the
    old node had sent them: they were in no inbox). A write Redis fails is tried again
    within the new node's wait for the handoff."""
    append = SessionQueue.append
    failed: list[str] = []

    async def fails_once(self: SessionQueue, *args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(self.client_id)
            raise StateUnavailableError("cannot reach Redis: Connection closed by server.")
        return await append(self, *args, **kwargs)

    a = await start_node("a")
    b = await start_node("b")
    await a.connect("phone", clean_start=False, expiry=600)
    await a.subscribe("phone", "news", qos=1)
    await a.publish("news", b"held by a", qos=1)  # (its client does not read it)
    monkeypatch.setattr(SessionQueue, "append", fails_once)

    assert await b.connect("phone", clean_start=False, expiry=600)

    [delivery] = await take(b, "phone", 1)
    assert delivery.payload == b"held by a"
    assert failed == ["phone"]
    assert b.stats()["handoffs_missed"] == 0
