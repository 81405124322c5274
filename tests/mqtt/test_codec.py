"""The MQTT codec: every packet type and every property round-trips at every protocol
level (hypothesis), streams frame at any chunking, and each decoding error becomes the
error (and so the reason code) the specification names."""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from router.core.messages import Delivery
from router.errors import (
    MalformedPacketError,
    MqttError,
    MqttProtocolError,
    PacketTooLargeError,
    UnsupportedProtocolVersionError,
)
from router.mqtt.codec import PacketReader, encode
from router.mqtt.outgoing import PublishEncoder, TopicFields
from router.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from router.mqtt.properties import (
    NO_PROPERTIES,
    SPECS,
    WILL,
    Kind,
    Properties,
    PropertyLimits,
)
from router.mqtt.reason_codes import ALLOWED
from router.mqtt.wire import PacketType

LEVELS = (MQTT_3_1, MQTT_3_1_1, MQTT_5)

texts = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20
)
# Topic names (a PUBLISH may leave its empty for an alias) hold no wildcard; filters, a
# will topic and a Response Topic are never empty (the decoder refuses what these do not).
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"), max_size=20
)
filters = texts.filter(bool)
blobs = st.binary(max_size=40)
packet_ids = st.integers(1, 0xFFFF)


def codes(kind: int) -> st.SearchStrategy[int]:
    """The reason codes a packet of ``kind`` may carry."""
    return st.sampled_from(sorted(ALLOWED[kind]))


def value_of(kind: Kind, flag: bool, minimum: int) -> st.SearchStrategy[Any]:
    if flag:
        return st.integers(0, 1)
    return {
        Kind.BYTE: st.integers(minimum, 0xFF),
        Kind.TWO: st.integers(minimum, 0xFFFF),
        Kind.FOUR: st.integers(minimum, 0xFFFFFFFF),
        Kind.STRING: texts,
        Kind.BINARY: blobs,
    }[kind]


@st.composite
def properties(draw: st.DrawFn, packet: int, level: int = MQTT_5) -> Properties:
    """Any valid properties of ``packet``: each allowed property present or not."""
    if level < MQTT_5:
        return NO_PROPERTIES
    values: dict[str, Any] = {}
    for spec in SPECS:
        if packet not in spec.packets or not draw(st.booleans()):
            continue
        if spec.kind is Kind.PAIR:
            values[spec.field] = tuple(draw(st.lists(st.tuples(texts, texts), max_size=3)))
        elif spec.kind is Kind.VARINT:
            most = 3 if packet == PacketType.PUBLISH else 1
            identifier = st.integers(1, 268_435_455)
            values[spec.field] = tuple(draw(st.lists(identifier, min_size=1, max_size=most)))
        elif spec.field == "response_topic":
            values[spec.field] = draw(names.filter(bool))
        else:
            values[spec.field] = draw(value_of(spec.kind, spec.flag, spec.minimum))
    if "authentication_data" in values and "authentication_method" not in values:
        del values["authentication_data"]  # (data needs a method: a Protocol Error)
    return Properties(**values)


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(names.filter(bool)),
            draw(blobs),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(properties(WILL, level)),
        )
    username = draw(st.none() | texts)
    password = draw(st.none() | blobs) if username is not None or level == MQTT_5 else None
    return Connect(
        draw(texts),
        level,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        will,
        username,
        password,
        draw(properties(PacketType.CONNECT, level)),
    )


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(names),
        draw(blobs),
        qos,
        draw(st.booleans()),
        draw(st.booleans()),
        draw(packet_ids) if qos else None,
        draw(properties(PacketType.PUBLISH, level)),
    )


def acks(cls: type, level: int) -> st.SearchStrategy[Packet]:
    if level < MQTT_5:
        return st.builds(cls, packet_ids)
    return st.builds(cls, packet_ids, codes(cls.type), properties(cls.type, level))


def subscriptions(level: int) -> st.SearchStrategy[Subscription]:
    if level < MQTT_5:
        return st.builds(Subscription, filters, st.integers(0, 2))
    return st.builds(
        Subscription, filters, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2)
    )


