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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Lock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    holder: asyncio.Task[object] | None = None
    users: int = 0  # tasks holding or waiting


class ClientLocks:
    """Per-client reentrant locks (see the module docstring)."""

    def __init__(self) -> None:
        self._locks: dict[str, _Lock] = {}

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
