"""Writes a node's route changes to Redis in coalesced batches (group commit).

Callers :meth:`~RouteWriter.submit` (route, count) changes and await the returned future:
it resolves once a batch holding the change is durable in Redis, with the effective
changes of that batch (versions included). While one batch is being written, new changes
gather; several changes of one route in a gathering batch collapse to the last one
(EMQX's lesson: add/delete of the same route coalesce, last wins).

A batch that still fails after the retries (Redis unreachable for long, or refusing
writes: OOM, READONLY) is not dropped: its changes go back ahead of newer ones and the
writer tries again with backoff until Redis takes them. Its callers get
:class:`~router.errors.RouteWriteError` meanwhile (``failed_batches`` counts these, and
:attr:`~RouteWriter.unwritten` is what waits), so a subscribe is never lost after the
local state changed: another subscribe of the same filter writes nothing new, because
routes are written when a local count goes 0 -> 1.

If the route set vanished in Redis (the node was purged as dead, or Redis lost its data),
the writer claims it again and republishes every route the node holds (``current_routes``),
so Redis converges to the node's local state whatever happened in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.cluster.tasks import stop_task
from router.core.topics import TopicFilter
from router.errors import RouteSetMissingError, RouteWriteError, StateUnavailableError
from router.state.routes import RouteChange, RouteStore

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
MAX_BACKOFF = 5.0
"""Seconds between attempts at most, once a batch failed through every retry."""


@dataclass(frozen=True)
class Reconciliation:
    """What :meth:`RouteWriter.reconcile` found (and whether it repaired it)."""

    node_id: str
    missing: dict[TopicFilter, int]
    stale: list[TopicFilter]
    repaired: bool


class RouteWriter:
    """The single writer of one node's route set."""

    def __init__(
        self,
        store: RouteStore,
        node_id: str,
        incarnation: str,
        current_routes: Callable[[], dict[TopicFilter, int]],
        on_applied: Callable[[list[RouteChange]], None],
        on_claimed: Callable[[str], Awaitable[None]],
    ) -> None:
        self._store = store
        self._node_id = node_id
        self.incarnation = incarnation
        self._current_routes = current_routes
        self._on_applied = on_applied
        self._on_claimed = on_claimed
        self._pending: dict[TopicFilter, int] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._writing: list[asyncio.Future[None]] = []  # the callers of the batch under way
        self._stopped = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failed_batches = 0

    def start(self) -> None:
        self._stopped = False
        self._task = asyncio.create_task(self._run(), name=f"route-writer:{self._node_id}")

    async def stop(self) -> None:
        """Stop writing. Every caller still waiting, for a batch under way too, and any
        that submits from now on gets :class:`RouteWriteError` (the node stops: a stopped
        node's routes go with its purge)."""
        self._stopped = True
        await stop_task(self._task)
        self._task = None
        stopped = self._stopped_error()
        for waiter in [*self._writing, *self._waiters]:
            if not waiter.done():
                waiter.set_exception(stopped)
        self._writing, self._waiters = [], []

    def submit(self, route: TopicFilter, count: int) -> asyncio.Future[None]:
        """Queue a change; the future resolves when it is durable in Redis (or fails
        with :class:`RouteWriteError`, see :meth:`stop` and the module docstring)."""
        self._pending.pop(route, None)
        self._pending[route] = count
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._stopped:
            waiter.set_exception(self._stopped_error())
            return waiter
        self._waiters.append(waiter)
        self._wake.set()
        return waiter

    def _stopped_error(self) -> RouteWriteError:
        return RouteWriteError(self._node_id, RuntimeError("the route writer stopped"))

    async def _run(self) -> None:
        backoff = RETRY_DELAYS[0]
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, {}
            waiters = self._writing = self._waiters
            self._waiters = []
            if not batch:
                continue
            try:
                await self._write(batch)
            except Exception as exc:  # (whatever failed: no change may be dropped)
                self._keep(batch)
                self.failed_batches += 1
                log.error(
                    "routes of node %s not written (%d changes kept, retrying in %.1f s): %r",
                    self._node_id,
                    len(self._pending),
                    backoff,
                    exc,
                )
                error = RouteWriteError(self._node_id, exc)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                self._wake.set()
                continue
            backoff = RETRY_DELAYS[0]
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _keep(self, batch: dict[TopicFilter, int]) -> None:
        """Put a batch that could not be written back before what was submitted since
        (a later change of the same route wins, as in any batch)."""
        self._pending = {**batch, **self._pending}

    @property
    def unwritten(self) -> int:
        """Route changes waiting to be written (kept from failed batches, or new)."""
        return len(self._pending)

    async def _write(self, batch: dict[TopicFilter, int]) -> None:
        for delay in (*RETRY_DELAYS, None):
            try:
                changes = await self._store.write(self._node_id, self.incarnation, batch)
            except RouteSetMissingError:
                await self.republish()
                return
            except StateUnavailableError:
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                continue
            self._on_applied(changes)
            return

    async def republish(self) -> None:
        """Claim the route set again with every route the node holds now."""
        claim = await self._store.claim(self._node_id, self.incarnation, self._current_routes())
        log.warning(
            "node %s claimed its route set again (generation %s)", self._node_id, claim.generation
        )
        await self._on_claimed(claim.generation)

    async def reconcile(self, repair: bool) -> Reconciliation:
        """Compare the route set in Redis with ``current_routes``: ``missing`` are routes
        Redis lacks (or holds with another count), ``stale`` routes in Redis that are not
        current. With ``repair`` and any difference, claim the route set again with
        exactly the current routes (readers resync from the new generation)."""
        wanted = self._current_routes()
        stored = (await self._store.snapshot(self._node_id)).routes
        missing = {r: c for r, c in wanted.items() if stored.get(r) != c}
        stale = sorted(r for r in stored if r not in wanted)
        repaired = bool(repair and (missing or stale))
        if repaired:
            await self.republish()
        return Reconciliation(self._node_id, missing, stale, repaired)
