"""A PUBLISH the ACL denies inside a batch: the QoS 0/1 PUBLISH packets a connection
reads at once are published as one batch (:meth:`MqttConnection._handle_all
<router.mqtt.protocol.MqttConnection>`), and each one gets exactly what it would have got
alone. The ACL is asked once per PUBLISH, ``message.dropped`` (denied) runs once for the
denied one, every PUBLISH has one message id (the id the hooks saw is the id routed), the
denied QoS 1 one is acknowledged 0x87 in 5.0 (0x00 in 3.1.1, which has no reason code),
the allowed ones reach the subscriber, and the whole read is one publish call.

In process: a node on fakeredis, the MQTT server of :func:`router.mqtt.serve`, raw
clients sending all their PUBLISH packets in one socket write.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from router.cluster.node import RouterNode
from router.core.acl import AclAction
from router.core.hooks import ClientInfo, Decision, DropReason, HookPoint, Stop
from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_3_1_1, MQTT_5, ConnAck, Connect, Packet, PubAck, Publish
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient

pytestmark = pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)

WAIT = 5.0
DENIED = "denied/x"


class Watched:
    """The hooks of a node whose ACL denies publishing to :data:`DENIED`: what the ACL
    was asked per topic, the ids ``message.publish`` saw, the ids delivered, and every
    ``message.dropped`` (id, reason)."""

    def __init__(self, node: RouterNode) -> None:
        self.asked: Counter[str] = Counter()
        self.published: list[bytes] = []
        self.delivered: list[bytes] = []
        self.dropped: list[tuple[bytes, DropReason]] = []
        node.hooks.register(HookPoint.CLIENT_CHECK_ACL, self.check)
        node.hooks.register(HookPoint.MESSAGE_PUBLISH, self.publish)
        node.hooks.register(HookPoint.MESSAGE_DELIVERED, self.deliver)
        node.hooks.register(HookPoint.MESSAGE_DROPPED, self.drop)

    def check(
        self, client: ClientInfo, action: AclAction, topic: str, acc: Decision
    ) -> Stop[Decision]:
        if action is AclAction.PUBLISH:
            self.asked[topic] += 1
            if topic == DENIED:
                return Stop(Decision.deny("test"))
        return Stop(Decision.allow("test"))

    def publish(self, client: ClientInfo | None, message: Any) -> None:
        self.published.append(message.id)

    def deliver(self, client: ClientInfo, delivery: Any) -> None:
        self.delivered.append(delivery.message_id)

    def drop(self, message: Any, reason: DropReason, client: ClientInfo | None) -> None:
        self.dropped.append((message.id, reason))


async def acks_of_one_write(port: int, level: int, packets: list[Publish]) -> list[Packet]:
    """Connect at ``level``, send ``packets`` in one socket write, and return the
    PUBACK packets that came for them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    incoming = PacketReader()
    incoming.level = level
    got: list[Packet] = []
    wanted = sum(packet.qos == 1 for packet in packets)
    try:
        writer.write(encode(Connect(f"publisher-{level}", level), level))
        writer.write(b"".join(encode(packet, level) for packet in packets))
        async with asyncio.timeout(WAIT):
            while sum(type(p) is PubAck for p in got) < wanted:
                chunk = await reader.read(65536)
                assert chunk, "the server closed the connection"
                got += incoming.feed(chunk)
    finally:
        writer.close()
    assert isinstance(got[0], ConnAck) and got[0].reason_code == 0
    return [p for p in got if type(p) is PubAck]


@pytest.mark.parametrize(
    ("level", "denied_code"), [(MQTT_5, 0x87), (MQTT_3_1_1, 0x00)], ids=["5.0", "3.1.1"]
)
async def test_a_denied_publish_in_a_batch_is_judged_once_and_the_others_go(
    start_node: StartNode, level: int, denied_code: int
) -> None:
    node = await start_node("n1")
    watched = Watched(node)
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        subscriber = await RawClient.connect(port, "sub", clean_start=True, expiry=0)
        try:
            await subscriber.subscribe("#", 1)
            calls = node.publish_latency.count
            batch = [
                Publish("allowed/1", b"one", 1, packet_id=1),
                Publish(DENIED, b"two", 1, packet_id=2),
                Publish("allowed/3", b"three", 1, packet_id=3),
            ]
            acks = await acks_of_one_write(port, level, batch)
            received = await subscriber.take(2)
        finally:
            subscriber.drop()
    assert [(a.packet_id, a.reason_code) for a in acks] == [(1, 0), (2, denied_code), (3, 0)]
    assert [(p.topic, p.payload) for p in received] == [
        ("allowed/1", b"one"),
        ("allowed/3", b"three"),
    ]
    assert watched.asked == {"allowed/1": 1, DENIED: 1, "allowed/3": 1}
    [(denied_id, reason)] = watched.dropped
    assert reason is DropReason.DENIED
    assert watched.published == watched.delivered  # (the ids the hook saw were routed)
    assert len({*watched.published, denied_id}) == 3  # (one id per PUBLISH)
    assert node.publish_latency.count == calls + 1  # (one batch: one publish call)
    assert node.stats()["publishes_denied"] == 1  # (counted once, as it was judged)


async def test_a_denied_qos_0_publish_in_a_batch_gets_no_answer(start_node: StartNode) -> None:
    node = await start_node("n1")
    watched = Watched(node)
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        batch = [Publish(DENIED, b"zero", 0), Publish("allowed/1", b"one", 1, packet_id=1)]
        acks = await acks_of_one_write(port, MQTT_5, batch)
    assert [(a.packet_id, a.reason_code) for a in acks] == [(1, 0x10)]  # (nobody subscribed)
    assert watched.asked == {DENIED: 1, "allowed/1": 1}
    assert [r for _, r in watched.dropped] == [DropReason.DENIED, DropReason.NO_SUBSCRIBERS]


async def test_a_publish_to_the_broker_topics_in_a_batch_is_refused_alone(
    start_node: StartNode,
) -> None:
    node = await start_node("n1")
    watched = Watched(node)
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        batch = [
            Publish("$SYS/x", b"the broker's", 1, packet_id=1),
            Publish("allowed/1", b"one", 1, packet_id=2),
        ]
        acks = await acks_of_one_write(port, MQTT_5, batch)
    assert [(a.packet_id, a.reason_code) for a in acks] == [(1, 0x87), (2, 0x10)]
    assert watched.asked == {"allowed/1": 1}  # (the broker's topic: the ACL is not asked)
    assert (node.stats()["publishes_denied"], node.stats()["publishes_denied_sys"]) == (0, 1)
