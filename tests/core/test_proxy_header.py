"""The PROXY protocol reader (router.core.proxy_header): table cases from HAProxy's
proxy-protocol.txt, then hypothesis: every header a model encoder makes is read whole
without a byte of what follows it, every proper prefix of one asks for more, and any
bytes at all end in a header, "no header", need-more or ProxyHeaderError, having read
no more than the bound."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, strategies as st

from router.core.proxy_header import (
    LOCAL,
    MAX_V2_LENGTH,
    PROXY,
    V1_MAX_LENGTH,
    V2_FIXED,
    V2_SIGNATURE,
    NoHeader,
    ProxyHeader,
    ProxyHeaderReader,
)
from router.errors import ProxyHeaderError


def read(stream: bytes, max_length: int = MAX_V2_LENGTH) -> tuple[object, int]:
    """Feed ``stream`` as a driver does (``wanted()`` bytes at a time): the outcome and
    the bytes read (None: the stream ran out first)."""
    reader = ProxyHeaderReader(max_length)
    offset = 0
    while offset < len(stream):
        chunk = stream[offset : offset + reader.wanted()]
        offset += len(chunk)
        outcome = reader.feed(chunk)
        if outcome is not None:
            return outcome, offset
    return None, offset


def v2(command: int, family: int, body: bytes, tlvs: bytes = b"", version: int = 2) -> bytes:
    rest = body + tlvs
    return (
        V2_SIGNATURE + bytes([version << 4 | command, family]) + len(rest).to_bytes(2, "big") + rest
    )


def inet(source: str, destination: str, sport: int, dport: int) -> bytes:
    return (
        ipaddress.ip_address(source).packed
        + ipaddress.ip_address(destination).packed
        + sport.to_bytes(2, "big")
        + dport.to_bytes(2, "big")
    )


MQTT_CONNECT = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"

GOOD = [
    (
        b"PROXY TCP4 192.0.2.7 192.0.2.1 51234 1883\r\n",
        ProxyHeader(1, PROXY, ("192.0.2.7", 51234), ("192.0.2.1", 1883), 43),
    ),
    (
        b"PROXY TCP6 2001:db8::7 2001:db8::1 65535 0\r\n",
        ProxyHeader(1, PROXY, ("2001:db8::7", 65535), ("2001:db8::1", 0), 44),
    ),
    (b"PROXY UNKNOWN\r\n", ProxyHeader(1, PROXY, None, None, 15)),
    (
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        ProxyHeader(1, PROXY, None, None, 59),
    ),
    (
        v2(1, 0x11, inet("127.0.0.2", "127.0.0.1", 40000, 1883)),
        ProxyHeader(2, PROXY, ("127.0.0.2", 40000), ("127.0.0.1", 1883), 28),
    ),
    (
        v2(1, 0x21, inet("2001:db8::7", "::1", 1, 2), b"\x04\x00\x02ab\x03\x00\x04abcd"),
        ProxyHeader(2, PROXY, ("2001:db8::7", 1), ("::1", 2), 16 + 36 + 12),
    ),
    (v2(0, 0x00, b""), ProxyHeader(2, LOCAL, None, None, 16)),
    (  # LOCAL ignores the addresses it carries
        v2(0, 0x11, inet("10.0.0.1", "10.0.0.2", 1, 2)),
        ProxyHeader(2, LOCAL, None, None, 28),
    ),
    (v2(1, 0x00, b""), ProxyHeader(2, PROXY, None, None, 16)),  # AF_UNSPEC
    (v2(1, 0x31, b"/run/lb.sock".ljust(216, b"\0")), ProxyHeader(2, PROXY, None, None, 232)),
]


@pytest.mark.parametrize(("header", "expected"), GOOD)
def test_a_header_is_read_whole_and_nothing_after_it(header: bytes, expected: ProxyHeader) -> None:
    outcome, used = read(header + MQTT_CONNECT)
    assert outcome == expected
    assert used == len(header)


BAD = [
    (b"PROXY TCP5 1.2.3.4 1.2.3.4 1 2\r\n", "family"),
    (b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2 3\r\n", "family"),
    (b"PROXY TCP4 1.2.3.4  1.2.3.4 1 2\r\n", "family"),
    (b"PROXY TCP4 2001:db8::1 2001:db8::2 1 2\r\n", "address"),
    (b"PROXY TCP6 1.2.3.4 1.2.3.4 1 2\r\n", "address"),
    (b"PROXY TCP4 1.2.3.4 1.2.3.4 1 65536\r\n", "address"),
    (b"PROXY TCP4 1.2.3.4 1.2.3.4 -1 2\r\n", "address"),
    (b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2\n" + b"x" * 20, "too_long"),
    (b"PROXY UNKNOWN " + b"x" * 100 + b"\r\n", "too_long"),
    (b"PROXI TCP4 1.2.3.4 1.2.3.4 1 2\r\n", "signature"),
    (b"\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c", "signature"),
    (v2(1, 0x11, inet("1.2.3.4", "1.2.3.4", 1, 2), version=1), "version"),
    (v2(2, 0x11, inet("1.2.3.4", "1.2.3.4", 1, 2)), "command"),
    (v2(1, 0x41, b""), "family"),
    (v2(1, 0x13, inet("1.2.3.4", "1.2.3.4", 1, 2)), "family"),
    (v2(1, 0x21, inet("1.2.3.4", "1.2.3.4", 1, 2)), "length"),  # 12 bytes for IPv6
    (v2(1, 0x11, b"\0" * (MAX_V2_LENGTH + 1)), "length"),
    (v2(1, 0x11, inet("1.2.3.4", "1.2.3.4", 1, 2), b"\x04\x00"), "tlv"),
    (v2(1, 0x11, inet("1.2.3.4", "1.2.3.4", 1, 2), b"\x04\x00\x05ab"), "tlv"),
]


@pytest.mark.parametrize(("stream", "reason"), BAD)
def test_a_bad_header_is_a_typed_error(stream: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError) as caught:
        read(stream)
    assert caught.value.reason == reason


@pytest.mark.parametrize("stream", [MQTT_CONNECT, b"\x16\x03\x01\x02\x00", b"GET /mqtt HTTP/1.1"])
def test_a_stream_without_a_header_is_told_from_its_first_byte(stream: bytes) -> None:
    outcome, used = read(stream)
    assert outcome == NoHeader(stream[:1])
    assert used == 1


def test_a_driver_that_feeds_more_than_wanted_is_refused() -> None:
    reader = ProxyHeaderReader()
    with pytest.raises(ProxyHeaderError) as caught:
        reader.feed(b"PROXY UNKNOWN\r\n")
    assert caught.value.reason == "too_long"


# -- properties ---------------------------------------------------------------------------

ports = st.integers(0, 0xFFFF)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
tlvs = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=5).map(
    lambda items: b"".join(bytes([t]) + len(v).to_bytes(2, "big") + v for t, v in items)
)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, ProxyHeader]:
    """A valid header and what reading it must give."""
    kind = draw(st.sampled_from(["v1-4", "v1-6", "v1-unknown", "v2-4", "v2-6", "v2-local"]))
    if kind == "v1-unknown":
        line = b"PROXY UNKNOWN" + draw(
            st.binary(max_size=90)
            .filter(lambda b: b"\n" not in b and b"\r" not in b)
            .map(lambda b: b" " + b if b else b"")
        )
        line = line[: V1_MAX_LENGTH - 2] + b"\r\n"
        return line, ProxyHeader(1, PROXY, None, None, len(line))
    v6 = kind.endswith("6")
    source, destination = draw(ipv6 if v6 else ipv4), draw(ipv6 if v6 else ipv4)
    sport, dport = draw(ports), draw(ports)
    if kind.startswith("v1"):
        proto = "TCP6" if v6 else "TCP4"
        line = f"PROXY {proto} {source} {destination} {sport} {dport}\r\n".encode()
        return line, ProxyHeader(1, PROXY, (source, sport), (destination, dport), len(line))
    family = 0x21 if v6 else 0x11
    command = 0 if kind == "v2-local" else 1
    header = v2(command, family, inet(source, destination, sport, dport), draw(tlvs))
    if command == 0:
        return header, ProxyHeader(2, LOCAL, None, None, len(header))
    return header, ProxyHeader(2, PROXY, (source, sport), (destination, dport), len(header))


@given(headers(), st.binary(max_size=64))
def test_any_header_is_read_without_what_follows(
    case: tuple[bytes, ProxyHeader], tail: bytes
) -> None:
    header, expected = case
    assert read(header + tail) == (expected, len(header))


@given(headers(), st.data())
def test_any_cut_header_asks_for_more(case: tuple[bytes, ProxyHeader], data: st.DataObject) -> None:
    header, _ = case
    cut = data.draw(st.integers(0, len(header) - 1))
    assert read(header[:cut]) == (None, cut)


@given(
    st.one_of(
        st.binary(max_size=300),
        st.binary(max_size=300).map(lambda b: V2_SIGNATURE + b),
        st.binary(max_size=120).map(lambda b: b"PROXY " + b),
    )
)
def test_any_bytes_end_in_an_answer_within_the_bound(stream: bytes) -> None:
    try:
        outcome, used = read(stream, max_length=200)
    except ProxyHeaderError as error:
        assert error.reason in {
            "signature",
            "version",
            "command",
            "family",
            "length",
            "address",
            "tlv",
            "too_long",
        }
        return
    assert used <= max(V1_MAX_LENGTH, V2_FIXED + 200)
    if isinstance(outcome, ProxyHeader):
        assert outcome.length == used
    elif isinstance(outcome, NoHeader):
        assert used == 1 and stream[:1] not in (b"P", b"\r")
    else:
        assert outcome is None and used == len(stream)
