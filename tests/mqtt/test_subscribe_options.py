"""MQTT 5.0 subscription features with real clients (paho-mqtt) against two ``router node
run --mqtt`` processes, on a real Redis and the 3-master Redis Cluster: shared
subscriptions across nodes, subscription identifiers, the subscribe options (No Local,
Retain As Published, Retain Handling), retained messages across nodes and the client's
Maximum Packet Size."""

from __future__ import annotations

import queue
import time
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.mqtt.conftest import Nodes
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, connect_properties, routed_to
from tests.support.waiting import wait_until


def client(port: int, clients: list[Paho], client_id: str, **options: Any) -> Paho:
    """A connected 5.0 client, closed when the test ends."""
    made = Paho(port, client_id, V5, **options)
    clients.append(made)
    code, _ = made.connected()
    assert code == 0
    return made


def collect(member: Paho, into: list[mqtt.MQTTMessage]) -> int:
    """Move what ``member`` received so far into ``into``; the length of ``into``."""
    while True:
        try:
            into.append(member.messages.get_nowait())
        except queue.Empty:
            return len(into)


def subscribe_with_identifier(subscriber: Paho, topic: str, qos: int, identifier: int) -> list[int]:
    """SUBSCRIBE with a Subscription Identifier property (the wrapper sends none)."""
    properties = Properties(PacketTypes.SUBSCRIBE)
    properties.SubscriptionIdentifier = identifier
    options = mqtt.SubscribeOptions(qos=qos)
    subscriber.client.subscribe(topic, options=options, properties=properties)
    return subscriber.subacks.get(timeout=TIMEOUT)


def test_a_shared_subscription_across_nodes_delivers_each_message_once(
    nodes: Nodes, clients: list[Paho]
) -> None:
    """``$share/g/jobs/#`` with a member on each node: every QoS 1 message published on
    node a reaches exactly one member, and both members get some (random strategy)."""
    port_a, port_b = nodes
    near = client(port_a, clients, "member-a")
    far = client(port_b, clients, "member-b")
    assert near.subscribe("$share/g/jobs/#", 1) == [1]
    assert far.subscribe("$share/g/jobs/#", 1) == [1]
    publisher = client(port_a, clients, "jobs-publisher")
    got_near: list[mqtt.MQTTMessage] = []
    got_far: list[mqtt.MQTTMessage] = []

    def received() -> int:
        return collect(near, got_near) + collect(far, got_far)

    # Until node a mirrors member b's route, everything goes to member a; publish (one
    # at a time, each reaching the group before the next) until both members got some.
    sent: list[bytes] = []
    deadline = time.monotonic() + 2 * TIMEOUT
    while not (got_near and got_far):
        assert time.monotonic() < deadline, f"one member got nothing of {len(sent)}"
        sent.append(f"probe {len(sent)}".encode())
        publisher.publish("jobs/probe", sent[-1], 1)
        wait_until(lambda: received() >= len(sent), TIMEOUT, lambda: (len(sent), received()))
    assert near.nothing_more() and far.nothing_more()
    probes = sorted(m.payload for m in got_near + got_far)
    assert probes == sorted(sent)  # each probe exactly once

    got_near.clear()
    got_far.clear()
    jobs = [f"job {n}".encode() for n in range(20)]
    for job in jobs:
        publisher.publish("jobs/work", job, 1)
    wait_until(lambda: received() >= len(jobs), TIMEOUT, lambda: (len(jobs), received()))
    assert near.nothing_more(0.5) and far.nothing_more()
    union = [m.payload for m in got_near + got_far]
    assert sorted(union) == sorted(jobs)  # all 20, none twice
    assert all(m.topic == "jobs/work" and m.qos == 1 for m in got_near + got_far)


def test_a_message_matching_two_subscriptions_arrives_once_with_both_identifiers(
    nodes: Nodes, clients: list[Paho]
) -> None:
    """``sid/#`` (identifier 7) and ``sid/+`` (identifier 9) of one client on node b: a
    publish to ``sid/x`` on node a arrives once, carrying both identifiers."""
    port_a, port_b = nodes
    subscriber = client(port_b, clients, "sid-subscriber")
    assert subscribe_with_identifier(subscriber, "sid/#", 1, 7) == [1]
    assert subscribe_with_identifier(subscriber, "sid/+", 1, 9) == [1]
    publisher = client(port_a, clients, "sid-publisher")

    # The two routes reach node a's mirror independently: probe until one probe
    # arrives carrying both identifiers.
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert time.monotonic() < deadline, "no probe carried both identifiers"
        publisher.publish("sid/probe", b"probe", 0)
        try:
            probe = subscriber.messages.get(timeout=0.1)
        except queue.Empty:
            continue
        if sorted(probe.properties.SubscriptionIdentifier) == [7, 9]:
            break
    while not subscriber.nothing_more(0.2):
        pass

    publisher.publish("sid/x", b"matched twice", 1)
    [message] = subscriber.take(1)
    assert (message.topic, message.payload, message.qos) == ("sid/x", b"matched twice", 1)
    assert sorted(message.properties.SubscriptionIdentifier) == [7, 9]
    assert subscriber.nothing_more(0.5)


