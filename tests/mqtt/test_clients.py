"""MQTT clients nobody here wrote (paho-mqtt 3.1.1 and 5.0, mosquitto_pub/mosquitto_sub)
against two ``router node run --mqtt`` processes, on a real Redis and the 3-master
Redis Cluster: whatever one node receives, subscribers on the other get."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from redis import Redis

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_5, ConnAck, Connect, Disconnect
from router.state.keys import Keys
from tests.mqtt.conftest import Nodes
from tests.support.mqtt import (
    TIMEOUT,
    V5,
    V311,
    Paho,
    connect_properties,
    mqtt_node,
    routed_to,
    user_properties,
)
from tests.support.waiting import wait_until


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5.0"])
def test_qos_0_1_2_cross_nodes(nodes: Nodes, clients: list[Paho], protocol: int) -> None:
    port_a, port_b = nodes
    sub = Paho(port_b, "sub", protocol)
    pub = Paho(port_a, "pub", protocol)
    clients += [sub, pub]
    assert sub.connected()[0] == 0 and pub.connected()[0] == 0
    assert sub.subscribe("s/+", 2) == [2]
    routed_to(pub, "s/probe", sub)
    for qos in (0, 1, 2):
        pub.publish("s/x", f"qos{qos}".encode(), qos)
    got = sorted((m.topic, m.payload, m.qos) for m in sub.take(3))
    assert got == [("s/x", b"qos0", 0), ("s/x", b"qos1", 1), ("s/x", b"qos2", 2)]
    assert sub.nothing_more()


def test_mosquitto_clients_cross_nodes(nodes: Nodes) -> None:
    """mosquitto_sub (5.0) on node b gets what mosquitto_pub (3.1.1) sends to node a.

    Rounds of three publishes go out until the subscriber, once its route reached node
    a, has its three messages (-C 3) and exits; earlier rounds had no subscriber yet."""
    port_a, port_b = nodes
    with subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(port_b),
            "-t",
            "m/#",
            "-q",
            "1",
            "-C",
            "3",
            "-V",
            "mqttv5",
            "-i",
            "msub",
            "-W",
            str(int(TIMEOUT)),
        ],
        stdout=subprocess.PIPE,
        text=True,
    ) as sub:
        deadline = time.monotonic() + TIMEOUT
        out = ""
        while time.monotonic() < deadline:
            for text in ("one", "two", "three"):
                subprocess.run(
                    [
                        "mosquitto_pub",
                        "-h",
                        "127.0.0.1",
                        "-p",
                        str(port_a),
                        "-t",
                        "m/t",
                        "-m",
                        text,
                        "-q",
                        "1",
                        "-V",
                        "mqttv311",
                    ],
                    check=True,
                    timeout=TIMEOUT,
                )
            try:
                out, _ = sub.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
        assert sub.wait(TIMEOUT) == 0
    received = out.split()
    assert len(received) == 3
    assert " ".join(received) in "one two three one two three"  # consecutive, in order


def test_properties_cross_nodes_and_assigned_client_id(nodes: Nodes, clients: list[Paho]) -> None:
    port_a, port_b = nodes
    sub = Paho(port_b, "", V5)
    clients.append(sub)
    code, properties = sub.connected()
    assert code == 0
    assert properties.AssignedClientIdentifier.startswith("auto-")
    assert properties.ReceiveMaximum >= 1 and properties.TopicAliasMaximum >= 1
    assert sub.subscribe("p/#", 1) == [1]
    pub = Paho(port_a, "pub5", V5)
    clients.append(pub)
    routed_to(pub, "p/probe", sub)
    pub.publish("p/x", b"hello", 1)
    [message] = sub.take(1)
    assert (message.topic, message.payload, message.qos) == ("p/x", b"hello", 1)


@pytest.mark.parametrize("protocol", [V5, V311], ids=["5.0", "3.1.1"])
def test_an_empty_user_name_connects_and_resumes_its_session_on_another_node(
    nodes: Nodes, clients: list[Paho], protocol: int
) -> None:
    """MQTT 5.0 3.1.3.5 and 3.1.1 3.1.3.4 allow a zero-length User Name (MQTT.js with
    ``username: ''``, gmqtt's suite by default). Before, CONNACK 0x85 / 0x02 (the claim
    took an empty user name for an invalid id)."""
    port_a, port_b = nodes
    expiry = connect_properties(SessionExpiryInterval=60) if protocol == V5 else None
    first = Paho(port_a, "blank", protocol, clean=False, user=("", None), properties=expiry)
    clients.append(first)
    assert first.connected()[0] == 0
    assert first.subscribe("blank/#", 1) == [1]
    first.close()
    again = Paho(port_b, "blank", protocol, clean=False, user=("", None), properties=expiry)
    clients.append(again)
    assert again.connected()[0] == 0
    assert again.sessions_present.get(timeout=TIMEOUT) is True
    publisher = Paho(port_a, "blank-pub", protocol, user=("", None))
    clients.append(publisher)
    routed_to(publisher, "blank/probe", again)
    publisher.publish("blank/x", b"for the empty user", 1)
    [message] = again.take(1)
    assert message.payload == b"for the empty user"


def test_a_will_is_published_when_a_client_drops(nodes: Nodes, clients: list[Paho]) -> None:
    port_a, port_b = nodes
    watcher = Paho(port_b, "watcher", V5)
    clients.append(watcher)
    assert watcher.subscribe("will/#", 1) == [1]
    probe = Paho(port_a, "probe", V5)
    clients.append(probe)
    routed_to(probe, "will/probe", watcher)
    dying = Paho(port_a, "dying", V311, will=("will/dying", b"gone", 1))
    assert dying.connected()[0] == 0
    dying.drop()
    [will] = watcher.take(1)
    assert (will.topic, will.payload, will.qos) == ("will/dying", b"gone", 1)
    polite = Paho(port_a, "polite", V311, will=("will/polite", b"never", 1))
    assert polite.connected()[0] == 0
    polite.close()  # DISCONNECT: the will is deleted
    assert watcher.nothing_more(0.5)


def test_takeover_across_nodes_disconnects_the_old_connection(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    first = Paho(port_a, "roamer", V5)
    clients.append(first)
    assert first.connected()[0] == 0
    second = Paho(port_b, "roamer", V5)
    clients.append(second)
    assert second.connected()[0] == 0
    assert first.disconnects.get(timeout=TIMEOUT) == 0x8E


def test_takeover_on_the_same_node(nodes: Nodes, clients: list[Paho]) -> None:
    port_a, _ = nodes
    first = Paho(port_a, "twin", V5)
    clients.append(first)
    assert first.connected()[0] == 0
    second = Paho(port_a, "twin", V5)
    clients.append(second)
    assert second.connected()[0] == 0
    assert first.disconnects.get(timeout=TIMEOUT) == 0x8E
    assert second.subscribe("t/#", 0) == [0]


def test_message_properties_cross_nodes_unaltered_and_in_order(
    nodes: Nodes, clients: list[Paho]
) -> None:
    """MQTT-3.3.2-17/18: payload format, content type, response topic, correlation data
    and user properties (in order, repeated names kept) reach a subscriber on another
    node, live and from the retained store."""
    port_a, port_b = nodes
    sub, pub = Paho(port_b, "s5", V5), Paho(port_a, "p5", V5)
    clients += [sub, pub]
    sub.subscribe("u/#", 1)
    routed_to(pub, "u/probe", sub)
    pairs = [("k", "v2"), ("a", "1"), ("k", "v1")]
    properties = user_properties(pairs)
    properties.PayloadFormatIndicator = 1
    properties.ContentType = "text/plain"
    properties.ResponseTopic = "reply/here"
    properties.CorrelationData = b"\x00id-7"
    pub.publish("u/x", b"with props", 1, properties=properties, retain=True)
    late = Paho(port_b, "late", V5)
    clients.append(late)
    late.subscribe("u/x", 1)
    for message in (sub.take(1)[0], late.take(1)[0]):
        got = message.properties
        assert message.payload == b"with props"
        assert got.UserProperty == pairs
        assert (got.PayloadFormatIndicator, got.ContentType) == (1, "text/plain")
        assert (got.ResponseTopic, got.CorrelationData) == ("reply/here", b"\x00id-7")
    pub.publish("u/x", b"", 1, retain=True)  # (clears the retained message)


# -- bad input: the node refuses it and keeps serving ---------------------------------------


def raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    sock.settimeout(TIMEOUT)
    return sock


def closed_after(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    sock.close()
    return data


def still_serving(port: int) -> None:
    client = Paho(port, "healthy", V5)
    try:
        assert client.connected()[0] == 0
    finally:
        client.close()


@pytest.fixture
def lone_node(redis_standalone_url: str, keys: Keys) -> Iterator[int]:
    """One node with a 1 s connect timeout, for clients that misbehave."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    args = ("--mqtt-connect-timeout", "1", "--mqtt-max-packet-size", "65536")
    with mqtt_node("lone", env, *args) as (_, port):
        yield port


