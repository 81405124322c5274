"""Arrival order on one node, in process (a node on fakeredis, raw clients): a SUBSCRIBE
or UNSUBSCRIBE that the node read before another client's PUBLISH applies to it, even
when the publisher's connection was still busy with an earlier packet and so handles
the PUBLISH before the subscriber's connection starts on its SUBSCRIBE
(:mod:`router.cluster.visibility`, :mod:`router.mqtt.subscribing`).

The order of the reads is set exactly by feeding the connections' bytes as their
listener would (:meth:`~router.mqtt.intake.Intake.feed`), within one turn of the loop;
the clients' sockets carry the answers. An asynchronous ``message.publish`` hook holds
the publisher's connection busy on its first PUBLISH until the test lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from router.core.hooks import HookPoint
from router.mqtt.codec import encode
from router.mqtt.packets import (
    MQTT_5,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
)
from router.mqtt.server import MqttServer, serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient

pytestmark = pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)

WAIT = 5.0


class Hold:
    """A ``message.publish`` hook that keeps a publish of topic ``hold`` waiting."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, client: Any, message: Any) -> None:
        if message.topic == "hold":
            self.reached.set()
            await self.released.wait()


def feed(server: MqttServer, client_id: str, packet: Any) -> None:
    """Give ``client_id``'s connection the bytes of ``packet`` as its listener would."""
    connection = server.owner(client_id)
    assert connection is not None
    connection.feed(encode(packet, MQTT_5))


async def busy_publisher(server: MqttServer, hold: Hold) -> None:
    """Leave the publisher's connection busy on a PUBLISH the hook holds."""
    feed(server, "pub", Publish("hold", b"", 0))
    async with asyncio.timeout(WAIT):
        await hold.reached.wait()


@contextlib.asynccontextmanager
async def held_node(start_node: StartNode) -> AsyncIterator[tuple[MqttServer, Hold, RawClient]]:
    """A node whose ``message.publish`` hook holds topic ``hold``, and the subscriber
    ``sub`` and the publisher ``pub`` connected to it; yields the server, the hook and
    the subscriber."""
    node = await start_node("n1")
    hold = Hold()
    node.hooks.register(HookPoint.MESSAGE_PUBLISH, hold)
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        subscriber = await RawClient.connect(port, "sub", clean_start=True, expiry=0)
        publisher = await RawClient.connect(port, "pub", clean_start=True, expiry=0)
        try:
            yield server, hold, subscriber
        finally:
            subscriber.drop()
            publisher.drop()


async def test_a_subscribe_read_first_applies_to_a_publish_a_busy_connection_reads_after_it(
    start_node: StartNode,
) -> None:
    async with held_node(start_node) as (server, hold, subscriber):
        await busy_publisher(server, hold)
        hold.released.set()  # (the publisher's connection goes on first in the next turn)
        feed(server, "sub", Subscribe(1, (Subscription("order/x", 0),)))
        feed(server, "pub", Publish("order/x", b"read after the subscribe", 0))
        [suback] = await subscriber.next(SubAck, 1)
        assert isinstance(suback, SubAck) and suback.reason_codes == (0,)
        [delivered] = await subscriber.take(1)
        assert delivered.payload == b"read after the subscribe"


async def test_an_unsubscribe_read_first_applies_to_a_publish_a_busy_connection_reads_after_it(
    start_node: StartNode,
) -> None:
    async with held_node(start_node) as (server, hold, subscriber):
        await subscriber.subscribe("order/x", 0)
        await subscriber.subscribe("order/last", 1)
        await busy_publisher(server, hold)
        hold.released.set()
        feed(server, "sub", Unsubscribe(2, ("order/x",)))
        feed(server, "pub", Publish("order/x", b"read after the unsubscribe", 0))
        feed(server, "pub", Publish("order/last", b"last", 1, packet_id=1))
        [unsuback] = await subscriber.next(UnsubAck, 1)
        assert isinstance(unsuback, UnsubAck) and unsuback.reason_codes == (0,)
        [delivered] = await subscriber.take(1)  # (the last one: nothing came before it)
        assert delivered.topic == "order/last"


