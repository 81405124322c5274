"""A node behind real load balancers: HAProxy in TCP mode (PROXY protocol v2 and v1) in
front of the TCP, TLS and WebSocket listeners, plain and over TLS (TLS passed through),
and nginx in front of the WebSocket and HTTP listeners (X-Forwarded-For). The configs
are docs/operations.md's ("Behind a load balancer"), read from it, their addresses
replaced by free loopback ports. Clients bind 127.0.0.2 so that their address differs
from the balancers' (127.0.0.1): the node must see 127.0.0.2 in its client listing, in
bans and in the login throttle. Then raw sockets straight at the node: an untrusted
PROXY header, a trusted peer without one, a malformed one and a slow one are refused
and counted."""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import re
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from router.cli import app
from router.core.trusted_proxies import TrustedProxies
from router.errors import InvalidSettingError
from router.mqtt.settings import MqttSettings
from router.state.keys import Keys
from tests.mqtt.test_bans import bans
from tests.support.metrics import scrape
from tests.support.mqtt import TIMEOUT, Paho, listener_ports, mqtt_node
from tests.support.pki import Pki, make_pki
from tests.support.servers import free_port
from tests.support.waiting import wait_until
from tests.system.test_doc_blocks import REPOSITORY, blocks_of

CLIENT, OTHER = "127.0.0.2", "127.0.0.3"  # (the balancers connect from 127.0.0.1)
DOC_NODE_PORTS = {"MQTT": 1883, "MQTT TLS": 8883, "MQTT WS": 8083, "MQTT WSS": 8084}
DOC_HTTP = 8080


def doc_config(first_line: str) -> str:
    """The text block of docs/operations.md that starts with ``first_line``."""
    [block] = [
        block
        for block in blocks_of(REPOSITORY / "docs" / "operations.md")
        if block.code.startswith(first_line + "\n")
    ]
    return block.code


