"""A persistent session that moves again right after a move gets its CONNACK at once and
loses nothing, with QoS 1/2 deliveries in flight.

After a move (node a hands the session on to node b) the old node keeps gathering the
session's copies for ``handoff_grace`` seconds, and the new node reads that tail in the
background. A client that closes its socket and reconnects at once (to a, to b again, or
to a while its connection to b is still open) used to wait for that grace before its
CONNACK. Here the grace is 4 s, so such a wait cannot hide inside the 2 s deadline given
to each CONNACK. Two embedded nodes with MQTT listeners on real Redis (standalone and
the 3-master cluster); the client is a raw MQTT 5.0 connection that leaves what it gets
unacknowledged until the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest

from router.cluster.node import RouterNode
from router.mqtt.server import serve
from tests.support import waiting
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

GRACE = 4.0  # the old node's handoff grace: longer than any CONNACK may take here
CONNACK_DEADLINE = 2.0
EXPIRY = 300
MESSAGES = 5

Ports = dict[str, int]


@pytest.fixture
async def cluster(start_node: StartNode) -> AsyncIterator[tuple[dict[str, RouterNode], Ports]]:
    """Nodes a and b, each with an MQTT listener, every mirror caught up."""
    nodes = {n: await start_node(n, handoff_grace=GRACE) for n in "ab"}
    await waiting.eventually(lambda: set(nodes["a"].mirror.nodes()) >= {"a", "b"}, 5, "a knows b")
    await waiting.eventually(lambda: set(nodes["b"].mirror.nodes()) >= {"a", "b"}, 5, "b knows a")
    async with AsyncExitStack() as stack:
        ports = {}
        for node_id, node in nodes.items():
            server = await stack.enter_async_context(serve(node, ["127.0.0.1:0"]))
            ports[node_id] = server.addresses[0][1]
        yield nodes, ports


async def resume(port: int, client_id: str) -> RawClient:
    """Reconnect with clean start 0: CONNACK within the deadline, Session Present."""
    client = await RawClient.connect(
        port, client_id, clean_start=False, expiry=EXPIRY, deadline=CONNACK_DEADLINE
    )
    assert client.connack is not None and client.connack.session_present
    return client


async def in_flight(
    nodes: dict[str, RouterNode], ports: Ports, client_id: str, qos: int
) -> tuple[RawClient, list[int]]:
    """The persistent session of ``client_id`` subscribed on a at ``qos``, then moved to b
    (close, reconnect at once): it holds ``MESSAGES`` copies sent and unacknowledged on
    both connections. Returns the connection to b and the packet ids of the copies."""
    first = await RawClient.connect(ports["a"], client_id, clean_start=True, expiry=EXPIRY)
    await first.subscribe("moves/#", qos)
    await waiting.eventually(
        lambda: "a" in nodes["b"].mirror.match("moves/t").nodes, 5, "b routes moves/t to a"
    )
    for n in range(MESSAGES):
        await nodes["b"].publish("moves/t", str(n).encode(), qos=qos)
    sent = await first.take(MESSAGES)
    assert [(p.payload, p.dup) for p in sent] == [(str(n).encode(), False) for n in range(MESSAGES)]
    first.drop()
    on_b = await resume(ports["b"], client_id)
    again = await on_b.take(MESSAGES)
    assert [(p.payload, p.packet_id, p.dup) for p in again] == [
        (p.payload, p.packet_id, True) for p in sent
    ]
    return on_b, [p.packet_id or 0 for p in sent]


async def everything_once_more(client: RawClient, qos: int, ids: list[int]) -> None:
    """The copies in flight come again, with DUP and their packet ids, then nothing else;
    acknowledged, the session is done with them."""
    got = await client.take(MESSAGES)
    assert [(p.payload, p.packet_id, p.dup) for p in got] == [
        (str(n).encode(), ids[n], True) for n in range(MESSAGES)
    ]
    client.acknowledge(got)
    if qos == 2:
        await client.complete(MESSAGES)


@pytest.mark.parametrize("qos", [1, 2])
async def test_a_reconnect_to_the_node_the_session_just_left_is_answered_at_once(
    cluster: tuple[dict[str, RouterNode], Ports], qos: int
) -> None:
    nodes, ports = cluster
    on_b, ids = await in_flight(nodes, ports, "pingpong", qos)
    on_b.drop()

    back_on_a = await resume(ports["a"], "pingpong")

    await everything_once_more(back_on_a, qos, ids)
    await nodes["a"].publish("moves/t", b"after", qos=qos)
    [after] = await back_on_a.take(1)
    assert (after.payload, after.dup) == (b"after", False)
    back_on_a.drop()


@pytest.mark.parametrize("qos", [1, 2])
async def test_a_reconnect_to_the_same_node_right_after_a_move_is_answered_at_once(
    cluster: tuple[dict[str, RouterNode], Ports], qos: int
) -> None:
    nodes, ports = cluster
    on_b, ids = await in_flight(nodes, ports, "sameagain", qos)
    on_b.drop()

    again_on_b = await resume(ports["b"], "sameagain")

    await everything_once_more(again_on_b, qos, ids)
    again_on_b.drop()


@pytest.mark.parametrize("qos", [1, 2])
async def test_a_takeover_right_after_a_move_is_answered_at_once(
    cluster: tuple[dict[str, RouterNode], Ports], qos: int
) -> None:
    """The connection to b is still open when the client connects to a: b's ends (0x8E)."""
    nodes, ports = cluster
    on_b, ids = await in_flight(nodes, ports, "takenback", qos)

    back_on_a = await resume(ports["a"], "takenback")

    await everything_once_more(back_on_a, qos, ids)
    on_b.drop()
    back_on_a.drop()
