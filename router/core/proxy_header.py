"""The PROXY protocol header, versions 1 and 2 (HAProxy's ``proxy-protocol.txt``), sans-I/O.

A load balancer in TCP mode (HAProxy ``send-proxy``/``send-proxy-v2``, a cloud network
load balancer) opens its connection to the node with one header that names the client it
carries, before any byte of the client's own (before TLS, too)::

    v1, text, 107 bytes at most, one line:
        PROXY TCP4 203.0.113.7 192.0.2.1 51234 1883\\r\\n
        PROXY TCP6 2001:db8::7 2001:db8::1 51234 1883\\r\\n
        PROXY UNKNOWN[ anything]\\r\\n                  (the sender does not know the client)

    v2, binary, 16 bytes then ``length`` more:
        0   \\r\\n\\r\\n\\x00\\r\\nQUIT\\n      the 12-byte signature
        12  0x2C                            version 2 (high nibble), command (low):
                                            0 LOCAL (the balancer's own health check),
                                            1 PROXY (a client's connection)
        13  0xFT                            family F: 0 unspecified, 1 IPv4, 2 IPv6,
                                            3 AF_UNIX; transport T: 0 unspecified, 1 stream
        14  length (2 bytes, big endian)    what follows: the addresses, then TLVs
        16  source, destination addresses, source port, destination port
            (4+4+2+2 IPv4, 16+16+2+2 IPv6, 108+108 AF_UNIX paths), then TLVs
            (type 1 byte, length 2 bytes, value), skipped

:class:`ProxyHeaderReader` reads one header from the first bytes of a connection. It asks
for no byte past the header (:meth:`~ProxyHeaderReader.wanted`), so a driver that reads
exactly that many can start TLS on the rest of the stream. It answers "need more" (None),
:class:`ProxyHeader` (the client's address, or None where the header names none: LOCAL,
UNKNOWN, AF_UNSPEC, AF_UNIX, whose connection's own address is then the client's), or
:class:`NoHeader` when the stream does not begin with one (the first byte of a PROXY header
is ``P`` or ``\\r``; an MQTT stream's is a CONNECT's 0x10, TLS's 0x16, HTTP's ``G``). Any
other beginning raises :class:`~router.errors.ProxyHeaderError`, and so does a v2 header
longer than ``max_length`` (TLVs included: what a driver buffers is bounded).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from router.errors import ProxyHeaderError

V1_PREFIX: Final = b"PROXY "
V1_MAX_LENGTH: Final = 107
"""Bytes of a v1 line at most, CRLF included (the specification's bound)."""
V1_MIN_LENGTH: Final = len(b"PROXY UNKNOWN\r\n")
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED: Final = 16
"""The signature, version and command, family and transport, and length."""
MAX_V2_LENGTH: Final = 2048
"""What follows a v2 header's 16 bytes, at most by default: the addresses (216 bytes for
AF_UNIX) and TLVs (a balancer's TLS or cloud TLVs take a few hundred bytes)."""

LOCAL: Final = "LOCAL"
PROXY: Final = "PROXY"
_V2_COMMANDS: Final = {0: LOCAL, 1: PROXY}
# v2 family -> (address bytes, the address type: None for AF_UNSPEC and AF_UNIX paths)
_V2_FAMILIES: Final[
    dict[int, tuple[int, type[ipaddress.IPv4Address | ipaddress.IPv6Address] | None]]
] = {
    0: (0, None),
    1: (12, ipaddress.IPv4Address),
    2: (36, ipaddress.IPv6Address),
    3: (216, None),
}
# the least a v1 line of each protocol can be (the rest of a line read so far bounds a read)
_V1_LEAST: Final = {
    b"PROXY TCP4 ": len(b"PROXY TCP4 0.0.0.0 0.0.0.0 0 0\r\n"),
    b"PROXY TCP6 ": len(b"PROXY TCP6 :: :: 0 0\r\n"),
}

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """One header read: ``version`` 1 or 2, ``command`` :data:`PROXY` or :data:`LOCAL`,
    ``source`` the client's (address, port) and ``destination`` the one it connected to,
    both None when the header names none; ``length`` its bytes."""

    version: int
    command: str
    source: Address | None
    destination: Address | None
    length: int


@dataclass(frozen=True, slots=True)
class NoHeader:
    """The stream does not begin with a PROXY header: ``data``, the bytes read to tell,
    belong to what follows."""

    data: bytes


class ProxyHeaderReader:
    """Reads the PROXY header at the start of one connection (see the module docstring)."""

    __slots__ = ("_buffer", "_max_length")

    def __init__(self, max_length: int = MAX_V2_LENGTH) -> None:
        self._buffer = bytearray()
        self._max_length = max_length

    def wanted(self) -> int:
        """How many bytes to read next: at least 1, and none past the header whatever it
        turns out to be (a v1 line is read up to 2 bytes at a time near its end)."""
        buffer = self._buffer
        if not buffer:
            return 1
        if buffer[0] == V2_SIGNATURE[0]:
            if len(buffer) < V2_FIXED:
                return V2_FIXED - len(buffer)
            return V2_FIXED + int.from_bytes(buffer[14:16], "big") - len(buffer)
        least = V1_MIN_LENGTH
        for prefix, length in _V1_LEAST.items():
            if buffer.startswith(prefix):
                least = length
        if len(buffer) < least:
            return least - len(buffer)
        return 1 if buffer.endswith(b"\r") else 2

    def feed(self, data: bytes) -> ProxyHeader | NoHeader | None:
        """Take the next bytes read (at most :meth:`wanted`: more raises
        :class:`ProxyHeaderError` ``too_long`` if they run past the header); returns None
        while the header is not whole, then the header, or :class:`NoHeader`. Raises
        :class:`ProxyHeaderError` for a beginning that is neither (see the module)."""
        if len(data) > self.wanted():
            raise ProxyHeaderError("too_long", "more bytes fed than the PROXY header may hold")
        buffer = self._buffer
        buffer += data
        if not buffer:
            return None
        first = buffer[0]
        if first == V2_SIGNATURE[0]:
            return self._v2()
        if first == V1_PREFIX[0]:
            return self._v1()
        return NoHeader(bytes(buffer))

    def _v1(self) -> ProxyHeader | None:
        buffer = self._buffer
        if not V1_PREFIX.startswith(bytes(buffer[: len(V1_PREFIX)])):
            raise ProxyHeaderError("signature", "the stream begins with neither PROXY nor MQTT")
        if not buffer.endswith(b"\r\n"):
            if len(buffer) >= V1_MAX_LENGTH or b"\n" in buffer:
                raise ProxyHeaderError(
                    "too_long", "a PROXY v1 line ends with CRLF within 107 bytes"
                )
            return None
        return _v1_header(bytes(buffer[:-2]), len(buffer))

    def _v2(self) -> ProxyHeader | None:
        buffer = self._buffer
        if not V2_SIGNATURE.startswith(bytes(buffer[: len(V2_SIGNATURE)])):
            raise ProxyHeaderError("signature", "the stream begins with a wrong PROXY v2 signature")
        if len(buffer) < V2_FIXED:
            return None
        if buffer[12] >> 4 != 2:
            raise ProxyHeaderError("version", f"PROXY header version {buffer[12] >> 4}, not 2")
        command = _V2_COMMANDS.get(buffer[12] & 0x0F)
        if command is None:
            raise ProxyHeaderError("command", f"PROXY v2 command {buffer[12] & 0x0F} is unknown")
        family = _V2_FAMILIES.get(buffer[13] >> 4)
        if family is None or buffer[13] & 0x0F > 2:
            raise ProxyHeaderError("family", f"PROXY v2 family/transport 0x{buffer[13]:02x}")
        length = int.from_bytes(buffer[14:16], "big")
        if length > self._max_length:
            raise ProxyHeaderError("length", f"a PROXY v2 header of {length} bytes is too long")
        if length < family[0]:
            raise ProxyHeaderError("length", f"{length} bytes cannot hold the PROXY v2 addresses")
        if len(buffer) < V2_FIXED + length:
            return None
        _check_tlvs(memoryview(buffer)[V2_FIXED + family[0] :])
        kind = family[1]
        if command == LOCAL or kind is None:
            return ProxyHeader(2, command, None, None, len(buffer))
        size = (family[0] - 4) // 2
        body = bytes(buffer[V2_FIXED : V2_FIXED + family[0]])
        source = str(kind(body[:size])), int.from_bytes(body[2 * size : 2 * size + 2], "big")
        target = str(kind(body[size : 2 * size])), int.from_bytes(body[2 * size + 2 :], "big")
        return ProxyHeader(2, command, source, target, len(buffer))


def _check_tlvs(tlvs: memoryview) -> None:
    """The TLVs after a v2 header's addresses each fit in it (their values are skipped)."""
    offset = 0
    while offset < len(tlvs):
        if offset + 3 > len(tlvs):
            raise ProxyHeaderError("tlv", "a PROXY v2 TLV is cut short")
        offset += 3 + int.from_bytes(tlvs[offset + 1 : offset + 3], "big")
        if offset > len(tlvs):
            raise ProxyHeaderError("tlv", "a PROXY v2 TLV runs past the header")


def _v1_header(line: bytes, length: int) -> ProxyHeader:
    """The header of a v1 ``line`` (without its CRLF)."""
    if line == b"PROXY UNKNOWN" or line.startswith(b"PROXY UNKNOWN "):
        return ProxyHeader(1, PROXY, None, None, length)  # (the rest is to be ignored)
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("address", "a PROXY v1 line is not ASCII") from None
    fields = text.split(" ")
    if len(fields) != 6 or fields[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(
            "family", f"a PROXY v1 line names no TCP4, TCP6 or UNKNOWN: {text!r}"
        )
    kind = ipaddress.IPv4Address if fields[1] == "TCP4" else ipaddress.IPv6Address
    try:
        source, destination = kind(fields[2]), kind(fields[3])
    except ValueError:
        raise ProxyHeaderError("address", f"a PROXY v1 line's addresses: {text!r}") from None
    ports = [_port(field) for field in fields[4:]]
    return ProxyHeader(1, PROXY, (str(source), ports[0]), (str(destination), ports[1]), length)


def _port(text: str) -> int:
    if not (text.isdigit() and text.isascii() and len(text) <= 5 and int(text) <= 0xFFFF):
        raise ProxyHeaderError("address", f"a PROXY v1 port is 0 to 65535, not {text!r}")
    return int(text)
