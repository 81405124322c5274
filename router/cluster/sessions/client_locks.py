"""One at a time per client: the steps that attach a client's session to this node, put
it away or adopt it do not interleave.

A connect (a resume that waits for the previous node's handoff, say) and a second one
for the same client id (the dead node's adoption here, or the client's own retry) would
otherwise both work on the one local session: the adoption's resume would find the
session attached and answer at once, then put it away under the connected client, whose
copies would go to the away queue from then on. With :class:`ClientLocks` each step runs
whole before the next begins.

The lock is reentrant for the task that holds it (an adoption holds it across a connect
and a put away, which take it too). Every step that holds it is bounded (Redis calls by
their timeouts, the handoff wait by ``handoff_timeout``), so a wait for it is too. A
client's lock exists while some task holds or waits for it.

A takeover notice (or an audit that finds a newer claim) may come while a connect of the
same client runs here: another node's CONNECT raced this one and claimed the session
after it. Closing the session under the connect made it fail half-way (a session closed
while attaching cannot be connected, nor put away). :meth:`ClientLocks.in_turn` runs such
a step in the client's turn instead: at once when nothing of the client runs, else once
the connect has run, in the background (the inbox reader that read the notice goes on
with the copies after it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from router.errors import RouterError

log = logging.getLogger(__name__)


@dataclass
class _Lock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    holder: asyncio.Task[object] | None = None
    users: int = 0  # tasks holding or waiting


class ClientLocks:
    """Per-client reentrant locks (see the module docstring)."""

    def __init__(self) -> None:
        self._locks: dict[str, _Lock] = {}
        self._waiting: set[asyncio.Task[None]] = set()  # steps in_turn waits to run

    def __len__(self) -> int:
        """Clients whose lock is held or awaited now."""
        return len(self._locks)

    def __contains__(self, client_id: object) -> bool:
        """Whether the client's lock is held or awaited now."""
        return client_id in self._locks

    async def released(self, client_id: str) -> None:
        """Wait until the steps holding or awaiting the client's lock now have run (at
        once when none does, or this task holds it)."""
        entry = self._locks.get(client_id)
        if entry is None or entry.holder is asyncio.current_task():
            return
        async with self.hold(client_id):
            pass

    @asynccontextmanager
    async def hold(self, client_id: str) -> AsyncIterator[None]:
        """Hold the client's lock for the block (at once when this task holds it)."""
        task = asyncio.current_task()
        entry = self._locks.get(client_id)
        if entry is not None and entry.holder is task and task is not None:
            yield
            return
        if entry is None:
            entry = self._locks[client_id] = _Lock()
        entry.users += 1
        try:
            async with entry.lock:
                entry.holder = task
                try:
                    yield
                finally:
                    entry.holder = None
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[client_id]

    async def in_turn(self, client_id: str, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` holding the client's lock: now when no other task holds or awaits
        it (its errors raised), else in the background once the steps before it have run
        (a :class:`RouterError` it raises then is logged)."""
        entry = self._locks.get(client_id)
        if entry is None or entry.holder is asyncio.current_task():
            async with self.hold(client_id):
                await step()
            return
        task = asyncio.create_task(self._later(client_id, step), name=f"in-turn:{client_id}")
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _later(self, client_id: str, step: Callable[[], Awaitable[None]]) -> None:
        try:
            async with self.hold(client_id):
                await step()
        except RouterError:
            log.warning("a step of the session of %s failed", client_id, exc_info=True)

    async def stop(self) -> None:
        """Cancel the steps :meth:`in_turn` still waits to run (the node stops)."""
        waiting = list(self._waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
