"""Credentials that expire end their connection, whichever authenticator gave the expiry
(``Decision.expires_at``; a JWT's is ``exp``): DISCONNECT 0xA0 (Maximum connect time) in
5.0, a plain close in 3.1.1, the will published, the close counted. In process: a node on
fakeredis, the MQTT server of :func:`router.mqtt.serve`, raw clients speaking bytes."""

from __future__ import annotations

import asyncio
import time

import pytest

from router.cluster.node import RouterNode
from router.core.hooks import ClientInfo, Decision, HookPoint, Stop
from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_3_1_1, MQTT_5, ConnAck, Connect, Disconnect, Packet, Will
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)

WAIT = 5.0


def valid_for(node: RouterNode, seconds: float) -> None:
    """Accept every client, with credentials valid ``seconds`` from each CONNECT."""

    def check(client: ClientInfo, password: object, acc: Decision) -> Stop[Decision]:
        return Stop(Decision.allow("test", time.time() + seconds))

    node.hooks.register(HookPoint.CLIENT_AUTHENTICATE, check)


async def session(port: int, level: int, connect: Connect) -> tuple[list[Packet], float]:
    """CONNECT, then every packet the server sends until it closes, and the seconds from
    the CONNACK to the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    packets = PacketReader()
    packets.level = level
    got: list[Packet] = []
    acked = 0.0
    try:
        writer.write(encode(connect, level))
        async with asyncio.timeout(WAIT):
            while chunk := await reader.read(65536):
                got += packets.feed(chunk)
                acked = acked or time.monotonic()
    finally:
        writer.close()
    return got, time.monotonic() - acked


@pytest.mark.parametrize("level", [MQTT_5, MQTT_3_1_1], ids=["5.0", "3.1.1"])
async def test_expired_credentials_end_the_connection_and_publish_the_will(
    start_node: StartNode, level: int
) -> None:
    node = await start_node("n1")
    await node.subscribe("watcher", "wills/#")
    valid_for(node, 0.5)
    connect = Connect(
        "expiring", level, will=Will("wills/expiring", b"gone"), username="u", password=b"p"
    )
    async with serve(node, ["127.0.0.1:0"], MqttSettings()) as server:
        got, lasted = await session(server.addresses[0][1], level, connect)
        assert [type(p) for p in got] == ([ConnAck, Disconnect] if level == MQTT_5 else [ConnAck])
        assert isinstance(got[0], ConnAck) and got[0].reason_code == 0
        if level == MQTT_5:
            assert got[1] == Disconnect(0xA0)
        assert 0.2 < lasted < WAIT
        [will] = await take(node, "watcher", 1)
        assert (will.topic, will.payload) == ("wills/expiring", b"gone")
        assert server.stats()["mqtt_closed_maximum_connect_time"] == 1


async def test_a_connection_that_ends_first_leaves_no_timer(start_node: StartNode) -> None:
    node = await start_node("n1")
    valid_for(node, 3600)
    async with serve(node, ["127.0.0.1:0"], MqttSettings()) as server:
        assert server.stats()["mqtt_closed_maximum_connect_time"] == 0  # (always listed)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.addresses[0][1])
        writer.write(encode(Connect("brief", MQTT_5, username="u", password=b"p"), MQTT_5))
        async with asyncio.timeout(WAIT):
            await reader.read(65536)  # (the CONNACK)
        connection = server.owner("brief")
        assert connection is not None
        timer = connection._expiry
        assert timer is not None and not timer.cancelled()
        writer.write(encode(Disconnect(0), MQTT_5))
        async with asyncio.timeout(WAIT):
            await connection.finished()
        writer.close()
        assert timer.cancelled()
        assert server.stats()["mqtt_closed_maximum_connect_time"] == 0


async def test_credentials_without_expiry_set_no_timer(start_node: StartNode) -> None:
    node = await start_node("n1")
    async with serve(node, ["127.0.0.1:0"], MqttSettings()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.addresses[0][1])
        writer.write(encode(Connect("plain", MQTT_5), MQTT_5))
        async with asyncio.timeout(WAIT):
            await reader.read(65536)
        connection = server.owner("plain")
        assert connection is not None and connection._expiry is None
        writer.close()
