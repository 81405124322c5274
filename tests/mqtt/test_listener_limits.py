"""The listener's limits against clients that break them, in process (a node on
fakeredis, the MQTT server of :func:`router.mqtt.serve`, raw clients speaking bytes):
each refusal gets the reason code the specification names, is counted in the server's
stats, and leaves nothing unhandled in the log. The same limits against a real node
process, with its memory measured: ``tests/system/test_hostile_clients.py``."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.cluster.node import RouterNode
from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    Publish,
    PubRec,
    SubAck,
    Subscribe,
    Subscription,
)
from router.mqtt.properties import Properties
from router.mqtt.protocol import READ_PAUSE, MqttConnection
from router.mqtt.server import MqttServer, serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient
from tests.support.waiting import eventually

pytestmark = pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)

WAIT = 5.0


async def answers(port: int, *sends: bytes) -> list[Packet]:
    """Send ``sends`` on a new connection; the packets the server sent until it closed.
    (What the server logs as its side of the connection ends is in the log once the
    ``serve`` block is left: closing the server waits for every connection's task.)"""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for data in sends:
            writer.write(data)
        data = b""
        async with asyncio.timeout(WAIT):
            while chunk := await reader.read(65536):
                data += chunk
    finally:
        writer.close()
    packets = PacketReader()
    packets.level = MQTT_5
    return packets.feed(data)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Log records at ERROR or above (an exception nothing handled is one)."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


def publish(
    topic: str, qos: int = 0, packet_id: int | None = None, alias: int | None = None
) -> bytes:
    properties = Properties(topic_alias=alias) if alias is not None else Properties()
    return encode(Publish(topic, b"x", qos, False, False, packet_id, properties), MQTT_5)


async def server_of(start_node: StartNode, **limits: float) -> tuple[RouterNode, MqttSettings]:
    return await start_node("n1"), MqttSettings(**limits)  # type: ignore[arg-type]


async def test_a_client_that_never_sends_connect_is_closed_quietly_and_counted(
    start_node: StartNode, caplog: pytest.LogCaptureFixture
) -> None:
    node, settings = await server_of(start_node, connect_timeout=0.3)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        started = time.monotonic()
        assert await answers(server.addresses[0][1]) == []
        assert 0.25 < time.monotonic() - started < WAIT
        assert server.stats()["mqtt_closed_connect_timeout"] == 1
    assert errors(caplog) == []


def connect_all(port: int, count: int) -> tuple[float, list[socket.socket]]:
    """Open ``count`` connections one after the other: (the longest connect, seconds)."""
    socks, longest = [], 0.0
    for _ in range(count):
        started = time.monotonic()
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT))
        longest = max(longest, time.monotonic() - started)
    return longest, socks


async def test_a_burst_of_connections_is_not_left_to_syn_retransmissions(
    start_node: StartNode,
) -> None:
    """A burst beyond the listen backlog has SYNs dropped: each client in it, a
    well-behaved one too, waits a second or more for the retransmission. The excess of
    ``max_connections`` must be refused at accept, not by the kernel's queue (the
    backlog is capped by ``net.core.somaxconn``: 4096 on Linux since 5.4)."""
    burst = min(800, int(Path("/proc/sys/net/core/somaxconn").read_text()) - 24)
    node, settings = await server_of(start_node, max_connections=10)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        longest, socks = await asyncio.to_thread(connect_all, server.addresses[0][1], burst)
        for sock in socks:
            sock.close()
    assert longest < 0.5, f"a connect of the burst took {longest:.2f} s"


async def test_a_topic_alias_bound_to_a_topic_with_a_wildcard_gets_0x90(
    start_node: StartNode, caplog: pytest.LogCaptureFixture
) -> None:
    node, settings = await server_of(start_node)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        got = await answers(port, encode(Connect("wild", MQTT_5)), publish("a/+", alias=1))
        assert [type(p) for p in got] == [ConnAck, Disconnect]
        assert got[1] == Disconnect(0x90)
        assert server.stats()["mqtt_closed_topic_name_invalid"] == 1
    assert errors(caplog) == []


