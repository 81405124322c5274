"""What a client can send that it should not: malformed packets and invalid fields, each
against one ``router node run --mqtt`` process, with the reason code the specification
names for it (MQTT 5.0 and 3.1.1; 3.1 is protocol level 3). Whatever the client sent,
the node's log holds no traceback and no ERROR line afterwards (each test's node is
checked when the test ends), and the node goes on serving.

Codes chosen where the specification leaves room (docs/mqtt.md has the whole table): a
will topic of zero length is a Protocol Error (CONNACK 0x82, as mosquitto), one with a
wildcard is Topic Name invalid (CONNACK 0x90); 3.1.1 closes without CONNACK
(MQTT-3.1.4-1). An Authentication Method gets CONNACK 0x8C: the server supports no
enhanced authentication. A zero-length topic filter is Malformed (0x81, as mosquitto);
SUBSCRIBE and UNSUBSCRIBE without any filter are a Protocol Error (0x82, MQTT-3.8.3-2,
3.10.3-2). A Message Expiry Interval of 0 means no expiry (as mosquitto).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from router.mqtt.codec import PacketReader, encode
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
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
)
from router.mqtt.properties import Properties
from router.state.keys import Keys
from tests.support.cli import Process
from tests.support.mqtt import TIMEOUT, V5, Paho, mqtt_node
from tests.support.waiting import wait_until

Node = tuple[Process, int]


def log_of(process: Process) -> list[str]:
    """Every line the node wrote on stderr so far."""
    return process.logged()


@pytest.fixture
def node(redis_standalone_url: str, keys: Keys) -> Iterator[Node]:
    """One node with a 64 KiB maximum packet size; when the test ends its log must hold
    no traceback and no ERROR line, and it must still take a connection."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    with mqtt_node("edges", env, "--mqtt-max-packet-size", "65536") as (process, port):
        yield process, port
        healthy = Paho(port, "healthy", V5)
        try:
            assert healthy.connected()[0] == 0
        finally:
            healthy.close()
        bad = [line for line in log_of(process) if "Traceback" in line or " ERROR " in line]
        assert not bad, "\n".join(log_of(process))


