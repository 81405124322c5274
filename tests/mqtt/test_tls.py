"""The TLS listener (``--mqtt-tls``) with certificates made by openssl for the test:
paho and mosquitto_sub over TLS, client certificates when required, and one-line errors
for a listener that cannot start."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner
from paho.mqtt.enums import CallbackAPIVersion

from router.cli import app
from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, Paho, listener_ports, mqtt_node, routed_to
from tests.support.pki import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_client(port: int, pki: Pki, client_id: str, *, with_cert: bool = False) -> Paho:
    """A paho 5.0 client over TLS that checks the server against the test CA."""
    return Paho(port, client_id, V5, tls=(pki, with_cert))


@pytest.fixture
def env(redis_standalone_url: str, keys: Keys) -> dict[str, str]:
    return {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}


def tls_args(pki: Pki, *extra: str) -> tuple[str, ...]:
    return (
        "--mqtt-tls",
        "127.0.0.1:0",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        *extra,
    )


@pytest.fixture
def tls_nodes(env: dict[str, str], pki: Pki) -> Iterator[tuple[int, int]]:
    """Node a with a TLS listener, node b plain: (TLS port of a, port of b)."""
    with mqtt_node("a", env, *tls_args(pki)) as (a, _), mqtt_node("b", env) as (_, port_b):
        yield listener_ports(a)["MQTT TLS"][0], port_b


def test_paho_over_tls_reaches_a_plain_subscriber_on_another_node(
    tls_nodes: tuple[int, int], pki: Pki
) -> None:
    tls_port, port_b = tls_nodes
    sub = Paho(port_b, "plain-sub", V5)
    pub = tls_client(tls_port, pki, "tls-pub")
    try:
        assert pub.connected()[0] == 0
        sub.subscribe("secure/#", 1)
        routed_to(pub, "secure/probe", sub)
        pub.publish("secure/x", b"over tls", 1)
        [message] = sub.take(1)
        assert (message.topic, message.payload) == ("secure/x", b"over tls")
    finally:
        pub.close()
        sub.close()


def test_mosquitto_sub_over_tls(tls_nodes: tuple[int, int], pki: Pki) -> None:
    tls_port, port_b = tls_nodes
    with subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(tls_port),
            "--cafile",
            str(pki.ca),
            "-t",
            "t/#",
            "-C",
            "1",
            "-q",
            "1",
            "-W",
            str(int(TIMEOUT)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as sub:
        pub = Paho(port_b, "pub", V5)
        try:
            deadline_rounds = int(TIMEOUT / 0.2)
            for _ in range(deadline_rounds):
                pub.publish("t/x", b"hello tls", 1)
                try:
                    out, _ = sub.communicate(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            pub.close()
    assert sub.returncode == 0
    assert out.strip() == "hello tls"


def test_a_required_client_certificate(env: dict[str, str], pki: Pki) -> None:
    args = tls_args(pki, "--tls-ca", str(pki.ca), "--tls-require-client-cert")
    with mqtt_node("strict", env, *args) as (node, _):
        port = listener_ports(node)["MQTT TLS"][0]
        refused = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="anon", protocol=V5)
        refused.tls_set(ca_certs=str(pki.ca))
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            refused.connect("127.0.0.1", port)
            refused.loop(timeout=2)  # the server's alert arrives after the handshake
            refused.loop(timeout=2)
            raise ConnectionError("the server accepted a client without a certificate")
        accepted = tls_client(port, pki, "certified", with_cert=True)
        try:
            assert accepted.connected()[0] == 0
        finally:
            accepted.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mqtt-tls", "127.0.0.1:0"), "needs --tls-cert and --tls-key"),
        (("--mqtt-wss", "127.0.0.1:0"), "needs --tls-cert and --tls-key"),
        (
            ("--mqtt-tls", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem", "--tls-key", "/x.key"),
            "/nonexistent.pem",
        ),
        (("--mqtt", "localhost"), "HOST:PORT"),
        (("--mqtt", "192.0.2.1:1883"), "cannot listen on 192.0.2.1:1883"),
    ],
    ids=[
        "no certificate",
        "wss without certificate",
        "missing files",
        "bad address",
        "not this machine's address",
    ],
)
def test_a_listener_that_cannot_start_is_one_error_line(
    env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    target = ["--redis", env["ROUTER_REDIS_URL"], "--prefix", env["ROUTER_PREFIX"]]
    result = CliRunner().invoke(app, ["node", "run", *target, *args])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert any(message in line for line in lines), result.output
    assert "Traceback" not in result.output