@pytest.mark.parametrize("qos1", [1, 3], ids=["one qos 1", "a run of qos 1"])
async def test_qos_1_over_a_receive_maximum_held_by_unreleased_qos_2_gets_0x93(
    start_node: StartNode, qos1: int
) -> None:
    """Receive Maximum counts QoS 1 and QoS 2 PUBLISHes not yet answered with PUBACK or
    PUBCOMP (MQTT-3.3.4-7/8): with the quota spent on QoS 2 flows awaiting PUBREL, a
    QoS 1 PUBLISH is one too many."""
    node, settings = await server_of(start_node, receive_maximum=2)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        flows = [publish("q/two", 2, packet_id) for packet_id in (1, 2)]
        ones = [publish("q/one", 1, 10 + n) for n in range(qos1)]
        got = await answers(
            server.addresses[0][1], encode(Connect("greedy", MQTT_5)), b"".join(flows + ones)
        )
        assert [type(p) for p in got] == [ConnAck, PubRec, PubRec, Disconnect]  # no PUBACK
        assert got[-1] == Disconnect(0x93)
        assert server.stats()["mqtt_closed_receive_maximum_exceeded"] == 1


async def test_a_takeover_whose_old_connection_does_not_end_is_refused_with_0x89(
    start_node: StartNode, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, settings = await server_of(start_node, connect_timeout=0.3)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode(Connect("twice", MQTT_5)))
        await reader.read(64)  # CONNACK
        old = server.owner("twice")
        assert old is not None
        stuck = asyncio.Event()
        finished = MqttConnection.finished

        async def never_for_old(connection: MqttConnection) -> None:
            await (stuck.wait() if connection is old else finished(connection))

        monkeypatch.setattr(MqttConnection, "finished", never_for_old)  # (its end never comes)
        try:
            got = await answers(port, encode(Connect("twice", MQTT_5)))
        finally:
            stuck.set()
            writer.close()
        assert got == [ConnAck(False, 0x89)]
    assert errors(caplog) == []


class StalledTransport:
    """A client that reads nothing: every write stays in the backlog, and a drain above
    asyncio's high-water mark waits until the connection is closed."""

    peer = "stalled"

    def __init__(self, backlog: int) -> None:
        self.tap = None
        self.written = backlog
        self._closed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def backlog(self) -> int:
        return self.written

    def acknowledge(self) -> None:
        pass

    async def drain(self) -> None:
        if self.written > 65536:
            await self._closed.wait()
            raise ConnectionResetError("closed")

    def close(self) -> None:
        self._closed.set()


async def test_a_client_that_reads_none_of_its_answers_is_not_read_either(
    start_node: StartNode,
) -> None:
    """The answers to a client's packets (PINGRESP, PUBACK, PUBCOMP...) pile up in the
    node's write buffer while it does not read them: above ``READ_PAUSE`` bytes the node
    stops reading from it (TCP pushes back on the client) instead of buffering without
    bound, and after 1.5 x keepalive of that the connection ends (0x8D)."""
    node, settings = await server_of(start_node)
    server = MqttServer(node, settings)
    transport = StalledTransport(backlog=READ_PAUSE + 1)  # (deliveries it did not read)
    consumed = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal consumed
        yield encode(Connect("deaf", MQTT_5, keepalive=1))
        for _ in range(50):
            consumed += 1
            yield encode(PingReq()) * 1000

    started = time.monotonic()
    async with asyncio.timeout(WAIT):
        await server.run_connection(MqttConnection(server, transport), chunks())
    assert consumed <= 2
    assert 1.4 < time.monotonic() - started < WAIT
    assert server.stats()["mqtt_closed_keep_alive_timeout"] == 1


