"""Limits a hostile client meets, each with the reason code the specification names and
a counter: subscriptions per session, topic levels, user properties, the publish rate,
a 3.1.1 keepalive of 0, TCP keepalive; paho-mqtt clients against ``router node run
--mqtt`` on a real Redis."""

from __future__ import annotations

import contextlib
import queue
import socket
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from router.cli import app
from router.mqtt.tcp import KEEPALIVE_IDLE, keep_alive
from router.state.keys import Keys
from tests.support.metrics import scrape
from tests.support.mqtt import (
    TIMEOUT,
    V5,
    V311,
    Paho,
    connect_properties,
    mqtt_node,
    user_properties,
)
from tests.support.servers import free_port
from tests.support.waiting import wait_until

Node = tuple[int, str]  # (MQTT port, metrics address)
TOPIC_LENGTH = 40  # the node's --mqtt-max-topic-length
USER_PROPERTIES = 8  # the node's --mqtt-max-user-properties
USER_PROPERTIES_BYTES = 256  # and --mqtt-max-user-properties-bytes


@pytest.fixture
def node(redis_standalone_url: str, keys: Keys) -> Iterator[Node]:
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    limits = ("--mqtt-max-subscriptions", "3", "--mqtt-max-topic-levels", "4")
    limits += ("--mqtt-max-topic-length", str(TOPIC_LENGTH))
    limits += ("--mqtt-max-publish-rate", "100", "--mqtt-max-subscribe-rate", "20")
    limits += ("--mqtt-max-user-properties", str(USER_PROPERTIES))
    limits += ("--mqtt-max-user-properties-bytes", str(USER_PROPERTIES_BYTES))
    with mqtt_node("limits", env, *limits, "--mqtt-max-keepalive", "1", "--metrics", metrics) as (
        _,
        port,
    ):
        yield port, metrics


def refused(metrics: str) -> float:
    return scrape(metrics)["router_mqtt_subscriptions_refused_total"]


def attached(port: int, clients: list[Paho], client_id: str, watch: str | None = None) -> Paho:
    """A connected 5.0 paho client (subscribed to ``watch`` at QoS 0, if given)."""
    client = Paho(port, client_id, V5)
    clients.append(client)
    assert client.connected()[0] == 0
    if watch is not None:
        assert client.subscribe(watch, 0) == [0]
    return client


@pytest.mark.parametrize(("protocol", "quota_code"), [(V5, 0x97), (V311, 0x80)])
def test_a_session_holds_at_most_max_subscriptions_filters(
    node: Node, clients: list[Paho], protocol: int, quota_code: int
) -> None:
    """Before, one client could hold any number of filters (each a route, a trie entry
    and Redis state)."""
    port, metrics = node
    properties = connect_properties(SessionExpiryInterval=300) if protocol == V5 else None
    client = Paho(port, "hoarder", protocol, clean=False, properties=properties)
    clients.append(client)
    assert client.connected()[0] == 0
    for n in range(3):
        assert client.subscribe(f"f/{n}", 1) == [1]
    before = refused(metrics)
    assert client.subscribe("f/3", 1) == [quota_code]
    assert refused(metrics) == before + 1
    assert client.subscribe("f/0", 0) == [0]  # (one it holds: changed, not counted twice)
    client.client.unsubscribe("f/1")
    wait_until(lambda: client.subscribe("f/4", 1) == [1], TIMEOUT, "room after UNSUBSCRIBE")
    client.close()
    again = Paho(port, "hoarder", protocol, clean=False, properties=properties)
    clients.append(again)
    assert again.connected()[0] == 0
    assert again.subscribe("f/5", 1) == [quota_code]  # (the resumed session holds three)


def test_topics_and_filters_deeper_than_max_topic_levels_are_refused(
    node: Node, clients: list[Paho]
) -> None:
    port, metrics = node
    client = attached(port, clients, "deep")
    before = refused(metrics)
    assert client.subscribe("a/b/c/d", 1) == [1]
    assert client.subscribe("a/b/c/d/e", 1) == [0x8F]
    assert refused(metrics) == before + 1
    client.client.publish("a/b/c/d/e", b"too deep", 1)
    assert client.expect_disconnect() == 0x90


def test_topics_and_filters_longer_than_max_topic_length_are_refused(
    node: Node, clients: list[Paho]
) -> None:
    """Before, a topic or filter could be as long as the packet (64 KiB in MQTT), kept in
    the trie, the route table and Redis."""
    port, metrics = node
    client = attached(port, clients, "long")
    before = refused(metrics)
    assert client.subscribe("l/" + "x" * (TOPIC_LENGTH - 2), 1) == [1]
    assert client.subscribe("l/" + "x" * (TOPIC_LENGTH - 1), 1) == [0x8F]
    assert refused(metrics) == before + 1
    client.client.publish("l/" + "x" * (TOPIC_LENGTH - 1), b"too long", 1)
    assert client.expect_disconnect() == 0x90


def test_a_311_client_with_keepalive_0_is_held_to_max_keepalive(
    node: Node, clients: list[Paho]
) -> None:
    """Before, a 3.1.1 client's keepalive 0 was never capped: a vanished client held its
    connection and session for ever."""
    port, _ = node
    silent = Paho(port, "silent", V311, keepalive=0)
    clients.append(silent)
    assert silent.connected()[0] == 0
    silent.expect_disconnect()  # (closed after 1.5 x 1 s of silence)


