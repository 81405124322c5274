"""Persistent sessions across the cluster, with real clients (paho-mqtt, mosquitto_sub /
mosquitto_pub) against two ``router node run --mqtt`` processes on a real Redis and the
3-master Redis Cluster: a session that goes away on one node resumes on the other with
everything it missed."""

from __future__ import annotations

import queue
import socket
import subprocess
import time
from dataclasses import replace
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_5, ConnAck, Connect, PubComp, Publish, PubRec, PubRel
from router.mqtt.properties import Properties as MqttProperties
from tests.mqtt.conftest import Nodes
from tests.support.mqtt import (
    TIMEOUT,
    V5,
    V311,
    Paho,
    connect_properties,
    publish_properties,
    routed_to,
)
from tests.support.waiting import wait_until


def keeper(port: int, clients: list[Paho], client_id: str, expiry: int, **options: object) -> Paho:
    """A 5.0 client resuming its session (clean start 0) with Session Expiry ``expiry``."""
    client = Paho(
        port,
        client_id,
        V5,
        clean=False,
        properties=connect_properties(SessionExpiryInterval=expiry),
        **options,
    )
    clients.append(client)
    return client


def test_a_session_away_on_one_node_resumes_on_the_other_with_what_it_missed(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    first = keeper(port_a, clients, "roamer", 300)
    code, _ = first.connected()
    assert code == 0
    assert first.subscribe("news/#", 1) == [1]
    publisher = Paho(port_b, "publisher", V5)
    clients.append(publisher)
    routed_to(publisher, "news/probe", first)
    first.close()  # DISCONNECT 0x00: the session stays (expiry 300 s)
    for n in range(5):
        publisher.publish("news/x", f"missed {n}".encode(), 1)
    publisher.publish("news/x", b"qos 0 is not kept", 0)
    second = keeper(port_b, clients, "roamer", 300)
    code, _ = second.connected()
    assert code == 0
    got = [(m.payload, m.qos) for m in second.take(5)]
    assert got == [(f"missed {n}".encode(), 1) for n in range(5)]
    publisher.publish("news/y", b"live", 1)  # the subscription goes on, now on node b
    [live] = second.take(1)
    assert (live.topic, live.payload) == ("news/y", b"live")
    assert second.nothing_more()


def test_session_present_says_whether_the_session_was_kept(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    first = keeper(port_a, clients, "flagged", 300)  # (its CONNACK recorded from the start)
    assert first.connected()[0] == 0
    assert first.sessions_present.get(timeout=TIMEOUT) is False
    first.close()
    second = keeper(port_b, clients, "flagged", 300)
    assert second.connected()[0] == 0
    assert second.sessions_present.get(timeout=TIMEOUT) is True


def test_mosquitto_sub_without_clean_session_gets_what_it_missed(nodes: Nodes) -> None:
    """3.1.1 clean session 0 (mosquitto_sub -c): subscribe on node a, leave, messages go
    to node b meanwhile (mosquitto_pub -q 1), come back on node b: all of them arrive."""
    port_a, port_b = nodes
    base = ["mosquitto_sub", "-h", "127.0.0.1", "-i", "durable", "-c", "-q", "1", "-V", "311"]
    subprocess.run([*base, "-p", str(port_a), "-t", "away/#", "-W", "1"], check=False)
    for n in range(3):
        pub = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port_b), "-q", "1", "-t", "away/t"]
        deadline = time.monotonic() + TIMEOUT
        subprocess.run([*pub, "-m", f"m{n}"], check=True, timeout=TIMEOUT)
        assert time.monotonic() < deadline
    received = subprocess.run(
        [*base, "-p", str(port_b), "-t", "away/#", "-C", "3", "-W", str(int(TIMEOUT))],
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 5,
        check=False,
    )
    assert received.stdout.split() == ["m0", "m1", "m2"], received


def test_an_expired_session_is_gone(nodes: Nodes, clients: list[Paho]) -> None:
    port_a, port_b = nodes
    first = keeper(port_a, clients, "brief", 1)
    assert first.connected()[0] == 0
    assert first.subscribe("brief/#", 1) == [1]
    first.close()
    left = time.monotonic()
    wait_until(lambda: time.monotonic() - left > 1.5, TIMEOUT, "the session expiry")
    second = keeper(port_b, clients, "brief", 60)
    assert second.connected()[0] == 0
    assert second.sessions_present.get(timeout=TIMEOUT) is False