async def test_subscribes_and_publishes_read_together_never_wait_on_each_other(
    start_node: StartNode,
) -> None:
    """Each connection reads, in one chunk, a SUBSCRIBE, a PUBLISH on the other's filter,
    a SUBSCRIBE again, and a PUBLISH on its own new filter: the first SUBSCRIBE opens a
    change (the connection was idle), the second cannot (a PUBLISH is ahead of it). Every
    answer comes, and each publish read after a subscription reaches it."""
    node = await start_node("n1")
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        one = await RawClient.connect(port, "one", clean_start=True, expiry=0)
        two = await RawClient.connect(port, "two", clean_start=True, expiry=0)
        try:
            for me, other in (("one", "two"), ("two", "one")):
                connection = server.owner(me)
                assert connection is not None
                connection.feed(
                    b"".join(
                        encode(packet, MQTT_5)
                        for packet in (
                            Subscribe(1, (Subscription(f"{me}/a", 1),)),
                            Publish(f"{other}/a", f"from {me}".encode(), 1, packet_id=1),
                            Subscribe(2, (Subscription(f"{me}/b", 1),)),
                            Publish(f"{me}/b", f"{me} to itself".encode(), 1, packet_id=2),
                        )
                    )
                )
            for client, other in ((one, "two"), (two, "one")):
                await client.next(SubAck, 2)
                await client.next(PubAck, 2)
                got = await client.take(2)
                assert sorted(p.payload for p in got) == sorted(
                    [f"from {other}".encode(), f"{client.client_id} to itself".encode()]
                )
        finally:
            one.drop()
            two.drop()


async def test_a_throttled_client_s_subscribe_holds_up_no_other_publisher(
    start_node: StartNode,
) -> None:
    """A client past its publish rate sends, in one read, far more PUBLISHes than its rate
    allows and then a SUBSCRIBE: its connection sleeps off the debt (tens of seconds)
    before it comes to the SUBSCRIBE, whose change opened when it was read. Another
    client's publish meanwhile is not held for that long: a throttled connection lets go
    of its changes (its subscriptions then apply when they are handled)."""
    node = await start_node("n1")
    settings = MqttSettings(sys_interval=0, max_publish_rate=10)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        greedy = await RawClient.connect(port, "greedy", clean_start=True, expiry=0)
        other = await RawClient.connect(port, "other", clean_start=True, expiry=0)
        try:
            connection = server.owner("greedy")
            assert connection is not None
            flood = [Publish("flood", b"", 0)] * 600
            late = Subscribe(1, (Subscription("late", 0),))
            connection.feed(b"".join(encode(packet, MQTT_5) for packet in (*flood, late)))
            other.writer.write(encode(Publish("elsewhere", b"x", 1, packet_id=1), MQTT_5))
            [puback] = await other.next(PubAck, 1)
            assert isinstance(puback, PubAck) and puback.packet_id == 1
            assert server.publish_throttled >= 1  # (the greedy client was held)
        finally:
            greedy.drop()
            other.drop()


async def test_a_subscribe_not_applied_yet_holds_up_only_the_publishes_it_can_concern(
    start_node: StartNode,
) -> None:
    """A client's SUBSCRIBE to ``hoard/#``, read while its connection is busy, holds up
    a publish to ``hoard/x`` read after it (which then reaches it) but not one to
    ``elsewhere``: under router bench hostile's flood of SUBSCRIBEs of new filters
    under one prefix, every other client's publish waited for the flood's backlog
    (probes' p99 1.7 s beside a flood of publishes, 0.03 s with the wait scoped)."""
    node = await start_node("n1")
    hold = Hold()
    node.hooks.register(HookPoint.MESSAGE_PUBLISH, hold)
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        hoarder = await RawClient.connect(port, "pub", clean_start=True, expiry=0)
        other = await RawClient.connect(port, "other", clean_start=True, expiry=0)
        try:
            await busy_publisher(server, hold)  # ("pub" is busy on its first PUBLISH)
            feed(server, "pub", Subscribe(1, (Subscription("hoard/#", 1),)))
            other.writer.write(encode(Publish("elsewhere", b"x", 1, packet_id=1), MQTT_5))
            [puback] = await other.next(PubAck, 1)
            assert isinstance(puback, PubAck) and not hold.released.is_set()
            other.writer.write(encode(Publish("hoard/x", b"kept", 1, packet_id=2), MQTT_5))
            hold.released.set()
            [suback] = await hoarder.next(SubAck, 1)
            assert isinstance(suback, SubAck) and suback.reason_codes == (1,)
            [delivered] = await hoarder.take(1)
            assert (delivered.topic, delivered.payload) == ("hoard/x", b"kept")
        finally:
            hoarder.drop()
            other.drop()