def exchange(port: int, *sends: bytes, level: int = MQTT_5) -> list[Packet]:
    """Send ``sends`` on a new connection; the packets the server sent until it closed
    the connection (read at ``level``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.settimeout(TIMEOUT)
        for data in sends:
            sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    reader = PacketReader()
    reader.level = level
    return reader.feed(received)


def connect(client_id: str, level: int = MQTT_5, **fields: object) -> bytes:
    return encode(Connect(client_id, level, keepalive=60, **fields), level)  # type: ignore[arg-type]


ACCEPTED = ConnAck(False, 0)


def accepted(packets: list[Packet]) -> list[Packet]:
    """What came after a CONNACK that accepted the connection."""
    assert packets, "the server closed the connection without CONNACK"
    first = packets[0]
    assert isinstance(first, ConnAck) and (first.session_present, first.reason_code) == (False, 0)
    return packets[1:]


# -- CONNECT ------------------------------------------------------------------------------------


def test_an_authentication_method_is_refused_with_connack_0x8c(node: Node) -> None:
    """MQTT-4.12.0-1: the server supports no enhanced authentication. Before: CONNACK 0x00."""
    _, port = node
    asked = Properties(authentication_method="SCRAM-SHA-256", authentication_data=b"n,,n=u")
    assert exchange(port, connect("scram", properties=asked)) == [ConnAck(False, 0x8C)]


def test_an_auth_packet_is_a_protocol_error(node: Node) -> None:
    """No Authentication Method was agreed at CONNECT, so AUTH is a Protocol Error."""
    process, port = node
    packets = exchange(port, connect("auth"), encode(Auth(0x19), MQTT_5))
    assert accepted(packets) == [Disconnect(0x82)]

    def told() -> list[str]:
        return [line for line in log_of(process) if "closing MQTT client auth " in line]

    wait_until(lambda: bool(told()), TIMEOUT, "the INFO line of the refusal")
    [line] = told()  # (once for the connection, with its id and reason)
    assert " INFO " in line and "0x82" in line


def test_authentication_data_without_a_method_is_a_protocol_error(node: Node) -> None:
    _, port = node
    asked = Properties(authentication_data=b"data")
    assert exchange(port, connect("data", properties=asked)) == [ConnAck(False, 0x82)]


WILL_TOPICS = {
    "empty": ("", 0x82),
    "multi-level wildcard": ("a/#", 0x90),
    "single-level wildcard": ("a/+/b", 0x90),
    "bare wildcard": ("#", 0x90),
}


@pytest.mark.parametrize(("topic", "code"), WILL_TOPICS.values(), ids=WILL_TOPICS.keys())
def test_an_invalid_will_topic_is_refused_at_connect(node: Node, topic: str, code: int) -> None:
    """5.0: CONNACK with the code; 3.1.1 and 3.1: closed without CONNACK (MQTT-3.1.4-1).
    Before: accepted (CONNACK 0x00), and the will failed when it was due."""
    _, port = node
    will = Will(topic, b"gone", 1)
    assert exchange(port, connect("will-5", will=will)) == [ConnAck(False, code)]
    for level in (MQTT_3_1_1, MQTT_3_1):
        assert exchange(port, connect(f"will-{level}", level, will=will), level=level) == []


def test_a_will_topic_past_the_nodes_limits_is_refused_at_connect(node: Node) -> None:
    """As a PUBLISH to that topic would be (``--mqtt-max-topic-levels``, 128): 5.0
    CONNACK 0x90, 3.1.1 return code 5 (the nearest it has). Before: accepted."""
    _, port = node
    will = Will("/".join(["deep"] * 200), b"gone", 1)
    assert exchange(port, connect("deep-5", will=will)) == [ConnAck(False, 0x90)]
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(connect("deep-4", MQTT_3_1_1, will=will))
        assert sock.recv(64) == b"\x20\x02\x00\x05"


# -- SUBSCRIBE and UNSUBSCRIBE -------------------------------------------------------------------

SUBSCRIBE_PACKETS = {
    "zero-length filter": (b"\x82\x06\x00\x01\x00\x00\x00\x01", 0x81),
    "filter cut short": (b"\x82\x06\x00\x01\x00\x00\x05a", 0x81),
    "no options byte": (b"\x82\x06\x00\x01\x00\x00\x01a", 0x81),
    "reserved option bits": (b"\x82\x07\x00\x01\x00\x00\x01a\xc1", 0x81),
    "no filter at all": (b"\x82\x03\x00\x01\x00", 0x82),
    "zero-length filter to unsubscribe": (b"\xa2\x05\x00\x01\x00\x00\x00", 0x81),
    "unsubscribe filter cut short": (b"\xa2\x05\x00\x01\x00\x00\x07", 0x81),
    "nothing to unsubscribe": (b"\xa2\x03\x00\x01\x00", 0x82),
}


@pytest.mark.parametrize(
    ("packet", "code"), SUBSCRIBE_PACKETS.values(), ids=SUBSCRIBE_PACKETS.keys()
)
def test_a_malformed_subscribe_or_unsubscribe_is_disconnected(
    node: Node, packet: bytes, code: int
) -> None:
    """5.0 (section 4.13): DISCONNECT 0x81 / 0x82, never a SUBACK or UNSUBACK 0x8F.
    Before: a zero-length filter got SUBACK / UNSUBACK 0x8F."""
    _, port = node
    assert accepted(exchange(port, connect("subs"), packet)) == [Disconnect(code)]


@pytest.mark.parametrize(
    "packet",
    [b"\x82\x05\x00\x01\x00\x00\x01", b"\x82\x03\x00\x01\x00", b"\xa2\x04\x00\x01\x00\x00"],
    ids=["zero-length filter", "cut short", "zero-length filter to unsubscribe"],
)
def test_a_malformed_3_1_1_subscribe_or_unsubscribe_closes_the_connection(
    node: Node, packet: bytes
) -> None:
    _, port = node
    assert accepted(exchange(port, connect("subs4", MQTT_3_1_1), packet, level=4)) == []


# -- Message Expiry Interval 0 ---------------------------------------------------------------------


def test_a_retained_publish_with_message_expiry_0_is_acknowledged_and_kept(node: Node) -> None:
    """0 is no expiry (as mosquitto). Before: the retained store refused 0, so the
    connection closed with a traceback and no PUBACK."""
    _, port = node
    zero = Properties(message_expiry_interval=0)
    publish = Publish("expiry/zero", b"kept", 1, True, packet_id=7, properties=zero)
    packets = exchange(port, connect("zero"), encode(publish, MQTT_5), encode(Disconnect()))
    assert accepted(packets) == [PubAck(7, 0x10)]  # (nobody subscribed)
    later = Paho(port, "later", V5)
    try:
        assert later.subscribe("expiry/#", 1) == [1]
        [message] = later.take(1)
        assert (message.topic, message.payload, message.retain) == ("expiry/zero", b"kept", True)
        assert not hasattr(message.properties, "MessageExpiryInterval")
    finally:
        later.publish("expiry/zero", b"", 1, retain=True)
        later.close()


def test_a_will_with_message_expiry_0_is_published(node: Node) -> None:
    """Before: the will was silently not published (its retained store refused 0)."""
    _, port = node
    watcher = Paho(port, "watcher", V5)
    try:
        assert watcher.subscribe("wills/#", 1) == [1]
        zero = Properties(message_expiry_interval=0)
        will = Will("wills/zero", b"gone", 1, True, zero)
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            sock.sendall(connect("mortal", will=will))
            assert sock.recv(64)[:1] == b"\x20"  # CONNACK; then the socket just closes
        [message] = watcher.take(1)
        assert (message.topic, message.payload) == ("wills/zero", b"gone")
    finally:
        watcher.publish("wills/zero", b"", 1, retain=True)
        watcher.close()


# -- MQTT 3.1 -------------------------------------------------------------------------------------


def test_a_3_1_connack_never_says_session_present(node: Node) -> None:
    """Before 3.1.1 the CONNACK's first byte is reserved: it must be 0 even when the
    session was kept. Before: Session Present 1."""
    _, port = node
    persistent = connect("old-timer", MQTT_3_1, clean_start=False)
    bye = encode(Disconnect(), MQTT_3_1)
    assert exchange(port, persistent, bye, level=MQTT_3_1) == [ACCEPTED]
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(persistent + bye)
        assert sock.recv(64) == b"\x20\x02\x00\x00"
    four = connect("old-timer", MQTT_3_1_1, clean_start=False)
    assert exchange(port, four, bye, level=MQTT_3_1_1) == [ConnAck(True, 0)]  # (3.1.1 says so)


# -- deliveries above the client's Maximum Packet Size -------------------------------------------


def test_after_a_message_too_large_for_the_client_the_next_ones_flow(node: Node) -> None:
    """MQTT-3.1.2-25: the server acts as if the large one had been sent. Before: its
    PUBLISH bound a topic alias the client never saw, so the next messages on that topic
    came as the alias alone, which the client cannot read."""
    _, port = node
    asked = Properties(maximum_packet_size=200, topic_alias_maximum=4, receive_maximum=1)
    publisher = Paho(port, "big-publisher", V5)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.settimeout(TIMEOUT)
        reader = PacketReader()
        reader.level = MQTT_5
        pending: list[Packet] = []

        def next_packet() -> Packet:
            while not pending:
                pending.extend(reader.feed(sock.recv(65536)))
            return pending.pop(0)

        sock.sendall(connect("small", properties=asked))
        assert accepted([next_packet()]) == []
        sock.sendall(encode(Subscribe(1, (Subscription("sized/#", 2),)), MQTT_5))
        assert next_packet() == SubAck(1, (2,))
        try:
            publisher.publish("sized/t", b"x" * 500, 1)
            aliases: dict[int, str] = {}
            for qos in (1, 2, 1):
                publisher.publish("sized/t", f"fits {qos}".encode(), qos)
                publish = next_packet()
                assert isinstance(publish, Publish) and publish.packet_id is not None
                alias = publish.properties.topic_alias
                if publish.topic and alias is not None:
                    aliases[alias] = publish.topic
                topic = publish.topic or aliases.get(alias or 0)
                assert (topic, publish.payload, publish.qos) == (
                    "sized/t",
                    f"fits {qos}".encode(),
                    qos,
                )
                if qos == 1:
                    sock.sendall(encode(PubAck(publish.packet_id), MQTT_5))
                else:
                    sock.sendall(encode(PubRec(publish.packet_id), MQTT_5))
                    assert next_packet() == PubRel(publish.packet_id)
                    sock.sendall(encode(PubComp(publish.packet_id), MQTT_5))
        finally:
            publisher.close()


# -- mutated packets ------------------------------------------------------------------------------


def _valid_streams(level: int) -> list[bytes]:
    v5 = level == MQTT_5
    carried = Properties(message_expiry_interval=0, response_topic="r/t", content_type="c")
    properties = carried if v5 else Properties()
    packets: list[Packet] = [
        Publish("m/a", b"x", 1, True, packet_id=1, properties=properties),
        Publish("m/b", b"y" * 40, 2, packet_id=2, properties=properties),
        Subscribe(3, (Subscription("m/#", 1), Subscription("$share/g/m/+", 2))),
        Unsubscribe(4, ("m/#", "$share/g/m/+")),
        PubRel(2),
        PingReq(),
        PubAck(9),
        Disconnect(0x04) if v5 else Disconnect(),
    ]
    return [encode(packet, level) for packet in packets]


def _mutated(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(out)) if out else 0
        kind = rng.randrange(4)
        if kind == 0 and out:
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and out:
            out[at] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif kind == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 3)))
        else:
            del out[at : at + rng.randint(1, 3)]
    return bytes(out)


@pytest.mark.parametrize("level", [MQTT_3_1_1, MQTT_5], ids=["3.1.1", "5.0"])
def test_mutated_packets_put_no_traceback_in_the_log(node: Node, level: int) -> None:
    """Valid CONNECTs (with wills, some mutated) followed by valid and mutated packets,
    each on its own connection: whatever the node answers, it writes no traceback and no
    ERROR line (checked by the fixture) and keeps serving. Seeded: a failure repeats."""
    _, port = node
    rng = random.Random(40 + level)
    streams = _valid_streams(level)
    for number in range(120):
        zero = Properties(message_expiry_interval=0) if level == MQTT_5 else Properties()
        will = Will("m/will", b"gone", 1, rng.random() < 0.5, zero) if number % 3 == 0 else None
        hello = connect(f"mutant-{level}-{number}", level, will=will)
        if number % 4 == 0:
            hello = _mutated(rng, hello)
        sends = [rng.choice(streams) for _ in range(rng.randint(1, 4))]
        sends = [_mutated(rng, data) if rng.random() < 0.6 else data for data in sends]
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            sock.sendall(hello + b"".join(sends))
            sock.settimeout(0.05)
            try:
                while sock.recv(65536):
                    pass
            except TimeoutError:
                pass
    sentinel_has_gone(port)


def sentinel_has_gone(port: int) -> None:
    """Return once a connection dropped now had its will published: the node is done
    with the connections that ended before it."""
    watcher = Paho(port, "sentinel-watcher", V5)
    try:
        assert watcher.subscribe("sentinel/#", 0) == [0]
        sentinel = Paho(port, "sentinel", V5, will=("sentinel/gone", b"", 0))
        assert sentinel.connected()[0] == 0
        sentinel.drop()
        assert watcher.take(1)[0].topic == "sentinel/gone"
    finally:
        watcher.close()