def packets(level: int) -> st.SearchStrategy[Packet]:
    v5 = level == MQTT_5
    connack_codes = (
        codes(PacketType.CONNACK) if v5 else st.sampled_from([0x00, 0x84, 0x85, 0x88, 0x86, 0x87])
    )
    suback_codes = codes(PacketType.SUBACK) if v5 else st.sampled_from([0, 1, 2, 0x80])
    options = [
        connects(level),
        publishes(level),
        *(acks(cls, level) for cls in (PubAck, PubRec, PubRel, PubComp)),
        st.builds(  # (3.1 has no Session Present)
            ConnAck,
            st.booleans() if level >= MQTT_3_1_1 else st.just(False),
            connack_codes,
            properties(PacketType.CONNACK, level),
        ),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscriptions(level), min_size=1, max_size=3).map(tuple),
            properties(PacketType.SUBSCRIBE, level),
        ),
        st.builds(
            SubAck,
            packet_ids,
            st.lists(suback_codes, max_size=4).map(tuple),
            properties(PacketType.SUBACK, level),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(filters, min_size=1, max_size=3).map(tuple),
            properties(PacketType.UNSUBSCRIBE, level),
        ),
        st.builds(
            UnsubAck,
            packet_ids,
            st.lists(codes(PacketType.UNSUBACK), max_size=3).map(tuple) if v5 else st.just(()),
            properties(PacketType.UNSUBACK, level),
        ),
        st.just(PingReq()),
        st.just(PingResp()),
    ]
    if v5:
        for cls, kind in ((Disconnect, PacketType.DISCONNECT), (Auth, PacketType.AUTH)):
            options.append(st.builds(cls, codes(kind), properties(kind)))
    else:
        options.append(st.just(Disconnect()))
    return st.one_of(options)


def read_all(data: bytes, level: int | None, chunk: int = 0) -> list[Packet]:
    reader = PacketReader()
    reader.level = level
    if not chunk:
        return reader.feed(data)
    found = []
    for start in range(0, len(data), chunk):
        found += reader.feed(data[start : start + chunk])
    assert reader.buffered == 0
    return found


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_every_packet_round_trips(level: int, data: st.DataObject) -> None:
    stream = data.draw(st.lists(packets(level), min_size=1, max_size=4))
    chunk = data.draw(st.integers(0, 9))
    encoded = b"".join(encode(packet, level) for packet in stream)
    assert read_all(encoded, level, chunk) == stream


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(LEVELS).flatmap(connects))
def test_a_reader_learns_the_level_from_connect(connect: Connect) -> None:
    reader = PacketReader()
    follow = Publish("t", b"x", 1, packet_id=5)
    assert reader.feed(encode(connect) + encode(follow, connect.protocol_level)) == [
        connect,
        follow,
    ]
    assert reader.level == connect.protocol_level


def test_every_property_is_written_in_some_packet() -> None:
    """The table covers every property of the specification (2.2.2.2), each once."""
    identifiers = "01 02 03 08 09 0B 11 12 13 15 16 17 18 19 1A 1C 1F 21 22 23 24 25 26 27 28 29 2A"
    assert sorted(spec.identifier for spec in SPECS) == [
        int(identifier, 16) for identifier in identifiers.split()
    ]


def test_known_bytes() -> None:
    """Spot checks against the specification's layouts, byte for byte."""
    assert encode(PingReq()) == b"\xc0\x00"
    assert encode(Disconnect(), MQTT_3_1_1) == b"\xe0\x00"
    assert encode(ConnAck(True, 0x87), MQTT_3_1_1) == b"\x20\x02\x01\x05"
    assert encode(PubAck(10), MQTT_5) == b"\x40\x02\x00\x0a"
    assert encode(Publish("a/b", b"hi", 1, True, True, 1), MQTT_3_1_1) == (
        b"\x3b\x09\x00\x03a/b\x00\x01hi"
    )
    assert encode(Connect("c", MQTT_3_1_1, True, 60), MQTT_3_1_1) == (
        b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"
    )