def test_a_shared_and_a_plain_subscription_of_one_client_get_a_copy_each(
    nodes: Nodes, clients: list[Paho]
) -> None:
    """``$share/g/overlap/t`` (identifier 1) and ``overlap/t`` (identifier 2) of one client
    on node b (MQTT 5.0 4.8.2, 3.3.4; zMQTT's test_subscription_identifier_overlapping):
    each QoS 1 message, published on node b and on node a, arrives twice, once with
    each identifier."""
    port_a, port_b = nodes
    subscriber = client(port_b, clients, "overlap-subscriber")
    assert subscribe_with_identifier(subscriber, "$share/g/overlap/t", 1, 1) == [1]
    assert subscribe_with_identifier(subscriber, "overlap/t", 1, 2) == [1]
    for port in (port_b, port_a):  # (a SUBACK means every node routes to it)
        publisher = client(port, clients, f"overlap-publisher-{port}")
        for n in range(3):
            publisher.publish("overlap/t", f"m{n}".encode(), 1)
        got = subscriber.take(6)
        assert subscriber.nothing_more(0.5)
        seen = sorted((m.payload, m.qos, m.properties.SubscriptionIdentifier) for m in got)
        assert seen == sorted((f"m{n}".encode(), 1, [i]) for n in range(3) for i in (1, 2))


def test_no_local_keeps_a_clients_own_messages_from_it(nodes: Nodes, clients: list[Paho]) -> None:
    port_a, port_b = nodes
    own = client(port_b, clients, "no-local")
    other = client(port_a, clients, "nl-other")
    assert own.subscribe("nl/#", 1, noLocal=True) == [1]
    assert other.subscribe("nl/#", 1) == [1]
    routed_to(own, "nl/probe", other)
    assert own.nothing_more(0)  # none of its probes came back either
    own.publish("nl/t", b"mine", 1)
    [message] = other.take(1)
    assert (message.topic, message.payload) == ("nl/t", b"mine")
    assert own.nothing_more(0.5)
    assert other.nothing_more()


