"""The decoder under hostile bytes (hypothesis): valid packets of every kind and level with
bits flipped, bytes replaced, inserted or cut, remaining lengths rewritten, and arbitrary
bytes after a valid CONNECT.

What must hold for every input: :class:`PacketReader` returns packets or raises an
:class:`MqttError` (never another exception); what it returns is the same however the
bytes are chunked; and every packet it returns encodes at its level and decodes back to
itself (the decoder accepts nothing the encoder cannot say).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from router.errors import MalformedPacketError, MqttError
from router.mqtt.codec import PacketReader, decode, encode
from router.mqtt.packets import MQTT_3_1, MQTT_3_1_1, MQTT_5, Connect, Packet, SubAck
from router.mqtt.wire import write_varint
from tests.mqtt.test_codec import LEVELS, connects, packets

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def read(
    data: bytes, level: int | None, chunks: list[int] | None = None
) -> tuple[list[Packet], Any]:
    """(packets, the type of the error that ended the stream or None); chunked as told."""
    reader = PacketReader(max_packet_size=1 << 16)
    reader.level = level
    found: list[Packet] = []
    pieces = [data]
    if chunks:
        pieces, at = [], 0
        for size in chunks:
            pieces.append(data[at : at + size])
            at += size
        pieces.append(data[at:])
    try:
        for piece in pieces:
            found += reader.feed(piece)
        if reader.error is not None:
            raise reader.error
    except MqttError as error:
        return found, type(error)
    return found, None


def assert_round_trips(packet: Packet, level: int | None) -> None:
    """A decoded packet encodes at its level and decodes back to itself."""
    if isinstance(packet, Connect):
        level = packet.protocol_level
    assert level is not None
    assert read(encode(packet, level), level) == ([packet], None), packet


def streams(level: int) -> st.SearchStrategy[bytes]:
    """1..3 valid packets of ``level``, encoded one after the other."""
    return st.lists(packets(level), min_size=1, max_size=3).map(
        lambda stream: b"".join(encode(packet, level) for packet in stream)
    )


@st.composite
def mutations(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` after 1..4 mutations: a bit flipped, a byte replaced, bytes inserted or
    deleted, the end cut off, the first packet's remaining length rewritten."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "insert", "delete", "cut", "length"]))
        at = draw(st.integers(0, len(data) - 1)) if data else 0
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data:
            data[at] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]) | st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(1, 4))]
        elif kind == "cut":
            del data[at:]
        elif kind == "length" and len(data) >= 2:
            end = 1  # the remaining length: bytes 1.. while the continuation bit is set
            while end < len(data) and end < 5 and data[end] & 0x80:
                end += 1
            varint = bytearray()
            write_varint(varint, draw(st.integers(0, 0x0FFFFFFF)))
            data[1 : end + 1] = varint
    return bytes(data)


def chunkings(data: bytes) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max(1, len(data))), max_size=6)


@pytest.mark.parametrize("level", LEVELS)
@FUZZ
@given(data=st.data())
def test_mutated_packets_decode_or_raise_a_typed_error(level: int, data: st.DataObject) -> None:
    stream = data.draw(streams(level).flatmap(mutations), "stream")
    found, error = read(stream, level)
    assert read(stream, level, data.draw(chunkings(stream), "chunks")) == (found, error)
    for packet in found:
        assert_round_trips(packet, level)


@FUZZ
@given(data=st.data())
def test_mutated_connects_decode_or_raise_a_typed_error(data: st.DataObject) -> None:
    """A reader before its CONNECT: the CONNECT and the packets after it, mutated."""
    level = data.draw(st.sampled_from(LEVELS), "level")
    valid = encode(data.draw(connects(level), "connect"), level) + data.draw(streams(level))
    stream = data.draw(mutations(valid), "stream")
    found, error = read(stream, None)
    assert read(stream, None, data.draw(chunkings(stream), "chunks")) == (found, error)
    reader_level: int | None = None
    for packet in found:
        if isinstance(packet, Connect) and reader_level is None:
            reader_level = packet.protocol_level
        assert_round_trips(packet, reader_level)


@FUZZ
@given(level=st.sampled_from([None, *LEVELS]), garbage=st.binary(min_size=1, max_size=300))
@example(level=MQTT_5, garbage=b"\x30\xff\xff\xff\x7f")  # the largest remaining length
@example(level=MQTT_5, garbage=b"\x30\x80\x80\x80\x80\x01")  # a 5-byte remaining length
@example(level=MQTT_3_1, garbage=b"\x82\x03\x00\x01\x00")  # SUBSCRIBE cut in its filter
@example(level=MQTT_5, garbage=b"\xe0\x02\x00\x80")  # DISCONNECT, properties run over
@example(level=MQTT_3_1_1, garbage=b"\x90\x03\x00\x01\xa2")  # a 5.0 code in a 3.1.1 SUBACK
def test_arbitrary_bytes_decode_or_raise_a_typed_error(level: int | None, garbage: bytes) -> None:
    found, _ = read(garbage, level)
    for packet in found:
        assert_round_trips(packet, level)


@FUZZ
@given(
    level=st.sampled_from([None, MQTT_3_1_1, MQTT_5]),
    first=st.integers(0, 255),
    body=st.binary(max_size=200),
)
def test_decode_of_any_fixed_header_and_body_is_a_packet_or_a_typed_error(
    level: int | None, first: int, body: bytes
) -> None:
    try:
        packet = decode(first, memoryview(body), level)
    except MqttError:
        return
    assert_round_trips(packet, level)


# -- defects the fuzzing found (atheris), each pinned ---------------------------------------


@pytest.mark.parametrize("level", [MQTT_3_1, MQTT_3_1_1])
@pytest.mark.parametrize("code", [0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2, 0x03, 0x7F])
def test_a_3_1_1_suback_refuses_the_return_codes_it_reserves(level: int, code: int) -> None:
    """Before: the decoder checked a 3.1.1 SUBACK against the 5.0 reason codes, so it took
    0xA2 (which 3.1.1 reserves, MQTT-3.9.3-2) and the packet re-encoded as 0x80."""
    reader = PacketReader()
    reader.level = level
    with pytest.raises(MalformedPacketError):
        reader.feed(bytes([0x90, 0x04, 0x00, 0x01, 0x00, code]))
    reader = PacketReader()
    reader.level = level
    assert reader.feed(bytes([0x90, 0x06, 0x00, 0x01, 0x00, 0x01, 0x02, 0x80])) == [
        SubAck(1, (0x00, 0x01, 0x02, 0x80))
    ]