def test_a_queued_message_expires_and_the_interval_sent_is_what_is_left(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    first = keeper(port_a, clients, "patient", 300)
    assert first.connected()[0] == 0
    assert first.subscribe("exp/#", 1) == [1]
    publisher = Paho(port_b, "exp-publisher", V5)
    clients.append(publisher)
    routed_to(publisher, "exp/probe", first)
    first.close()
    sent = time.monotonic()
    publisher.publish(
        "exp/short", b"gone", 1, properties=publish_properties(MessageExpiryInterval=1)
    )
    publisher.publish(
        "exp/long", b"kept", 1, properties=publish_properties(MessageExpiryInterval=600)
    )
    wait_until(lambda: time.monotonic() - sent > 2.1, TIMEOUT, "the short expiry")
    second = keeper(port_a, clients, "patient", 300)
    [kept] = second.take(1)
    assert kept.payload == b"kept"
    assert 590 <= kept.properties.MessageExpiryInterval <= 599
    assert second.nothing_more()


def test_unacknowledged_messages_are_sent_again_with_dup_and_their_packet_ids(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    forgetful = keeper(port_a, clients, "forgetful", 300, manual_ack=True)
    assert forgetful.connected()[0] == 0
    assert forgetful.subscribe("dup/#", 1) == [1]
    publisher = Paho(port_b, "dup-publisher", V5)
    clients.append(publisher)
    routed_to(publisher, "dup/probe", forgetful)
    publisher.publish("dup/t", b"once", 1)
    [first] = forgetful.take(1)  # never acknowledged (manual ack)
    assert not first.dup
    forgetful.drop()
    again = keeper(port_b, clients, "forgetful", 300)
    [resent] = again.take(1)
    assert (resent.payload, resent.dup, resent.mid) == (b"once", True, first.mid)
    assert again.nothing_more()


def test_a_will_with_a_delay_waits_and_is_cancelled_by_a_return(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    watcher = Paho(port_b, "will-watcher", V5)
    clients.append(watcher)
    assert watcher.subscribe("wills/#", 1) == [1]
    probe = Paho(port_a, "will-probe", V5)
    clients.append(probe)
    routed_to(probe, "wills/probe", watcher)
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = 1
    comes_back = keeper(port_a, clients, "returner", 300, will=("wills/r", b"r", 1, will_props))
    assert comes_back.connected()[0] == 0
    comes_back.drop()
    back = keeper(port_b, clients, "returner", 300)  # back within the delay: no will
    assert back.connected()[0] == 0
    gone = keeper(port_a, clients, "leaver", 300, will=("wills/l", b"l", 1, will_props))
    assert gone.connected()[0] == 0
    dropped = time.monotonic()
    gone.drop()
    [will] = watcher.take(1)
    assert (will.topic, will.payload) == ("wills/l", b"l")
    assert time.monotonic() - dropped >= 0.9
    assert watcher.nothing_more(0.5)


def test_3_1_1_reconnect_to_the_same_node_resumes(nodes: Nodes, clients: list[Paho]) -> None:
    port_a, _ = nodes
    first = Paho(port_a, "same-node", V311, clean=False)
    clients.append(first)
    assert first.connected()[0] == 0
    assert first.subscribe("same/#", 1) == [1]
    first.close()
    publisher = Paho(port_a, "same-publisher", V311)
    clients.append(publisher)
    publisher.publish("same/t", b"while away", 1)
    second = Paho(port_a, "same-node", V311, clean=False)
    clients.append(second)
    [got] = second.take(1)
    assert got.payload == b"while away"


def test_a_connected_session_taken_over_on_another_node_hands_on_what_was_in_flight(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    first = keeper(port_a, clients, "mover", 300, manual_ack=True)
    assert first.connected()[0] == 0
    assert first.subscribe("move/#", 1) == [1]
    publisher = Paho(port_b, "move-publisher", V5)
    clients.append(publisher)
    routed_to(publisher, "move/probe", first)
    publisher.publish("move/t", b"in flight", 1)
    [sent] = first.take(1)  # not acknowledged: in flight on node a
    second = keeper(port_b, clients, "mover", 300)
    assert second.connected()[0] == 0
    assert first.expect_disconnect() == 0x8E
    [resent] = second.take(1)
    assert (resent.payload, resent.dup, resent.mid) == (b"in flight", True, sent.mid)
    publisher.publish("move/t", b"after", 1)
    [after] = second.take(1)
    assert after.payload == b"after"
    assert second.nothing_more()


def test_outbound_topic_aliases_when_the_client_allows_them(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, _ = nodes
    aliased = Paho(port_a, "aliased", V5, properties=connect_properties(TopicAliasMaximum=2))
    clients.append(aliased)
    assert aliased.connected()[0] == 0
    assert aliased.subscribe("alias/#", 0) == [0]
    publisher = Paho(port_a, "alias-publisher", V5)
    clients.append(publisher)
    topics = ["alias/a", "alias/b", "alias/c", "alias/a", "alias/b", "alias/c"]
    for n, topic in enumerate(topics):
        publisher.publish(topic, str(n).encode(), 1)
    got = [
        (m.topic, getattr(m.properties, "TopicAlias", None), m.payload)
        for m in aliased.take(len(topics))
    ]
    # paho hands on what came over the wire: the first two topics get aliases 1 and 2
    # (sent with their topic once, then alone); the third is past the client's maximum.
    assert got == [
        ("alias/a", 1, b"0"),
        ("alias/b", 2, b"1"),
        ("alias/c", None, b"2"),
        ("", 1, b"3"),
        ("", 2, b"4"),
        ("alias/c", None, b"5"),
    ]


def test_a_client_cannot_publish_to_sys_topics(nodes: Nodes, clients: list[Paho]) -> None:
    """mosquitto_pub cannot forge ``$SYS`` figures (5.0: PUBACK 0x87; nothing stored)."""
    port_a, _ = nodes
    forged = subprocess.run(
        [
            "mosquitto_pub",
            "-h",
            "127.0.0.1",
            "-p",
            str(port_a),
            "-V",
            "5",
            "-q",
            "1",
            "-r",
            "-t",
            "$SYS/broker/version",
            "-m",
            "forged",
            "-d",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert "received PUBACK (Mid: 1, RC:135)" in forged.stdout, forged
    reader = Paho(port_a, "sys-reader", V5)
    clients.append(reader)
    assert reader.subscribe("$SYS/broker/version", 0) == [0]
    assert all(m.payload != b"forged" for m in _drain(reader))


def _drain(client: Paho) -> list[Any]:
    """What the client receives until it has been quiet for half a second."""
    got = []
    while True:
        try:
            got.append(client.messages.get(timeout=0.5))
        except queue.Empty:
            return got


def _packets_until(sock: socket.socket, want: int) -> list[object]:
    """Read packets until ``want`` of them came (bounded by the socket timeout)."""
    reader = PacketReader()
    reader.level = MQTT_5
    got: list[object] = []
    while len(got) < want:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += reader.feed(chunk)
    return got


def test_inbound_qos_2_state_survives_a_reconnect_to_another_node(
    nodes: Nodes, clients: list[Paho]
) -> None:
    """A QoS 2 PUBLISH acknowledged by PUBREC on node a, then the connection drops; the
    client resends it (DUP) on node b and releases it there: one copy reaches the
    subscriber, and PUBREL finds the packet id (PUBCOMP 0x00, not 0x92). The sender is
    a raw socket speaking through our codec: no client library lets a test drop the
    connection between PUBREC and PUBREL."""
    port_a, port_b = nodes
    watcher = Paho(port_b, "q2-watcher", V5)
    clients.append(watcher)
    assert watcher.subscribe("q2/#", 2) == [2]
    probe = Paho(port_a, "q2-probe", V5)
    clients.append(probe)
    routed_to(probe, "q2/probe", watcher)
    hello = encode(
        Connect(
            "q2-sender",
            MQTT_5,
            clean_start=False,
            keepalive=60,
            properties=MqttProperties(session_expiry_interval=300),
        )
    )
    message = Publish("q2/t", b"exactly once", 2, packet_id=7)
    first = socket.create_connection(("127.0.0.1", port_a), timeout=TIMEOUT)
    first.sendall(hello + encode(message))
    assert [type(p) for p in _packets_until(first, 2)] == [ConnAck, PubRec]
    first.close()  # no DISCONNECT: the session stays, PUBREL never came
    second = socket.create_connection(("127.0.0.1", port_b), timeout=TIMEOUT)
    second.sendall(hello)
    [connack] = _packets_until(second, 1)
    assert isinstance(connack, ConnAck) and connack.session_present
    second.sendall(encode(replace(message, dup=True)))
    [rec] = _packets_until(second, 1)
    assert isinstance(rec, PubRec) and rec.packet_id == 7
    second.sendall(encode(PubRel(7)))
    [comp] = _packets_until(second, 1)
    assert isinstance(comp, PubComp) and (comp.packet_id, comp.reason_code) == (7, 0)
    second.close()
    [got] = watcher.take(1)
    assert got.payload == b"exactly once"
    assert watcher.nothing_more(0.5)
