"""A node's events: told to the log at once, written to the cluster's event log behind.

:meth:`EventReporter.tell` never waits and never raises: it writes the event to the
node's log (INFO, WARNING for warnings and critical ones) and queues it; a task
(:meth:`EventReporter.run`) writes the queue to Redis (:mod:`router.state.event_log`),
what came together in one round trip. While Redis refuses, the queue keeps the newest
:data:`PENDING` events, and the task tries again every :data:`RETRY` seconds; an event
pushed out is counted (``events_unwritten``). A noisy event (one per client or per
alarm) passes ``every``: told at most once in that many seconds per kind and subject,
the others counted (``events_suppressed``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Final

from router.errors import StateFailureError
from router.state.event_log import Event, EventLog, Severity

log = logging.getLogger(__name__)

PENDING: Final = 1_000
RETRY: Final = 1.0
STOP_FLUSH: Final = 1.0
"""Seconds a stopping node gives its last events to reach Redis."""
MAX_SUBJECTS: Final = 10_000
"""Kinds and subjects whose last telling is remembered for ``every`` (bounded)."""


class EventReporter:
    """Tells one node's events (see the module docstring)."""

    def __init__(self, events: EventLog, node_id: str) -> None:
        self._events = events
        self._node_id = node_id
        self._pending: deque[tuple[Event, str | None]] = deque()
        self._wake = asyncio.Event()
        self._last: dict[tuple[str, str], float] = {}
        self.told = 0
        self.unwritten = 0
        self.suppressed = 0

    def tell(
        self,
        kind: str,
        subject: str,
        text: str,
        severity: Severity = "info",
        *,
        once: str | None = None,
        every: float | None = None,
    ) -> bool:
        """Tell an event about ``subject``; with ``once``, the cluster keeps only the first
        event told with that token (another node may have told it); with ``every``, not
        if this node told one of this kind about this subject within that many seconds
        (False then)."""
        if every is not None:
            if not self.due(kind, subject, every):
                return False
            now = time.monotonic()
            if len(self._last) >= MAX_SUBJECTS:
                self._last = {k: t for k, t in self._last.items() if now - t < every}
            self._last[(kind, subject)] = now
        event = Event(kind, severity, self._node_id, subject, text)
        log.log(logging.INFO if severity == "info" else logging.WARNING, "%s: %s", kind, text)
        if len(self._pending) >= PENDING:
            self._pending.popleft()
            self.unwritten += 1
        self._pending.append((event, once))
        self.told += 1
        self._wake.set()
        return True

    def due(self, kind: str, subject: str, every: float) -> bool:
        """Whether an event of ``kind`` about ``subject`` told with ``every`` would be told
        now (not: counted as suppressed), for a caller whose words cost to make."""
        last = self._last.get((kind, subject))
        if last is not None and time.monotonic() - last < every:
            self.suppressed += 1
            return False
        return True

    async def run(self) -> None:
        """Write what is told, for ever (a supervised task)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                try:
                    await self._write()
                except StateFailureError as error:
                    log.warning(
                        "events not written yet (%d waiting): %s", len(self._pending), error
                    )
                    await asyncio.sleep(RETRY)

    async def _write(self) -> None:
        """Write the events pending now (those told meanwhile wait for the next round)."""
        batch = list(self._pending)
        plain = [event for event, once in batch if once is None]
        for event, once in batch:
            if once is not None:
                await self._events.add(event, once=once)
        if plain:
            await self._events.add_many(plain)
        written = {id(event) for event, _ in batch}  # (tell() may have pushed some out)
        while self._pending and id(self._pending[0][0]) in written:
            self._pending.popleft()

    async def flush(self) -> None:
        """Write what is pending, for at most :data:`STOP_FLUSH` seconds (a node that
        stops: what is left is counted as unwritten)."""
        try:
            async with asyncio.timeout(STOP_FLUSH):
                while self._pending:
                    await self._write()
        except (TimeoutError, StateFailureError):
            self.unwritten += len(self._pending)
            self._pending.clear()

    def stats(self) -> dict[str, int]:
        return {
            "events_told": self.told,
            "events_unwritten": self.unwritten,
            "events_suppressed": self.suppressed,
        }
