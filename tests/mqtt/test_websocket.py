"""MQTT over WebSocket (``--mqtt-ws``): paho-mqtt's websockets transport publishes through
node a's WebSocket listener to a subscriber on node b's TCP listener, and back; a request
for another path gets HTTP 404."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator

import pytest
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_5, ConnAck, Connect, Disconnect, Packet
from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, listener_ports, mqtt_node, routed_to


@pytest.fixture
def ports(redis_standalone_url: str, keys: Keys) -> Iterator[tuple[int, int]]:
    """(WebSocket port of node a, TCP port of node b)."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    with (
        mqtt_node("a", env, "--mqtt-ws", "127.0.0.1:0") as (a, _),
        mqtt_node("b", env) as (
            _,
            port_b,
        ),
    ):
        yield listener_ports(a)["MQTT WS"][0], port_b


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5.0"])
def test_paho_over_websocket_both_ways(ports: tuple[int, int], protocol: int) -> None:
    ws_port, port_b = ports
    web = Paho(ws_port, "browser", protocol, websocket="/mqtt")
    tcp = Paho(port_b, "device", protocol)
    try:
        assert web.connected()[0] == 0
        assert web.subscribe("down/#", 1) == [1]
        assert tcp.subscribe("up/#", 1) == [1]
        routed_to(web, "up/probe", tcp)
        routed_to(tcp, "down/probe", web)
        web.publish("up/x", b"from the browser", 1)
        tcp.publish("down/x", b"to the browser", 2)
        assert tcp.take(1)[0].payload == b"from the browser"
        down = web.take(1)[0]
        assert (down.topic, down.payload, down.qos) == ("down/x", b"to the browser", 1)
    finally:
        web.close()
        tcp.close()


def test_another_path_gets_404(ports: tuple[int, int]) -> None:
    ws_port, _ = ports
    with socket.create_connection(("127.0.0.1", ws_port), timeout=TIMEOUT) as sock:
        sock.sendall(
            b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 404")


def _masked(payload: bytes, opcode: int = 0x2) -> bytes:
    """One client frame (clients mask theirs, RFC 6455 5.3), FIN set; binary by default."""
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + size.to_bytes(2, "big")
    return (
        bytes([0x80 | opcode])
        + length
        + mask
        + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """(opcode, payload) of each whole server frame (unmasked, under 64 KiB) in ``data``."""
    frames, at = [], 0
    while at + 2 <= len(data):
        size, start = data[at + 1] & 0x7F, at + 2
        if size == 126:
            size, start = int.from_bytes(data[at + 2 : at + 4], "big"), at + 4
        frames.append((data[at] & 0x0F, data[start : start + size]))
        at = start + size
    return frames


def test_the_socket_closes_promptly_after_the_servers_disconnect(ports: tuple[int, int]) -> None:
    """A client that does not answer the server's WebSocket Close frame (paho's does not)
    is closed at once after DISCONNECT, as over TCP. Before: ~10 s later (the websockets
    library's close timeout)."""
    ws_port, _ = ports
    with socket.create_connection(("127.0.0.1", ws_port), timeout=TIMEOUT) as sock:
        sock.sendall(
            b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        response = b""
        while b"\r\n\r\n" not in response:
            response += sock.recv(4096)
        assert response.startswith(b"HTTP/1.1 101")
        received = response.split(b"\r\n\r\n", 1)[1]
        sock.sendall(_masked(encode(Connect("ws-closing", MQTT_5, keepalive=60))))
        sock.sendall(_masked(b"\x30\xff\xff\x7f"))  # announces 2 MiB: above the maximum
        started = time.monotonic()
        while chunk := sock.recv(4096):
            received += chunk
        took = time.monotonic() - started
    frames = _frames(received)
    mqtt = PacketReader()
    mqtt.level = MQTT_5
    packets = mqtt.feed(b"".join(payload for opcode, payload in frames if opcode == 0x2))
    assert [type(packet) for packet in packets] == [ConnAck, Disconnect]
    assert packets[1] == Disconnect(0x95)
    assert frames[-1][0] == 0x8  # a Close frame, then the socket closes
    assert took < 2.0, f"closed {took:.1f} s after DISCONNECT"


def _start_of_a_frame(announced: int, sent: int) -> bytes:
    """The first ``sent`` bytes of a client's binary frame of ``announced`` payload bytes
    (masked with a zero key: the payload goes as it is)."""
    return b"\x82\xff" + announced.to_bytes(8, "big") + b"\0\0\0\0" + b"x" * sent


def test_a_slow_loris_over_websocket_meets_the_node_s_unfinished_packet_bounds(
    redis_standalone_url: str, keys: Keys
) -> None:
    """Frames still arriving were held inside the WebSocket library, outside the node's
    bounds on unfinished packets (each connection up to the largest packet, for good).
    Now: with 1 MiB for the node, the fourth of four connections holding 300 KiB of a
    512 KiB frame gets DISCONNECT 0x97, and the others 0x8D once a frame is 2 s late."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    bounds = ("--mqtt-max-unfinished-bytes", str(1 << 20), "--mqtt-packet-timeout", "2")
    with mqtt_node("ws-loris", env, "--mqtt-ws", "127.0.0.1:0", *bounds) as (node, _):
        url = f"ws://127.0.0.1:{listener_ports(node)['MQTT WS'][0]}/mqtt"
        lorises: list[ClientConnection] = []
        with contextlib.ExitStack() as opened:
            for number in range(4):
                loris = opened.enter_context(
                    connect(url, subprotocols=[Subprotocol("mqtt")], open_timeout=TIMEOUT)
                )
                lorises.append(loris)
                loris.send(encode(Connect(f"ws-loris-{number}", MQTT_5, keepalive=0)))
                assert answer(loris) == (ConnAck, 0)
                loris.socket.sendall(_start_of_a_frame(512 << 10, 300 << 10))
            started = time.monotonic()
            assert answer(lorises[3]) == (Disconnect, 0x97)
            assert [answer(loris) for loris in lorises[:3]] == [(Disconnect, 0x8D)] * 3
            assert 1.5 < time.monotonic() - started < TIMEOUT


def answer(websocket: ClientConnection) -> tuple[type[Packet], int | None]:
    """The type and reason code of the next packet the server sent on ``websocket``."""
    reader = PacketReader()
    reader.level = MQTT_5
    message = websocket.recv(timeout=TIMEOUT)
    assert isinstance(message, bytes)
    [packet] = reader.feed(message)
    return type(packet), getattr(packet, "reason_code", None)