# -- errors ------------------------------------------------------------------------------------

V311_CONNECT = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c"

ERRORS: list[tuple[str, bytes, int | None, type[MqttError]]] = [
    # (what, bytes, connection level, error)
    ("first packet is not CONNECT", b"\xc0\x00", None, MqttProtocolError),
    (
        "protocol level 6",
        b"\x10\x0d\x00\x04MQTT\x06\x02\x00\x3c\x00\x01c",
        None,
        UnsupportedProtocolVersionError,
    ),
    (
        "protocol name MQTS",
        b"\x10\x0d\x00\x04MQTS\x04\x02\x00\x3c\x00\x01c",
        None,
        UnsupportedProtocolVersionError,
    ),
    (
        "reserved CONNECT flag",
        b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01c",
        None,
        MalformedPacketError,
    ),
    (
        "will QoS without will",
        b"\x10\x0d\x00\x04MQTT\x04\x0a\x00\x3c\x00\x01c",
        None,
        MalformedPacketError,
    ),
    (
        "3.1.1 password without user",
        b"\x10\x10\x00\x04MQTT\x04\x42\x00\x3c\x00\x01c\x00\x01p",
        None,
        MalformedPacketError,
    ),
    (
        "CONNECT with trailing bytes",
        b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x01cX",
        None,
        MalformedPacketError,
    ),
    (
        "CONNECT flags in the header",
        b"\x11\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c",
        None,
        MalformedPacketError,
    ),
    ("PUBLISH QoS 3", b"\x36\x05\x00\x01a\x00\x01", MQTT_3_1_1, MalformedPacketError),
    ("packet id 0", b"\x32\x05\x00\x01a\x00\x00", MQTT_3_1_1, MalformedPacketError),
    ("string runs past the end", b"\x30\x03\x00\x05a", MQTT_3_1_1, MalformedPacketError),
    ("topic is not UTF-8", b"\x30\x04\x00\x02\xc3\x28", MQTT_3_1_1, MalformedPacketError),
    ("topic holds U+0000", b"\x30\x03\x00\x01\x00", MQTT_3_1_1, MalformedPacketError),
    ("PUBREL flags 0", b"\x60\x02\x00\x01", MQTT_3_1_1, MalformedPacketError),
    ("SUBSCRIBE flags 0", b"\x80\x06\x00\x01\x00\x01a\x00", MQTT_3_1_1, MalformedPacketError),
    ("3.1.1 empty SUBSCRIBE", b"\x82\x02\x00\x01", MQTT_3_1_1, MalformedPacketError),
    ("5.0 empty SUBSCRIBE", b"\x82\x03\x00\x01\x00", MQTT_5, MqttProtocolError),
    ("SUBSCRIBE QoS 3", b"\x82\x06\x00\x01\x00\x01a\x03", MQTT_3_1_1, MalformedPacketError),
    (
        "3.1.1 reserved option bits",
        b"\x82\x06\x00\x01\x00\x01a\x04",
        MQTT_3_1_1,
        MalformedPacketError,
    ),
    ("retain handling 3", b"\x82\x07\x00\x01\x00\x00\x01a\x30", MQTT_5, MqttProtocolError),
    ("PINGREQ with a body", b"\xc0\x01\x00", MQTT_3_1_1, MalformedPacketError),
    ("AUTH below 5.0", b"\xf0\x00", MQTT_3_1_1, MqttProtocolError),
    ("undefined reason code", b"\xe0\x01\x03", MQTT_5, MalformedPacketError),
    ("PUBACK with a DISCONNECT code", b"\x40\x03\x00\x01\x8e", MQTT_5, MalformedPacketError),
    ("PUBCOMP with a PUBACK code", b"\x70\x03\x00\x01\x10", MQTT_5, MalformedPacketError),
    ("DISCONNECT with a CONNACK code", b"\xe0\x01\x84", MQTT_5, MalformedPacketError),
    ("AUTH with a PUBREL code", b"\xf0\x01\x92", MQTT_5, MalformedPacketError),
    ("reserved packet type 0", b"\x00\x00", MQTT_5, MalformedPacketError),
    (
        "property not allowed in PUBLISH",
        b"\x30\x09\x00\x01a\x05\x11\x00\x00\x00\x01",
        MQTT_5,
        MalformedPacketError,
    ),
    (
        "property given twice",
        b"\x30\x0a\x00\x01a\x06\x01\x00\x01\x01\x01\x00",
        MQTT_5,
        MqttProtocolError,
    ),
    (
        "receive maximum 0",
        b"\x10\x11\x00\x04MQTT\x05\x02\x00\x3c\x03\x21\x00\x00\x00\x01c",
        None,
        MqttProtocolError,
    ),
    (
        "subscription identifier 0",
        b"\x82\x08\x00\x01\x02\x0b\x00\x00\x01a\x00",
        MQTT_5,
        MqttProtocolError,
    ),
    ("property length past the end", b"\x30\x05\x00\x01a\x09\x01", MQTT_5, MalformedPacketError),
    ("remaining length of 5 bytes", b"\x30\xff\xff\xff\xff\x01", MQTT_5, MalformedPacketError),
    ("overlong remaining length", b"\xc0\x80\x00", MQTT_5, MalformedPacketError),
    ("overlong property length", b"\x30\x05\x00\x01a\x80\x00", MQTT_5, MalformedPacketError),
    ("zero-length filter", b"\x82\x05\x00\x01\x00\x00\x00", MQTT_3_1_1, MalformedPacketError),
    ("zero-length unsubscribe", b"\xa2\x05\x00\x01\x00\x00\x00", MQTT_5, MalformedPacketError),
    ("5.0 empty UNSUBSCRIBE", b"\xa2\x03\x00\x01\x00", MQTT_5, MqttProtocolError),
    (
        "empty will topic",
        b"\x10\x11\x00\x04MQTT\x04\x06\x00\x3c\x00\x01c\x00\x00\x00\x00",
        None,
        MqttProtocolError,
    ),
    (
        "authentication data without a method",
        b"\x10\x12\x00\x04MQTT\x05\x02\x00\x3c\x04\x16\x00\x01d\x00\x01c",
        None,
        MqttProtocolError,
    ),
    (
        "response topic with a wildcard",
        b"\x30\x09\x00\x01a\x05\x08\x00\x02a#",
        MQTT_5,
        MqttProtocolError,
    ),
    ("3.1 CONNACK with Session Present", b"\x20\x02\x01\x00", MQTT_3_1, MalformedPacketError),
]


