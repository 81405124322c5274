"""Read-only views of channel-clock channels (node inboxes, queues) for operators.

Channels have no index: :func:`list_channels` finds them by SCAN over their clock keys
and :func:`channel_info` finds a channel's subscribers by SCAN over its cursor keys (one
hash tag, so on a cluster only the primary serving it is scanned). Both are bounded by
``limit``; a view says whether it is complete. TTLs are seconds (None: no expiry);
``pending`` counts the clocks after a subscriber's cursor up to the channel clock
(messages not acknowledged yet, expired ones included), across the clock wrap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from router.errors import CorruptStateError, SubscriptionNotFoundError
from router.state.channels import CLOCK_LIMIT
from router.state.keys import Keys, check_id
from router.state.reads import read_with_ttl
from router.state.scan import scan_keys
from router.state.scripts import RedisClient

DEFAULT_LIMIT: Final = 1000
_CLOCK_SPAN: Final = 2 * CLOCK_LIMIT + 1


@dataclass(frozen=True)
class CursorInfo:
    """One subscriber of a channel: its cursor (last acknowledged clock)."""

    subscriber: str
    cursor: int
    pending: int
    ttl_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "subscriber": self.subscriber,
            "cursor": self.cursor,
            "pending": self.pending,
            "ttl_s": self.ttl_s,
        }


@dataclass(frozen=True)
class ChannelInfo:
    """A channel: its clock, the clock key's TTL and (with :func:`channel_info`) its
    subscribers; ``complete`` is False when a scan stopped at its limit."""

    name: str
    clock: int
    ttl_s: float | None
    subscribers: list[CursorInfo] | None = None
    complete: bool = True

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "clock": self.clock, "ttl_s": self.ttl_s}
        if self.subscribers is not None:
            data["subscribers"] = [s.as_dict() for s in self.subscribers]
            data["complete"] = self.complete
        return data


def pending_between(cursor: int, clock: int) -> int:
    """How many clocks follow ``cursor`` up to ``clock`` in iteration order (with wrap)."""
    return (clock - cursor) % _CLOCK_SPAN


def _clock(value: Any, what: str) -> int:
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    try:
        number = int(text)
    except ValueError:
        raise CorruptStateError(f"the {what} is not an integer clock: {value!r}") from None
    if not -CLOCK_LIMIT <= number <= CLOCK_LIMIT:
        raise CorruptStateError(f"the {what} is out of the clock range: {value!r}")
    return number


async def _read(redis: RedisClient, key: str, what: str) -> tuple[int, float | None] | None:
    """(clock value, TTL seconds or None) of a clock or cursor key; None if it is gone."""
    read = await read_with_ttl(redis, key)
    if read is None:
        return None
    value, ttl = read
    return _clock(value, what), ttl


async def list_channels(
    redis: RedisClient, keys: Keys, limit: int = DEFAULT_LIMIT
) -> tuple[list[ChannelInfo], bool]:
    """Channels under the namespace, sorted by name, at most ``limit``; and whether the
    scan was complete. Raises :class:`CorruptStateError` for a clock that is not one."""
    scanned = await scan_keys(redis, keys.channel_clocks_pattern(), limit=limit)
    found = []
    for key in scanned.keys:
        name = keys.channel_of_clock_key(key)
        if name is None:
            continue
        read = await _read(redis, key, f"clock of channel {name!r}")
        if read is not None:
            found.append(ChannelInfo(name, *read))
    return sorted(found, key=lambda info: info.name), scanned.complete


async def channel_info(
    redis: RedisClient, keys: Keys, name: str, limit: int = DEFAULT_LIMIT
) -> ChannelInfo:
    """One channel with its subscribers (at most ``limit``, sorted by id).

    Raises :class:`SubscriptionNotFoundError` when the channel has no clock (it never existed
    or expired), :class:`InvalidIdError` for an unusable name, :class:`CorruptStateError`
    for a clock or cursor that is not an integer clock.
    """
    check_id(name, "channel name")
    clock_key = keys.channel_clock(name)
    read = await _read(redis, clock_key, f"clock of channel {name!r}")
    if read is None:
        raise SubscriptionNotFoundError(
            f"channel {name!r} does not exist (no clock under this prefix)"
        )
    clock, ttl = read
    scanned = await scan_keys(
        redis, keys.channel_cursors_pattern(name), limit=limit, slot_key=clock_key
    )
    subscribers = []
    for key in scanned.keys:
        subscriber = keys.subscriber_of_cursor_key(name, key)
        if subscriber is None:
            continue
        cursor = await _read(redis, key, f"cursor of {subscriber!r}")
        if cursor is not None:
            value, cursor_ttl = cursor
            subscribers.append(
                CursorInfo(subscriber, value, pending_between(value, clock), cursor_ttl)
            )
    subscribers.sort(key=lambda s: s.subscriber)
    return ChannelInfo(name, clock, ttl, subscribers, scanned.complete)