def test_retain_as_published_keeps_the_retain_flag_of_live_messages(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    keeping = client(port_b, clients, "rap-keeping")
    plain = client(port_b, clients, "rap-plain")
    assert keeping.subscribe("rap/#", 1, retainAsPublished=True) == [1]
    assert plain.subscribe("rap/#", 1) == [1]
    publisher = client(port_a, clients, "rap-publisher")
    routed_to(publisher, "rap/probe", keeping, plain)
    publisher.publish("rap/t", b"retained", 1, retain=True)
    [kept] = keeping.take(1)
    [cleared] = plain.take(1)
    assert (kept.topic, kept.payload, kept.retain) == ("rap/t", b"retained", 1)
    assert (cleared.topic, cleared.payload, cleared.retain) == ("rap/t", b"retained", 0)
    publisher.publish("rap/t", b"", 1, retain=True)  # (clears the retained message)


def test_retain_handling_0_1_2_on_subscribe(nodes: Nodes, clients: list[Paho]) -> None:
    """A retained message stored through node a; subscribers on node b get it on every
    SUBSCRIBE (0), on a new subscription only (1), never (2)."""
    port_a, port_b = nodes
    publisher = client(port_a, clients, "rh-publisher")
    publisher.publish("rh/t", b"kept", 1, retain=True)

    def retained(subscriber: Paho) -> None:
        [message] = subscriber.take(1)
        assert (message.topic, message.payload, message.retain) == ("rh/t", b"kept", 1)
        assert subscriber.nothing_more()

    always = client(port_b, clients, "rh-0")
    assert always.subscribe("rh/t", 1, retainHandling=0) == [1]
    retained(always)
    assert always.subscribe("rh/t", 1, retainHandling=0) == [1]
    retained(always)  # again: 0 sends them at every SUBSCRIBE

    new_only = client(port_b, clients, "rh-1")
    assert new_only.subscribe("rh/t", 1, retainHandling=1) == [1]
    retained(new_only)
    assert new_only.subscribe("rh/t", 1, retainHandling=1) == [1]
    assert new_only.nothing_more(0.5)  # the subscription existed already

    never = client(port_b, clients, "rh-2")
    assert never.subscribe("rh/t", 1, retainHandling=2) == [1]
    assert never.nothing_more(0.5)
    publisher.publish("rh/t", b"", 1, retain=True)  # (clears the retained message)


def test_a_retained_message_is_seen_on_the_other_node_and_deleted_by_an_empty_payload(
    nodes: Nodes, clients: list[Paho]
) -> None:
    port_a, port_b = nodes
    publisher = client(port_a, clients, "ret-publisher")
    publisher.publish("ret/t", b"last known", 1, retain=True)
    fresh = client(port_b, clients, "ret-fresh")
    assert fresh.subscribe("ret/#", 1) == [1]
    [message] = fresh.take(1)
    assert (message.topic, message.payload, message.qos, message.retain) == (
        "ret/t",
        b"last known",
        1,
        1,
    )
    assert fresh.nothing_more()

    publisher.publish("ret/t", b"", 1, retain=True)
    later = client(port_b, clients, "ret-later")
    assert later.subscribe("ret/#", 1) == [1]
    assert later.nothing_more(0.5)


def test_a_message_above_the_clients_maximum_packet_size_is_not_sent_to_it(
    nodes: Nodes, clients: list[Paho]
) -> None:
    """MQTT-3.1.2-25: the server discards a PUBLISH larger than the client's Maximum
    Packet Size (for that client only) and goes on with the next."""
    port_a, port_b = nodes
    small = client(
        port_b, clients, "mps-small", properties=connect_properties(MaximumPacketSize=200)
    )
    large = client(port_b, clients, "mps-large")
    assert small.subscribe("mps/#", 1) == [1]
    assert large.subscribe("mps/#", 1) == [1]
    publisher = client(port_a, clients, "mps-publisher")
    routed_to(publisher, "mps/probe", small, large)
    publisher.publish("mps/t", b"x" * 1000, 1)
    publisher.publish("mps/t", b"y" * 10, 1)
    assert [m.payload for m in large.take(2)] == [b"x" * 1000, b"y" * 10]
    [fits] = small.take(1)
    assert (fits.topic, fits.payload) == ("mps/t", b"y" * 10)
    assert small.nothing_more(0.5)
    assert small.disconnects.empty()  # still connected: the big one was only skipped


def test_one_message_to_clients_of_every_kind_on_a_node(nodes: Nodes, clients: list[Paho]) -> None:
    """Clients on node b whose copies are shared or not (tests/cluster/test_shared_copies.py):
    two 3.1.1 clients, two plain 5.0 clients, one with topic aliases, one with a
    subscription identifier, one with retain-as-published, one at QoS 1: every one gets
    the PUBLISH its own subscription asks for, twice."""
    port_a, port_b = nodes
    v311 = [Paho(port_b, f"kind-311-{n}", V311) for n in range(2)]
    clients.extend(v311)
    plain = [client(port_b, clients, f"kind-5-{n}") for n in range(2)]
    aliased = client(
        port_b, clients, "kind-alias", properties=connect_properties(TopicAliasMaximum=2)
    )
    identified = client(port_b, clients, "kind-sid")
    keeping = client(port_b, clients, "kind-rap")
    acknowledging = client(port_b, clients, "kind-qos1")
    assert all(subscriber.connected()[0] == 0 for subscriber in v311)
    for subscriber in (*v311, *plain, aliased):
        assert subscriber.subscribe("kind/#", 0) == [0]
    assert subscribe_with_identifier(identified, "kind/#", 0, 5) == [0]
    assert keeping.subscribe("kind/#", 0, retainAsPublished=True) == [0]
    assert acknowledging.subscribe("kind/#", 1) == [1]
    everyone = (*v311, *plain, aliased, identified, keeping, acknowledging)
    publisher = client(port_a, clients, "kind-publisher")
    routed_to(publisher, "kind/probe", *everyone)
    publisher.publish("kind/t", b"first", 1, retain=True)
    publisher.publish("kind/t", b"second", 1)

    def seen(subscriber: Paho) -> list[tuple[str, bytes, int, int, Any, Any]]:
        return [
            (
                m.topic,
                m.payload,
                m.qos,
                m.retain,
                getattr(m.properties, "TopicAlias", None),
                getattr(m.properties, "SubscriptionIdentifier", None),
            )
            for m in subscriber.take(2)
        ]

    plainly = [("kind/t", b"first", 0, 0, None, None), ("kind/t", b"second", 0, 0, None, None)]
    for subscriber in (*v311, *plain):
        assert seen(subscriber) == plainly
    assert seen(aliased) == [  # (alias 1 went to the probes' topic)
        ("kind/t", b"first", 0, 0, 2, None),
        ("", b"second", 0, 0, 2, None),  # (paho hands on the empty topic it got)
    ]
    assert seen(identified) == [
        ("kind/t", b"first", 0, 0, None, [5]),
        ("kind/t", b"second", 0, 0, None, [5]),
    ]
    assert seen(keeping) == [
        ("kind/t", b"first", 0, 1, None, None),
        ("kind/t", b"second", 0, 0, None, None),
    ]
    assert seen(acknowledging) == [
        ("kind/t", b"first", 1, 0, None, None),
        ("kind/t", b"second", 1, 0, None, None),
    ]
    assert all(subscriber.nothing_more(0.2) for subscriber in everyone)
    publisher.publish("kind/t", b"", 1, retain=True)  # (clears the retained message)