V5_CONNECT = encode(Connect("raw", MQTT_5, keepalive=60))


def answer(port: int, *sends: bytes) -> list[object]:
    """Send ``sends`` on a raw socket; the packets the server sent until it closed."""
    sock = raw(port)
    for data in sends:
        sock.sendall(data)
    reader = PacketReader()
    reader.level = MQTT_5
    return reader.feed(closed_after(sock))


BAD_BEFORE_CONNECT = {
    "giant remaining length": b"\x10\xff\xff\xff\xff\x01",
    "publish first": b"\x30\x05\x00\x01a\x00\x01",
    "garbage": b"\x00\x01\x02\x03",
}


@pytest.mark.parametrize("data", BAD_BEFORE_CONNECT.values(), ids=BAD_BEFORE_CONNECT.keys())
def test_garbage_before_connect_closes_the_connection(lone_node: int, data: bytes) -> None:
    assert answer(lone_node, data) == []
    still_serving(lone_node)


def test_a_connect_that_never_comes(lone_node: int) -> None:
    sock = raw(lone_node)
    started = time.monotonic()
    assert closed_after(sock) == b""
    assert time.monotonic() - started < TIMEOUT
    still_serving(lone_node)


def test_unsupported_protocol_levels_get_connack_0x84_or_0x01(lone_node: int) -> None:
    level_6 = b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x3c\x00\x01c"
    sock = raw(lone_node)
    sock.sendall(level_6)
    assert closed_after(sock) == b"\x20\x03\x00\x84\x00"  # 5.0 CONNACK 0x84
    wrong_name = b"\x10\x0d\x00\x04MQTS\x04\x02\x00\x3c\x00\x01c"
    sock = raw(lone_node)
    sock.sendall(wrong_name)
    assert closed_after(sock) == b"\x20\x02\x00\x01"  # 3.1.1 return code 1


