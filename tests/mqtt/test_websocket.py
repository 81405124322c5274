"""MQTT over WebSocket (``--mqtt-ws``): paho-mqtt's websockets transport publishes through
node a's WebSocket listener to a subscriber on node b's TCP listener, and back; a request
for another path gets HTTP 404."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

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
