"""How much of the time an event loop works: the share of wall time it spent outside
waiting for I/O, the signal that a node is saturated (:mod:`router.mqtt.overload`).

A loop's lag (how late a timer fires) shows a node held by long callbacks, but not one
saturated by many short ones: a flood of small packets keeps every turn of the loop
short and full, and the other clients wait behind it without any timer firing late. The
share of time the loop works shows both. :class:`LoopLoad` measures it by timing the
loop's calls to its selector (the only place a selector event loop waits): the rest of
the wall time is work, including time the process was runnable and not scheduled, which
is work waiting too.

A loop without a selector to time (uvloop, the proactor loop of Windows) is measured by
its thread's CPU time instead, which misses the time the process waited for a core.

Cost: two clock readings a turn of the loop.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

_WAITS: Final[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SelectorWaits]] = (
    weakref.WeakKeyDictionary()
)


class _SelectorWaits:
    """The seconds one loop has spent in its selector, all told (timed from the first
    :class:`LoopLoad` of the loop on; the timing stays for the loop's life)."""

    def __init__(self, selector: Any, select: Callable[..., Any]) -> None:
        self.waited = 0.0
        clock = time.perf_counter

        def timed_select(timeout: float | None = None) -> Any:
            started = clock()
            try:
                return select(timeout)
            finally:
                self.waited += clock() - started

        selector.select = timed_select


class LoopLoad:
    """The work share of the running event loop, over the windows between this
    sampler's own calls of :meth:`sample` (several samplers of one loop do not share
    windows)."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        waits = _WAITS.get(loop)
        if waits is None:
            selector = getattr(loop, "_selector", None)
            select = getattr(selector, "select", None)
            if select is not None:
                waits = _WAITS[loop] = _SelectorWaits(selector, select)
        self._waits = waits
        self.timed = waits is not None  # (False: the thread's CPU time instead)
        self._at = time.perf_counter()
        self._mark = self._reading()

    def _reading(self) -> float:
        return self._waits.waited if self._waits is not None else time.thread_time()

    def sample(self) -> float:
        """The share of the wall time since the last sample (or since this sampler was
        made) that the loop worked, from 0 to 1; called from the loop's thread."""
        now, reading = time.perf_counter(), self._reading()
        elapsed, self._at = now - self._at, now
        counted, self._mark = reading - self._mark, reading
        if elapsed <= 0:
            return 0.0
        worked = elapsed - counted if self._waits is not None else counted
        return min(1.0, max(0.0, worked / elapsed))
