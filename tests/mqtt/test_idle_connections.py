"""Idle connections in process (a node on fakeredis, raw clients speaking bytes): an
idle client holds no task on the node (:mod:`router.mqtt.intake`, the outbox's wait
without one), and wakes up for its deliveries; silence is measured from the client's
last whole packet; a client that closes its sending side still gets its answers."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.waiting import eventually

pytestmark = pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)

WAIT = 5.0


class Client:
    """A raw MQTT 5 client: what it sends, and the packets it gets."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.packets = PacketReader()
        self.packets.level = MQTT_5
        self.got: list[Packet] = []

    @classmethod
    async def connect(cls, port: int, client_id: str, keepalive: int = 60) -> Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.send(Connect(client_id, MQTT_5, keepalive=keepalive))
        connack = await client.next()
        assert isinstance(connack, ConnAck) and connack.reason_code == 0, connack
        return client

    def send(self, *packets: Packet) -> None:
        self.writer.write(b"".join(encode(packet, MQTT_5) for packet in packets))

    async def next(self) -> Packet | None:
        """The next packet, None once the node closed the connection."""
        async with asyncio.timeout(WAIT):
            while not self.got:
                data = await self.reader.read(65536)
                if not data:
                    return None
                self.got += self.packets.feed(data)
        return self.got.pop(0)

    def close(self) -> None:
        self.writer.close()


async def test_idle_clients_hold_no_task_and_wake_for_deliveries(start_node: StartNode) -> None:
    node = await start_node("n1")
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        before = len(asyncio.all_tasks())
        clients = [await Client.connect(port, f"idle-{n}") for n in range(40)]
        for n, client in enumerate(clients):
            client.send(Subscribe(1, (Subscription(f"idle/{n}", 1),)))
            assert isinstance(await client.next(), SubAck)
        await eventually(  # (not one or more per client)
            lambda: len(asyncio.all_tasks()) - before < 5, WAIT, "the connect tasks ended"
        )
        for n in range(len(clients)):
            await node.publish(f"idle/{n}", f"to {n}".encode(), qos=1)
        for n, client in enumerate(clients):
            delivery = await client.next()
            assert isinstance(delivery, Publish) and delivery.payload == f"to {n}".encode()
            assert delivery.packet_id is not None
            client.send(PubAck(delivery.packet_id))
        await eventually(
            lambda: len(asyncio.all_tasks()) - before < 5, WAIT, "the delivery tasks ended"
        )
        await eventually(
            lambda: all(not node.sessions.session(f"idle-{n}").inflight for n in range(40)),
            WAIT,
            "every PUBACK taken",
        )
        for client in clients:
            client.close()


async def test_silence_counts_from_the_last_bytes(start_node: StartNode) -> None:
    """A client that pings within 1.5 x keepalive stays; once it stops, 0x8D."""
    node = await start_node("n1")
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        client = await Client.connect(server.addresses[0][1], "pinger", keepalive=1)
        for _ in range(5):
            await asyncio.sleep(0.6)
            client.send(PingReq())
            assert await client.next() == PingResp()
        started = time.monotonic()
        assert await client.next() == Disconnect(0x8D)
        assert 1.3 < time.monotonic() - started < WAIT
        assert await client.next() is None
        assert server.stats()["mqtt_closed_keep_alive_timeout"] == 1
        client.close()


async def test_a_client_that_closes_its_sending_side_gets_its_answers(
    start_node: StartNode,
) -> None:
    node = await start_node("n1")
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        client = await Client.connect(server.addresses[0][1], "half")
        client.send(Publish("half/t", b"x", 1, False, False, 7), PingReq())
        client.writer.write_eof()
        assert await client.next() == PubAck(7, 0x10)  # (no matching subscribers)
        assert await client.next() == PingResp()
        assert await client.next() is None
        client.close()
