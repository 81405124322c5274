"""One copy, one encoding, for every client that gets the same PUBLISH.

:meth:`LocalSessions.deliver` gives clients whose matching subscription makes the same
copy one :class:`Delivery`, and :class:`PublishEncoder` keeps a QoS 0 copy's PUBLISH on
it. Checked against a brute-force model: a client gets one copy for its plain
subscriptions together and one per share group that chose it, and a client with one
matching subscription gets the copy :func:`make_copy` builds for it alone, shared with
every other of its shape; every PUBLISH any connection makes of a shared copy is byte
for byte what :func:`encode` makes of that client's own packet.
The same through real clients: tests/mqtt/test_subscribe_options.py."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from router.cluster.sessions.local_sessions import LocalSessions, make_copy
from router.core.messages import Delivery, Message, MessageProperties
from router.core.options import SubscriptionOptions
from router.core.sharing import ShareGroup
from router.core.topics import matches, parse_shared
from router.mqtt.codec import encode
from router.mqtt.outgoing import PublishEncoder, publish_properties
from router.mqtt.packets import MQTT_3_1_1, MQTT_5, Publish

FILTERS = ["a/b", "a/+", "a/#", "#", "+/b", "x/y"]
SHARED = ["$share/g/a/b", "$share/g/#", "$share/h/a/+", "$share/h/x/#"]
TOPIC = "a/b"

options_strategy = st.builds(
    SubscriptionOptions,
    qos=st.integers(0, 2),
    no_local=st.booleans(),
    retain_as_published=st.booleans(),
    subscription_identifier=st.one_of(st.none(), st.integers(1, 3)),
)
shared_options_strategy = st.builds(  # (no_local is a protocol error on a shared one)
    SubscriptionOptions,
    qos=st.integers(0, 2),
    retain_as_published=st.booleans(),
    subscription_identifier=st.one_of(st.none(), st.integers(1, 3)),
)
subscriptions_strategy = st.tuples(
    st.dictionaries(st.sampled_from(FILTERS), options_strategy, max_size=3),
    st.dictionaries(st.sampled_from(SHARED), shared_options_strategy, max_size=2),
).map(lambda both: {**both[0], **both[1]})
clients_strategy = st.dictionaries(
    st.sampled_from([f"c{n}" for n in range(8)]),
    subscriptions_strategy.filter(bool),
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

Clients = dict[str, dict[str, SubscriptionOptions]]
Shape = tuple[int, bool, tuple[int, ...]]


class FirstMember:
    """A share strategy the model can follow: the first member (members are sorted)."""

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        return group.members[0]


def delivered(
    clients: Clients, message: Message, only_groups: list[str] | None = None
) -> tuple[LocalSessions, dict[str, list[Delivery]]]:
    sessions = LocalSessions(FirstMember(), match_cache=None)
    for client_id, subscriptions in clients.items():
        for topic_filter, options in subscriptions.items():
            sessions.subscribe(client_id, topic_filter, options)
    sessions.deliver(message, only_groups)
    return sessions, {c: sessions.session(c).take_all() for c in clients}


def model(
    clients: Clients, message: Message, only_groups: list[str] | None
) -> dict[str, list[Shape]]:
    """What each client must get, by brute force (MQTT 5.0 3.3.4, 4.8.2): one copy for
    all its matching plain subscriptions together, one for each share group that chose it
    (the group's first member, by :class:`FirstMember`); each as (QoS, retain, ids)."""

    def shape(chosen: list[SubscriptionOptions]) -> Shape:
        return (
            min(max(o.qos for o in chosen), message.qos),
            message.retain and any(o.retain_as_published for o in chosen),
            tuple(sorted(o.subscription_identifier for o in chosen if o.subscription_identifier)),
        )

    wanted: dict[str, list[Shape]] = {client_id: [] for client_id in clients}
    for client_id, subscriptions in clients.items():
        plain = [
            options
            for topic_filter, options in subscriptions.items()
            if parse_shared(topic_filter) is None
            and matches(topic_filter, message.topic)
            and not (options.no_local and client_id == message.publisher)
        ]
        if plain:
            wanted[client_id].append(shape(plain))
    for share_filter in SHARED:
        if only_groups is not None and share_filter not in only_groups:
            continue
        members = sorted(c for c, subscriptions in clients.items() if share_filter in subscriptions)
        if members and matches(share_filter, message.topic):
            wanted[members[0]].append(shape([clients[members[0]][share_filter]]))
    return wanted


def shapes_of(copies: list[Delivery]) -> list[Shape]:
    return sorted((c.qos, c.retain, tuple(sorted(c.subscription_ids))) for c in copies)


@settings(max_examples=400, deadline=None)
@given(
    clients=clients_strategy,
    message=message_strategy,
    only_groups=st.one_of(st.none(), st.lists(st.sampled_from(SHARED), unique=True)),
)
def test_every_client_gets_a_copy_for_its_plain_subscriptions_and_one_per_share_group(
    clients: Clients, message: Message, only_groups: list[str] | None
) -> None:
    sessions, copies = delivered(clients, message, only_groups)
    wanted = model(clients, message, only_groups)
    for client_id in clients:
        assert shapes_of(copies[client_id]) == sorted(wanted[client_id]), client_id
        for copy in copies[client_id]:
            assert (copy.topic, copy.payload, copy.message_id) == (
                message.topic,
                message.payload,
                message.id,
            )
            assert copy.properties == message.properties
        served = only_groups or []  # (copies_for serves no group unless told)
        alone = sessions.copies_for(message, client_id, served)
        assert shapes_of(alone) == sorted(model(clients, message, served)[client_id])
    shared: dict[tuple[int, bool, int | None], Delivery] = {}
    for client_id in clients:
        matched = sessions.trie.subscriptions_for(TOPIC, message.publisher, only_groups)
        found = [
            s
            for s in matched.get(client_id, [])
            if not (s.options.no_local and client_id == message.publisher)
        ]
        if len(found) == 1:  # one subscription: the copy is shared with its shape
            options = found[0].options
            shape = (
                min(options.qos, message.qos),
                message.retain and options.retain_as_published,
                options.subscription_identifier,
            )
            [copy] = copies[client_id]
            assert shared.setdefault(shape, copy) is copy
            assert copy == make_copy(message, found)


def test_a_shared_and_a_plain_subscription_of_one_client_make_two_copies() -> None:
    """``$share/g/t`` (identifier 1) and ``t`` (identifier 2) of one client: two copies,
    each with its subscription's identifier and QoS (zMQTT's
    test_subscription_identifier_overlapping); without the plain one, one copy."""
    sessions = LocalSessions(match_cache=None)
    sessions.subscribe("c", "$share/g/t", SubscriptionOptions(qos=1, subscription_identifier=1))
    sessions.subscribe("c", "t", SubscriptionOptions(qos=0, subscription_identifier=2))
    sessions.subscribe("c", "+", SubscriptionOptions(qos=0, subscription_identifier=3))
    assert sessions.deliver(Message(b"m" * 16, "t", b"x", qos=1), None) == (2, 0)
    plain, share = sessions.session("c").take_all()
    assert (plain.qos, sorted(plain.subscription_ids)) == (0, [2, 3])
    assert (share.qos, share.subscription_ids) == (1, (1,))
    sessions.unsubscribe("c", "t")
    sessions.unsubscribe("c", "+")
    assert sessions.deliver(Message(b"n" * 16, "t", b"x", qos=1), None) == (1, 0)
    [only] = sessions.session("c").take_all()
    assert only.subscription_ids == (1,)


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
            delivery.topic,
            delivery.payload,
            delivery.qos,
            delivery.retain,
            dup,
            packet_id,
            properties,
        ),
        level,
    )


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