@contextlib.contextmanager
def program(command: list[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (a balancer in the foreground) until the block ends; yields once
    it accepts connections on ``port``."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:

        def accepting() -> bool:
            assert process.poll() is None, f"{command[0]} ended: {log.read_text()}"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return True
            return False

        wait_until(accepting, TIMEOUT, f"{command[0]} listening")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(TIMEOUT)


def outcome(client: Paho) -> str:
    """``accepted`` once the client's CONNACK says so, ``closed`` if the node closed it."""
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                code, _ = client.connack.get(timeout=0.05)
                return "accepted" if code == 0 else f"refused 0x{code:02x}"
            if not client.disconnects.empty():
                return "closed"
        return "no answer"
    finally:
        client.close()


def peer_of(http_address: str, client_id: str) -> str:
    """The client's address as the node's API shows it (its connection's peer)."""
    url = f"http://{http_address}/api/v1/clients/{client_id}"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        detail: dict[str, Any] = json.load(response)
    return str(detail["connection"]["peer"]).rpartition(":")[0]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def env(redis_standalone_url: str, keys: Keys) -> dict[str, str]:
    return {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}


class Proxied:
    """A node whose TCP, TLS and WebSocket (ws, wss) listeners read PROXY headers from
    127.0.0.1."""

    def __init__(self, ports: dict[str, int], http: str) -> None:
        self.ports = ports
        self.http = http


@pytest.fixture
def proxied(env: dict[str, str], pki: Pki) -> Iterator[Proxied]:
    http = f"127.0.0.1:{free_port()}"
    args = [
        *("--mqtt-tls", "127.0.0.1:0", "--tls-cert", str(pki.server_cert)),
        *("--tls-key", str(pki.server_key), "--mqtt-ws", "127.0.0.1:0", "--http", http),
        *("--mqtt-wss", "127.0.0.1:0"),
        *("--mqtt-proxy-protocol", "mqtt", "--mqtt-proxy-protocol", "mqtts"),
        *("--mqtt-proxy-protocol", "ws", "--mqtt-proxy-protocol", "wss"),
        *("--mqtt-proxy-trusted", "127.0.0.1"),
        *("--mqtt-connect-timeout", "1"),
    ]
    with mqtt_node("lb", env, *args) as (process, _):
        ports = {kind: found[0] for kind, found in listener_ports(process).items()}
        yield Proxied(ports, http)


@contextlib.contextmanager
def haproxy(node: Proxied, folder: Path, version: int) -> Iterator[dict[str, int]]:
    """HAProxy from the docs' config in front of ``node``; yields its port for each of
    the node's listeners (by kind)."""
    fronts = {kind: free_port() for kind in DOC_NODE_PORTS}
    by_doc_port = {port: kind for kind, port in DOC_NODE_PORTS.items()}
    config = doc_config("# haproxy.cfg")
    config = re.sub(
        r"bind :(\d+)", lambda m: f"bind 127.0.0.1:{fronts[by_doc_port[int(m[1])]]}", config
    )
    config = re.sub(
        r"10\.0\.0\.1[12]:(\d+)",
        lambda m: f"127.0.0.1:{node.ports[by_doc_port[int(m[1])]]}",
        config,
    )
    if version == 1:
        config = config.replace("send-proxy-v2", "send-proxy")
    path = folder / "haproxy.cfg"
    path.write_text(config)
    with program(["haproxy", "-f", str(path), "-db"], fronts["MQTT"], folder / "haproxy.log"):
        yield fronts


@pytest.mark.parametrize("version", [2, 1])
def test_behind_haproxy_the_node_sees_the_client_address(
    proxied: Proxied, tmp_path: Path, keys: Keys, redis_standalone_url: str, version: int
) -> None:
    with haproxy(proxied, tmp_path, version) as fronts:
        client = Paho(fronts["MQTT"], "behind", bind=CLIENT)
        try:
            assert client.connected()[0] == 0
            assert peer_of(proxied.http, "behind") == CLIENT
        finally:
            client.close()
        bans(keys, redis_standalone_url, "add", "address", OTHER, "--for", "30")
        wait_until(
            lambda: outcome(Paho(fronts["MQTT"], "other", bind=OTHER)) == "closed",
            TIMEOUT,
            f"{OTHER} refused behind the balancer",
        )
        assert outcome(Paho(fronts["MQTT"], "still-fine", bind=CLIENT)) == "accepted"
        bans(keys, redis_standalone_url, "add", "address", CLIENT, "--for", "30")
        wait_until(
            lambda: outcome(Paho(fronts["MQTT"], "banned", bind=CLIENT)) == "closed",
            TIMEOUT,
            f"{CLIENT} refused behind the balancer",
        )
    stats = scrape(proxied.http)
    assert stats["router_mqtt_proxy_accepted_total"] >= 3
    assert stats["router_mqtt_banned_total"] >= 2


def test_tls_and_websocket_pass_through_haproxy(proxied: Proxied, tmp_path: Path, pki: Pki) -> None:
    with haproxy(proxied, tmp_path, 2) as fronts:
        secure = Paho(fronts["MQTT TLS"], "secure", tls=(pki, False), bind=CLIENT)
        web = Paho(fronts["MQTT WS"], "web", websocket="/mqtt", bind=CLIENT)
        try:
            assert secure.connected()[0] == 0
            assert web.connected()[0] == 0
            assert peer_of(proxied.http, "secure") == CLIENT
            assert peer_of(proxied.http, "web") == CLIENT
            assert web.subscribe("lb/t", 1) == [1]
            secure.publish("lb/t", b"through haproxy", 1)
            assert web.take(1)[0].payload == b"through haproxy"
        finally:
            secure.close()
            web.close()


def test_websocket_over_tls_passes_through_haproxy(
    proxied: Proxied, tmp_path: Path, pki: Pki, keys: Keys, redis_standalone_url: str
) -> None:
    """A browser's wss:// through HAProxy in TCP mode: the PROXY header comes before its
    TLS handshake, then the upgrade; the node sees the client's own address (a ban of it
    holds behind the balancer). A client straight at the node from an untrusted address
    is served as itself, and its forged X-Forwarded-For is not believed."""
    secure_web: dict[str, Any] = {"websocket": "/mqtt", "tls": (pki, False), "bind": CLIENT}
    forged = {"X-Forwarded-For": "192.0.2.1"}
    with haproxy(proxied, tmp_path, 2) as fronts:
        browser = Paho(fronts["MQTT WSS"], "browser", **secure_web)
        direct = Paho(
            proxied.ports["MQTT WSS"],
            "direct",
            **secure_web | {"bind": OTHER, "ws_headers": forged},
        )
        try:
            assert browser.connected()[0] == 0
            assert direct.connected()[0] == 0
            assert peer_of(proxied.http, "browser") == CLIENT
            assert peer_of(proxied.http, "direct") == OTHER
            assert browser.subscribe("lb/wss", 1) == [1]
            direct.publish("lb/wss", b"through haproxy", 1)
            assert browser.take(1)[0].payload == b"through haproxy"
        finally:
            browser.close()
            direct.close()
        bans(keys, redis_standalone_url, "add", "address", CLIENT, "--for", "30")
        wait_until(
            lambda: outcome(Paho(fronts["MQTT WSS"], "banned", **secure_web)) == "closed",
            TIMEOUT,
            f"{CLIENT} refused behind the balancer over wss",
        )
    stats = scrape(proxied.http)
    assert stats["router_mqtt_proxy_accepted_total"] >= 2
    assert stats["router_mqtt_banned_total"] >= 1
    assert stats["router_mqtt_forwarded_ignored_total"] == 1
    assert stats["router_mqtt_forwarded_accepted_total"] == 0


def refused_at_once(port: int, source: str, data: bytes) -> bool:
    """Whether the node closes a connection from ``source`` that sends ``data``."""
    with socket.create_connection(("127.0.0.1", port), TIMEOUT, (source, 0)) as sock:
        sock.sendall(data)
        sock.settimeout(TIMEOUT)
        with contextlib.suppress(ConnectionResetError):
            return sock.recv(16) == b""
        return True


CONNECT = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"  # (3.1.1, empty client id)


def test_headers_from_the_wrong_peers_are_refused_and_counted(proxied: Proxied) -> None:
    port = proxied.ports["MQTT"]
    header = b"PROXY TCP4 192.0.2.7 127.0.0.1 5000 1883\r\n"
    assert refused_at_once(port, CLIENT, header + CONNECT)  # untrusted, with a header
    assert refused_at_once(port, "127.0.0.1", CONNECT)  # trusted, without one
    assert refused_at_once(port, "127.0.0.1", b"PROXY TCP4 nonsense\r\n" + b"x" * 20)
    assert refused_at_once(port, "127.0.0.1", b"PROXY TCP4 ")  # then silence: the timeout
    with socket.create_connection(("127.0.0.1", port), TIMEOUT, (CLIENT, 0)) as sock:
        sock.sendall(CONNECT)  # untrusted without a header: a client as any other
        sock.settimeout(TIMEOUT)
        assert sock.recv(4)[:1] == b"\x20"  # CONNACK
    with socket.create_connection(("127.0.0.1", port), TIMEOUT, ("127.0.0.1", 0)) as sock:
        sock.sendall(b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00" + CONNECT)  # v2 LOCAL
        sock.settimeout(TIMEOUT)
        assert sock.recv(4)[:1] == b"\x20"
    stats = scrape(proxied.http)
    for way in ("untrusted", "missing", "malformed", "timeout"):
        assert stats[f"router_mqtt_proxy_refused_{way}_total"] == 1, way
    assert stats["router_mqtt_proxy_local_total"] >= 1
    assert stats["router_mqtt_proxy_pending"] == 0


def upgrade(*headers: bytes) -> bytes:
    """A WebSocket upgrade to /mqtt (subprotocol mqtt), with these more header lines."""
    return (
        b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Protocol: mqtt\r\n" + b"".join(line + b"\r\n" for line in headers) + b"\r\n"
    )


@pytest.mark.parametrize(
    ("kind", "first", "answered"),
    [("MQTT TLS", CONNECT, b"\x20"), ("MQTT WSS", upgrade(), b"HTTP/1.1 101")],
)
def test_tls_starts_right_after_a_header_in_the_same_segment(
    proxied: Proxied, pki: Pki, kind: str, first: bytes, answered: bytes
) -> None:
    """The header and the ClientHello in one segment, then the client's Finished and its
    first bytes (a CONNECT; a WebSocket upgrade) in one: the node reads no byte of TLS as
    the header's (an exact read) and loses none that comes with the end of the handshake."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    header = b"PROXY TCP4 192.0.2.7 127.0.0.1 5000 8883\r\n"
    address = ("127.0.0.1", proxied.ports[kind])
    with socket.create_connection(address, TIMEOUT, ("127.0.0.1", 0)) as sock:
        sock.settimeout(TIMEOUT)

        def answer(step: Callable[[], bytes | None], sent: bytes = b"") -> bytes | None:
            """Send ``sent`` and what TLS has to send, feed TLS what comes back until
            ``step`` stops wanting to read."""
            for _ in range(10):  # (a handshake takes a round trip or two)
                sock.sendall(sent + outgoing.read())
                sent = b""
                data = sock.recv(65536)
                assert data, "the node closed the connection"
                incoming.write(data)
                with contextlib.suppress(ssl.SSLWantReadError):
                    return step()
            raise AssertionError("no answer over TLS")

        with contextlib.suppress(ssl.SSLWantReadError):
            tls.do_handshake()
        answer(tls.do_handshake, header)  # (the header and the ClientHello: one send)
        tls.write(first)  # (with the client's Finished, still unsent: one send)
        response = answer(lambda: tls.read(len(answered)))
        assert response == answered


def test_a_websocket_listener_reads_the_header_before_the_upgrade(proxied: Proxied) -> None:
    port = proxied.ports["MQTT WS"]
    assert refused_at_once(port, CLIENT, b"PROXY UNKNOWN\r\n" + upgrade())  # untrusted
    assert refused_at_once(port, "127.0.0.1", upgrade())  # trusted, no header
    header = b"PROXY TCP4 192.0.2.7 127.0.0.1 5000 8083\r\n"
    with socket.create_connection(("127.0.0.1", port), TIMEOUT, ("127.0.0.1", 0)) as sock:
        sock.sendall(header + upgrade())  # (one segment: the upgrade follows the header)
        sock.settimeout(TIMEOUT)
        assert sock.recv(12) == b"HTTP/1.1 101"
    stats = scrape(proxied.http)
    assert stats["router_mqtt_proxy_refused_untrusted_total"] == 1
    assert stats["router_mqtt_proxy_refused_missing_total"] == 1


def websocket_frame(payload: bytes) -> bytes:
    """A client's binary WebSocket message (masked, with a key of zeros: RFC 6455 5.3)."""
    assert len(payload) < 126
    return bytes([0x82, 0x80 | len(payload)]) + b"\x00" * 4 + payload


def test_a_websocket_over_tls_listener_reads_the_header_before_the_handshake(
    proxied: Proxied, pki: Pki
) -> None:
    port = proxied.ports["MQTT WSS"]
    context = ssl.create_default_context(cafile=str(pki.ca))
    trusted = socket.create_connection(("127.0.0.1", port), TIMEOUT, ("127.0.0.1", 0))
    with (
        trusted,
        pytest.raises(OSError),  # no header: its ClientHello is not one
        context.wrap_socket(trusted, server_hostname="127.0.0.1") as tls,
    ):
        tls.recv(1)
    header = b"PROXY TCP4 192.0.2.7 127.0.0.1 5000 8084\r\n"
    assert refused_at_once(port, CLIENT, header)  # (untrusted: read as TLS, which fails)
    connect = b"\x10\x12\x00\x04MQTT\x04\x02\x00\x3c\x00\x06wssfwd"  # (3.1.1, id wssfwd)
    local = b"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00"  # (v2 LOCAL: the balancer itself)
    with socket.create_connection(("127.0.0.1", port), TIMEOUT, ("127.0.0.1", 0)) as sock:
        sock.sendall(local)
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            tls.sendall(upgrade(b"X-Forwarded-For: 192.0.2.9"))
            assert tls.recv(12) == b"HTTP/1.1 101"
            tls.sendall(websocket_frame(connect))  # (the rest of the 101 comes first)
            received = b""
            while not received.endswith(b"\x82\x04\x20\x02\x00\x00"):  # CONNACK 0
                data = tls.recv(4096)
                assert data, "the node closed the connection"
                received += data
            # (the balancer's own address, trusted: its X-Forwarded-For names the client)
            assert peer_of(proxied.http, "wssfwd") == "192.0.2.9"
    stats = scrape(proxied.http)
    assert stats["router_mqtt_proxy_refused_missing_total"] == 1
    assert stats["router_mqtt_proxy_refused_untrusted_total"] == 0  # (not read: see above)
    assert stats["router_mqtt_proxy_local_total"] == 1
    assert stats["router_mqtt_forwarded_accepted_total"] == 1
    assert stats["router_mqtt_proxy_pending"] == 0


def test_proxy_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(InvalidSettingError, match="proxy_trusted"):
        MqttSettings(proxy_protocol=frozenset({"mqtt"}))
    with pytest.raises(InvalidSettingError, match="the listeners are mqtt, mqtts, ws, wss"):
        MqttSettings(proxy_protocol=frozenset({"http"}), proxy_trusted=TrustedProxies.parse("::1"))
    result = CliRunner().invoke(app, ["node", "run", "--mqtt-proxy-protocol", "mqtt"])
    assert result.exit_code == 2
    assert "--mqtt-proxy-protocol: needs --mqtt-proxy-trusted" in result.output
    assert "Traceback" not in result.output


# -- nginx ----------------------------------------------------------------------------------


@pytest.fixture
def behind_nginx(env: dict[str, str], tmp_path: Path) -> Iterator[tuple[int, str, int]]:
    """A node with a WebSocket and an HTTP listener trusting 127.0.0.1 (no PROXY protocol),
    nginx from the docs' config in front: (nginx's port, the node's HTTP address, its
    WebSocket port)."""
    http = f"127.0.0.1:{free_port()}"
    args = ["--mqtt-ws", "127.0.0.1:0", "--http", http, "--mqtt-proxy-trusted", "127.0.0.1"]
    with ExitStack() as stack:
        process, _ = stack.enter_context(
            mqtt_node("ngx", env, *args, "--http-proxy-trusted", "127.0.0.1")
        )
        ws = listener_ports(process)["MQTT WS"][0]
        front = free_port()
        config = doc_config("# nginx.conf").replace("listen 80;", f"listen 127.0.0.1:{front};")
        config = config.replace("10.0.0.11:8083;", f"127.0.0.1:{ws};")
        config = config.replace("10.0.0.12:8083;", f"127.0.0.1:{ws};")
        config = config.replace(f"10.0.0.11:{DOC_HTTP};", f"{http};")
        assert "10.0.0." not in config
        (tmp_path / "logs").mkdir()
        (tmp_path / "nginx.conf").write_text(config)
        command = ["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr"]
        command += ["-g", f"daemon off; pid {tmp_path / 'nginx.pid'};"]
        stack.enter_context(program(command, front, tmp_path / "nginx.log"))
        yield front, http, ws


def test_behind_nginx_websocket_clients_have_their_address(
    behind_nginx: tuple[int, str, int],
) -> None:
    front, http, ws = behind_nginx
    client = Paho(front, "ws-behind", websocket="/mqtt", bind=CLIENT)
    forged = {"X-Forwarded-For": "192.0.2.1"}  # (straight to the node: not believed)
    forger = Paho(ws, "ws-forger", websocket="/mqtt", bind=OTHER, ws_headers=forged)
    try:
        assert client.connected()[0] == 0
        assert forger.connected()[0] == 0
        assert peer_of(http, "ws-behind") == CLIENT
        assert peer_of(http, "ws-forger") == OTHER
    finally:
        client.close()
        forger.close()
    stats = scrape(http)
    assert stats["router_mqtt_forwarded_accepted_total"] == 1
    assert stats["router_mqtt_forwarded_ignored_total"] == 1


def login(front: int, source: str, user: str) -> int:
    """The status of a failed login through nginx from ``source``."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", front, timeout=TIMEOUT, source_address=(source, 0)
    )
    try:
        body = json.dumps({"user": user, "password": "wrong"})
        connection.request("POST", "/api/v1/login", body, {"Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


def test_behind_nginx_the_login_throttle_counts_each_client(
    behind_nginx: tuple[int, str, int],
) -> None:
    front, _, _ = behind_nginx
    statuses = [login(front, CLIENT, f"guess-{n}") for n in range(10)]
    assert statuses == [401] * 10
    assert login(front, CLIENT, "guess-10") == 429  # (127.0.0.2's failures are used up)
    assert login(front, OTHER, "guess-11") == 401  # (another client behind the same proxy)
