"""Supervised background tasks: a task that fails is restarted with backoff and counted,
and a node whose task keeps failing knows it.

A node's background work (reading its inbox, keeping its route mirror, writing routes)
runs as long-lived coroutines. Before supervision, one that raised anything unexpected
(READONLY, OOM, a corrupt record) ended for good while the node went on claiming to be
alive, so peers forwarded copies that nobody dispatched. Under a :class:`Supervisor`:

- a task that raises (anything but cancellation) is logged, counted in ``restarts`` and
  started again after a backoff that doubles from ``first_delay`` to ``max_delay`` (and
  starts over once the task ran ``healthy_after`` seconds without failing);
- a task is *failing* from a failure until it has run ``healthy_after`` seconds since
  its last restart; :meth:`Supervisor.down` names the tasks failing for longer than
  ``grace`` seconds. The node stops its heartbeat while any task is down (peers then
  purge it and stop routing to it) and says so in its log and health figures;
- a task that returns has finished its work and is not restarted.

A loop that must go on whatever happens (a heartbeat, a sampler) catches the failures it
can act on, the state layer's :class:`~router.errors.StateError` (Redis failed, or holds
what the router did not write), and tells them as such. Anything else it catches is a bug,
not an outage: it hands it to :meth:`Supervisor.caught`, which counts it
(``internal_errors``) and logs it at ERROR with its type and traceback, so that it is never
told as Redis being away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from router.cluster.tasks import stop_task

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class _Supervised:
    name: str
    factory: TaskFactory
    task: asyncio.Task[None] | None = None
    restarts: int = 0
    started_at: float = 0.0
    failing_since: float | None = None
    last_error: str = ""
    running: bool = False
    finished: bool = False


class Supervisor:
    """Runs and restarts the background tasks of one node (see the module docstring)."""

    def __init__(
        self,
        owner: str,
        *,
        first_delay: float = 0.1,
        max_delay: float = 5.0,
        healthy_after: float = 5.0,
        grace: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.owner = owner
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.healthy_after = healthy_after
        self.grace = grace
        self._clock = clock
        self._tasks: dict[str, _Supervised] = {}
        self.internal_errors = 0  # bugs caught by loops that go on (see caught())
        self.last_internal_error = ""

    def start(self, name: str, factory: TaskFactory) -> None:
        """Run ``factory()`` under supervision as task ``name`` (unique per supervisor)."""
        if name in self._tasks:
            raise ValueError(f"a task named {name!r} is supervised already")
        entry = self._tasks[name] = _Supervised(name, factory)
        entry.task = asyncio.create_task(self._run(entry), name=f"{name}:{self.owner}")

    def caught(self, where: str, error: BaseException) -> None:
        """Count and log an error ``where`` did not expect (a bug: anything but a
        :class:`~router.errors.StateError`), caught by a loop that goes on."""
        self.internal_errors += 1
        self.last_internal_error = f"{where}: {type(error).__name__}: {error}"
        log.error(
            "internal error in %s of %s (a bug, not an outage; %d so far): %s: %s",
            where,
            self.owner,
            self.internal_errors,
            type(error).__name__,
            error,
            exc_info=error,
        )

    async def stop(self) -> None:
        """Cancel every task and wait for them (bounded, see :func:`stop_task`)."""
        for entry in self._tasks.values():
            await stop_task(entry.task)
        self._tasks.clear()

    def failing(self) -> dict[str, str]:
        """The tasks failing now, with their last error."""
        now = self._clock()
        found = {}
        for entry in self._tasks.values():
            if entry.failing_since is None:
                continue
            if entry.running and now - entry.started_at >= self.healthy_after:
                entry.failing_since = None  # it has run long enough since its restart
                continue
            found[entry.name] = entry.last_error
        return found

    def down(self) -> dict[str, str]:
        """The tasks that have been failing for longer than ``grace`` seconds."""
        now = self._clock()
        failing = self.failing()
        return {
            name: error
            for name, error in failing.items()
            if now - (self._tasks[name].failing_since or now) > self.grace
        }

    @property
    def restarts(self) -> int:
        return sum(entry.restarts for entry in self._tasks.values())

    def stats(self) -> dict[str, int]:
        return {
            "task_restarts": self.restarts,
            "tasks_failing": len(self.failing()),
            "internal_errors": self.internal_errors,
        }

    async def _run(self, entry: _Supervised) -> None:
        delay = self.first_delay
        while True:
            entry.started_at = self._clock()
            entry.running = True
            try:
                await entry.factory()
            except Exception as exc:  # (supervision: any failure restarts)
                entry.running = False
                now = self._clock()
                if now - entry.started_at >= self.healthy_after:
                    delay = self.first_delay
                if entry.failing_since is None or now - entry.started_at >= self.healthy_after:
                    entry.failing_since = now
                entry.restarts += 1
                entry.last_error = f"{type(exc).__name__}: {exc}"
                log.error(
                    "task %s of %s failed (restart %d in %.2f s): %s",
                    entry.name,
                    self.owner,
                    entry.restarts,
                    delay,
                    entry.last_error,
                    exc_info=exc,
                )
            else:
                entry.running = False
                entry.finished = True
                entry.failing_since = None
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_delay)
