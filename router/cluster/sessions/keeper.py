"""Persistent sessions on a node: keeping them while their client is away, and moving them.

A session with a Session Expiry Interval (``session.expiry`` > 0) outlives its
connection. The node that holds it:

* **client away** (:meth:`SessionKeeper.put_away`): marks it away in Redis (every key of
  the client then expires after the interval, on Redis server time), moves what it held
  for the client into the session's Redis queue (the copies in flight first, keeping
  their packet ids, then the queue), and from then on a *spiller* task moves each new
  QoS 1/2 copy there as it arrives (:mod:`router.cluster.sessions.away`). QoS 0 copies
  for an away client are not kept (as Mosquitto's default) and are counted
  (``offline_qos0_skipped``). The node keeps the session's subscriptions and routes,
  arms a timer for the session's end and, for a will with a delay, one for the will
  (whichever comes first publishes it).
* **client back** (:meth:`come_back`, on this node or another): the timers stop, the
  spiller finishes, and what the queue holds goes first into the session.
* **taken over by another node** (:meth:`hand_off`): what the node holds goes to the
  queue, then the *handoff marker* of the new claim's epoch, carrying the inbound QoS 2
  ids still awaiting PUBREL. Until the move's fence passed (:mod:`router.cluster.
  move_fence`: every mirror routes the client to the new node, and what was routed here
  is handled; within ``fence_bound`` seconds, else ``handoff_grace``) the node keeps the
  session's filters (its routes) and gathers the copies still sent here: a publishing
  node's route mirror may not have caught up with the move yet (it may even have seen
  this node's routes go before the new node's come). Those go to the queue too (the
  session's *tail*), then the tail end marker, and the routes go. The new owner
  (:meth:`come_back`) waits until the marker is in the queue before it reads anything
  (until then the old node may itself still be reading the tail of an earlier move to
  it), then drains the queue up to it (bounded by ``handoff_timeout``: the old node may
  be dead), answers the client, and reads the tail in the background; what reaches it
  directly meanwhile waits behind the tail (a copy that came both ways once). So no
  copy is lost or reordered by the move unless a mirror lags by more than the bound.
* **back during the grace**: a client that connects again to the node its session just
  left ends that node's grace at once (:meth:`handing_off`): the node writes the tail
  end and keeps the session's filters for the session that resumes there. Likewise a
  client that leaves, or comes back to, the node whose tail it is still reading does
  not wait for that tail: leaving, what the session holds goes to the queue once the
  tail is in (the tail is older); coming back, the session simply goes on. Nothing in
  a move waits for a grace, so a client that reconnects at once is answered at once.
* **session end** (the interval passed): the node's timer ends it here; if the node died,
  Redis expires its keys anyway and the routes went with the node.

What is not kept: copies that reach a node whose queue is full beyond ``max_queued``
follow the node's overflow policy and are counted (``session_queue_drops``); messages
whose Message Expiry Interval passed while queued are dropped when read
(``expired_dropped``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from router.cluster.sessions.away import AwaySession, spill_forever
from router.cluster.sessions.local_sessions import EXPIRED, ClientSession, Overflow
from router.cluster.sessions.recovery import InboxRecovery, Recovery
from router.cluster.sessions.resumes import Read, Resume, drain, tail_follows
from router.cluster.sessions.spills import Spills
from router.cluster.sessions.states import SessionEvent, SessionState
from router.cluster.tasks import stop_task
from router.core.messages import Delivery, Outgoing
from router.errors import RouterError, StateFailureError
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_queue import Drained, SessionQueue
from router.state.session_store import NEVER, SessionStore
from router.state.subscriptions import Owner

log = logging.getLogger(__name__)

#: Seconds before a handoff's write that Redis refused is tried again (doubling).
HANDOFF_RETRY: Final = 0.05


@dataclass
class _Move:
    """A session being handed on from this node: the task that hands it on, the away
    session that gathers its copies in the grace, and whether its client came back."""

    task: asyncio.Task[None]
    leaving: ClientSession
    back: asyncio.Event


class SessionKeeper:
    """The persistent sessions of one node (see the module docstring).

    ``publish_will(will)`` publishes a will; ``end_session(client_id)`` ends a session
    whose interval passed (the node removes it here and in Redis); ``is_dead(node_id)``
    says a node's heartbeat expired (a resume stops waiting for its handoff). ``fence``
    (public: a test may stand in front of it) is the move's fence a handoff's grace waits
    on (:meth:`MoveFence.passed <router.cluster.sessions.move_fence.MoveFence.passed>`;
    None: the grace is ``handoff_grace``).
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
        max_queued_bytes: int = 0,
        handoff_grace: float,
        recovery: InboxRecovery,
        publish_will: Callable[[Outgoing], Awaitable[object]],
        end_session: Callable[[str], Awaitable[None]],
        is_dead: Callable[[str], bool] = lambda _node_id: False,
        fence: Callable[[str, int, float], Awaitable[bool]] | None = None,
        fence_bound: float = 0.0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self.store = store
        self.spills = Spills(max_queued, overflow, max_queued_bytes)
        self.handoff_timeout = handoff_timeout
        self.handoff_grace = handoff_grace
        self._recovery = recovery
        self._publish_will = publish_will
        self._end_session = end_session
        self._is_dead = is_dead
        self.fence = fence
        self.fence_bound = fence_bound
        self._away: dict[str, AwaySession] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._handoffs: dict[str, _Move] = {}  # sessions moving away
        self._tails: dict[str, asyncio.Task[None]] = {}  # sessions moving here
        self._unfinished: dict[str, Resume] = {}  # resumes that failed half-way
        self._stopping = asyncio.Event()  # (cuts the grace of handoffs short)
        self.expired_dropped = 0
        self.sessions_expired = 0
        self.sessions_resumed = 0
        self.tails_lost = 0
        self.handoffs_missed = 0  # resumes whose previous node, alive or not, did not hand on

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
        *,
        marked: bool = False,
    ) -> None:
        """The client left; keep its session (see the module docstring). While the tail
        of a move to this node is still being read, what the session holds goes to the
        queue once that tail is in (the spiller's first batch): it is newer. ``marked``:
        Redis has the session away already (an adoption marked it).

        Should Redis fail to take the away mark, :class:`StateFailureError` is raised and
        the session is away here all the same: its timers run, and its spiller marks it
        away in Redis as soon as Redis takes it, then queues its copies there (they are
        never left in this node's memory only). Another error (the session was taken
        over meanwhile) leaves it to the takeover notice. A will without a delay is
        published first (at the close of the connection, MQTT-3.1.3-9: not a loop turn
        later, which a connection taking the session over at once would cancel)."""
        client_id = session.client_id
        if will is not None and not will_delay:
            await self._publish(will)
            will = None
        event = SessionEvent.ADOPTED if marked else SessionEvent.CONNECTION_ENDED
        session.move_to(SessionState.AWAY, event)
        queue = self.queue(client_id, session.expiry)  # (one for the spiller's life)
        away = self._away[client_id] = AwaySession(queue)
        tail = self._tails.get(client_id)
        make_away = functools.partial(self._make_away, session, owner, queue, marked, tail)
        try:
            await make_away()
        except StateFailureError:
            self._keep_away(session, away, tail, will, will_delay, make_away)
            raise
        except BaseException:
            self._away.pop(client_id, None)
            raise
        self._keep_away(session, away, tail, will, will_delay)

    async def _make_away(
        self,
        session: ClientSession,
        owner: Owner,
        queue: SessionQueue,
        marked: bool,
        tail: asyncio.Task[None] | None,
    ) -> None:
        """The Redis part of :meth:`put_away`: the away mark, the queue's reader, and
        (no tail under way) what the session holds, into the queue."""
        if not marked:
            await self.store.mark_away(
                session.client_id,
                owner,
                expiry=session.expiry,
                awaiting_release=session.awaiting_release,
            )
        await queue.ensure()  # (a reader idle longer than the interval had expired)
        if tail is None:
            await self.spills.write_together(queue, session.take_all(), session)

    async def put_away_adopted(
        self, sessions: list[ClientSession], queues: dict[str, SessionQueue]
    ) -> None:
        """:meth:`put_away` of ``sessions``, which an adoption marked away in Redis and
        whose ``queues`` (by client id) it made, together: what they hold is appended in
        a few pipelined steps, not in calls of their own."""
        batches = []
        for session in sessions:
            queue = queues[session.client_id]
            session.move_to(SessionState.AWAY, SessionEvent.ADOPTED)
            self._away[session.client_id] = AwaySession(queue)
            if session.client_id not in self._tails and (held := session.take_all()):
                batches.append((queue, held, session))
        await asyncio.gather(*(self.spills.write_together(*batch) for batch in batches))
        for session in sessions:
            away = self._away[session.client_id]
            self._keep_away(session, away, self._tails.get(session.client_id), None, 0)

    def _keep_away(
        self,
        session: ClientSession,
        away: AwaySession,
        tail: asyncio.Task[None] | None,
        will: Outgoing | None,
        will_delay: int,
        make_away: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Arm the away session's timers and start its spiller (which first runs
        ``make_away``, the Redis part Redis failed, until Redis takes it)."""
        client_id = session.client_id
        loop = asyncio.get_running_loop()
        if session.expiry < NEVER:
            away.end = loop.call_later(session.expiry, self._spawn, self._expire, client_id)
        if will is not None:
            away.pending_will = will
            if will_delay < session.expiry:
                away.will = loop.call_later(will_delay, self._spawn, self._will_due, client_id)
        away.spiller = asyncio.create_task(
            spill_forever(self.spills, session, away, tail, make_away), name=f"spill:{client_id}"
        )

    async def queue_copies(self, client_id: str, expiry: int, copies: list[Delivery]) -> None:
        """Append ``copies`` to the client's Redis queue (a session this node does not
        hold: the node that resumes it reads them there)."""
        if copies:
            queue = self.queue(client_id, expiry)
            try:
                await self.spills.write(queue, copies)
            finally:
                await queue.aclose()

    async def restore_queue(self, client_id: str) -> None:
        """Make the queue's reader of an away session again (Redis lost it)."""
        away = self._away.get(client_id)
        if away is not None:
            await away.queue.ensure()

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
        except RouterError:
            log.warning("the will of %s was not published", will.publisher, exc_info=True)

    async def _expire(self, client_id: str) -> None:
        if client_id not in self._away:
            return
        self.sessions_expired += 1
        await self._end_session(client_id)

    # -- the session goes on -------------------------------------------------------------

    async def settle(self, client_id: str, *, publish_will: bool, wait_tail: bool = True) -> None:
        """The session stops being away here (its client is back, or it moves or ends):
        stop its timers and spiller; the pending will is published with
        ``publish_will`` (the session ended), else dropped (a connection came back).
        With ``wait_tail`` the tail of a move to this node comes first (a client back on
        this node does not wait for it: :meth:`come_back`)."""
        if wait_tail:
            await self.tail_taken(client_id)
        if publish_will:
            self._unfinished.pop(client_id, None)  # (the session ends)
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

    def hand_off(
        self,
        session: ClientSession,
        leaving: ClientSession,
        epoch: int,
        handed: Callable[[], Awaitable[None]],
    ) -> None:
        """Another node claimed the session with ``epoch`` (resuming it): queue what the
        closed ``session`` holds and the handoff marker; then for ``handoff_grace``
        seconds what reaches ``leaving`` (the away session that keeps its filters here)
        and the tail end marker; then ``handed()`` (the node ends ``leaving``), unless
        the client came back here meanwhile (:meth:`handing_off`: the node keeps
        ``leaving`` for it). Runs in the background."""
        client_id = session.client_id
        back = asyncio.Event()

        async def move() -> None:
            try:
                await self.settle(client_id, publish_will=False)
                await self._queue_handoff(session, leaving, epoch, back)
            except RouterError:
                log.warning(
                    "handing on the session of %s failed; its new node recovers its copies "
                    "from this node's inbox once its handoff wait ends",
                    client_id,
                    exc_info=True,
                )
            finally:
                try:
                    if not back.is_set():
                        await handed()
                except RouterError:  # (a route writer keeps its changes)
                    log.warning("routes of %s not removed yet", client_id, exc_info=True)

        task = asyncio.create_task(move(), name=f"handoff:{client_id}")
        handoff = self._handoffs[client_id] = _Move(task, leaving, back)
        task.add_done_callback(lambda _: self._forget_handoff(client_id, handoff))

    def _forget_handoff(self, client_id: str, handoff: _Move) -> None:
        if self._handoffs.get(client_id) is handoff:
            del self._handoffs[client_id]

    async def _queue_handoff(
        self, session: ClientSession, leaving: ClientSession, epoch: int, back: asyncio.Event
    ) -> None:
        """What the closed ``session`` holds (after what a resume here that failed
        half-way had got), the handoff marker, then (with a grace, cut short when the
        client is ``back`` here or the node stops) what reaches ``leaving`` meanwhile
        and the tail end marker."""
        client_id = session.client_id
        queue = self.queue(client_id, session.expiry)
        unfinished = self._unfinished.pop(client_id, None)
        awaiting = sorted(session.awaiting_release)
        deadline = asyncio.get_running_loop().time() + self.handoff_timeout
        retrying = functools.partial(_retrying, deadline=deadline)
        try:
            if unfinished is not None:  # (older than what the session holds)
                if not unfinished.recovered:
                    await self._recover(client_id, unfinished)
                earlier = unfinished.read.deliveries
                await retrying(lambda: self.spills.write(queue, earlier))
                awaiting = sorted({*awaiting, *unfinished.stored})
            held = session.take_all()
            await retrying(lambda: self.spills.write(queue, held))
            graced = self.handoff_grace > 0
            if graced:
                await retrying(lambda: queue.mark_handoff(epoch, awaiting, tail=True))
                ends: list[asyncio.Future[object]] = [
                    asyncio.ensure_future(e.wait()) for e in (self._stopping, back)
                ]
                ends.append(asyncio.ensure_future(self._grace(client_id, epoch)))
                try:
                    await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for end in ends:
                        end.cancel()
                    await asyncio.gather(*ends, return_exceptions=True)
            tail = leaving.take_all()
            await retrying(lambda: self.spills.write(queue, tail))
            if graced:
                await retrying(lambda: queue.mark_tail_end(epoch))
            else:
                await retrying(lambda: queue.mark_handoff(epoch, awaiting))
        finally:
            await queue.aclose()

    async def _grace(self, client_id: str, epoch: int) -> None:
        """The grace of a handoff: until the move's fence passed (every live mirror routes
        the client to its new node, and what was routed here is handled: :mod:`router.
        cluster.move_fence`), within ``fence_bound`` seconds (at least the grace); should
        it not pass by then, or should it not be told, ``handoff_grace`` seconds."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        if self.fence is not None:
            bound = max(self.handoff_grace, self.fence_bound)
            if await self.fence(client_id, epoch, bound):
                return
        await asyncio.sleep(max(0.0, began + self.handoff_grace - loop.time()))

    async def handing_off(self, client_id: str) -> None:
        """The client connects to this node again: end the grace of a handoff of its
        session that is under way and return once the tail end is written. The away
        session that gathered the copies stays (for the session that resumes here; what
        reaches it from now on is held back, behind what the new owner hands back), or
        goes with the handoff's end if none was under way."""
        move = self._handoffs.get(client_id)
        if move is not None:
            move.leaving.hold()
            move.back.set()
            await asyncio.wait([move.task])

    async def come_back(
        self,
        session: ClientSession,
        handoff: int | None,
        expiry: int,
        stored: tuple[int, ...] = (),
        previous: Owner | None = None,
        recovery: Recovery | None = None,
    ) -> None:
        """Give a resumed session what was queued for it, ahead of anything newer, and the
        inbound QoS 2 ids awaiting PUBREL (``stored`` in Redis, or handed on).

        With ``handoff`` (the epoch of this node's claim) the ``previous`` node hands the
        session on: what it queued up to its handoff marker goes first; a tail that
        follows goes next, read in the background (:meth:`_take_tail`), and until it
        has come the copies that reach the session here are held back (``session.hold``,
        by the caller, before this node's routes were written). No handoff from
        ``previous``: it is presumed dead; its inbox's copies for the client are
        recovered from the ``recovery`` mark (:mod:`router.cluster.sessions.recovery`). Without
        ``handoff``, while the tail of a move to this node is still being read, nothing
        is drained: the queue holds that tail only, and its reader releases the session.

        Should Redis fail under it, the error is raised and the session is left away
        (no client attached) with what the resume had got: the next one here goes on
        from there (:class:`Resume`), so the retry of a refused CONNECT gets it all."""
        client_id = session.client_id
        session.move_to(SessionState.ATTACHING, SessionEvent.READ_BACK)
        resume = self._unfinished.pop(client_id, None)
        if resume is None:
            if handoff is None and client_id in self._tails:
                session.awaiting_release.update(stored)
                session.expiry = expiry
                self.sessions_resumed += 1
                return
            deadline = asyncio.get_running_loop().time() + self.handoff_timeout
            resume = Resume(handoff, previous, recovery, deadline)
        resume.stored.update(stored)
        try:
            await self._read_back(session, resume)
        except BaseException:
            session.move_to(SessionState.AWAY, SessionEvent.RESUME_FAILED)
            self._unfinished[client_id] = resume
            raise
        self.sessions_resumed += 1
        markers = resume.read.markers
        for found in markers.handoffs:
            session.awaiting_release.update(found.awaiting_release)
        session.awaiting_release.update(resume.stored)
        taken = resume.read.deliveries
        session.put_first(taken)
        session.expiry = expiry
        seen = {d.message_id for d in taken}
        if tail_follows(resume):
            assert resume.handoff is not None
            self._tails[client_id] = asyncio.create_task(
                self._take_tail(session, resume.handoff, seen, resume.previous, resume.recovery)
            )
        else:
            session.release([], seen)

    async def _read_back(self, session: ClientSession, resume: Resume) -> None:
        """The Redis part of :meth:`come_back`: drain the queue (the first time up to the
        handoff marker awaited, within the resume's deadline), then recover the copies
        of a previous node that did not hand the session on."""
        epoch = resume.handoff
        if resume.waited or epoch is None:
            await self._drain(session, None, None, resume.read, resume.deadline)
            resume.handed = resume.handed or epoch is None  # (none awaited: none missing)
        else:
            came = await self._drain(
                session,
                lambda d: epoch in (m.epoch for m in d.handoffs),
                epoch,
                resume.read,
                resume.deadline,
                resume.previous,
            )
            resume.handed = came
        resume.waited = True
        if not resume.recovered:
            await self._recover(session.client_id, resume)

    async def _recover(self, client_id: str, resume: Resume) -> None:
        """Read the previous node's inbox for the client when that node did not hand the
        session on (its copies join what the resume took), else drop the mark."""
        previous = resume.previous
        if not resume.handed and previous is not None:
            self.handoffs_missed += 1
            resume.read.deliveries += await self._recovery.recover_for(
                previous.node_id, client_id, resume.recovery
            )
        elif not tail_follows(resume):
            await self._recovery.release(resume.recovery)
        resume.recovered = True

    async def _take_tail(
        self,
        session: ClientSession,
        epoch: int,
        seen: set[bytes],
        previous: Owner | None,
        recovery: Recovery | None,
    ) -> None:
        """Read the tail the previous node sends after its handoff marker, up to its tail
        end marker (at most ``handoff_timeout``: else that node died in its grace, and
        its inbox's copies are recovered), then release the session's held copies."""
        read = Read()
        tail = read.deliveries
        deadline = asyncio.get_running_loop().time() + self.handoff_timeout
        try:
            ended = await self._drain(
                session, lambda d: epoch in d.tail_ends, None, read, deadline, previous
            )
            if ended or previous is None:
                await self._recovery.release(recovery)
            else:
                tail += await self._recovery.recover_for(
                    previous.node_id, session.client_id, recovery
                )
        except RouterError:
            self.tails_lost += 1
            log.warning("the tail of the move of %s was not read", session.client_id, exc_info=True)
        finally:
            self._tails.pop(session.client_id, None)
            session.release(tail, seen)

    async def tail_taken(self, client_id: str) -> None:
        """Return once the tail of a move to this node that is under way has come."""
        task = self._tails.get(client_id)
        if task is not None:
            await asyncio.wait([task])

    async def _drain(
        self,
        session: ClientSession,
        came: Callable[[Drained], bool] | None,
        handoff: int | None,
        read: Read,
        deadline: float,
        previous: Owner | None = None,
    ) -> bool:
        """:func:`~router.cluster.sessions.resumes.drain` the session's queue; the wait
        ends early once the ``previous`` owner is known dead (no handoff will come)."""
        queue = self.queue(session.client_id, session.expiry)
        dead = self._is_dead
        gone = (lambda: False) if previous is None else (lambda: dead(previous.node_id))
        try:
            found, expired = await drain(queue, came, handoff, read, deadline, gone)
        finally:
            await queue.aclose()
        self.expired_dropped += expired
        if expired:
            session.lose(EXPIRED, expired)
        return found

    async def reset_queue(self, client_id: str, expiry: int) -> None:
        """Forget whatever a session's queue held (a new session under an old id); the
        queue's reader lives as long as a session of ``expiry`` seconds."""
        queue = self.queue(client_id, expiry)
        try:
            await queue.reset()
        finally:
            await queue.aclose()

    async def moves_done(self, timeout: float) -> bool:
        """Wait until the moves under way (handoffs of sessions moving away, with their
        grace, and tails of sessions moving here) have finished, those that begin
        meanwhile too, at most ``timeout`` seconds; True when none is left. A node about
        to stop calls it first, so that a client that moved to a peer gets its session
        handed on whole (:meth:`stop` cuts the graces short)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while moves := [*(move.task for move in self._handoffs.values()), *self._tails.values()]:
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.wait(moves, timeout=left)
        return True

    async def stop(self) -> None:
        """End the handoffs under way without their grace and take the tails under way,
        then stop every spiller and timer (the node is stopping; Redis keeps the
        sessions)."""
        self._stopping.set()
        moves = [*(move.task for move in self._handoffs.values()), *self._tails.values()]
        if moves:
            await asyncio.wait(moves)
        for client_id in list(self._away):
            await self.settle(client_id, publish_will=False)
        for task in list(self._tasks):
            await stop_task(task)
        await self.spills.stop()

    def stats(self) -> dict[str, int]:
        return {
            "sessions_away": len(self._away),
            "sessions_resumed": self.sessions_resumed,
            "sessions_expired": self.sessions_expired,
            "session_queued": self.spills.queued,
            "session_queue_drops": self.spills.queue_drops,
            "offline_qos0_skipped": self.spills.offline_qos0_skipped,
            "expired_dropped": self.expired_dropped,
            "handoff_tails_lost": self.tails_lost,
            "handoffs_missed": self.handoffs_missed,
        }


async def _retrying(work: Callable[[], Awaitable[object]], deadline: float) -> None:
    """Run ``work`` until Redis takes it, trying again after a failure of Redis (a
    pooled connection that met a restart of Redis fails once) until ``deadline`` (loop
    time: the new owner's wait for the handoff); then raise what the last try raised."""
    loop = asyncio.get_running_loop()
    pause = HANDOFF_RETRY
    while True:
        try:
            await work()
        except StateFailureError:
            if loop.time() + pause >= deadline:
                raise
            await asyncio.sleep(pause)
            pause *= 2
            continue
        return
