"""A client that connects to another node takes its session over (MQTT-3.1.4-3): the old
node closes its copy and stops routing for it; on real Redis and the 3-master cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Takeover
from router.cluster.node import RouterNode
from router.core.hooks import ClientInfo, HookPoint
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


def downs(node: RouterNode) -> list[tuple[str, str]]:
    """Where ``client.disconnected`` runs on ``node`` are recorded: (client id, reason)."""
    seen: list[tuple[str, str]] = []

    def record(client: ClientInfo, reason: str) -> None:
        seen.append((client.client_id, reason))

    node.hooks.register(HookPoint.CLIENT_DISCONNECTED, record)
    return seen


async def test_the_old_node_closes_a_session_taken_over_by_another(
    start_node: StartNode,
) -> None:
    a, b = await start_node("a"), await start_node("b")
    closed_on_a = downs(a)
    await a.subscribe("phone", "home/#")
    await waiting.eventually(lambda: "a" in b.mirror.match("home/x").nodes, 5, "a's route")
    stale = a.messages("phone")

    await b.subscribe("phone", "home/kitchen")

    await waiting.eventually(lambda: closed_on_a, 5, "the takeover notice on a")
    assert closed_on_a == [("phone", "takenover")]
    assert a.stats()["sessions_taken_over"] == 1
    assert "phone" not in a.sessions.clients()
    assert a.sessions.routes() == {}
    assert [d async for d in stale] == []  # the old copy's stream ended
    await waiting.eventually(
        lambda: "a" not in b.mirror.match("home/x").nodes, 5, "a's route gone from b's mirror"
    )
    assert set(await b.subscriptions.subscriptions("phone")) == {"home/kitchen"}


async def test_messages_after_a_takeover_reach_only_the_new_session(
    start_node: StartNode,
) -> None:
    a, b, c = await start_node("a"), await start_node("b"), await start_node("c")
    await a.subscribe("phone", "home/#")
    await b.subscribe("phone", "home/#")
    await waiting.eventually(lambda: a.stats()["sessions_taken_over"] == 1, 5, "the takeover")
    await waiting.eventually(
        lambda: c.mirror.match("home/x").nodes.keys() == {"b"}, 5, "only b routes home/#"
    )
    result = await c.publish("home/x", b"1")
    assert result.nodes == ["b"]
    [delivery] = await take(b, "phone", 1)
    assert delivery.payload == b"1"
    assert a.stats()["received"] == 0
    owner = await a.subscriptions.owner("phone")
    assert owner is not None and owner.node_id == "b"


async def test_a_client_back_on_its_first_node_gets_a_fresh_session(
    start_node: StartNode,
) -> None:
    a, b = await start_node("a"), await start_node("b")
    closed_on_a, closed_on_b = downs(a), downs(b)
    await a.subscribe("phone", "one")
    await b.connect("phone")
    await a.connect("phone")  # whether or not b's notice reached a yet: a new session
    await a.subscribe("phone", "two")
    await waiting.eventually(lambda: closed_on_b, 5, "the takeover notice on b")
    assert closed_on_a == [("phone", "takenover")]
    assert closed_on_b == [("phone", "takenover")]
    assert set(await a.subscriptions.subscriptions("phone")) == {"two"}
    assert set(a.sessions.routes()) == {"two"}
    assert b.sessions.routes() == {}


async def test_an_older_notice_leaves_a_newer_session_alone(
    start_node: StartNode, redis_connect: Any, keys: Keys
) -> None:
    a, b = await start_node("a"), await start_node("b")
    closed = downs(a)
    await a.connect("phone")
    await a.subscribe("probe", "p")
    await waiting.eventually(lambda: "a" in b.mirror.match("p").nodes, 5, "a's route")
    owner = await a.subscriptions.owner("phone")
    assert owner is not None
    sender = Forwarder(await redis_connect(), keys, expire=60)
    try:
        await sender.notify("a", Takeover("phone", owner.epoch - 1))
        await sender.notify("a", Takeover("phone", owner.epoch))
        await sender.notify("a", Takeover("nobody", owner.epoch + 1))
    finally:
        await sender.stop()
    # A copy stored in a's inbox after the notices: once it arrives, a has read them.
    await b.publish("p", b"after the notices")
    await take(a, "probe", 1)
    assert closed == []
    assert "phone" in a.sessions.clients()
    assert a.stats()["sessions_taken_over"] == 0


async def test_a_claim_whose_notice_never_came_is_found_by_the_heartbeat(
    start_node: StartNode,
) -> None:
    a = await start_node("a")
    closed = downs(a)
    await a.subscribe("phone", "home/#")
    await a.connect("tablet")
    # Another node claims the session without leaving a notice (as if it was lost).
    await a.subscriptions.claim("phone", "elsewhere")
    await waiting.eventually(lambda: closed, 5, "a heartbeat to find the newer claim")
    assert closed == [("phone", "takenover")]
    assert a.sessions.clients() == ["tablet"]
    assert a.sessions.routes() == {}


async def test_a_kick_and_the_client_attaching_again_at_once_leave_it_attached(
    start_node: StartNode,
) -> None:
    """An operator's kick (node.kick -> disconnect) while the client subscribes again, the
    subscribe started after any number of event-loop turns of the kick: the kick ends the
    old session, the subscribe attaches a new one; the kick used to fail half-way
    (SessionOwnershipError) when the subscribe's claim landed during its removal."""
    a = await start_node("a")
    for turns in range(30):
        await a.connect("phone", clean_start=False, expiry=60)
        await a.subscribe("phone", "home/#")
        kick = asyncio.create_task(a.kick("phone"))
        for _ in range(turns):
            await asyncio.sleep(0)
        again = asyncio.create_task(a.subscribe("phone", "home/#"))
        assert await kick
        await again
        assert a.serves("phone"), turns
        assert set(await a.subscriptions.subscriptions("phone")) == {"home/#"}
        await a.disconnect("phone")


