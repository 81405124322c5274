"""Following one subscriber of a channel as messages arrive, with no fetch on the hot path.

A publisher that pushes (``Channel.publish(..., push=True)``) puts the stored messages in the
channel's wake-up announcement. A :class:`ChannelFollower` hands those on as they arrive,
in clock order, without a round trip to Redis. It reads from Redis only to catch up: at
the start, after a clock-only announcement or a gap in the clocks, when announcements may
have been lost (the wake-up connection failed, or too many piled up), and at least every
``poll`` seconds as a safety net (it also notices a channel that vanished, as after a
FLUSHALL: the read raises :class:`~router.errors.SubscriptionNotFoundError`). A read resumes
after the last clock handed on.

Acknowledging is off the hot path: :meth:`ChannelFollower.done`, called once a batch is
handled, schedules an ack of everything handed on so far (a caller that failed part-way
calls :meth:`~ChannelFollower.rewind` instead, to be handed the rest again); acks go out
in the background, one at a time, at most one per ``ack_interval`` seconds, each covering
all that was handled before it. A process that dies before an ack gets those messages
again from its cursor (at-least-once). Within one follower a message is handed on twice
only when a catch-up read overlaps what announcements already delivered; callers drop
repeats by message id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from router.errors import StateError, StateUnavailableError
from router.state.channels import (
    CLOCK_LIMIT,
    Channel,
    FetchedMessage,
    next_clock,
    parse_announcement,
)

log = logging.getLogger(__name__)

_CLOCK_SPACE: Final = 2 * CLOCK_LIMIT + 1


def clock_after(clock: int, reference: int) -> bool:
    """True when ``clock`` comes after ``reference`` in iteration order (across a wrap:
    within half the clock space ahead)."""
    distance = (clock - reference) % _CLOCK_SPACE
    return 0 < distance < _CLOCK_SPACE // 2


class ChannelFollower:
    """Hands on one subscriber's messages in clock order; see the module docstring.

    One follower per channel object: it keeps the channel's announcements.
    """

    def __init__(
        self,
        channel: Channel,
        subscriber: str,
        *,
        max_fetch: int = 256,
        poll: float = 5.0,
        ack_interval: float = 0.01,
    ) -> None:
        self.channel = channel
        self.subscriber = subscriber
        self._max_fetch = max_fetch
        self._poll = poll
        self._ack_interval = ack_interval
        self._wakeups = channel.wakeups
        self._wakeups.keep = True
        self._position: int | None = None  # the last clock handed on (or skipped)
        self._handled: int | None = None  # the last clock the caller said it handled
        self._behind = True  # a read from Redis is due
        self._next_check = 0.0
        self._acked: int | None = None
        self._ack_task: asyncio.Task[None] | None = None
        self.reads = 0
        self.pushed = 0

    @property
    def listening(self) -> bool:
        """True while the follower is caught up and hears new messages as they are
        stored (its wake-ups are up, none lost)."""
        return self._wakeups.listening and not self._behind

    async def next(self) -> list[FetchedMessage]:
        """The next messages in clock order; empty after ``poll`` quiet seconds."""
        wakeups = self._wakeups
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._poll
        while True:
            generation = await wakeups.arm()
            if self._behind or wakeups.lost or loop.time() >= self._next_check:
                messages = await self._read()
                if messages:
                    return messages
                if self._behind:
                    continue
            messages = self._take_announced()
            if messages:
                return messages
            if self._behind:
                continue
            remaining = min(deadline, self._next_check) - loop.time()
            if not await wakeups.wait(generation, max(remaining, 0)) and loop.time() >= deadline:
                return []

    async def _read(self) -> list[FetchedMessage]:
        """Catch up from Redis, resuming after the last clock handed on."""
        self._wakeups.lost = False
        self._next_check = asyncio.get_running_loop().time() + self._poll
        self._wakeups.announcements.clear()  # older than this read, or re-announced after it
        result, position = await self.channel.read(self.subscriber, self._max_fetch, self._position)
        self.reads += 1
        self._position = position
        self._behind = result.more
        return list(result.messages)

    def _take_announced(self) -> list[FetchedMessage]:
        """Messages from announcements that continue the position; flags a gap as behind."""
        announcements = self._wakeups.announcements
        position = self._position
        assert position is not None
        while announcements:
            announcement = parse_announcement(announcements.popleft())
            if announcement is None:
                log.error("unreadable announcement on channel %s", self.channel.name)
                self._behind = True
                return []
            if not clock_after(announcement.last, position):
                # Handed on already, or the channel's clock went back (a failover or a
                # restart lost its latest writes): a read from Redis tells them apart.
                self._behind = True
                continue
            if not announcement.pushed or clock_after(announcement.first, next_clock(position)):
                self._behind = True  # a clock-only announcement, or a gap: read it
                return []
            fresh = [m for m in announcement.messages if clock_after(m.clock, position)]
            self._position = announcement.last
            self.pushed += len(fresh)
            if fresh:
                return fresh
            position = announcement.last
        return []

    def handled_through(self, clock: int) -> bool:
        """True once the message of ``clock``, and every one before it, is handled."""
        handled = self._handled
        return handled is not None and not clock_after(clock, handled)

    def handled(self, clock: int) -> None:
        """The message of ``clock`` (handed on) is handled: :meth:`rewind` resumes after it."""
        self._handled = clock

    def rewind(self) -> None:
        """Hand on again, read from Redis, what came after the last handled message (a
        batch that failed part-way); :meth:`done` then acknowledges only what was handled."""
        self._position = self._handled
        self._behind = True

    def forget(self) -> None:
        """Start over from the cursor (after the subscriber was created anew)."""
        self._position = self._handled = self._acked = None
        self._behind = True

    def done(self) -> None:
        """Everything handed on so far is handled: acknowledge it (in the background)."""
        self._handled = self._position
        if self._ack_task is None and self._handled != self._acked:
            self._ack_task = asyncio.create_task(
                self._acknowledge(), name=f"ack:{self.channel.name}"
            )

    async def _acknowledge(self) -> None:
        try:
            while self._handled is not None and self._handled != self._acked:
                await self._ack_once()
                await asyncio.sleep(self._ack_interval)
        except StateUnavailableError as exc:
            log.warning("ack on channel %s failed (%s); retried later", self.channel.name, exc)
        except StateError as exc:  # the channel vanished or is corrupt: the next read says
            log.error("ack on channel %s refused: %s", self.channel.name, exc)
            self._behind = True
        finally:
            self._ack_task = None

    async def _ack_once(self) -> None:
        target = self._handled
        assert target is not None
        await self.channel.ack(self.subscriber, self.channel.handle(self.subscriber, target))
        self._acked = target

    async def close(self) -> None:
        """Stop following; acknowledge what was handed on (best effort if Redis is gone)."""
        task, self._ack_task = self._ack_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wakeups.keep = False
        self._wakeups.announcements.clear()
        if self._handled is not None and self._handled != self._acked:
            try:
                await self._ack_once()
            except StateError as exc:  # (the next reader reads them again)
                log.warning("last ack on channel %s not written: %r", self.channel.name, exc)
