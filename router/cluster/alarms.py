"""A node's alarms: it watches its own figures and its Redis, and tells what an operator
acts on as events (:mod:`router.cluster.events`).

Every :data:`WATCH` seconds the node PINGs its Redis (bounded by :data:`PING_BOUND`) and
compares its counters with the last look:

``redis_unreachable`` (warning)
    a PING failed or did not answer in time; told once Redis answers again, with how
    long it was out (an event cannot reach Redis before that; the log has it at once);
``redis_slow`` (warning, once a minute at most)
    a PING answered, slower than :data:`SLOW`;
``queue_overflow`` (warning, once a minute at most)
    messages were dropped because clients' queues were full (``queue_drops`` in memory,
    ``session_queue_drops`` in Redis), with the clients that dropped most;
``takeover_storm`` (warning, once a minute at most)
    more than :data:`STORM` sessions taken over within :data:`STORM_WINDOW` seconds
    (devices that share a client id, or a reconnect loop).

A peer's death is told where it is found, by the node's membership round
(:meth:`Membership.purge_dead <router.cluster.membership.Membership.purge_dead>`); a peer
that retired (stopped gracefully, its sessions left to a live node) is not told down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from router.cluster.events import EventReporter
from router.errors import StateFailureError

log = logging.getLogger(__name__)

WATCH: Final = 2.0
PING_BOUND: Final = 5.0
SLOW: Final = 0.25
"""Seconds a PING may take before Redis counts as slow."""
STORM: Final = 100
STORM_WINDOW: Final = 10.0
QUIET: Final = 60.0
"""Seconds between two alarms of one kind on one node."""
TOP: Final = 5
"""Clients named in a queue-overflow alarm."""


class Alarms:
    """One node's alarms (see the module docstring). ``figures`` are the node's
    counters (``node.stats()``); ``droppers(n)`` the ``n`` clients that dropped most
    (client id, messages dropped)."""

    def __init__(
        self,
        events: EventReporter,
        node_id: str,
        figures: Callable[[], Mapping[str, int]],
        ping: Callable[[], Awaitable[object]],
        droppers: Callable[[int], list[tuple[str, int]]],
        watch: float = WATCH,
    ) -> None:
        self._events = events
        self._node_id = node_id
        self._figures = figures
        self._ping = ping
        self._droppers = droppers
        self.watch = watch
        self._unreachable_since: float | None = None  # (wall clock, for the words)
        self._unreachable_at = 0.0  # (monotonic, for the length)
        self._drops: int | None = None
        self._takeovers: deque[tuple[float, int]] = deque()

    async def run(self) -> None:
        """Look every ``watch`` seconds, for ever (a supervised task)."""
        while True:
            await asyncio.sleep(self.watch)
            await self.look()

    async def look(self) -> None:
        """Look once: Redis, then the counters."""
        if await self._redis_answered():
            self._counters(self._figures())

    async def _redis_answered(self) -> bool:
        began = time.monotonic()
        try:
            async with asyncio.timeout(PING_BOUND):
                await self._ping()
        except (StateFailureError, TimeoutError) as error:
            if self._unreachable_since is None:
                self._unreachable_since, self._unreachable_at = time.time(), began
                log.warning("node %s cannot reach Redis: %r", self._node_id, error)
            return False
        took = time.monotonic() - began
        if self._unreachable_since is not None:
            out = time.monotonic() - self._unreachable_at
            since = time.strftime("%H:%M:%S UTC", time.gmtime(self._unreachable_since))
            self._events.tell(
                "redis_unreachable",
                self._node_id,
                f"node {self._node_id} could not reach Redis for {out:.1f} s (since {since})",
                "warning",
            )
            self._unreachable_since = None
        elif took > SLOW:
            self._events.tell(
                "redis_slow",
                self._node_id,
                f"Redis answered a PING of node {self._node_id} in {took * 1000:.0f} ms",
                "warning",
                every=QUIET,
            )
        return True

    def _counters(self, figures: Mapping[str, int]) -> None:
        drops = figures.get("queue_drops", 0) + figures.get("session_queue_drops", 0)
        if self._drops is not None and drops > self._drops:
            self._overflowed(drops - self._drops)
        self._drops = drops
        now = time.monotonic()
        takeovers = figures.get("sessions_taken_over", 0)
        window = self._takeovers
        window.append((now, takeovers))
        while window and window[0][0] < now - STORM_WINDOW:
            window.popleft()
        storm = takeovers - window[0][1]
        if storm > STORM:
            self._events.tell(
                "takeover_storm",
                self._node_id,
                f"{storm} sessions taken over on node {self._node_id} within "
                f"{STORM_WINDOW:.0f} s (devices sharing a client id, or a reconnect loop)",
                "warning",
                every=QUIET,
            )

    def _overflowed(self, dropped: int) -> None:
        if not self._events.due("queue_overflow", self._node_id, QUIET):
            return
        top = ", ".join(f"{client} {count}" for client, count in self._droppers(TOP))
        self._events.tell(
            "queue_overflow",
            self._node_id,
            f"{dropped} messages dropped on node {self._node_id} within {self.watch:.0f} s: "
            f"queues full (clients that dropped most: {top or 'none held now'})",
            "warning",
            every=QUIET,
        )