class ResetTransport:
    """A client whose socket its peer reset: asyncio marks the transport closing at once
    and tells the protocol a loop turn later, so a drain in between raises."""

    peer = "reset"

    def __init__(self) -> None:
        self.tap = None
        self.reset = False
        self.reader = PacketReader()
        self.reader.level = MQTT_5
        self.written: list[Packet] = []

    def write(self, data: bytes) -> None:
        self.written += self.reader.feed(data)

    def backlog(self) -> int:
        return 0

    def acknowledge(self) -> None:
        pass

    async def drain(self) -> None:
        if self.reset:
            raise ConnectionResetError("Connection lost")

    def close(self) -> None:
        pass


async def test_a_delivery_to_a_reset_socket_ends_the_connection_without_a_traceback(
    start_node: StartNode, caplog: pytest.LogCaptureFixture
) -> None:
    """A fuzzer's clients that reset their sockets while deliveries flowed put a WARNING
    with a ConnectionResetError traceback in the log (5 in 20,000 connections), and the
    connection was ended as taken over (DISCONNECT 0x8E to nobody). The client is gone:
    the connection ends as lost, quietly."""
    node, settings = await server_of(start_node, sys_interval=0)
    server = MqttServer(node, settings)
    transport = ResetTransport()
    connection = MqttConnection(server, transport)
    more = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        yield encode(Connect("reset", MQTT_5))
        yield encode(Subscribe(1, (Subscription("reset/#", 0),)), MQTT_5)
        await more.wait()  # (the stream stays open: only the failed delivery ends it)

    running = asyncio.create_task(server.run_connection(connection, chunks()))
    try:
        await eventually(
            lambda: any(isinstance(p, SubAck) for p in transport.written), WAIT, "the SUBACK"
        )
        transport.reset = True
        await node.publish("reset/x", b"to nobody")
        async with asyncio.timeout(WAIT):
            await connection.finished()
    finally:
        more.set()
        async with asyncio.timeout(WAIT):
            await running
    assert [record.getMessage() for record in caplog.records if record.exc_info] == []
    assert not any(isinstance(p, Disconnect) for p in transport.written)


async def test_deliveries_wait_while_their_unacknowledged_bytes_are_at_max_inflight_bytes(
    start_node: StartNode,
) -> None:
    """Before, a client that acknowledged nothing held ``max_inflight`` deliveries on the
    node whatever their size (64 of 1 MiB). Now one that would take the unacknowledged
    payload bytes above ``max_inflight_bytes`` waits in the queue (and what is behind it)
    until PUBACKs make room; one larger than the whole window goes when it is empty."""
    node, settings = await server_of(start_node, max_inflight_bytes=1000, sys_interval=0)
    async with serve(node, ["127.0.0.1:0"], settings) as server:

        def waits() -> int:
            return server.stats()["mqtt_inflight_bytes_waited"]

        deaf = await RawClient.connect(server.addresses[0][1], "deaf", clean_start=True, expiry=0)
        try:
            await deaf.subscribe("big/#", 1)
            await node.publish("big/alone", b"a" * 3000, qos=1)
            [alone] = await deaf.take(1)  # (larger than the window, but nothing else is out)
            for n in range(6):
                await node.publish(f"big/{n}", bytes([n]) * 300, qos=1)
            await eventually(lambda: waits() == 1, WAIT, "the deliveries to wait on their bytes")
            with pytest.raises(TimeoutError):
                await deaf.take(1, deadline=0.3)
            deaf.acknowledge([alone])
            first = await deaf.take(3)  # 900 bytes: a fourth would make 1,200
            assert [p.topic for p in first] == ["big/0", "big/1", "big/2"]
            await eventually(lambda: waits() == 2, WAIT, "the fourth delivery to wait")
            with pytest.raises(TimeoutError):
                await deaf.take(1, deadline=0.3)
            deaf.acknowledge(first[:1])
            assert [p.topic for p in await deaf.take(1)] == ["big/3"]
            deaf.acknowledge(first[1:])
            assert [p.topic for p in await deaf.take(2)] == ["big/4", "big/5"]
        finally:
            deaf.drop()
