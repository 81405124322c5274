"""Bytes to packets and back, for protocol levels 3, 4 and 5, without I/O.

:func:`encode` writes one packet for a protocol level (it lives in
:mod:`router.mqtt.encoder`, with the delivery path's shortcuts). :class:`PacketReader` frames a
byte stream: it reads the fixed header first and refuses a packet above its maximum size
from the remaining length alone (:class:`PacketTooLargeError`, 0x95), before any of the
body arrives or is buffered; then :func:`decode` parses the body. The protocol level is
the CONNECT's: a reader that has not seen one decodes only a CONNECT.

What a decoding error becomes (reason codes of 5.0, section 4.13):

* :class:`MalformedPacketError` (0x81): reserved flag bits set, a QoS of 3, a remaining
  length or a field that runs short or long, bad UTF-8, a packet identifier 0, a
  reason code that packet may not carry, a property not allowed there, a topic filter
  of zero length (MQTT-4.7.3-1, as mosquitto);
* :class:`MqttProtocolError` (0x82): a well-formed packet the protocol forbids (a first
  packet other than CONNECT, a second CONNECT is left to the session; an empty
  SUBSCRIBE or UNSUBSCRIBE in 5.0, MQTT-3.8.3-2 and 3.10.3-2, retain handling 3, a
  property given twice, AUTH below 5.0, an empty will topic, Authentication Data
  without an Authentication Method, a Response Topic that is empty or has a wildcard);
* :class:`MqttProtocolError` with 0x90 (Topic Name invalid): a wildcard in the topic
  name of a PUBLISH or a will;
* :class:`UnsupportedProtocolVersionError` (0x84): a protocol name or level other than
  ``MQIsdp``/3, ``MQTT``/4 or ``MQTT``/5;
* :class:`MqttProtocolError` with 0x97 (Quota exceeded): a property block with more user
  properties than the reader's :class:`~router.mqtt.properties.PropertyLimits` allow.

An error raised decoding a CONNECT, once its protocol level was read, carries that
level (:attr:`MqttError.level <router.errors.MqttError>`): a 5.0 CONNECT is refused
with a CONNACK of its reason code, a 3.1.1 one closed without CONNACK (MQTT-3.1.4-1).
What the server supports (no Authentication Method at all, its own limits) is judged
once the CONNECT is decoded (:func:`router.mqtt.exchange.admit`).
"""

from __future__ import annotations

from typing import Final

