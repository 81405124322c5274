"""MQTT 5.0 properties (section 2.2.2): one value type, the table of every property, and
their encoding.

Rules enforced when reading, with the reason code a violation gets:

* A property not defined for its packet (or the will) is a Malformed Packet (0x81,
  [2.2.2.2]); so is a value that ends early or is not of its data type.
* A property given twice is a Protocol Error (0x82), except User Property (kept in
  order, [3.3.2-17/18]) and Subscription Identifier in PUBLISH (one per subscription).
* Values outside their range are a Protocol Error: Receive Maximum 0, Maximum Packet Size
  0, a Subscription Identifier 0, a flag (Payload Format Indicator, Request Problem
  Information, ...) other than 0 or 1, Maximum QoS other than 0 or 1, a Response Topic
  that is empty or holds a wildcard (it is a topic name, MQTT-3.3.2-14, 4.7.3-1).
* More User Properties in one property block than :class:`PropertyLimits` allow, by
  count or by the UTF-8 bytes of their names and values, is Quota exceeded (0x97, a limit
  of ours: each costs decoding, memory and an encoding per subscriber). It is judged as
  each pair is read, so a packet past it costs at most one pair more than the limit.

Properties travel as one frozen :class:`Properties` (``None`` fields are absent); a packet
without properties carries :data:`NO_PROPERTIES`, shared, so a plain PUBLISH allocates none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, Final

from router.errors import MalformedPacketError, MqttProtocolError
from router.mqtt.wire import (
    PacketType,
    read_binary,
    read_byte,
    read_string,
    read_u16,
    read_u32,
    read_varint,
    varint_size,
    write_binary,
    write_string,
    write_u16,
    write_u32,
    write_varint,
)

WILL: Final = 0
"""The pseudo packet type of the will properties inside CONNECT."""
QUOTA_EXCEEDED: Final = 0x97
TOPIC_NAME_INVALID: Final = 0x90


class Kind(Enum):
    """The data type of a property value."""

    BYTE = 1
    TWO = 2
    FOUR = 4
    VARINT = 5
    STRING = 6
    BINARY = 7
    PAIR = 8


@dataclass(frozen=True, slots=True)
class Properties:
    """The properties of one packet (or will). ``None``: the property is absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __bool__(self) -> bool:
        return self != NO_PROPERTIES

    def but(self, **changes: Any) -> Properties:
        """A copy with ``changes``."""
        return replace(self, **changes)


NO_PROPERTIES: Final = Properties()


@dataclass(frozen=True, slots=True)
class PropertyLimits:
    """What one property block (a packet's, or a will's) may hold, 0 meaning no limit:
    ``user_properties`` pairs, and ``user_properties_bytes``, the UTF-8 bytes of their
    names and values together (length prefixes not counted). A hostile 1 MB PUBLISH
    holds 140,000 pairs, or one pair of 128 KiB."""

    user_properties: int = 0
    user_properties_bytes: int = 0


NO_LIMITS: Final = PropertyLimits()


@dataclass(frozen=True, slots=True)
class Spec:
    """One property: its identifier, field, data type, the packets that may carry it and,
    for integers, the smallest value allowed (a flag also allows at most 1)."""

    identifier: int
    field: str
    kind: Kind
    packets: frozenset[int]
    minimum: int = 0
    flag: bool = False


