"""128-bit message ids in the EMQ layout: what forwarding deduplicates on.

Rules:

* An id is one unsigned 128-bit integer, most significant part first::

      bit 127                 64 63                      16 15        0
      +------------------------+--------------------------+-----------+
      | timestamp, microseconds |  node-and-process part   | sequence  |
      |        64 bits          |        48 bits           |  16 bits  |
      +------------------------+--------------------------+-----------+

* Its bytes form is 16 bytes big-endian and its text form 32 lowercase hex digits, so
  byte order, text order and numeric order are the same order.
* Ids from one :class:`GuidGenerator` strictly increase, whatever its clock does. Within one
  microsecond the sequence counts 0, 1, 2, ...; when it would wrap past 65535, or when the
  clock stalls or steps back, the generator *borrows* the next microsecond: it keeps its own
  last timestamp and moves it forward by one. It never emits a duplicate or a smaller id.
* The wall clock going back (NTP step, VM resume): the generator goes on from its last
  timestamp, so its timestamps run ahead of the wall clock until the clock catches up
  (by at most the size of the step, plus one microsecond per 65536 ids issued meanwhile).
  The order holds within one generator only: a *new* generator (a restarted process) whose
  clock is behind the previous one's could repeat its ids, unless its node part differs.
  That is why the node part should carry something new per process start (see
  :func:`node_part_for`).
* Two generators with different node parts never produce the same id. Node parts come
  from :func:`node_part_for` (a 48-bit hash of the node id and a per-process identity) or
  from the caller (e.g. a number handed out by a registry, which is collision-free).

A generator is safe to share between threads (one small lock around its state).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from typing import Final, NamedTuple

from router.errors import InvalidGuidError

TIMESTAMP_BITS: Final = 64
NODE_BITS: Final = 48
SEQUENCE_BITS: Final = 16
MAX_TIMESTAMP: Final = (1 << TIMESTAMP_BITS) - 1
MAX_NODE: Final = (1 << NODE_BITS) - 1
MAX_SEQUENCE: Final = (1 << SEQUENCE_BITS) - 1
GUID_BYTES: Final = 16
GUID_HEX_DIGITS: Final = 32

_NODE_SHIFT: Final = SEQUENCE_BITS
_TIMESTAMP_SHIFT: Final = NODE_BITS + SEQUENCE_BITS
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")


class GuidParts(NamedTuple):
    """An id taken apart: microsecond timestamp, node-and-process part, sequence."""

    timestamp_us: int
    node: int
    sequence: int


def wall_clock_us() -> int:
    """Microseconds since the Unix epoch from the wall clock (the default clock)."""
    return time.time_ns() // 1000


def node_part_for(node_id: str, process: int | str | None = None) -> int:
    """A 48-bit node-and-process part from a node id and a per-process identity.

    ``process`` defaults to the pid. In containers every process may be pid 1 on every
    start, so a node that restarts should pass something new per start instead (its
    incarnation number from the node registry, or random bytes as text). The result is a
    hash: two different (node, process) pairs collide with probability about n**2 / 2**49
    for n live generators (about 2e-9 for a thousand). Raises :class:`InvalidGuidError`
    if ``node_id`` is not a non-empty str.
    """
    if type(node_id) is not str or not node_id:
        raise InvalidGuidError(f"a node id must be a non-empty str, not {node_id!r}")
    if process is None:
        process = os.getpid()
    digest = hashlib.blake2b(
        f"{len(node_id)}:{node_id}/{process}".encode("utf-8", "surrogatepass"),
        digest_size=NODE_BITS // 8,
    ).digest()
    return int.from_bytes(digest, "big")


def compose(timestamp_us: int, node: int, sequence: int) -> int:
    """Build an id from its three parts; raises :class:`InvalidGuidError` if one is out of range."""
    for name, value, top in (
        ("timestamp", timestamp_us, MAX_TIMESTAMP),
        ("node part", node, MAX_NODE),
        ("sequence", sequence, MAX_SEQUENCE),
    ):
        if type(value) is not int or not 0 <= value <= top:
            raise InvalidGuidError(f"a guid {name} must be an int in 0..{top}, not {value!r}")
    return (timestamp_us << _TIMESTAMP_SHIFT) | (node << _NODE_SHIFT) | sequence


def _check_int(guid: int) -> int:
    if type(guid) is not int or guid < 0 or guid >> 128:
        raise InvalidGuidError(f"a guid is an int in 0..2**128-1, not {guid!r}")
    return guid


def to_bytes(guid: int) -> bytes:
    """The 16-byte big-endian form (byte order = numeric order)."""
    return _check_int(guid).to_bytes(GUID_BYTES, "big")


def to_hex(guid: int) -> str:
    """The 32-digit lowercase hex form (text order = numeric order)."""
    return f"{_check_int(guid):032x}"


def from_bytes(data: bytes) -> int:
    """The id held in 16 bytes; raises :class:`InvalidGuidError` for any other length or type."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) != GUID_BYTES:
        raise InvalidGuidError(f"a guid is {GUID_BYTES} bytes, not {data!r}")
    return int.from_bytes(data, "big")


