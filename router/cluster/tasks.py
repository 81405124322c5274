"""Stopping background tasks reliably.

A task is stopped by cancelling it. A library may swallow a cancellation it receives at
an unlucky moment (a cancel that lands while a redis-py call converts errors, say) and
carry on; :func:`stop_task` therefore cancels again until the task has ended, within a
deadline, and never waits forever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

STOP_TIMEOUT = 5.0
RECANCEL_INTERVAL = 0.05


async def stop_task(task: asyncio.Task[Any] | None, timeout: float = STOP_TIMEOUT) -> None:
    """Cancel ``task`` and wait until it ended (re-cancelling), at most ``timeout`` s."""
    if task is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_INTERVAL)
        if loop.time() > deadline and not task.done():
            log.error("task %s did not stop within %.1f s", task.get_name(), timeout)
            return
    if not task.cancelled() and task.exception() is not None:
        log.warning("task %s had failed: %r", task.get_name(), task.exception())
