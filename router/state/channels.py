"""Channel clocks: durable, deduplicated message queues in Redis.

A channel holds messages at consecutive clocks; each subscriber has a cursor, the last clock
it acknowledged. All keys of a channel share its hash tag (see :mod:`router.state.keys`)::

    rt:{ch:NAME}:clock       the channel clock: the clock of the newest message
    rt:{ch:NAME}:sub:SUB     subscriber SUB's cursor
    rt:{ch:NAME}:m:CLOCK     the message stored at CLOCK: "<id length>:<id><content>"
    rt:{ch:NAME}:id:MSGID    the clock MSGID was stored at (the dedup window)

Rules:

* The first message of a channel gets clock 1; creating a subscriber on a missing channel sets
  the clock to 0. A new subscriber's cursor is the current clock: it never sees older messages.
* Clocks live in +-(2^53-1) (Lua numbers are doubles); the clock after 2^53-1 is -(2^53-1), so
  iterating across the wrap yields ``[max-1, max, min, min+1, ...]``.
* Publishing a batch is one script call. A message id seen within the dedup window stores
  nothing and moves no clock; it is reported as a duplicate with its original clock. Every key
  written lives ``ttl = ceil(expire + CLOCK_DRIFT_MARGIN)`` seconds (also the dedup window).
* Fetching never moves the cursor: it returns the messages at cursor < clock <= channel clock,
  in iteration order, up to ``max``, skipping expired and malformed bodies, and an ack handle
  for the last clock it examined (so a run of expired clocks is skipped by the next ack, and
  after a batch across the wrap the handle holds the last clock in iteration order, not the
  numerically largest). Unacknowledged messages are fetched again.
* Acknowledging moves the cursor to the handle's clock when cursor < ack <= clock (or, after a
  wrap, cursor < ack or ack <= clock); any other ack is stale: a successful no-op.

Wake-ups: a publish that stored something publishes the new clock on the channel's pub/sub
channel. A long poll (``fetch(..., wait=s)``) subscribes to it *before* its first fetch, so a
message published after that fetch always wakes it. The subscription, shared by the long
polls of one :class:`Channel` until :meth:`Channel.aclose`, is
:class:`~router.state.wakeups.WakeUps`.

Ack handles read ``"<clock>:<checksum>"``; the checksum (BLAKE2b over namespace, channel,
subscriber and clock) binds a handle to its channel and subscriber. It catches mix-ups and
tampering, it is not a secret: anyone who can write to Redis can forge one anyway.

The messages themselves (:class:`ChannelMessage`, :class:`Published`, :class:`FetchResult`,
an :class:`Announcement` ...) are :mod:`router.state.channel_messages`'s, named here too.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
import re
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Final

from router.errors import (
    ChannelArgumentError,
    CorruptStateError,
    MalformedAckHandleError,
    RouterError,
)
from router.state.channel_messages import (
    CLOCK_LIMIT,
    Announcement,
    ChannelMessage,
    FetchedMessage,
    FetchResult,
    Published,
    decode_body,
    next_clock,
    parse_announcement,
)
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import command, commands_each
from router.state.scripts import RedisClient, Scripts
from router.state.wakeups import WakeUps

CLOCK_DRIFT_MARGIN: Final = 1.0
"""Seconds added to the channel expiry before rounding up to the TTL of every channel key."""
MAX_FETCH: Final = 10_000
"""The largest ``max`` one fetch accepts."""
SCAN_SLACK: Final = 1_000
"""A fetch script examines at most ``max + SCAN_SLACK`` clocks per call."""
MAX_SCAN_CALLS: Final = 16
"""A fetch that finds only expired clocks continues with at most this many script calls,
then returns no messages, ``more=True`` and a handle that skips what it examined."""
PUSH_LIMIT: Final = 1 << 20
"""The most body bytes one pushing publish carries in its announcement; a larger batch is
announced by its clock only (followers fetch it)."""

_HANDLE = re.compile(r"(0|-?[1-9][0-9]{0,15}):([0-9a-f]{20})")
_HANDLE_PERSON: Final = b"router-ack-v1"


def channel_ttl(expire: float) -> int:
    """The TTL in whole seconds of a channel's keys: ``ceil(expire + CLOCK_DRIFT_MARGIN)``.

    Raises :class:`ChannelArgumentError` unless ``expire`` is a finite number > 0.
    """
    if isinstance(expire, bool) or not isinstance(expire, int | float):
        raise ChannelArgumentError(f"expire must be a number of seconds, not {expire!r}")
    if not math.isfinite(expire) or expire <= 0:
        raise ChannelArgumentError(f"expire must be finite and > 0, not {expire!r}")
    return math.ceil(expire + CLOCK_DRIFT_MARGIN)


class Channel:
    """One channel of messages in Redis, with its subscribers (cursors).

    ``redis`` is a ``redis.asyncio`` ``Redis`` or ``RedisCluster`` returning bytes
    (``decode_responses=False``); ``expire`` is how long, in seconds, a message stays; channel
    keys live ``ceil(expire + CLOCK_DRIFT_MARGIN)`` seconds after their last use. Long polls
    open one extra connection: close the channel with :meth:`aclose` (or ``async with``).
    """

    def __init__(
        self, redis: RedisClient, name: str, expire: float, keys: Keys | None = None
    ) -> None:
        if redis.get_encoder().decode_responses:
            raise ChannelArgumentError("a Channel needs a Redis client with decode_responses=False")
        self.keys = keys if keys is not None else Keys()
        self.name = check_id(name, "channel name")
        self.expire = expire
        self.ttl = channel_ttl(expire)
        self._redis = redis
        self._scripts = Scripts(redis)
        #: The channel's fixed keys.
        self.key_set = named = self.keys.channel_keys(name)
        self._base = named.base
        self._clock_key = named.clock
        self._epoch_key = named.epoch
        self.epoch: str | None = None  # learnt by add_subscriber
        self._bodies = named.bodies
        self._wake = named.wakeup
        self._announce = "SPUBLISH" if self._scripts.cluster else "PUBLISH"
        self._wakeups: WakeUps | None = None

    @property
    def wakeups(self) -> WakeUps:
        """The channel's wake-ups (made when first asked for: most channels of a node, its
        away sessions' queues, are never waited on)."""
        if self._wakeups is None:
            self._wakeups = WakeUps(self._redis, self._wake)
        return self._wakeups

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, expire={self.expire!r}, prefix={self.keys.prefix!r})"

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the long-poll connection, if one was opened. The channel stays usable."""
        if self._wakeups is not None:
            await self._wakeups.aclose()

    # -- subscribers -----------------------------------------------------------------

    async def add_subscriber(self, subscriber: str, *, lost: bool = False) -> bool:
        """Create ``subscriber`` with its cursor at the current clock (0 on a new channel).

        Returns True when created, False when it existed: then nothing changes, neither the
        cursor nor a TTL. Learns the channel's :attr:`epoch`, which is new whenever the
        channel is made anew (a FLUSHALL, a restart that lost it). With ``lost`` (the
        subscriber existed, and its cursor vanished) and an epoch that is not the one this
        object learnt before, the channel was made anew since: the cursor starts before its
        first message, so nothing stored meanwhile is skipped. Raises
        :class:`CorruptStateError` if the clock or cursor in Redis is not an integer clock
        (nothing changed).
        """
        known = self.epoch if lost and self.epoch is not None else ""
        created, epoch = await self._scripts.run(
            "channel_add_subscriber",
            [self._clock_key, self.keys.channel_cursor(self.name, subscriber), self._epoch_key],
            [self.ttl, known],
        )
        self.epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
        return bool(created)

    async def backlog(self, subscriber: str) -> int:
        """How many clocks ``subscriber`` has not acknowledged (0 when either is missing)."""
        position = await self.position(subscriber)
        if position is None:
            return 0
        clock, cursor = position
        return max(clock - cursor, 0)

    async def position(self, subscriber: str) -> tuple[int, int] | None:
        """(the channel's clock, ``subscriber``'s cursor), read together; None when
        either is missing."""
        cursor_key = self.keys.channel_cursor(self.name, subscriber)
        with translating:
            clock, cursor = await command(self._redis, "MGET", self._clock_key, cursor_key)
        if clock is None or cursor is None:
            return None
        return int(clock), int(cursor)

    async def copy_cursor(self, subscriber: str, copy: str) -> bool:
        """Make ``copy`` a subscriber whose cursor (and its TTL) is ``subscriber``'s now:
        it reads what ``subscriber`` has not acknowledged yet, whatever ``subscriber``
        does next. Returns False (nothing made) when ``subscriber`` has no cursor."""
        cursor = self.keys.channel_cursor(self.name, subscriber)
        with translating:
            copied = await self._redis.copy(
                cursor, self.keys.channel_cursor(self.name, copy), replace=True
            )
        return bool(copied)

    async def remove_subscriber(self, subscriber: str) -> bool:
        """Delete ``subscriber``'s cursor. Returns whether it existed (a missing one is fine)."""
        with translating:
            removed = await command(
                self._redis, "DEL", self.keys.channel_cursor(self.name, subscriber)
            )
        return bool(removed)

    # -- publish ---------------------------------------------------------------------

    async def publish(
        self, messages: Iterable[ChannelMessage | tuple[str, bytes]], *, push: bool = False
    ) -> list[Published]:
        """Store a batch of messages atomically, in order, each id at most once per window.

        Returns one :class:`Published` per message, in order. An empty batch does nothing.
        One wake-up is published when at least one message was stored; with ``push`` it
        carries the stored messages themselves (up to :data:`PUSH_LIMIT` bytes), so a
        :class:`~router.cluster.follower.ChannelFollower` dispatches them without a fetch. Raises
        :class:`InvalidIdError` for an unusable id, :class:`ChannelArgumentError` for content
        that is not bytes, :class:`CorruptStateError` if the clock or a dedup entry in Redis
        is not an integer clock (nothing stored).
        """
        call = self._publish_call(messages, push)
        if call is None:
            return []
        ids, keys, args = call
        return self._published(ids, await self._scripts.run("channel_publish", keys, args))

    def _publish_call(
        self, messages: Iterable[ChannelMessage | tuple[str, bytes]], push: bool = False
    ) -> tuple[list[str], list[str], list[Any]] | None:
        """(ids, KEYS, ARGV) of ``channel_publish`` for ``messages``; None for none."""
        ids: list[str] = []
        contents: list[bytes] = []
        for message in messages:
            try:
                message_id, content = message
            except (TypeError, ValueError):
                raise ChannelArgumentError(
                    f"a message is an (id, content) pair, not {message!r:.80}"
                ) from None
            if type(content) is not bytes:
                if not isinstance(content, bytes | bytearray | memoryview):
                    raise ChannelArgumentError(
                        f"message content must be bytes, not {type(content).__name__}"
                    )
                content = bytes(content)
            ids.append(message_id)
            contents.append(content)
        if not ids:
            return None
        keys = [self._clock_key, self._bodies, *self.keys.channel_dedup(self.name, ids)]
        # Ids go out as bytes encoded here (channel_dedup has checked them): cheaper than
        # redis-py's generic per-argument encoder, which tries several types first.
        args: list[Any] = [self.ttl, self._wake, PUSH_LIMIT if push else 0, self._announce]
        for message_id, content in zip(ids, contents, strict=True):
            args.append(message_id.encode())
            args.append(content)
        return ids, keys, args

    @staticmethod
    def _published(ids: list[str], reply: Any) -> list[Published]:
        before, duplicates = reply
        originals: dict[int, int] = {}
        if duplicates:
            for entry in duplicates.split(b","):
                position, _, clock = entry.partition(b":")
                originals[int(position) - 1] = int(clock)
        published = []
        clock = int(before)
        for i, message_id in enumerate(ids):
            original = originals.get(i)
            if original is None:
                clock = next_clock(clock)
                published.append(Published(message_id, clock, False))
            else:
                published.append(Published(message_id, original, True))
        return published

    # -- many channels at once -----------------------------------------------------------

    @staticmethod
    async def add_subscribers(channels: Sequence[Channel], subscriber: str) -> None:
        """:meth:`add_subscriber` on each of ``channels`` (of one Redis client), in one
        pipelined step on a standalone server. Raises the first refusal (as
        :meth:`add_subscriber` would), or the :class:`StateFailureError` that stopped the
        step."""
        if not channels:
            return
        calls = [
            (
                [c._clock_key, c.keys.channel_cursor(c.name, subscriber), c._epoch_key],
                [c.ttl, ""],
            )
            for c in channels
        ]
        replies = await channels[0]._scripts.run_many("channel_add_subscriber", calls)
        for channel, reply in zip(channels, replies, strict=True):
            if isinstance(reply, RouterError):
                raise reply
            epoch = reply[1]
            channel.epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)

    @staticmethod
    async def subscribed(
        channels: Sequence[Channel], subscriber: str
    ) -> list[tuple[int, int] | None]:
        """:meth:`position` of ``subscriber`` on each of ``channels`` (of one client)
        whose clock, epoch and ``subscriber``'s cursor all exist, learning the channel's
        :attr:`epoch` there: the channels on which :meth:`add_subscriber` would change
        nothing, read in one pipelined step (one MGET each). None for the others. Raises
        :class:`CorruptStateError` for a clock or cursor that is not an integer."""
        if not channels:
            return []
        replies = await commands_each(
            channels[0]._redis,
            [
                [("MGET", c.keys.channel_cursor(c.name, subscriber), c._clock_key, c._epoch_key)]
                for c in channels
            ],
        )
        found: list[tuple[int, int] | None] = []
        for channel, [(cursor, clock, epoch)] in zip(channels, replies, strict=True):
            if cursor is None or clock is None or epoch is None:
                found.append(None)
                continue
            try:
                found.append((int(clock), int(cursor)))
            except ValueError:
                raise CorruptStateError(
                    f"channel {channel.name!r}: clock {clock!r} or cursor {cursor!r} is not "
                    "an integer clock"
                ) from None
            channel.epoch = epoch.decode() if isinstance(epoch, bytes) else str(epoch)
        return found

    @staticmethod
    async def positions(
        channels: Sequence[Channel], subscriber: str
    ) -> list[tuple[int, int] | None]:
        """:meth:`position` of ``subscriber`` on each of ``channels`` (of one client), in
        one pipeline on a standalone server (:func:`~router.state.reads.commands_each`;
        not atomic: each cursor is read before its clock, so the clock is never older)."""
        if not channels:
            return []
        replies = await commands_each(
            channels[0]._redis,
            [
                [("GET", c.keys.channel_cursor(c.name, subscriber)), ("GET", c._clock_key)]
                for c in channels
            ],
        )
        return [
            None if clock is None or cursor is None else (int(clock), int(cursor))
            for cursor, clock in replies
        ]

    @staticmethod
    async def publish_each(
        batches: Sequence[tuple[Channel, Iterable[ChannelMessage]]],
    ) -> list[list[Published] | RouterError]:
        """:meth:`publish` of each (channel, messages) of ``batches`` (channels of one
        Redis client), in one pipelined step on a standalone server. Returns what each
        publish returns, or the refusal it met (the others still ran); raises the
        :class:`StateFailureError` that stopped the step (some may have run)."""
        calls = [(channel, channel._publish_call(messages)) for channel, messages in batches]
        sent = [(channel, call) for channel, call in calls if call is not None]
        replies: list[Any] = []
        if sent:
            replies = await sent[0][0]._scripts.run_many(
                "channel_publish", [(keys, args) for _, (_, keys, args) in sent]
            )
        answers = iter(replies)
        results: list[list[Published] | RouterError] = []
        for channel, call in calls:
            if call is None:
                results.append([])
                continue
            reply = next(answers)
            results.append(
                reply if isinstance(reply, RouterError) else channel._published(call[0], reply)
            )
        return results

    # -- fetch and ack ---------------------------------------------------------------

    async def fetch(self, subscriber: str, max: int = 100, wait: float = 0.0) -> FetchResult:
        """Read ``subscriber``'s unacknowledged messages (at most ``max``); the cursor stays.

        With ``wait`` > 0 and nothing to return, wait up to ``wait`` seconds for a publish and
        fetch again: it returns soon after a publish, or empty after ``wait`` seconds;
        cancelling it returns at once. Raises :class:`SubscriptionNotFoundError` when the cursor or
        the clock is missing, :class:`CorruptStateError` when either is not an integer clock,
        :class:`ChannelArgumentError` for a bad ``max`` or ``wait``.
        """
        if isinstance(max, bool) or not isinstance(max, int) or not 1 <= max <= MAX_FETCH:
            raise ChannelArgumentError(f"max must be an int in 1..{MAX_FETCH}, not {max!r}")
        if isinstance(wait, bool) or not isinstance(wait, int | float):
            raise ChannelArgumentError(f"wait must be a number of seconds, not {wait!r}")
        if not math.isfinite(wait) or wait < 0:
            raise ChannelArgumentError(f"wait must be finite and >= 0, not {wait!r}")
        cursor = self.keys.channel_cursor(self.name, subscriber)
        if wait == 0:
            return (await self._fetch_now(subscriber, cursor, max))[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            # Subscribe before fetching: a publish after this fetch always wakes us.
            seen = await self.wakeups.arm()
            result, _ = await self._fetch_now(subscriber, cursor, max)
            if result.messages or result.more:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self.wakeups.wait(seen, remaining):
                return result

    async def read(
        self, subscriber: str, max: int, after: int | None = None
    ) -> tuple[FetchResult, int]:
        """A fetch without waiting, optionally resuming ``after`` a clock, plus the position.

        ``after`` is used when it is a valid ack position (ahead of the cursor, not beyond
        the clock); otherwise the read starts at the cursor, as :meth:`fetch` does. The
        position is the last clock examined: the channel clock when nothing is left. Raises
        as :meth:`fetch` does.
        """
        cursor = self.keys.channel_cursor(self.name, subscriber)
        return await self._fetch_now(subscriber, cursor, max, "" if after is None else str(after))

    async def _fetch_now(
        self, subscriber: str, cursor: str, limit: int, start: str = ""
    ) -> tuple[FetchResult, int]:
        """One fetch without waiting; continues past runs of expired clocks (bounded)."""
        keys = [self._clock_key, cursor, self._bodies, self._epoch_key]
        last: int | None = None
        position = 0
        messages: list[FetchedMessage] = []
        more = False
        for _ in range(MAX_SCAN_CALLS):
            reply = await self._scripts.run(
                "channel_fetch", keys, [limit, self.ttl, limit + SCAN_SLACK, start]
            )
            position = int(reply[1])
            if reply[0]:
                last = position
            more = bool(reply[2])
            for i in range(3, len(reply), 2):
                message = decode_body(int(reply[i]), reply[i + 1])
                if message is not None:
                    messages.append(message)
            if messages or not more or last is None:
                break
            start = str(last)
        handle = None if last is None else self.handle(subscriber, last)
        return FetchResult(tuple(messages), handle, more), position

    async def ack(self, subscriber: str, handle: str) -> bool:
        """Acknowledge everything a fetch returned: move the cursor to the handle's clock.

        Returns True when the cursor moved, False for a stale handle (an ack at or behind the
        cursor, or beyond the clock): a successful no-op that changes no value and no TTL.
        Raises :class:`MalformedAckHandleError` for a handle that is malformed or was issued for
        another channel or subscriber (nothing changes), :class:`SubscriptionNotFoundError` when
        the cursor or clock is missing, :class:`CorruptStateError` when either is corrupt.
        """
        clock = self._check_handle(subscriber, handle)
        reply = await self._scripts.run(
            "channel_ack",
            [self._clock_key, self.keys.channel_cursor(self.name, subscriber)],
            [str(clock), self.ttl],
        )
        return bool(reply)

    # -- ack handles -----------------------------------------------------------------

    def _digest(self, subscriber: str, clock: int) -> str:
        """The checksum binding an ack position to this channel (and namespace) and subscriber."""
        data = b"\0".join((self._base.encode(), subscriber.encode(), str(clock).encode("ascii")))
        return hashlib.blake2b(data, digest_size=10, person=_HANDLE_PERSON).hexdigest()

    def handle(self, subscriber: str, clock: int) -> str:
        """The ack handle that acknowledges ``subscriber``'s messages up to ``clock``.
        Raises :class:`InvalidIdError` for a bad subscriber id, ``TypeError`` for a clock
        that is not an int."""
        check_id(subscriber, "subscriber id")
        if type(clock) is not int:
            raise TypeError(f"a clock is an int, not {clock!r:.80}")
        return f"{clock}:{self._digest(subscriber, clock)}"

    def _check_handle(self, subscriber: str, handle: object) -> int:
        """The clock of a handle issued for this channel and subscriber; raises
        :class:`MalformedAckHandleError` for any other."""
        check_id(subscriber, "subscriber id")
        match = _HANDLE.fullmatch(handle) if isinstance(handle, str) else None
        if match is None:
            raise MalformedAckHandleError(f"not an ack handle: {handle!r:.80}")
        clock = int(match[1])
        if not -CLOCK_LIMIT <= clock <= CLOCK_LIMIT or not hmac.compare_digest(
            match[2], self._digest(subscriber, clock)
        ):
            raise MalformedAckHandleError(
                f"the ack handle was not issued for subscriber {subscriber!r:.80} "
                f"of channel {self.name!r:.80}"
            )
        return clock


__all__ = [
    "CLOCK_LIMIT",
    "Announcement",
    "Channel",
    "ChannelMessage",
    "FetchResult",
    "FetchedMessage",
    "Published",
    "channel_ttl",
    "next_clock",
    "parse_announcement",
]