def test_client_sockets_get_tcp_keepalive() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        keep_alive(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE


def quota_closes(metrics: str) -> float:
    return scrape(metrics)["router_mqtt_closed_quota_exceeded_total"]


def test_a_publish_with_too_many_user_properties_is_quota_exceeded(
    node: Node, clients: list[Paho]
) -> None:
    """Before, a 1 MB PUBLISH with 140,000 user properties cost 0.3-0.4 s of the node's
    event loop to decode, and was encoded again for each subscriber; then the limit was
    a constant of 128."""
    port, metrics = node
    watcher = attached(port, clients, "watcher", "props/#")
    sender = attached(port, clients, "sender")
    most = [(f"k{n}", "v") for n in range(USER_PROPERTIES)]
    sender.publish("props/a", b"at the limit", 1, properties=user_properties(most))
    [got] = watcher.take(1)
    assert len(got.properties.UserProperty) == USER_PROPERTIES
    before = quota_closes(metrics)
    over = user_properties([*most, ("one", "more")])
    sender.client.publish("props/b", b"past it", 1, properties=over)
    assert sender.expect_disconnect() == 0x97
    assert quota_closes(metrics) == before + 1
    assert watcher.nothing_more(0.3)


def test_a_publish_with_too_many_user_property_bytes_is_quota_exceeded(
    node: Node, clients: list[Paho]
) -> None:
    """Before, a few pairs of 64 KiB strings passed: only their count was limited."""
    port, metrics = node
    watcher = attached(port, clients, "watcher", "bytes/#")
    sender = attached(port, clients, "sender")
    # Names and values of 256 bytes in all (ü is two bytes: UTF-8 is what counts).
    most = [("name", "v" * 60), ("ü" * 30, "x" * 68), ("k", "z" * 63)]
    assert sum(len(f"{name}{text}".encode()) for name, text in most) == USER_PROPERTIES_BYTES
    sender.publish("bytes/a", b"at the limit", 1, properties=user_properties(most))
    [got] = watcher.take(1)
    assert got.properties.UserProperty == most
    before = quota_closes(metrics)
    over = user_properties([*most[:-1], ("k", "z" * 64)])
    sender.client.publish("bytes/b", b"one byte past it", 1, properties=over)
    assert sender.expect_disconnect() == 0x97
    assert quota_closes(metrics) == before + 1
    assert watcher.nothing_more(0.3)


def test_a_client_publishing_past_its_rate_is_slowed_not_cut_off(
    node: Node, clients: list[Paho]
) -> None:
    """Before, one client could publish as fast as the node could take it, starving the
    others; now the node stops reading from it a while (TCP pushes back) and loses
    nothing."""
    port, metrics = node
    watcher = attached(port, clients, "rate-watcher", "rate/#")
    sender = attached(port, clients, "rate-sender")
    before = scrape(metrics)["router_mqtt_publish_throttled_total"]
    for n in range(300):  # (three seconds' worth at 100 a second, sent at once)
        sender.client.publish("rate/x", str(n).encode(), 0)
    got = watcher.take(300)
    assert [int(m.payload) for m in got] == list(range(300))
    assert sender.disconnects.empty()
    assert scrape(metrics)["router_mqtt_publish_throttled_total"] > before


def test_a_client_subscribing_past_its_rate_is_slowed_not_cut_off(
    node: Node, clients: list[Paho]
) -> None:
    """Before, one client could send SUBSCRIBE and UNSUBSCRIBE packets as fast as the node
    could decode them (thousands of filters a second, each decoded and judged); now the
    node stops reading from it a while, and every packet is still answered."""
    port, metrics = node
    churner = attached(port, clients, "churner")
    answered: queue.Queue[int] = queue.Queue()
    churner.client.on_unsubscribe = lambda client, userdata, mid, codes, props: answered.put(mid)
    before = scrape(metrics)["router_mqtt_publish_throttled_total"]
    filters = [f"churn/{n}" for n in range(10)]
    for _ in range(6):  # (60 filters: three seconds' worth at 20 a second, sent at once)
        churner.client.unsubscribe(filters)
    for _ in range(6):
        answered.get(timeout=TIMEOUT)
    assert churner.disconnects.empty()
    assert scrape(metrics)["router_mqtt_publish_throttled_total"] > before


def test_an_address_opening_connections_too_fast_is_closed_at_accept(
    redis_standalone_url: str, keys: Keys
) -> None:
    """Before, one host could open connections as fast as the node accepted them (each a
    TLS handshake or CONNECT's work)."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    with mqtt_node("rated", env, "--mqtt-max-connect-rate", "5", "--metrics", metrics) as (
        _,
        port,
    ):
        socks = [socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) for _ in range(20)]
        try:
            closed = 0
            for sock in socks:
                sock.settimeout(0.5)
                with contextlib.suppress(TimeoutError):  # (accepted: it waits for a CONNECT)
                    closed += sock.recv(1) == b""
            assert 10 <= closed <= 15  # (5 a second, a second's burst, while they opened)
            other = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
            with other:
                other.settimeout(0.5)
                with pytest.raises(TimeoutError):
                    other.recv(1)  # (another address: accepted)
            assert scrape(metrics)["router_mqtt_connect_rate_refused_total"] == closed
        finally:
            for sock in socks:
                sock.close()


@pytest.mark.parametrize(
    "option",
    [
        "--mqtt-max-user-properties",
        "--mqtt-max-user-properties-bytes",
        "--mqtt-max-inflight-bytes",
        "--mqtt-max-subscribe-rate",
        "--mqtt-max-topic-length",
        "--queue-bytes",
    ],
)
def test_node_run_refuses_a_negative_limit(option: str) -> None:
    result = CliRunner().invoke(app, ["node", "run", option, "-1"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and f"'{option}': -1" in errors[0] and "not in the range" in errors[0]
