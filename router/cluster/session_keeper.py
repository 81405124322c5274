"""Persistent sessions on a node: keeping them while their client is away, and moving them.

A session with a Session Expiry Interval (``session.expiry`` > 0) outlives its
connection. The node that holds it:

* **client away** (:meth:`SessionKeeper.put_away`): marks it away in Redis (every key of
  the client then expires after the interval, on Redis server time), moves what it held
  for the client into the session's Redis queue (the copies in flight first, keeping
  their packet ids, then the queue), and from then on a *spiller* task moves each new
  QoS 1/2 copy there as it arrives. QoS 0 copies for an away client are not kept (as
  Mosquitto's default) and are counted (``offline_qos0_skipped``). The node keeps the
  session's subscriptions and routes, arms a timer for the session's end and, for a
  will with a delay, one for the will (whichever comes first publishes it).
* **client back on this node** (:meth:`come_back`): the timers stop, the spiller
  finishes, and what the queue holds goes first into the session.
* **taken over by another node** (:meth:`hand_off`): what the node holds goes to the queue,
  then the *handoff marker* of the new claim's epoch, carrying the inbound QoS 2 ids
  still awaiting PUBREL. The new owner (:meth:`take_queued`) drains the queue until it
  sees that marker (bounded by ``handoff_timeout``: the old node may be dead), so no copy
  is lost or reordered by the move.
* **session end** (the interval passed): the node's timer ends it here; if the node died,
  Redis expires its keys anyway and the routes went with the node.

What is not kept: copies that reach a node whose queue is full beyond ``max_queued``
follow the node's overflow policy and are counted (``session_queue_drops``); messages
whose Message Expiry Interval passed while queued are dropped when read
(``expired_dropped``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from router.cluster.local_sessions import ClientSession, Overflow
from router.cluster.tasks import stop_task
from router.core.messages import Delivery, Outgoing
from router.errors import RouterError
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_store import NEVER, SessionQueue, SessionStore
from router.state.subscriptions import Owner

log = logging.getLogger(__name__)

#: Deliveries the spiller moves to Redis in one call, at most.
SPILL_BATCH = 500


@dataclass
class _Away:
    """The queue, timers and spiller of one away session."""

    queue: SessionQueue
    spiller: asyncio.Task[None] | None = None
    spilling: asyncio.Future[None] | None = None  # the batch on its way to Redis
    end: asyncio.TimerHandle | None = None
    will: asyncio.TimerHandle | None = None
    pending_will: Outgoing | None = None


class SessionKeeper:
    """The persistent sessions of one node (see the module docstring).

    ``publish_will(will)`` publishes a will; ``end_session(client_id)`` ends a session
    whose interval passed (the node removes it here and in Redis).
    """

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys,
        store: SessionStore,
        *,
        max_queued: int,
        overflow: Overflow,
        handoff_timeout: float,
        publish_will: Callable[[Outgoing], Awaitable[object]],
        end_session: Callable[[str], Awaitable[None]],
    ) -> None:
        self._redis = redis
        self._keys = keys
        self.store = store
        self.max_queued = max_queued
        self.overflow: Overflow = overflow
        self.handoff_timeout = handoff_timeout
        self._publish_will = publish_will
        self._end_session = end_session
        self._away: dict[str, _Away] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.queued = 0
        self.queue_drops = 0
        self.offline_qos0_skipped = 0
        self.expired_dropped = 0
        self.sessions_expired = 0
        self.sessions_resumed = 0

    def queue(self, client_id: str, expiry: int) -> SessionQueue:
        return SessionQueue(self._redis, self._keys, client_id, expiry)

    def is_away(self, client_id: str) -> bool:
        return client_id in self._away

    # -- the client leaves ---------------------------------------------------------------

    async def put_away(
        self,
        session: ClientSession,
        owner: Owner,
        will: Outgoing | None = None,
        will_delay: int = 0,
    ) -> None:
        """The client left; keep its session (see the module docstring)."""
        client_id = session.client_id
        session.away = True
        await self.store.mark_away(
            client_id, owner, expiry=session.expiry, awaiting_release=session.awaiting_release
        )
        queue = self.queue(client_id, session.expiry)  # (one for the spiller's life)
        await queue.ensure()  # (a reader idle longer than the interval had expired)
        away = self._away[client_id] = _Away(queue)
        await self._spill(queue, session.take_all())
        loop = asyncio.get_running_loop()
        if session.expiry < NEVER:
            away.end = loop.call_later(session.expiry, self._spawn, self._expire, client_id)
        if will is not None:
            away.pending_will = will
            if will_delay < session.expiry:
                away.will = loop.call_later(will_delay, self._spawn, self._will_due, client_id)
        away.spiller = asyncio.create_task(
            self._spill_forever(session, away), name=f"spill:{client_id}"
        )

    async def _spill_forever(self, session: ClientSession, away: _Away) -> None:
        """Move the session's copies to Redis as they come. A batch taken from the session
        is shielded from cancellation: :meth:`settle` waits for it instead."""
        while True:
            delivery = await session.get()
            if delivery is None:
                return
            batch = [delivery]
            while session.pending() and len(batch) < SPILL_BATCH:
                next_one = await session.get()
                if next_one is not None:
                    batch.append(next_one)
            away.spilling = asyncio.ensure_future(self._spill_batch(away.queue, batch))
            await asyncio.shield(away.spilling)

    async def _spill_batch(self, queue: SessionQueue, batch: list[Delivery]) -> None:
        try:
            await self._spill(queue, batch)
        except (RouterError, RedisError):
            self.queue_drops += len(batch)
            log.warning("could not queue %d messages for %s", len(batch), queue.client_id)

    async def _spill(self, queue: SessionQueue, deliveries: list[Delivery]) -> None:
        kept = [d for d in deliveries if d.qos > 0]
        self.offline_qos0_skipped += len(deliveries) - len(kept)
        if kept:
            stored, dropped = await queue.append(kept, self.max_queued, self.overflow)
            self.queued += stored
            self.queue_drops += dropped

    # -- timers --------------------------------------------------------------------------

    def _spawn(self, work: Callable[[str], Awaitable[None]], client_id: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work(client_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _will_due(self, client_id: str) -> None:
        away = self._away.get(client_id)
        if away is not None and away.pending_will is not None:
            will, away.pending_will = away.pending_will, None
            await self._publish(will)

    async def _publish(self, will: Outgoing) -> None:
        try:
            await self._publish_will(will)
        except (RouterError, RedisError):
            log.warning("the will of %s was not published", will.publisher, exc_info=True)

    async def _expire(self, client_id: str) -> None:
        if client_id not in self._away:
            return
        self.sessions_expired += 1
        await self._end_session(client_id)

    # -- the session goes on -------------------------------------------------------------

    async def settle(self, client_id: str, *, publish_will: bool) -> None:
        """The session stops being away here (its client is back, or it moves or ends):
        stop its timers and spiller; the pending will is published with
        ``publish_will`` (the session ended), else dropped (a connection came back)."""
        away = self._away.pop(client_id, None)
        if away is None:
            return
        for timer in (away.end, away.will):
            if timer is not None:
                timer.cancel()
        await stop_task(away.spiller)
        if away.spilling is not None:
            await away.spilling
        await away.queue.aclose()
        if publish_will and away.pending_will is not None:
            await self._publish(away.pending_will)

    async def hand_off(self, session: ClientSession, epoch: int) -> None:
        """Another node claimed the session with ``epoch`` (resuming it): queue what this
        node holds for the client, then the handoff marker (see the module docstring)."""
        await self.settle(session.client_id, publish_will=False)
        queue = self.queue(session.client_id, session.expiry)
        try:
            await self._spill(queue, session.take_all())
            await queue.mark_handoff(epoch, sorted(session.awaiting_release))
        finally:
            await queue.aclose()

    async def take_queued(
        self, session: ClientSession, handoff: int | None
    ) -> tuple[list[Delivery], set[int], bool]:
        """Drain the session's queue for its client: every delivery in order (expired
        ones dropped, counted), the inbound QoS 2 ids the previous node handed on, and
        whether the handoff came. With ``handoff``, drain until that epoch's marker or
        ``handoff_timeout`` (then False: the previous node is presumed dead)."""
        queue = self.queue(session.client_id, session.expiry)
        deliveries: list[Delivery] = []
        awaiting: set[int] = set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handoff_timeout
        try:
            await queue.ensure()
            while True:
                drained = await queue.drain()
                deliveries += drained.deliveries
                for marker in drained.handoffs:
                    awaiting.update(marker.awaiting_release)
                    if marker.epoch == handoff:
                        handoff = None
                if drained.more:
                    continue
                remaining = deadline - loop.time()
                if handoff is None or remaining <= 0:
                    break
                with contextlib.suppress(RouterError):
                    await queue.channel.fetch("session", max=1, wait=min(remaining, 0.5))
        finally:
            await queue.aclose()
        now = time.time()
        live = [d for d in deliveries if d.expires_at is None or d.expires_at > now]
        self.expired_dropped += len(deliveries) - len(live)
        self.sessions_resumed += 1
        return live, awaiting, handoff is None

    async def reset_queue(self, client_id: str, expiry: int) -> None:
        """Forget whatever a session's queue held (a new session under an old id); the
        queue's reader lives as long as a session of ``expiry`` seconds."""
        queue = self.queue(client_id, expiry)
        try:
            await queue.reset()
        finally:
            await queue.aclose()

    async def stop(self) -> None:
        """Stop every spiller and timer (the node is stopping; Redis keeps the sessions)."""
        for client_id in list(self._away):
            await self.settle(client_id, publish_will=False)
        for task in list(self._tasks):
            await stop_task(task)

    def stats(self) -> dict[str, int]:
        return {
            "sessions_away": len(self._away),
            "sessions_resumed": self.sessions_resumed,
            "sessions_expired": self.sessions_expired,
            "session_queued": self.queued,
            "session_queue_drops": self.queue_drops,
            "offline_qos0_skipped": self.offline_qos0_skipped,
            "expired_dropped": self.expired_dropped,
        }