from router.errors import (
    MalformedPacketError,
    MqttError,
    MqttProtocolError,
    PacketTooLargeError,
    UnsupportedProtocolVersionError,
)
from router.mqtt.encoder import (
    encode,
    encode_puback,
    encode_publish,
    encoded_size,
    topic_field,
)
from router.mqtt.packets import (
    MQTT_3_1,
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
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from router.mqtt.properties import (
    NO_LIMITS,
    NO_PROPERTIES,
    WILL,
    Properties,
    PropertyLimits,
    check_topic_name,
    read_properties,
)
from router.mqtt.reason_codes import ALLOWED
from router.mqtt.wire import (
    MAX_VARINT,
    PacketType,
    read_binary,
    read_byte,
    read_string,
    read_u16,
    varint_size,
)

MAX_PACKET_SIZE: Final = 1 + 4 + MAX_VARINT
"""The largest packet the protocol can express (fixed header included)."""

# Packets whose fixed header flags must be 0b0010 (MQTT-3.6.1-1, 3.8.1-1, 3.10.1-1).
_FLAGS_TWO: Final = frozenset({PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE})
_V3_CONNACK: Final = {0: 0x00, 1: 0x84, 2: 0x85, 3: 0x88, 4: 0x86, 5: 0x87}
# The SUBACK return codes of 3.1 and 3.1.1; the rest are reserved (MQTT-3.9.3-2).
_V3_SUBACK: Final = frozenset({0x00, 0x01, 0x02, 0x80})
_ACKS: Final[dict[int, type[PubAck | PubRec | PubRel | PubComp]]] = {
    PacketType.PUBACK: PubAck,
    PacketType.PUBREC: PubRec,
    PacketType.PUBREL: PubRel,
    PacketType.PUBCOMP: PubComp,
}


# -- decoding ----------------------------------------------------------------------------------


def decode(
    first: int, body: memoryview, level: int | None, limits: PropertyLimits = NO_LIMITS
) -> Packet:
    """The packet of fixed header byte ``first`` and ``body`` (exactly the remaining
    length). ``level`` is the connection's protocol level, None before its CONNECT
    (then only a CONNECT decodes); its property blocks must keep within ``limits``.
    Raises as the module docstring says."""
    kind = first >> 4
    flags = first & 0x0F
    if kind == PacketType.CONNECT:
        if flags:
            raise MalformedPacketError("CONNECT has reserved flags set")
        return _decode_connect(body, limits)
    if level is None:
        raise MqttProtocolError("the first packet of a connection must be CONNECT")
    v5 = level >= MQTT_5
    if kind == PacketType.PUBLISH:
        return _decode_publish(flags, bytes(body), 0, len(body), v5, limits)
    if kind == 0:
        raise MalformedPacketError("packet type 0 is reserved")
    expected = 2 if kind in _FLAGS_TWO else 0
    if flags != expected:
        raise MalformedPacketError(f"packet type {kind} has flags {flags:#06b}")
    if kind in (PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP):
        return _decode_ack(kind, body, v5, limits)
    if kind == PacketType.SUBSCRIBE:
        return _decode_subscribe(body, v5, limits)
    if kind == PacketType.UNSUBSCRIBE:
        packet_id, at = _packet_id(body, 0)
        properties, at = read_properties(body, at, kind, limits) if v5 else (NO_PROPERTIES, at)
        filters = []
        while at < len(body):
            topic_filter, at = _read_filter(body, at)
            filters.append(topic_filter)
        if not filters:
            raise _empty(v5, "UNSUBSCRIBE needs at least one topic filter")
        return Unsubscribe(packet_id, tuple(filters), properties)
    if kind == PacketType.CONNACK:
        return _decode_connack(body, level, limits)
    if kind == PacketType.SUBACK:
        return _decode_suback(body, v5, limits)
    if kind == PacketType.UNSUBACK:
        packet_id, at = _packet_id(body, 0)
        if not v5:
            _end(body, at)
            return UnsubAck(packet_id)
        properties, at = read_properties(body, at, kind, limits)
        codes = tuple(body[at:])
        for code in codes:
            _check_code(code, kind)
        return UnsubAck(packet_id, codes, properties)
    if kind in (PacketType.PINGREQ, PacketType.PINGRESP):
        _end(body, 0)
        return PingReq() if kind == PacketType.PINGREQ else PingResp()
    if kind == PacketType.DISCONNECT:
        if not v5:
            _end(body, 0)
            return Disconnect()
        code, properties = _code_and_properties(body, 0, kind, limits)
        return Disconnect(code, properties)
    if not v5:
        raise MqttProtocolError("AUTH exists only in MQTT 5.0")
    code, properties = _code_and_properties(body, 0, kind, limits)
    return Auth(code, properties)


def _decode_connect(body: memoryview, limits: PropertyLimits) -> Connect:
    name, at = read_string(body, 0)
    level, at = read_byte(body, at)
    if PROTOCOL_NAMES.get(level) != name:
        raise UnsupportedProtocolVersionError(
            f"protocol {name!r} level {level} is not MQTT 3.1, 3.1.1 or 5.0", level
        )
    try:
        return _decode_connect_fields(body, at, level, limits)
    except MqttError as error:
        error.level = level  # (refused with a CONNACK of that level: MqttError.level)
        raise


def _decode_connect_fields(
    body: memoryview, at: int, level: int, limits: PropertyLimits
) -> Connect:
    """The CONNECT of ``level`` whose flags start at ``at``."""
    v5 = level == MQTT_5
    flags, at = read_byte(body, at)
    if flags & 0x01:
        raise MalformedPacketError("the reserved CONNECT flag is set")
    will_flag = bool(flags & 0x04)
    will_qos = (flags >> 3) & 0x03
    will_retain = bool(flags & 0x20)
    if will_qos == 3 or (not will_flag and (will_qos or will_retain)):
        raise MalformedPacketError("the will flags are inconsistent")
    has_username, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if has_password and not has_username and not v5:
        raise MalformedPacketError("a password without a user name needs MQTT 5.0")
    keepalive, at = read_u16(body, at)
    properties, at = (
        read_properties(body, at, PacketType.CONNECT, limits) if v5 else (NO_PROPERTIES, at)
    )
    if properties.authentication_data is not None and properties.authentication_method is None:
        raise MqttProtocolError("Authentication Data without an Authentication Method")
    client_id, at = read_string(body, at)
    will = None
    if will_flag:
        will_properties, at = read_properties(body, at, WILL, limits) if v5 else (NO_PROPERTIES, at)
        topic, at = read_string(body, at)
        if not topic:
            raise MqttProtocolError("the will topic is empty")
        check_topic_name(topic)  # (0x90)
        payload, at = read_binary(body, at)
        will = Will(topic, payload, will_qos, will_retain, will_properties)
    username = password = None
    if has_username:
        username, at = read_string(body, at)
    if has_password:
        password, at = read_binary(body, at)
    _end(body, at)
    return Connect(
        client_id, level, bool(flags & 0x02), keepalive, will, username, password, properties
    )


def _decode_connack(body: memoryview, level: int, limits: PropertyLimits) -> ConnAck:
    v5 = level >= MQTT_5
    ack_flags, at = read_byte(body, 0)
    if ack_flags & (0xFE if level >= MQTT_3_1_1 else 0xFF):  # (3.1 has no Session Present)
        raise MalformedPacketError("CONNACK has reserved acknowledge flags set")
    code, at = read_byte(body, at)
    if not v5:
        _end(body, at)
        if code not in _V3_CONNACK:
            raise MalformedPacketError(f"CONNACK return code {code} is not defined")
        return ConnAck(bool(ack_flags), _V3_CONNACK[code])
    _check_code(code, PacketType.CONNACK)
    properties, at = read_properties(body, at, PacketType.CONNACK, limits)
    _end(body, at)
    return ConnAck(bool(ack_flags), code, properties)


def _decode_publish(
    flags: int, data: bytes, at: int, end: int, v5: bool, limits: PropertyLimits
) -> Publish:
    """The PUBLISH in ``data[at:end]``, read in place (the one packet decoded per
    message: no view or slice of the body is made but the topic's and the payload's)."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacketError("a PUBLISH has QoS 3")
    if end - at < 2:
        raise MalformedPacketError("the packet ends inside a two byte integer")
    topic_end = at + 2 + ((data[at] << 8) | data[at + 1])
    if topic_end > end:
        raise MalformedPacketError("the packet ends inside binary data or a string")
    try:
        topic = data[at + 2 : topic_end].decode()
    except UnicodeDecodeError:
        raise MalformedPacketError("a string is not well-formed UTF-8") from None
    if "\x00" in topic:
        raise MalformedPacketError("a string contains U+0000")
    check_topic_name(topic)
    at = topic_end
    packet_id = None
    if qos:
        if end - at < 2:
            raise MalformedPacketError("the packet ends inside a two byte integer")
        packet_id = (data[at] << 8) | data[at + 1]
        if not packet_id:
            raise MalformedPacketError("packet identifier 0 is not allowed")
        at += 2
    properties = NO_PROPERTIES
    if v5:
        body = memoryview(data)[:end]
        properties, at = read_properties(body, at, PacketType.PUBLISH, limits)
    return Publish(
        topic, data[at:end], qos, bool(flags & 0x01), bool(flags & 0x08), packet_id, properties
    )


def _decode_suback(body: memoryview, v5: bool, limits: PropertyLimits) -> SubAck:
    packet_id, at = _packet_id(body, 0)
    properties, at = (
        read_properties(body, at, PacketType.SUBACK, limits) if v5 else (NO_PROPERTIES, at)
    )
    codes = tuple(body[at:])
    for code in codes:
        if v5:
            _check_code(code, PacketType.SUBACK)
        elif code not in _V3_SUBACK:
            raise MalformedPacketError(f"SUBACK return code 0x{code:02x} is reserved in 3.1.1")
    return SubAck(packet_id, codes, properties)


def _decode_ack(
    kind: int, body: memoryview, v5: bool, limits: PropertyLimits
) -> PubAck | PubRec | PubRel | PubComp:
    packet_id, at = _packet_id(body, 0)
    code, properties = 0, NO_PROPERTIES
    if v5:
        code, properties = _code_and_properties(body, at, kind, limits)
    else:
        _end(body, at)
    return _ACKS[kind](packet_id, code, properties)


def _decode_subscribe(body: memoryview, v5: bool, limits: PropertyLimits) -> Subscribe:
    packet_id, at = _packet_id(body, 0)
    properties = NO_PROPERTIES
    if v5:
        properties, at = read_properties(body, at, PacketType.SUBSCRIBE, limits)
    subscriptions = []
    while at < len(body):
        topic_filter, at = _read_filter(body, at)
        options, at = read_byte(body, at)
        qos = options & 0x03
        if qos == 3 or options & (0xC0 if v5 else 0xFC):
            raise MalformedPacketError(f"subscription options {options:#010b} are not valid")
        retain_handling = (options >> 4) & 0x03
        if retain_handling == 3:
            raise MqttProtocolError("retain handling 3 is not defined")
        subscriptions.append(
            Subscription(
                topic_filter, qos, bool(options & 0x04), bool(options & 0x08), retain_handling
            )
        )
    if not subscriptions:
        raise _empty(v5, "SUBSCRIBE needs at least one topic filter")
    return Subscribe(packet_id, tuple(subscriptions), properties)


def _read_filter(body: memoryview, at: int) -> tuple[str, int]:
    """A topic filter of a SUBSCRIBE or UNSUBSCRIBE: at least one character
    (MQTT-4.7.3-1; its syntax is judged per filter, 0x8F, once it is decoded)."""
    topic_filter, at = read_string(body, at)
    if not topic_filter:
        raise MalformedPacketError("a topic filter is empty")
    return topic_filter, at


def _code_and_properties(
    body: memoryview, at: int, kind: int, limits: PropertyLimits
) -> tuple[int, Properties]:
    """The optional reason code and properties of a 5.0 ack, DISCONNECT or AUTH."""
    if at == len(body):
        return 0, NO_PROPERTIES
    code, at = read_byte(body, at)
    _check_code(code, kind)
    if at == len(body):
        return code, NO_PROPERTIES
    properties, at = read_properties(body, at, kind, limits)
    _end(body, at)
    return code, properties


def _packet_id(body: memoryview, at: int) -> tuple[int, int]:
    packet_id, at = read_u16(body, at)
    if not packet_id:
        raise MalformedPacketError("packet identifier 0 is not allowed")
    return packet_id, at


def _check_code(code: int, kind: int) -> None:
    if code not in ALLOWED[kind]:
        name = PacketType(kind).name
        raise MalformedPacketError(f"reason code 0x{code:02x} is not one a {name} may carry")


def _end(body: memoryview, at: int) -> None:
    if at != len(body):
        raise MalformedPacketError(f"{len(body) - at} unexpected bytes at the end of a packet")


def _empty(v5: bool, message: str) -> Exception:
    return MqttProtocolError(message) if v5 else MalformedPacketError(message)


# -- framing -----------------------------------------------------------------------------------


def _remaining_length(data: bytes, at: int, size: int) -> tuple[int, int]:
    """The remaining length whose first byte is ``data[at]``, and where the body starts;
    (-1, at) while its bytes are still arriving (``data`` ends at ``size``)."""
    remaining = 0
    for shift in (0, 7, 14, 21):
        if at >= size:
            return -1, at
        byte = data[at]
        at += 1
        remaining |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if not byte and shift:  # MQTT-1.5.5-1: the fewest bytes
                raise MalformedPacketError("the remaining length is overlong")
            return remaining, at
    raise MalformedPacketError("the remaining length is longer than 4 bytes")


class PacketReader:
    """Frames a byte stream into packets.

    :meth:`feed` takes whatever bytes arrived and returns the packets they complete, in
    order. A packet whose fixed header announces more than ``max_packet_size`` bytes
    raises :class:`PacketTooLargeError` at once, with none of its body buffered; a
    decoding error raises as :func:`decode` does (property blocks past ``limits``
    included). When good packets came before the bad
    one in the same bytes, ``feed`` returns them and keeps the error in :attr:`error`
    (the caller handles them, then raises it; the next ``feed`` raises it too). After an
    error the reader is spent: the connection must close. ``level`` is set from the
    first CONNECT read. A packet that arrives in pieces costs one append per piece until
    it is whole (never a copy of what is buffered: a client trickling a large packet in
    must not cost the node its size at every piece).
    """

    __slots__ = ("_buffer", "_wanted", "error", "level", "limits", "max_packet_size")

    def __init__(
        self, max_packet_size: int = MAX_PACKET_SIZE, limits: PropertyLimits = NO_LIMITS
    ) -> None:
        if not 2 <= max_packet_size <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be 2..{MAX_PACKET_SIZE}")
        self.max_packet_size = max_packet_size
        self.limits = limits
        self.level: int | None = None
        self.error: MqttError | None = None
        self._buffer = bytearray()
        self._wanted = 0  # bytes the packet at the head of the buffer needs, once known

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole packet (only what arrived: the
        remaining length a fixed header announces allocates nothing)."""
        return len(self._buffer)

    def discard(self) -> None:
        """Let go of the unfinished packet's bytes: the connection ends, the reader is
        fed no more."""
        self._buffer = bytearray()
        self._wanted = 0

    def feed(self, data: bytes | memoryview) -> list[Packet]:
        if self.error is not None:
            raise self.error
        buffer = self._buffer
        buffer += data
        if len(buffer) < self._wanted:
            return []  # (the head packet is still arriving: no copy per piece of it)
        packets: list[Packet] = []
        start = self._wanted = 0
        size = len(buffer)
        snapshot = bytes(buffer)  # parsed through views: the buffer itself may then shrink
        view = memoryview(snapshot)
        try:
            while size - start >= 2:
                at = start + 2
                remaining = snapshot[start + 1]
                if remaining & 0x80:  # (a remaining length of 128 bytes or more)
                    second = snapshot[at] if at < size else 0
                    if 0 < second < 0x80:  # (two bytes: packets under 16 KiB)
                        remaining = (remaining & 0x7F) | (second << 7)
                        at += 1
                    else:
                        remaining, at = _remaining_length(snapshot, start + 1, size)
                        if remaining < 0:
                            break  # the length is still arriving
                total = at - start + remaining
                if total > self.max_packet_size:
                    raise PacketTooLargeError(
                        f"a packet of {total} bytes is above the maximum of {self.max_packet_size}"
                    )
                if at + remaining > size:
                    self._wanted = total
                    break
                first = snapshot[start]
                packet: Packet
                if first >> 4 == PacketType.PUBLISH and self.level is not None:
                    v5 = self.level >= MQTT_5
                    packet = _decode_publish(
                        first & 0x0F, snapshot, at, at + remaining, v5, self.limits
                    )
                else:
                    packet = decode(first, view[at : at + remaining], self.level, self.limits)
                if self.level is None and type(packet) is Connect:
                    self.level = packet.protocol_level
                packets.append(packet)
                start = at + remaining
        except MqttError as error:
            if not packets:
                raise
            self.error = error
        if start:
            del buffer[:start]
        return packets


__all__ = [
    "MAX_PACKET_SIZE",
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "PacketReader",
    "decode",
    "encode",
    "encode_puback",
    "encode_publish",
    "encoded_size",
    "topic_field",
    "varint_size",
]
