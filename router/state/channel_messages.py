"""The messages of a channel clock (:mod:`router.state.channels`): what is published, what
a fetch returns, how a stored body and a wake-up's announcement are read, and the clocks'
order (they wrap from ``CLOCK_LIMIT`` to ``-CLOCK_LIMIT``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, NamedTuple

CLOCK_LIMIT: Final = 2**53 - 1
"""Clocks stay within +-CLOCK_LIMIT; the clock after CLOCK_LIMIT is -CLOCK_LIMIT."""
_CLOCK_BYTES = re.compile(rb"0|-?[1-9][0-9]{0,15}")


class ChannelMessage(NamedTuple):
    """A message to publish: an id (the dedup key) and binary content."""

    id: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Published:
    """The outcome of publishing one message.

    ``clock`` is where the message is stored; for a duplicate (its id was seen within the
    dedup window, or earlier in the same batch) it is the clock of the original message.
    """

    id: str
    clock: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class FetchedMessage:
    """A message read from a channel, with the clock it is stored at."""

    id: str
    content: bytes
    clock: int


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What a fetch returns.

    ``messages`` in iteration order; ``ack_handle`` acknowledges everything examined (None
    when there was nothing after the cursor); ``more`` is True exactly when the fetch stopped
    before the channel clock (fetch again after acknowledging). A result without messages
    may still carry a handle: the clocks it examined had expired, and acking skips them.
    """

    messages: tuple[FetchedMessage, ...]
    ack_handle: str | None
    more: bool


def next_clock(clock: int) -> int:
    """The clock after ``clock`` in iteration order (CLOCK_LIMIT wraps to -CLOCK_LIMIT)."""
    return -CLOCK_LIMIT if clock == CLOCK_LIMIT else clock + 1


def decode_body(clock: int, body: bytes) -> FetchedMessage | None:
    """The message in a stored body ("<id length>:<id><content>"), or None if malformed."""
    digits, colon, rest = body.partition(b":")
    if not colon or not digits.isdigit():
        return None
    size = int(digits)
    if size > len(rest):
        return None
    try:
        message_id = rest[:size].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return FetchedMessage(message_id, rest[size:], clock)


class Announcement(NamedTuple):
    """What a publish announced: the clocks it stored, ``first`` to ``last``, and the
    messages themselves when the publisher pushed them (empty when it announced only
    ``last``, or when every pushed body was malformed)."""

    first: int
    last: int
    messages: tuple[FetchedMessage, ...]
    pushed: bool


def parse_announcement(data: bytes) -> Announcement | None:
    """The announcement in a wake-up message (see ``lua/channel_publish.lua``), or None."""
    if not data.startswith(b"P"):
        if _CLOCK_BYTES.fullmatch(data) is None:
            return None
        return Announcement(int(data), int(data), (), False)
    head, colon, _ = data.partition(b":")
    first = _CLOCK_BYTES.fullmatch(head, 1)
    if not colon or first is None:
        return None
    first_clock = int(head[1:])
    clock: int | None = None
    position = len(head) + 1
    messages = []
    while position < len(data):
        colon_at = data.find(b":", position, position + 12)
        if colon_at < 0 or not data[position:colon_at].isdigit():
            return None
        end = colon_at + 1 + int(data[position:colon_at])
        if end > len(data):
            return None
        clock = first_clock if clock is None else next_clock(clock)
        message = decode_body(clock, data[colon_at + 1 : end])
        if message is not None:
            messages.append(message)
        position = end
    if clock is None:
        return None
    return Announcement(first_clock, clock, tuple(messages), True)
