"""Slow loris, in process (a node on fakeredis, the MQTT server of
:func:`router.mqtt.serve`, raw sockets on loopback): the bytes of packets begun and not
yet whole are bounded for the whole node (``max_unfinished_bytes``, DISCONNECT 0x97), a
packet begun must be whole within ``packet_timeout`` of its first byte (0x8D), and the
keepalive is judged on whole control packets: the bytes of an unfinished one are not
a sign of life.
"""

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
    Publish,
)
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.waiting import eventually

pytestmark = pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)

WAIT = 5.0
KiB = 1024


class Client:
    """A raw MQTT 5.0 client on a socket: bytes out, packets in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.packets = PacketReader()
        self.packets.level = MQTT_5
        self.got: list[Packet] = []

    @classmethod
    async def connect(cls, port: int, client_id: str, keepalive: int = 0) -> Client:
        client = cls(*await asyncio.open_connection("127.0.0.1", port))
        client.writer.write(encode(Connect(client_id, MQTT_5, keepalive=keepalive)))
        connack = await client.next()
        assert isinstance(connack, ConnAck) and connack.reason_code == 0, connack
        return client

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def next(self, wait: float = WAIT) -> Packet | None:
        """The next packet, None once the node closed the connection."""
        async with asyncio.timeout(wait):
            while not self.got:
                data = await self.reader.read(65536)
                if not data:
                    return None
                self.got += self.packets.feed(data)
        return self.got.pop(0)

    def close(self) -> None:
        self.writer.close()


def big_publish(size: int) -> bytes:
    return encode(Publish("slow/loris", b"x" * size, 0), MQTT_5)


async def test_unfinished_packets_are_bounded_for_the_whole_node(start_node: StartNode) -> None:
    """Three clients each send 35 KiB of a 40 KiB PUBLISH under a node-wide bound of
    100 KiB: the third would go over and gets DISCONNECT 0x97 (counted); the others
    stay, and once one finishes its packet its bytes are free again for another client."""
    node = await start_node("n1")
    settings = MqttSettings(sys_interval=0, max_unfinished_bytes=100 * KiB)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]

        def held() -> int:
            return server.stats()["mqtt_unfinished_bytes"]

        packet, part = big_publish(40 * KiB), 35 * KiB
        first, second, third = [await Client.connect(port, f"loris-{n}") for n in range(3)]
        await first.send(packet[:part])
        await second.send(packet[:part])
        await eventually(lambda: held() == 2 * part, WAIT, held)
        await third.send(packet[:part])
        assert await third.next() == Disconnect(0x97)
        assert await third.next() is None
        stats = server.stats()
        assert stats["mqtt_closed_unfinished_bytes"] == 1
        assert stats["mqtt_unfinished_bytes"] == 2 * part
        assert stats["mqtt_unfinished_packets"] == 2
        await first.send(packet[part:] + encode(PingReq()))
        assert await first.next() == PingResp()
        assert held() == part
        fourth = await Client.connect(port, "loris-3")
        await fourth.send(packet[:part])
        await eventually(lambda: held() == 2 * part, WAIT, held)
        second.close()  # (a connection that ends gives its bytes back)
        await eventually(lambda: held() == part, WAIT, held)
        stats = server.stats()
        assert stats["mqtt_closed_unfinished_bytes"] == 1
        assert stats["mqtt_unfinished_bytes_peak"] == 2 * part
        for client in (first, third, fourth):
            client.close()


async def test_a_packet_begun_must_be_whole_within_the_packet_timeout(
    start_node: StartNode,
) -> None:
    """With keepalive 0 nothing else ends a client that starts a packet and trickles
    it: it gets DISCONNECT 0x8D once ``packet_timeout`` passed since the packet's first
    byte, counted apart from keepalive. A client idle between whole packets is not."""
    node = await start_node("n1")
    settings = MqttSettings(sys_interval=0, packet_timeout=1.0)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        idle = await Client.connect(port, "idle")
        await idle.send(encode(PingReq()))
        assert await idle.next() == PingResp()
        trickler = await Client.connect(port, "trickler")
        packet = big_publish(1000)
        started = time.monotonic()
        closed = asyncio.create_task(trickler.next())
        for at in range(len(packet) - 1):
            if closed.done():
                break
            await trickler.send(packet[at : at + 1])
            await asyncio.wait((closed,), timeout=0.1)
        assert await closed == Disconnect(0x8D)
        assert 0.9 < time.monotonic() - started < 1.0 + WAIT / 2
        assert await trickler.next() is None
        assert server.stats()["mqtt_closed_packet_timeout"] == 1
        assert server.stats()["mqtt_closed_keep_alive_timeout"] == 0
        await idle.send(encode(PingReq()))  # (idle for longer than the timeout: still here)
        assert await idle.next() == PingResp()
        assert server.stats()["mqtt_unfinished_packets"] == 0
        idle.close()
        trickler.close()


async def test_the_bytes_of_an_unfinished_packet_do_not_count_as_keepalive(
    start_node: StartNode,
) -> None:
    """Keepalive 1: a byte every 0.3 s of a PUBLISH that never ends is no control
    packet, so the client is silent since its CONNECT and gets 0x8D at 1.5 s
    ([MQTT-3.1.2-24]); before, every byte put the silence off and it stayed for good."""
    node = await start_node("n1")
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        client = await Client.connect(server.addresses[0][1], "dripping", keepalive=1)
        connected = time.monotonic()
        packet = big_publish(1000)
        closed = asyncio.create_task(client.next(wait=3 * WAIT))
        for at in range(len(packet) - 1):
            if closed.done():
                break
            await client.send(packet[at : at + 1])
            await asyncio.wait((closed,), timeout=0.3)
        assert await closed == Disconnect(0x8D)
        assert 1.4 < time.monotonic() - connected < 1.5 + WAIT / 2
        assert server.stats()["mqtt_closed_keep_alive_timeout"] == 1
        client.close()