async def test_a_session_of_interval_0_ends_with_its_connection_taken_over_elsewhere(
    start_node: StartNode,
) -> None:
    """Clean start 0 on another node while the old connection (Session Expiry 0) is
    attached: no session is resumed (it ends with the connection the takeover closes),
    and the connect neither fails nor waits for a handoff; it used to fail (0x88) on a
    queue the old node never made."""
    a, b = await start_node("a"), await start_node("b")
    closed_on_a = downs(a)
    await a.connect("phone", clean_start=False, expiry=0)
    await a.subscribe("phone", "home/#")
    async with asyncio.timeout(2):  # (well within handoff_timeout: no wait for one)
        assert await b.connect("phone", clean_start=False, expiry=0) is False
    await waiting.eventually(lambda: closed_on_a, 5, "the takeover notice on a")
    assert closed_on_a == [("phone", "takenover")]
    assert await b.subscriptions.subscriptions("phone") == {}
    assert b.sessions.routes() == {}
    await waiting.eventually(lambda: a.sessions.routes() == {}, 5, "a's routes gone")


async def test_a_notice_that_comes_while_the_client_connects_here_waits_for_the_connect(
    start_node: StartNode, redis_connect: Any, keys: Keys
) -> None:
    """A takeover notice read while a connect of the same client runs on the node (a
    CONNECT that raced another node's) is handled once the connect has run, not under
    it (closing the session half-way made the connect fail: SessionStateError), and the
    inbox reader goes on meanwhile."""
    a, b = await start_node("a"), await start_node("b")
    closed = downs(a)
    await a.connect("phone")
    await a.subscribe("probe", "p")
    await waiting.eventually(lambda: "a" in b.mirror.match("p").nodes, 5, "a's route")
    owner = await a.subscriptions.owner("phone")
    assert owner is not None
    sender = Forwarder(await redis_connect(), keys, expire=60)
    async with a._lifecycle.locks.hold("phone"):  # (as a connect of phone would)
        try:
            await sender.notify("a", Takeover("phone", owner.epoch + 1))
        finally:
            await sender.stop()
        await b.publish("p", b"after the notice")
        await take(a, "probe", 1)  # (the inbox reader read the notice, and went on)
        assert closed == []
        assert a.serves("phone")
    await waiting.eventually(lambda: closed, 5, "the notice handled after the connect")
    assert closed == [("phone", "takenover")]
    assert not a.serves("phone")