@pytest.mark.parametrize(
    ("bytes_in", "level", "error"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_decoding_errors_map_to_the_specified_reason_code(
    bytes_in: bytes, level: int | None, error: type[MqttError]
) -> None:
    reader = PacketReader()
    reader.level = level
    with pytest.raises(error) as raised:
        reader.feed(bytes_in)
    assert type(raised.value) is error
    assert (
        raised.value.reason_code
        == {
            MalformedPacketError: 0x81,
            MqttProtocolError: 0x82,
            UnsupportedProtocolVersionError: 0x84,
        }[error]
    )


@pytest.mark.parametrize(
    ("bytes_in", "level"),
    [
        (b"\x30\x06\x00\x03a/+x", MQTT_3_1_1),
        (b"\x30\x05\x00\x01#\x00x", MQTT_5),
        (b"\x10\x12\x00\x04MQTT\x04\x06\x00\x3c\x00\x01c\x00\x01#\x00\x00", None),
    ],
    ids=["publish", "publish 5.0", "will"],
)
def test_a_wildcard_in_a_topic_name_is_topic_name_invalid(
    bytes_in: bytes, level: int | None
) -> None:
    reader = PacketReader()
    reader.level = level
    with pytest.raises(MqttProtocolError) as raised:
        reader.feed(bytes_in)
    assert raised.value.reason_code == 0x90


def test_an_error_in_a_connect_carries_its_protocol_level() -> None:
    """Its refusal is a CONNACK of that level (5.0) or none (3.1.1: MQTT-3.1.4-1)."""
    for level, connect in (
        (MQTT_5, b"\x10\x0f\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x01cX"),
        (MQTT_3_1_1, b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x01cX"),
    ):
        with pytest.raises(MalformedPacketError) as raised:
            PacketReader().feed(connect)
        assert raised.value.level == level
    reader = PacketReader()
    reader.level = MQTT_5
    with pytest.raises(MalformedPacketError) as raised:
        reader.feed(b"\x82\x05\x00\x01\x00\x00\x00")
    assert raised.value.level is None


def test_a_3_1_connack_never_carries_session_present() -> None:
    """Protocol level 3 reserves the byte (3.1.1 made bit 0 Session Present)."""
    assert encode(ConnAck(True, 0), MQTT_3_1) == b"\x20\x02\x00\x00"
    assert encode(ConnAck(True, 0), MQTT_3_1_1) == b"\x20\x02\x01\x00"


def test_an_oversized_packet_is_refused_from_its_fixed_header() -> None:
    reader = PacketReader(max_packet_size=1024)
    reader.feed(V311_CONNECT)
    header = b"\x30\xff\xff\xff\x7f"  # announces 268,435,455 bytes; none of them arrive
    with pytest.raises(PacketTooLargeError) as raised:
        reader.feed(header)
    assert raised.value.reason_code == 0x95
    assert reader.buffered <= len(header)


def _with_pairs(pairs: tuple[tuple[str, str], ...]) -> list[Packet]:
    """One packet of each kind a client sends whose (will's) properties are ``pairs``."""
    held = Properties(user_properties=pairs)
    will = Will("w", b"", 0, False, held)
    return [
        Connect("c", MQTT_5, True, 0, will),
        Publish("t", b"x", 1, packet_id=1, properties=held),
        Subscribe(1, (Subscription("t", 0),), held),
        PubAck(1, 0x10, held),
        Disconnect(0, held),
        SubAck(1, (0,), held),  # (not a client's packet: refused after decoding, if read)
    ]


@pytest.mark.parametrize(
    "limits",
    [PropertyLimits(2, 0), PropertyLimits(0, 6), PropertyLimits(2, 6)],
    ids=["count", "bytes", "both"],
)
def test_a_property_block_past_the_limits_is_quota_exceeded(limits: PropertyLimits) -> None:
    most = (("a", "b"), ("ü", "dd"))  # 2 pairs of 6 UTF-8 bytes
    for packet, over in zip(_with_pairs(most), _with_pairs((*most, ("e", ""))), strict=True):
        reader = PacketReader(limits=limits)
        reader.level = MQTT_5
        assert reader.feed(encode(packet, MQTT_5)) == [packet]
        with pytest.raises(MqttProtocolError) as raised:
            reader.feed(encode(over, MQTT_5))
        assert raised.value.reason_code == 0x97, over
    unlimited = PacketReader()
    unlimited.level = MQTT_5
    crowded = Properties(user_properties=tuple((f"k{n}", "v" * 200) for n in range(1000)))
    assert unlimited.feed(encode(Disconnect(0, crowded), MQTT_5)) == [Disconnect(0, crowded)]


def test_the_largest_allowed_packet_passes() -> None:
    reader = PacketReader(max_packet_size=1024)
    reader.level = MQTT_3_1_1
    packet = Publish("t", b"x" * (1024 - 3 - 3), 0)  # fixed header 3, topic 3
    encoded = encode(packet, MQTT_3_1_1)
    assert len(encoded) == 1024
    assert reader.feed(encoded) == [packet]
    with pytest.raises(PacketTooLargeError):
        reader.feed(encode(Publish("t", b"x" * 1019), MQTT_3_1_1))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_give_packets_or_a_typed_error(garbage: bytes) -> None:
    for level in (None, MQTT_3_1_1, MQTT_5):
        reader = PacketReader(max_packet_size=4096)
        reader.level = level
        with contextlib.suppress(MqttError):  # anything else (or a crash) fails the test
            reader.feed(garbage)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(LEVELS).flatmap(lambda level: st.tuples(st.just(level), packets(level))))
def test_a_truncated_packet_waits_for_the_rest(case: tuple[int, Packet]) -> None:
    level, packet = case
    encoded = encode(packet, level)
    reader = PacketReader()
    reader.level = level
    assert reader.feed(encoded[:-1]) == []
    assert reader.feed(encoded[-1:]) == [packet]


def test_encoding_refuses_what_the_wire_cannot_carry() -> None:
    with pytest.raises(ValueError):
        encode(Publish("t" * 70_000))
    with pytest.raises(ValueError):
        encode(Publish("t", b"", 1))  # QoS 1 without a packet identifier
    with pytest.raises(ValueError):
        encode(Auth(), MQTT_3_1_1)
    with pytest.raises(TypeError):
        encode("not a packet")  # type: ignore[arg-type]


def test_good_packets_before_a_bad_one_come_out_first() -> None:
    reader = PacketReader()
    reader.level = MQTT_3_1_1
    good = Publish("ok", b"1")
    assert reader.feed(encode(good, MQTT_3_1_1) + b"\x36\x00") == [good]
    assert isinstance(reader.error, MalformedPacketError)
    with pytest.raises(MalformedPacketError):
        reader.feed(encode(good, MQTT_3_1_1))


def test_a_packet_trickling_in_is_not_copied_again_for_every_piece() -> None:
    """A client that sends a large packet a few bytes at a time (a slowloris after
    CONNECT) costs the node the bytes once, not the bytes buffered so far at every piece:
    4 MiB in 256-byte pieces would copy 32 GB if each feed copied the buffer."""
    packet = Publish("slow", b"x" * (4 << 20))
    data = encode(packet, MQTT_5)
    reader = PacketReader()
    reader.level = MQTT_5
    started = time.process_time()
    got = [p for at in range(0, len(data), 256) for p in reader.feed(data[at : at + 256])]
    spent = time.process_time() - started
    assert got == [packet]
    assert spent < 0.5, f"{spent:.2f} s of CPU for one 4 MiB packet"


@pytest.mark.parametrize("level", [MQTT_3_1_1, MQTT_5])
def test_the_delivery_path_encodes_what_the_codec_reads_with_its_topic_fields_bounded(
    level: int,
) -> None:
    fields = TopicFields(size=8)
    encoder = PublishEncoder(level, 0, fields)
    topics = [f"t/{n % 20}" for n in range(60)]  # more topics than the fields kept
    data = b"".join(
        encoder.encode(Delivery(topic, topic.encode(), 0, False, b"i" * 16), None, dup=False)
        for topic in topics
    )
    reader = PacketReader()
    reader.level = level  # (as a CONNECT of that level sets it)
    packets = reader.feed(data)
    got = [(p.topic, p.payload) for p in packets if isinstance(p, Publish)]
    assert got == [(topic, topic.encode()) for topic in topics]
    assert len(fields) <= 8


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from([0, 1, 120, 125, 126, 300, 16_000, 16_379, 16_380, 20_000]),
        min_size=1,
        max_size=6,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=60_000), max_size=12),
    level=st.sampled_from([MQTT_3_1_1, MQTT_5]),
    qos=st.sampled_from([0, 1]),
)
def test_publish_packets_split_anywhere_read_back_whole(
    sizes: list[int], cuts: list[int], level: int, qos: int
) -> None:
    """Remaining lengths of one, two and three bytes (payloads around 127 and 16,383
    bytes of body), the stream cut at any points, a cut inside a length among them."""
    packets = [
        Publish(f"t/{n}", bytes([n]) * size, qos, packet_id=n + 1 if qos else None)
        for n, size in enumerate(sizes)
    ]
    data = b"".join(encode(packet, level) for packet in packets)
    reader = PacketReader()
    reader.level = level
    bounds = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
    got = [p for a, b in itertools.pairwise(bounds) for p in reader.feed(data[a:b])]
    assert got == packets
    assert reader.buffered == 0
