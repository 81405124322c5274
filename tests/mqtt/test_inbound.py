"""What a client may send (:mod:`router.mqtt.inbound`), as tables: the topic each
PUBLISH stands for after its alias, or the reason code it is refused with; and the
Receive Maximum quota against the QoS 2 flows awaiting PUBREL."""

from __future__ import annotations

import pytest

from router.errors import MqttProtocolError
from router.mqtt.inbound import InboundLimits
from router.mqtt.packets import Publish
from router.mqtt.properties import Properties


def publish(topic: str, alias: int | None = None, qos: int = 0, packet_id: int = 1) -> Publish:
    return Publish(
        topic,
        b"",
        qos,
        packet_id=packet_id if qos else None,
        properties=Properties(topic_alias=alias),
    )


# (what came before, the PUBLISH, its topic or the reason code it is refused with)
ALIAS_CASES = [
    ([], publish("a/b"), "a/b"),
    ([], publish("a/b", alias=1), "a/b"),
    ([publish("a/b", alias=1)], publish("", alias=1), "a/b"),
    ([publish("a/b", alias=1), publish("c/d", alias=1)], publish("", alias=1), "c/d"),
    ([publish("a/b", alias=1)], publish("", alias=2), 0x82),  # never bound
    ([], publish(""), 0x82),  # neither topic nor alias (MQTT-3.3.2-1)
    ([], publish("a/b", alias=0), 0x94),
    ([], publish("a/b", alias=5), 0x94),  # above the maximum (4)
    ([], publish("", alias=0), 0x94),
    ([], publish("a/+", alias=1), 0x90),  # a wildcard cannot be bound either
    ([], publish("a/#", alias=2), 0x90),
]


@pytest.mark.parametrize(("before", "packet", "expected"), ALIAS_CASES)
def test_topic_aliases(before: list[Publish], packet: Publish, expected: str | int) -> None:
    limits = InboundLimits(topic_alias_maximum=4, receive_maximum=2)
    for earlier in before:
        limits.topic(earlier)
    if isinstance(expected, str):
        assert limits.topic(packet) == expected
    else:
        with pytest.raises(MqttProtocolError) as refused:
            limits.topic(packet)
        assert refused.value.reason_code == expected


def test_remapping_an_alias_forgets_the_topic_it_stood_for() -> None:
    limits = InboundLimits(topic_alias_maximum=2, receive_maximum=2)
    for n in range(100):
        limits.topic(publish(f"huge/{n}/" + "t" * 1000, alias=n % 2 + 1))
    assert sum(len(topic) for topic in limits._aliases.aliases("", "client").values()) < 2100


# (QoS 2 ids awaiting PUBREL, the PUBLISH, refused with 0x93)
QUOTA_CASES = [
    (set(), publish("t", qos=1), False),
    ({1}, publish("t", qos=2, packet_id=2), False),
    ({1, 2}, publish("t", qos=2, packet_id=3), True),
    ({1, 2}, publish("t", qos=2, packet_id=2), False),  # a resend of a flow it has
    ({1, 2}, publish("t", qos=1, packet_id=3), True),  # QoS 1 counts too (MQTT-3.3.4-8)
    ({1, 2}, publish("t", qos=0), False),
]


@pytest.mark.parametrize(("awaiting", "packet", "refused"), QUOTA_CASES)
def test_receive_maximum(awaiting: set[int], packet: Publish, refused: bool) -> None:
    limits = InboundLimits(topic_alias_maximum=4, receive_maximum=2)
    if not refused:
        limits.check_quota(packet, awaiting)
        return
    with pytest.raises(MqttProtocolError) as error:
        limits.check_quota(packet, awaiting)
    assert error.value.reason_code == 0x93


def test_a_subscription_identifier_from_a_client_is_a_protocol_error() -> None:
    """MQTT-3.3.4-6: only the server sends one (before: taken and ignored)."""
    limits = InboundLimits(topic_alias_maximum=4, receive_maximum=10)
    packet = Publish("t", b"", 1, packet_id=1, properties=Properties(subscription_identifiers=(3,)))
    with pytest.raises(MqttProtocolError) as raised:
        limits.outgoing(packet, "c", set())
    assert raised.value.reason_code == 0x82