def from_hex(text: str) -> int:
    """The id written as 32 hex digits (either case); raises :class:`InvalidGuidError` otherwise."""
    if type(text) is not str or len(text) != GUID_HEX_DIGITS or not _HEX_DIGITS.issuperset(text):
        raise InvalidGuidError(f"a guid is {GUID_HEX_DIGITS} hex digits, not {text!r}")
    return int(text, 16)


def parse(guid: int | bytes | str) -> GuidParts:
    """Take an id apart, given as an int, its 16 bytes or its 32 hex digits.

    Raises :class:`InvalidGuidError` if it is none of those.
    """
    if isinstance(guid, str):
        value = from_hex(guid)
    elif isinstance(guid, bytes | bytearray | memoryview):
        value = from_bytes(guid)
    else:
        value = _check_int(guid)
    return GuidParts(
        value >> _TIMESTAMP_SHIFT, (value >> _NODE_SHIFT) & MAX_NODE, value & MAX_SEQUENCE
    )


class GuidGenerator:
    """Makes strictly increasing ids with one node-and-process part.

    ``node`` is the 48-bit node part (see :func:`node_part_for`); ``clock`` returns
    microseconds since the epoch (default :func:`wall_clock_us`; tests inject their own).
    Raises :class:`InvalidGuidError` if ``node`` is out of range.
    """

    __slots__ = ("_clock", "_last", "_lock", "_node", "_sequence")

    def __init__(self, node: int, clock: Callable[[], int] | None = None) -> None:
        if type(node) is not int or not 0 <= node <= MAX_NODE:
            raise InvalidGuidError(f"a node part must be an int in 0..{MAX_NODE}, not {node!r}")
        self._node = node
        self._clock: Callable[[], int] = clock if clock is not None else wall_clock_us
        self._last = -1  # the timestamp of the last id issued (none yet)
        self._sequence = 0
        self._lock = threading.Lock()

    @property
    def node(self) -> int:
        """The node-and-process part of every id this generator makes."""
        return self._node

    def new(self) -> int:
        """The next id as an int, greater than every id this generator made before.

        Raises :class:`InvalidGuidError` if the timestamp would leave 64 bits (year 586524)
        or the clock returns something that is not a non-negative int.
        """
        now = self._clock()
        if type(now) is not int or now < 0:
            raise InvalidGuidError(f"the clock must return microseconds as an int, not {now!r}")
        with self._lock:
            last = self._last
            if now > last:
                timestamp, sequence = now, 0
            elif self._sequence < MAX_SEQUENCE:
                # The same microsecond, a stalled clock or one that went back: count on.
                timestamp, sequence = last, self._sequence + 1
            else:
                # The sequence would wrap: borrow the next microsecond.
                timestamp, sequence = last + 1, 0
            if timestamp > MAX_TIMESTAMP:
                raise InvalidGuidError("the guid timestamp ran out of 64 bits")
            self._last = timestamp
            self._sequence = sequence
        return (timestamp << _TIMESTAMP_SHIFT) | (self._node << _NODE_SHIFT) | sequence

    def new_bytes(self) -> bytes:
        """The next id as 16 big-endian bytes."""
        return self.new().to_bytes(GUID_BYTES, "big")

    def new_bytes_many(self, count: int) -> list[bytes]:
        """The next ``count`` ids as 16 big-endian bytes each, in increasing order: what
        ``count`` calls of :meth:`new_bytes` return, for one reading of the clock (the
        publish path makes one per message of a batch). Raises as :meth:`new`."""
        if count <= 0:
            return []
        first = self.new()  # (checks the clock, starts the run)
        timestamp, sequence = first >> _TIMESTAMP_SHIFT, first & MAX_SEQUENCE
        if sequence + count - 1 <= MAX_SEQUENCE:
            with self._lock:
                if self._last == timestamp and self._sequence == sequence:
                    # Nobody took an id since: the run continues in the same microsecond.
                    self._sequence = sequence + count - 1
                    return [(first + i).to_bytes(GUID_BYTES, "big") for i in range(count)]
        return [first.to_bytes(GUID_BYTES, "big"), *(self.new_bytes() for _ in range(count - 1))]

    def new_hex(self) -> str:
        """The next id as 32 lowercase hex digits."""
        return f"{self.new():032x}"