@pytest.mark.parametrize(
    ("after_connect", "code"),
    [
        (b"\x30\xff\xff\x7f", 0x95),  # announces 2 MiB: above the 64 KiB maximum
        (V5_CONNECT, 0x82),  # a second CONNECT
        (b"\x30\x06\x00\x03a/#\x00", 0x90),  # a wildcard in a topic name
        (b"\x30\x07\x00\x00\x03\x23\x00\x05x", 0x82),  # an alias that was never bound
        (b"\x30\x07\x00\x00\x03\x23\x01\x00x", 0x94),  # alias 256: above the maximum
        (b"\x30\x04\x00\x00\x00x", 0x82),  # no topic name and no alias (MQTT-3.3.2-1)
    ],
    ids=[
        "too large",
        "second connect",
        "wildcard topic",
        "unbound alias",
        "alias too high",
        "no topic at all",
    ],
)
def test_protocol_errors_get_disconnect_with_their_reason_code(
    lone_node: int, after_connect: bytes, code: int
) -> None:
    packets = answer(lone_node, V5_CONNECT, after_connect)
    assert type(packets[0]) is ConnAck and packets[0].reason_code == 0
    assert packets[1:] == [Disconnect(code)]
    still_serving(lone_node)


def test_keepalive_timeout(lone_node: int) -> None:
    started = time.monotonic()
    packets = answer(lone_node, encode(Connect("sleepy", MQTT_5, keepalive=1)))
    assert packets[1:] == [Disconnect(0x8D)]
    assert 1.4 < time.monotonic() - started < TIMEOUT


def test_empty_client_id_with_a_persistent_3_1_1_session_is_refused(lone_node: int) -> None:
    """(paho will not send this CONNECT, so the bytes are written out.)"""
    sock = raw(lone_node)
    sock.sendall(b"\x10\x0c\x00\x04MQTT\x04\x00\x00\x3c\x00\x00")  # clean session 0, id ""
    assert closed_after(sock) == b"\x20\x02\x00\x02"  # return code 2: identifier rejected


def test_a_subscription_whose_route_redis_refused_gets_0x80_and_is_routed_later(
    lone_node: int, redis_standalone_url: str, keys: Keys, clients: list[Paho]
) -> None:
    """The node keeps a route change Redis refused (issue 14, silent loss 1): the client
    hears 0x80, and the route is written once Redis takes writes again."""
    routes = keys.node_routes("lone")
    redis = Redis.from_url(redis_standalone_url)
    try:
        redis.set(routes, b"not a hash")  # the node's route_apply.lua fails: WRONGTYPE
        client = Paho(lone_node, "patient", V5)
        clients.append(client)
        assert client.subscribe("alerts/#", 1) == [0x80]
        redis.delete(routes)
        wait_until(lambda: redis.hget(routes, "alerts/#") == b"1", TIMEOUT, "the kept route")
        assert client.subscribe("alerts/#", 1) == [1]  # the connection carried on
    finally:
        redis.close()