_P = PacketType
_ACKS = (_P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP, _P.SUBACK, _P.UNSUBACK)
SPECS: Final = (
    Spec(0x01, "payload_format_indicator", Kind.BYTE, frozenset({_P.PUBLISH, WILL}), flag=True),
    Spec(0x02, "message_expiry_interval", Kind.FOUR, frozenset({_P.PUBLISH, WILL})),
    Spec(0x03, "content_type", Kind.STRING, frozenset({_P.PUBLISH, WILL})),
    Spec(0x08, "response_topic", Kind.STRING, frozenset({_P.PUBLISH, WILL})),
    Spec(0x09, "correlation_data", Kind.BINARY, frozenset({_P.PUBLISH, WILL})),
    Spec(0x0B, "subscription_identifiers", Kind.VARINT, frozenset({_P.PUBLISH, _P.SUBSCRIBE}), 1),
    Spec(
        0x11,
        "session_expiry_interval",
        Kind.FOUR,
        frozenset({_P.CONNECT, _P.CONNACK, _P.DISCONNECT}),
    ),
    Spec(0x12, "assigned_client_identifier", Kind.STRING, frozenset({_P.CONNACK})),
    Spec(0x13, "server_keep_alive", Kind.TWO, frozenset({_P.CONNACK})),
    Spec(0x15, "authentication_method", Kind.STRING, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    Spec(0x16, "authentication_data", Kind.BINARY, frozenset({_P.CONNECT, _P.CONNACK, _P.AUTH})),
    Spec(0x17, "request_problem_information", Kind.BYTE, frozenset({_P.CONNECT}), flag=True),
    Spec(0x18, "will_delay_interval", Kind.FOUR, frozenset({WILL})),
    Spec(0x19, "request_response_information", Kind.BYTE, frozenset({_P.CONNECT}), flag=True),
    Spec(0x1A, "response_information", Kind.STRING, frozenset({_P.CONNACK})),
    Spec(0x1C, "server_reference", Kind.STRING, frozenset({_P.CONNACK, _P.DISCONNECT})),
    Spec(
        0x1F,
        "reason_string",
        Kind.STRING,
        frozenset({_P.CONNACK, *_ACKS, _P.DISCONNECT, _P.AUTH}),
    ),
    Spec(0x21, "receive_maximum", Kind.TWO, frozenset({_P.CONNECT, _P.CONNACK}), 1),
    Spec(0x22, "topic_alias_maximum", Kind.TWO, frozenset({_P.CONNECT, _P.CONNACK})),
    Spec(0x23, "topic_alias", Kind.TWO, frozenset({_P.PUBLISH})),
    Spec(0x24, "maximum_qos", Kind.BYTE, frozenset({_P.CONNACK}), flag=True),
    Spec(0x25, "retain_available", Kind.BYTE, frozenset({_P.CONNACK}), flag=True),
    Spec(0x26, "user_properties", Kind.PAIR, frozenset({*_P, WILL})),
    Spec(0x27, "maximum_packet_size", Kind.FOUR, frozenset({_P.CONNECT, _P.CONNACK}), 1),
    Spec(0x28, "wildcard_subscription_available", Kind.BYTE, frozenset({_P.CONNACK}), flag=True),
    Spec(0x29, "subscription_identifier_available", Kind.BYTE, frozenset({_P.CONNACK}), flag=True),
    Spec(0x2A, "shared_subscription_available", Kind.BYTE, frozenset({_P.CONNACK}), flag=True),
)
BY_IDENTIFIER: Final = {spec.identifier: spec for spec in SPECS}
BY_FIELD: Final = {spec.field: spec for spec in SPECS}
assert {f.name for f in fields(Properties)} == set(BY_FIELD)

_READERS: Final[dict[Kind, Callable[[memoryview, int], tuple[Any, int]]]] = {
    Kind.BYTE: read_byte,
    Kind.TWO: read_u16,
    Kind.FOUR: read_u32,
    Kind.VARINT: read_varint,
    Kind.STRING: read_string,
    Kind.BINARY: read_binary,
}


def read_properties(
    data: memoryview, at: int, packet: int, limits: PropertyLimits
) -> tuple[Properties, int]:
    """The property block at ``at`` (its length, then the properties) of a ``packet``
    (a :class:`PacketType`, or :data:`WILL`) within ``limits``; returns the properties
    and the position after the block. Raises as the module docstring says."""
    size, at = read_varint(data, at)
    end = at + size
    if end > len(data):
        raise MalformedPacketError("the property length runs past the end of the packet")
    if not size:
        return NO_PROPERTIES, at
    block = data[:end]
    values: dict[str, Any] = {}
    pairs: list[tuple[str, str]] = []
    pair_bytes = 0
    identifiers: list[int] = []
    while at < end:
        identifier, at = read_varint(block, at)
        spec = BY_IDENTIFIER.get(identifier)
        if spec is None or packet not in spec.packets:
            raise MalformedPacketError(
                f"property 0x{identifier:02x} is not allowed in packet type {packet}"
            )
        if spec.kind is Kind.PAIR:
            start = at
            name, at = read_string(block, at)
            text, at = read_string(block, at)
            pairs.append((name, text))
            pair_bytes += at - start - 4  # (less the two length prefixes)
            most, most_bytes = limits.user_properties, limits.user_properties_bytes
            if most and len(pairs) > most:
                raise MqttProtocolError(f"more than {most} user properties", QUOTA_EXCEEDED)
            if most_bytes and pair_bytes > most_bytes:
                raise MqttProtocolError(
                    f"user properties of more than {most_bytes} bytes", QUOTA_EXCEEDED
                )
            continue
        value: Any
        value, at = _READERS[spec.kind](block, at)
        if isinstance(value, int) and (value < spec.minimum or (spec.flag and value > 1)):
            raise MqttProtocolError(f"{spec.field.replace('_', ' ')} may not be {value}")
        if spec.field == "subscription_identifiers":
            if identifiers and packet != PacketType.PUBLISH:
                raise MqttProtocolError("a SUBSCRIBE carries one subscription identifier")
            identifiers.append(value)
            continue
        if spec.field in values:
            raise MqttProtocolError(f"{spec.field.replace('_', ' ')} is given twice")
        if spec.field == "response_topic":
            check_topic_name(value, MqttProtocolError.reason_code, empty=True)
        values[spec.field] = value
    return Properties(
        **values, user_properties=tuple(pairs), subscription_identifiers=tuple(identifiers)
    ), end


def check_topic_name(topic: str, code: int = TOPIC_NAME_INVALID, *, empty: bool = False) -> None:
    """Raise :class:`MqttProtocolError` with ``code`` for a topic name that holds a
    wildcard (``+`` or ``#``: a topic name has none, MQTT-3.3.2-2) or, with ``empty``,
    that is empty (MQTT-4.7.3-1; a PUBLISH may leave it empty for its topic alias)."""
    if "+" in topic or "#" in topic:
        raise MqttProtocolError(f"topic name {topic!r} holds a wildcard", code)
    if empty and not topic:
        raise MqttProtocolError("a topic name is empty", code)


def write_properties(out: bytearray, properties: Properties) -> None:
    """Append the property block (length, then each present property in table order)."""
    if properties is NO_PROPERTIES:
        out.append(0)
        return
    body = bytearray()
    for spec in SPECS:
        value = getattr(properties, spec.field)
        if value is None or value == ():
            continue
        if spec.kind is Kind.PAIR:
            for name, text in value:
                body.append(spec.identifier)
                write_string(body, name)
                write_string(body, text)
        elif spec.kind is Kind.VARINT:
            for number in value:
                body.append(spec.identifier)
                write_varint(body, number)
        else:
            body.append(spec.identifier)
            _write_value(body, spec.kind, value)
    write_varint(out, len(body))
    out += body


def _write_value(out: bytearray, kind: Kind, value: Any) -> None:
    if kind is Kind.BYTE:
        out.append(value)
    elif kind is Kind.TWO:
        write_u16(out, value)
    elif kind is Kind.FOUR:
        write_u32(out, value)
    elif kind is Kind.STRING:
        write_string(out, value)
    else:
        write_binary(out, value)


def properties_size(properties: Properties) -> int:
    """The bytes :func:`write_properties` appends (length prefix included)."""
    if properties is NO_PROPERTIES:
        return 1
    out = bytearray()
    write_properties(out, properties)
    return len(out)


__all__ = [
    "NO_LIMITS",
    "NO_PROPERTIES",
    "SPECS",
    "WILL",
    "Properties",
    "PropertyLimits",
    "check_topic_name",
    "properties_size",
    "read_properties",
    "varint_size",
    "write_properties",
]
