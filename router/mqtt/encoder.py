"""Packets to bytes, for protocol levels 3, 4 and 5, without I/O (the encoding half of
:mod:`router.mqtt.codec`, which is where callers import it from).

:func:`encode` writes any packet; the delivery path writes PUBLISH and PUBACK packets
through :func:`encode_publish` (with the topic's field made once: :func:`topic_field`)
and :func:`encode_puback`, which make the same bytes without a packet object to build
first. Fields that only 5.0 has are left out below 5, and CONNACK's Session Present
below 3.1.1 (protocol level 3 reserves that byte).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from router.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    PROTOCOL_NAMES,
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
    UnsubAck,
    Unsubscribe,
)
from router.mqtt.properties import Properties, write_properties
from router.mqtt.reason_codes import connack_return_code
from router.mqtt.wire import MAX_VARINT, write_binary, write_string, write_u16, write_varint


def encode(packet: Packet, level: int = MQTT_5) -> bytes:
    """The bytes of ``packet`` for protocol ``level`` (fields 5.0 alone has are left out
    below 5). Raises ``ValueError`` for a field that cannot be encoded (a string over
    65535 bytes, a packet over the protocol's size) and ``TypeError`` for a non-packet."""
    if type(packet) is Publish:
        return encode_publish(
            topic_field(packet.topic),
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
            packet.properties,
            level >= MQTT_5,
        )
    writer = _WRITERS.get(type(packet))
    if writer is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    if type(packet) is ConnAck and level < MQTT_3_1_1 and packet.session_present:
        packet = replace(packet, session_present=False)  # (3.1 reserves the flag: always 0)
    body = bytearray()
    flags = writer(body, packet, level >= MQTT_5)
    if len(body) > MAX_VARINT:
        raise ValueError(f"a packet body is at most {MAX_VARINT} bytes, not {len(body)}")
    out = bytearray(((packet.type << 4) | flags,))
    write_varint(out, len(body))
    out += body
    return bytes(out)


def topic_field(topic: str) -> bytes:
    """A topic name as a PUBLISH carries it: its UTF-8 bytes after their length (two
    bytes); raises ``ValueError`` over 65535 bytes."""
    name = topic.encode("utf-8")
    if len(name) > 0xFFFF:
        raise ValueError(f"binary data or a string is at most 65535 bytes, not {len(name)}")
    return len(name).to_bytes(2, "big") + name


def encode_publish(
    field: bytes,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: Properties,
    v5: bool,
) -> bytes:
    """The bytes of one PUBLISH whose topic name is ``field`` (its :func:`topic_field`:
    the delivery path encodes one PUBLISH per copy, and keeps the fields of its topics),
    as :func:`encode` makes them, without a :class:`Publish` to build first; raises as
    :func:`encode`."""
    head = b""
    if qos:
        if not packet_id:
            raise ValueError("a QoS 1 or 2 PUBLISH needs a packet identifier 1..65535")
        head = packet_id.to_bytes(2, "big")
    if v5:
        props = bytearray(head)
        write_properties(props, properties)
        head = bytes(props)
    size = len(field) + len(head) + len(payload)
    first = 0x30 | (dup << 3) | (qos << 1) | retain
    fixed: bytes | bytearray
    if size < 0x80:
        fixed = bytes((first, size))
    elif size < 0x4000:  # (two bytes of remaining length: payloads under 16 KiB)
        fixed = bytes((first, (size & 0x7F) | 0x80, size >> 7))
    else:
        if size > MAX_VARINT:
            raise ValueError(f"a packet body is at most {MAX_VARINT} bytes, not {size}")
        fixed = bytearray((first,))
        write_varint(fixed, size)
    return b"".join((fixed, field, head, payload))


def encode_puback(packet_id: int, reason_code: int, v5: bool) -> bytes:
    """The bytes of ``PubAck(packet_id, reason_code)``, as :func:`encode` makes them (a
    3.1.1 PUBACK has no reason code); one is written per QoS 1 publish."""
    if v5 and reason_code:
        return b"\x40\x03" + packet_id.to_bytes(2, "big") + bytes((reason_code,))
    return b"\x40\x02" + packet_id.to_bytes(2, "big")


def _write_ack(body: bytearray, packet: PubAck | PubRec | PubRel | PubComp, v5: bool) -> int:
    write_u16(body, packet.packet_id)
    _write_code_and_properties(body, packet.reason_code, packet.properties, v5)
    return 2 if type(packet) is PubRel else 0


def _write_code_and_properties(
    body: bytearray, code: int, properties: Properties, v5: bool
) -> None:
    """The optional tail of 5.0 acks, DISCONNECT and AUTH: left out when it is 0 and empty."""
    if v5 and (code or properties):
        body.append(code)
        if properties:
            write_properties(body, properties)


def _write_connack(body: bytearray, packet: ConnAck, v5: bool) -> int:
    body.append(1 if packet.session_present else 0)
    body.append(packet.reason_code if v5 else connack_return_code(packet.reason_code))
    if v5:
        write_properties(body, packet.properties)
    return 0


def _write_subscribe(body: bytearray, packet: Subscribe, v5: bool) -> int:
    write_u16(body, packet.packet_id)
    if v5:
        write_properties(body, packet.properties)
    for sub in packet.subscriptions:
        write_string(body, sub.topic_filter)
        options = sub.qos
        if v5:
            options |= (sub.no_local << 2) | (sub.retain_as_published << 3)
            options |= sub.retain_handling << 4
        body.append(options)
    return 2


def _write_suback(body: bytearray, packet: SubAck, v5: bool) -> int:
    write_u16(body, packet.packet_id)
    if v5:
        write_properties(body, packet.properties)
    body += bytes(code if v5 or code < 0x80 else 0x80 for code in packet.reason_codes)
    return 0


def _write_unsubscribe(body: bytearray, packet: Unsubscribe, v5: bool) -> int:
    write_u16(body, packet.packet_id)
    if v5:
        write_properties(body, packet.properties)
    for topic_filter in packet.topic_filters:
        write_string(body, topic_filter)
    return 2


def _write_unsuback(body: bytearray, packet: UnsubAck, v5: bool) -> int:
    write_u16(body, packet.packet_id)
    if v5:
        write_properties(body, packet.properties)
        body += bytes(packet.reason_codes)
    return 0


def _write_disconnect(body: bytearray, packet: Disconnect, v5: bool) -> int:
    _write_code_and_properties(body, packet.reason_code, packet.properties, v5)
    return 0


def _write_auth(body: bytearray, packet: Auth, v5: bool) -> int:
    """AUTH may leave out its reason code and property length only together, and only
    for Success (MQTT 5.0 3.15.2.1); unlike the acks it never leaves out the length alone."""
    if not v5:
        raise ValueError("AUTH exists only in MQTT 5.0")
    if packet.reason_code or packet.properties:
        body.append(packet.reason_code)
        write_properties(body, packet.properties)
    return 0


def _write_nothing(body: bytearray, packet: PingReq | PingResp, v5: bool) -> int:
    return 0


def _write_connect(body: bytearray, packet: Connect, v5: bool) -> int:
    _encode_connect(body, packet)  # its own protocol level, whatever the connection's
    return 0


def _encode_connect(body: bytearray, packet: Connect) -> None:
    level = packet.protocol_level
    v5 = level >= MQTT_5
    write_string(body, PROTOCOL_NAMES[level])
    body.append(level)
    will = packet.will
    flags = (packet.clean_start << 1) | (packet.username is not None) << 7
    flags |= (packet.password is not None) << 6
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (will.retain << 5)
    body.append(flags)
    write_u16(body, packet.keepalive)
    if v5:
        write_properties(body, packet.properties)
    write_string(body, packet.client_id)
    if will is not None:
        if v5:
            write_properties(body, will.properties)
        write_string(body, will.topic)
        write_binary(body, will.payload)
    if packet.username is not None:
        write_string(body, packet.username)
    if packet.password is not None:
        write_binary(body, packet.password)


_WRITERS: Final[dict[type, Callable[[bytearray, Any, bool], int]]] = {
    Connect: _write_connect,
    ConnAck: _write_connack,
    PubAck: _write_ack,
    PubRec: _write_ack,
    PubRel: _write_ack,
    PubComp: _write_ack,
    Subscribe: _write_subscribe,
    SubAck: _write_suback,
    Unsubscribe: _write_unsubscribe,
    UnsubAck: _write_unsuback,
    PingReq: _write_nothing,
    PingResp: _write_nothing,
    Disconnect: _write_disconnect,
    Auth: _write_auth,
}


def encoded_size(packet: Packet, level: int = MQTT_5) -> int:
    """The size in bytes of ``packet`` encoded for ``level`` (fixed header included)."""
    return len(encode(packet, level))
