"""Copies of away sessions into their Redis queues, under the node's limit, counted.

A session whose client is away keeps its QoS 1/2 copies in its Redis queue
(:class:`~router.state.session_queue.SessionQueue`); QoS 0 copies are not kept (as
Mosquitto's default) and are counted (``offline_qos0_skipped``). A queue keeps at most
``max_queued`` copies and follows the node's overflow policy past it; what it stored and
dropped is counted (``session_queued``, ``session_queue_drops``). The copies of many
sessions go to Redis together (:meth:`Spills.write_together`). A batch that Redis does
not take goes back to the head of its session: nothing acknowledged is dropped for it,
and the caller tries again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Final

from router.cluster.sessions.local_sessions import (
    OFFLINE_QOS0,
    SESSION_QUEUE_FULL,
    ClientSession,
    Overflow,
)
from router.cluster.tasks import stop_task
from router.core.messages import Delivery
from router.errors import RouterError, StateFailureError
from router.state.session_queue import SessionQueue

log = logging.getLogger(__name__)


#: Spills written to Redis in one pipelined step, at most.
GROUP: Final = 200
#: Groups written at the same time, at most (a node that adopts thousands of sessions
#: puts them away in a few round trips of their own, not one after the other). A session
#: has one spill due at a time, so its copies keep their order.
WRITERS: Final = 4


@dataclass
class _Due:
    """A spill waiting for the writer; ``done`` says whether Redis took it."""

    queue: SessionQueue
    batch: list[Delivery]
    session: ClientSession
    done: asyncio.Future[bool]

    def give_back(self) -> None:
        """Redis did not take it: the batch goes back to the head of its session."""
        if not self.done.done():
            self.session.put_first(self.batch)
            self.done.set_result(False)


class Spills:
    """Writes copies into session queues (see the module docstring) and counts them."""

    def __init__(self, max_queued: int, overflow: Overflow, max_queued_bytes: int = 0) -> None:
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        self.overflow: Overflow = overflow
        self.queued = 0
        self.queue_drops = 0
        self.offline_qos0_skipped = 0
        self._due: list[_Due] = []
        self._writers: set[asyncio.Task[None]] = set()

    def _kept(
        self, deliveries: list[Delivery], session: ClientSession | None = None
    ) -> list[Delivery]:
        kept = [d for d in deliveries if d.qos > 0]
        skipped = len(deliveries) - len(kept)
        if skipped:
            self.offline_qos0_skipped += skipped
            if session is not None:
                session.lose(OFFLINE_QOS0, skipped)
        return kept

    def _count(self, stored: int, dropped: int) -> None:
        self.queued += stored
        self.queue_drops += dropped

    async def write(self, queue: SessionQueue, deliveries: list[Delivery]) -> None:
        """Append ``deliveries`` (the QoS 1/2 ones) to ``queue``; raises what Redis raised."""
        kept = self._kept(deliveries)
        if kept:
            self._count(
                *await queue.append(kept, self.max_queued, self.overflow, self.max_queued_bytes)
            )

    async def write_together(
        self, queue: SessionQueue, batch: list[Delivery], session: ClientSession
    ) -> bool:
        """:meth:`write` ``batch``, in one pipelined step with the spills of other
        sessions due meanwhile (a group commit: a node holding thousands of away sessions
        writes their copies in a few round trips, not one each). False when Redis did
        not take it: then it is back at the head of ``session``. The caller has no other
        spill of ``session`` due."""
        kept = self._kept(batch, session)
        if not kept:
            return True
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        self._due.append(_Due(queue, kept, session, done))
        writers = len(self._writers)
        if not writers or (writers < WRITERS and len(self._due) > GROUP * writers):
            writer = loop.create_task(self._write_due(), name="spills")
            self._writers.add(writer)
        return await done

    async def _write_due(self) -> None:
        """Write what is due, :data:`GROUP` spills a step, until nothing is; what the
        last writer leaves when it is cancelled goes back to its sessions."""
        try:
            await asyncio.sleep(0)  # (the spills due in this turn of the loop join)
            while self._due:
                group, self._due = self._due[:GROUP], self._due[GROUP:]
                await self._write_group(group)
        finally:
            writer = asyncio.current_task()
            if writer is not None:
                self._writers.discard(writer)
            if not self._writers:
                for due in self._due:
                    due.give_back()
                self._due = []

    async def _write_group(self, group: list[_Due]) -> None:
        outcomes: list[tuple[int, int] | RouterError]
        try:
            outcomes = list(
                await SessionQueue.append_each(
                    [(due.queue, due.batch) for due in group],
                    self.max_queued,
                    self.overflow,
                    self.max_queued_bytes,
                )
            )
        except StateFailureError as error:
            outcomes = [error] * len(group)
        except BaseException:
            for due in group:
                due.give_back()
            raise
        refused = [outcome for outcome in outcomes if not isinstance(outcome, tuple)]
        for due, outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, tuple):
                self._count(*outcome)
                if outcome[1]:
                    due.session.lose(SESSION_QUEUE_FULL, outcome[1])
                if not due.done.done():  # (its caller may have been cancelled)
                    due.done.set_result(True)
            else:
                due.give_back()
        if refused:
            log.warning(
                "could not queue the messages of %d sessions yet: %s", len(refused), refused[0]
            )

    async def stop(self) -> None:
        """Stop writing: what is due goes back to its sessions."""
        for writer in list(self._writers):
            await stop_task(writer)
