"""One copy, one encoding, for every client that gets the same PUBLISH.

:meth:`LocalSessions.deliver` gives clients whose matching subscription makes the same
copy one :class:`Delivery`, and :class:`PublishEncoder` keeps a QoS 0 copy's PUBLISH on
it. Checked against the unshared path: every client's copy equals the one
:func:`make_copy` builds for it alone, and every PUBLISH any connection makes of a
shared copy is byte for byte what :func:`encode` makes of that client's own packet.
The same through real clients: tests/mqtt/test_subscribe_options.py.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from router.cluster.local_sessions import LocalSessions, make_copy
from router.core.messages import Delivery, Message, MessageProperties
from router.core.options import SubscriptionOptions
from router.mqtt.codec import encode
from router.mqtt.outgoing import PublishEncoder, publish_properties
from router.mqtt.packets import MQTT_3_1_1, MQTT_5, Publish

FILTERS = ["a/b", "a/+", "a/#", "#", "+/b"]
TOPIC = "a/b"

options_strategy = st.builds(
    SubscriptionOptions,
    qos=st.integers(0, 2),
    no_local=st.booleans(),
    retain_as_published=st.booleans(),
    subscription_identifier=st.one_of(st.none(), st.integers(1, 3)),
)
clients_strategy = st.dictionaries(
    st.sampled_from([f"c{n}" for n in range(8)]),
    st.dictionaries(st.sampled_from(FILTERS), options_strategy, min_size=1, max_size=3),
    min_size=1,
)
message_strategy = st.builds(
    Message,
    id=st.just(b"m" * 16),
    topic=st.just(TOPIC),
    payload=st.binary(max_size=40),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=st.sampled_from([None, "c0", "c1"]),
    properties=st.sampled_from([None, MessageProperties(content_type="text/plain")]),
)


def delivered(
    clients: dict[str, dict[str, SubscriptionOptions]], message: Message
) -> tuple[LocalSessions, dict[str, Delivery]]:
    sessions = LocalSessions(match_cache=None)
    for client_id, subscriptions in clients.items():
        for topic_filter, options in subscriptions.items():
            sessions.subscribe(client_id, topic_filter, options)
    sessions.deliver(message, None)
    copies = {}
    for client_id in clients:
        [*queued] = sessions.session(client_id).take_all()
        assert len(queued) <= 1
        if queued:
            copies[client_id] = queued[0]
    return sessions, copies


@settings(max_examples=300, deadline=None)
@given(clients=clients_strategy, message=message_strategy)
def test_every_client_gets_the_copy_it_would_get_alone(
    clients: dict[str, dict[str, SubscriptionOptions]], message: Message
) -> None:
    sessions, copies = delivered(clients, message)
    shapes: dict[tuple[int, bool, int | None], Delivery] = {}
    for client_id in clients:
        matched = sessions.trie.subscriptions_for(TOPIC, message.publisher).get(client_id, [])
        if client_id == message.publisher:
            matched = [s for s in matched if not s.options.no_local]
        alone = make_copy(message, matched) if matched else None
        assert copies.get(client_id) == alone
        if len(matched) == 1:  # one subscription: the copy is shared with its shape
            options = matched[0].options
            shape = (
                min(options.qos, message.qos),
                message.retain and options.retain_as_published,
                options.subscription_identifier,
            )
            assert shapes.setdefault(shape, copies[client_id]) is copies[client_id]


def test_clients_with_the_same_subscription_share_one_copy() -> None:
    sessions = LocalSessions(match_cache=None)
    for client_id in ("p", "q", "r"):
        sessions.subscribe(client_id, "a/+", SubscriptionOptions(qos=1))
    sessions.subscribe("s", "a/#", SubscriptionOptions(qos=1, subscription_identifier=4))
    sessions.deliver(Message(b"m" * 16, TOPIC, b"x", qos=1), None)
    [p], [q], [r], [s] = (sessions.session(c).take_all() for c in "pqrs")
    assert p is q is r
    assert s is not p and s.subscription_ids == (4,)


def reference(delivery: Delivery, level: int, packet_id: int | None, dup: bool) -> bytes:
    """What the packet of one client's own copy encodes to (no alias)."""
    properties = publish_properties(delivery, 0.0)
    return encode(
        Publish(
            delivery.topic, delivery.payload, delivery.qos, delivery.retain, dup, packet_id,
            properties,
        ),
        level,
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    qos=st.integers(0, 2),
    retain=st.booleans(),
    ids=st.sampled_from([(), (3,)]),
    properties=st.sampled_from([None, MessageProperties(content_type="text/plain")]),
    levels=st.lists(st.sampled_from([MQTT_3_1_1, MQTT_5]), min_size=1, max_size=8),
)
def test_every_connection_encodes_a_shared_copy_as_its_own(
    qos: int,
    retain: bool,
    ids: tuple[int, ...],
    properties: MessageProperties | None,
    levels: list[int],
) -> None:
    shared = Delivery(TOPIC, b"payload", qos, retain, b"m" * 16, None, ids, 0.0, None, properties)
    for n, level in enumerate(levels):
        packet_id = n + 1 if qos else None
        got = PublishEncoder(level, 0).encode(shared, packet_id, dup=False)
        assert got == reference(shared, level, packet_id, False)


def test_a_qos_0_copy_is_encoded_once_per_protocol_family() -> None:
    shared = Delivery(TOPIC, b"payload", 0, False, b"m" * 16)
    first = PublishEncoder(MQTT_3_1_1, 0).encode(shared, None, dup=False)
    assert PublishEncoder(MQTT_3_1_1, 0).encode(shared, None, dup=False) is first
    five = PublishEncoder(MQTT_5, 0).encode(shared, None, dup=False)
    assert five == reference(shared, MQTT_5, None, False) != first
    assert PublishEncoder(MQTT_5, 0).encode(shared, None, dup=False) is five


def test_a_client_with_topic_aliases_gets_its_own_packet() -> None:
    shared = Delivery(TOPIC, b"payload", 0, False, b"m" * 16)
    plain = PublishEncoder(MQTT_5, 0).encode(shared, None, dup=False)
    aliasing = PublishEncoder(MQTT_5, 1)
    first = aliasing.encode(shared, None, dup=False)
    again = aliasing.encode(shared, None, dup=False)
    assert plain != first != again  # topic + alias 1, then alias 1 alone
    assert PublishEncoder(MQTT_5, 0).encode(shared, None, dup=False) == plain


def test_a_changed_copy_does_not_keep_the_old_encoding() -> None:
    shared = Delivery(TOPIC, b"payload", 0, False, b"m" * 16)
    PublishEncoder(MQTT_3_1_1, 0).encode(shared, None, dup=False)
    retained = replace(shared, retain=True)
    assert retained.encoded is None
    assert PublishEncoder(MQTT_3_1_1, 0).encode(retained, None, dup=False) == reference(
        retained, MQTT_3_1_1, None, False
    )
