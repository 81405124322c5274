"""MQTT over WebSocket over TLS (``--mqtt-wss``, the browsers' ``wss://``) with the test
certificates: paho-mqtt's websockets transport over TLS both ways to a TCP client on
another node, a required client certificate, and the listener named ``wss://`` in the
node's telemetry (``/api/v1/nodes``: what the dashboard lists)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
import urllib.request
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from router.mqtt.codec import encode
from router.mqtt.packets import Connect
from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, listener_ports, mqtt_node, routed_to
from tests.support.pki import Pki, make_pki
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def env(redis_standalone_url: str, keys: Keys) -> dict[str, str]:
    return {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}


def wss_args(pki: Pki, *extra: str) -> tuple[str, ...]:
    return (
        "--mqtt-wss",
        "127.0.0.1:0",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        *extra,
    )


def wss_client(port: int, pki: Pki, client_id: str, protocol: int = V5, **options: bool) -> Paho:
    """A paho client over wss:// at /mqtt that checks the server against the test CA."""
    return Paho(port, client_id, protocol, websocket="/mqtt", tls=(pki, options.get("cert", False)))


@pytest.fixture
def ports(env: dict[str, str], pki: Pki) -> Iterator[tuple[int, int, str]]:
    """(wss port of node a, TCP port of node b, a's HTTP base URL)."""
    with (
        mqtt_node("a", env, *wss_args(pki), "--http", "127.0.0.1:0") as (a, _),
        mqtt_node("b", env) as (_, port_b),
    ):
        base = re.search(r"HTTP on (http://\S+)", "\n".join(a.stderr_lines))
        assert base is not None
        yield listener_ports(a)["MQTT WSS"][0], port_b, base.group(1)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5.0"])
def test_paho_over_wss_both_ways(ports: tuple[int, int, str], pki: Pki, protocol: int) -> None:
    wss_port, port_b, _ = ports
    web = wss_client(wss_port, pki, "browser", protocol)
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


def test_a_plain_websocket_handshake_gets_no_answer_from_the_wss_port(
    ports: tuple[int, int, str],
) -> None:
    wss_port, _, _ = ports
    with socket.create_connection(("127.0.0.1", wss_port), timeout=TIMEOUT) as sock:
        sock.sendall(
            b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        )
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(100):  # (the TLS server closes: not a ClientHello)
                answer += chunk
    assert not answer.startswith(b"HTTP")


def test_the_listener_is_named_wss_in_the_nodes_telemetry(ports: tuple[int, int, str]) -> None:
    wss_port, _, base = ports
    listed: list[str] = []

    def named() -> bool:
        with urllib.request.urlopen(base + "/api/v1/nodes", timeout=TIMEOUT) as answer:
            rows = json.loads(answer.read())["items"]
        listed[:] = next((r["listeners"] or [] for r in rows if r["node_id"] == "a"), [])
        return bool(listed)

    wait_until(named, TIMEOUT, "node a's telemetry")
    assert f"wss://127.0.0.1:{wss_port}" in listed


def test_a_required_client_certificate_over_wss(env: dict[str, str], pki: Pki) -> None:
    args = wss_args(pki, "--tls-ca", str(pki.ca), "--tls-require-client-cert")
    with mqtt_node("strict", env, *args) as (node, _):
        port = listener_ports(node)["MQTT WSS"][0]
        context = ssl.create_default_context(cafile=str(pki.ca))
        # (TLS 1.3: the refusal may come as an alert in the handshake, a reset, or the
        # connection closed once the client sends: every one is a refusal)
        failures = (ssl.SSLError, ConnectionError, OSError, InvalidHandshake, ConnectionClosed)
        with (
            pytest.raises(failures),
            connect(
                f"wss://127.0.0.1:{port}/mqtt",
                ssl=context,
                subprotocols=[Subprotocol("mqtt")],
                open_timeout=TIMEOUT,
            ) as websocket,
        ):  # (TLS 1.3: the server's alert comes after the client's handshake)
            websocket.send(encode(Connect("anon")))
            websocket.recv(TIMEOUT)
        accepted = wss_client(port, pki, "certified", cert=True)
        try:
            assert accepted.connected()[0] == 0
        finally:
            accepted.close()
