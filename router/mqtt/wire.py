"""The data types of the MQTT wire format (section 1.5) and the control packet types.

Readers take a ``memoryview`` and a position and return ``(value, next position)``;
they raise :class:`MalformedPacketError` when the data ends early or breaks the rules
of its type (a variable byte integer longer than 4 bytes, UTF-8 that is not
well-formed or holds U+0000). Writers append to a ``bytearray``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from router.errors import MalformedPacketError

MAX_VARINT: Final = 268_435_455
"""The largest variable byte integer (4 bytes): also the largest remaining length."""


class PacketType(IntEnum):
    """The control packet type in the high nibble of the first byte."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


def read_byte(data: memoryview, at: int) -> tuple[int, int]:
    if at >= len(data):
        raise MalformedPacketError("the packet ends inside a byte field")
    return data[at], at + 1


def read_u16(data: memoryview, at: int) -> tuple[int, int]:
    if at + 2 > len(data):
        raise MalformedPacketError("the packet ends inside a two byte integer")
    return (data[at] << 8) | data[at + 1], at + 2


def read_u32(data: memoryview, at: int) -> tuple[int, int]:
    if at + 4 > len(data):
        raise MalformedPacketError("the packet ends inside a four byte integer")
    return int.from_bytes(data[at : at + 4], "big"), at + 4


def read_varint(data: memoryview, at: int) -> tuple[int, int]:
    """A variable byte integer (1..4 bytes, 7 bits each, least significant first)."""
    value = 0
    for shift in (0, 7, 14, 21):
        if at >= len(data):
            raise MalformedPacketError("the packet ends inside a variable byte integer")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if not byte and shift:
                raise MalformedPacketError("a variable byte integer is not in its shortest form")
            return value, at
    raise MalformedPacketError("a variable byte integer is longer than 4 bytes")


def read_binary(data: memoryview, at: int) -> tuple[bytes, int]:
    size, at = read_u16(data, at)
    if at + size > len(data):
        raise MalformedPacketError("the packet ends inside binary data or a string")
    return bytes(data[at : at + size]), at + size


def read_string(data: memoryview, at: int) -> tuple[str, int]:
    """A UTF-8 encoded string: well-formed, without U+0000 (MQTT-1.5.4-1/2)."""
    raw, at = read_binary(data, at)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacketError("a string is not well-formed UTF-8") from None
    if "\x00" in text:
        raise MalformedPacketError("a string contains U+0000")
    return text, at


def write_varint(out: bytearray, value: int) -> None:
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"a variable byte integer is 0..{MAX_VARINT}, not {value}")
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def varint_size(value: int) -> int:
    """How many bytes :func:`write_varint` writes for ``value``."""
    return 1 if value < 0x80 else 2 if value < 0x4000 else 3 if value < 0x200000 else 4


def write_u16(out: bytearray, value: int) -> None:
    out += value.to_bytes(2, "big")


def write_u32(out: bytearray, value: int) -> None:
    out += value.to_bytes(4, "big")


def write_binary(out: bytearray, value: bytes) -> None:
    if len(value) > 0xFFFF:
        raise ValueError(f"binary data or a string is at most 65535 bytes, not {len(value)}")
    out += len(value).to_bytes(2, "big")
    out += value


def write_string(out: bytearray, value: str) -> None:
    write_binary(out, value.encode("utf-8"))
