"""The session lifecycle as a table: ``(state, event) -> (state, effects)``, pure.

One local session of a node is in one :class:`SessionState`; what happens to it is a
:class:`SessionEvent`; :func:`next_move` says where that takes it and what the driver must
do (:class:`Effect`), or raises :class:`~router.errors.SessionStateError` for an event
the state does not allow (a defect of the node, never of a client). No asyncio, no Redis,
no clock: the machine decides, the driver (today :mod:`router.cluster.sessions`) does the
I/O. :class:`SessionMachine` is one session's machine.

**Shadow mode** (this is its first slice): the driver does not ask the machine yet. Each
move of a session (:meth:`ClientSession.move_to
<router.cluster.sessions.local_sessions.ClientSession.move_to>`) names its event, and
:func:`router.cluster.sessions.states.shadow` checks that this table sends the session to
the state the lifecycle's own code chose; a disagreement raises under the tests and is
counted (``session_machine_disagreements``) and logged once in production. The effects
are the table's account of what the driver does for each move today; nothing executes
them yet.

The table (``-`` stays in the state; an event not listed for a state is refused):

=========== ================== =========== ===========================================
state       event              next        effects
=========== ================== =========== ===========================================
ATTACHING   RESUME_CLAIMED     ATTACHING   RESTORE_ROUTES, CLAIM
AWAY        RESUME_CLAIMED     ATTACHING   RESTORE_ROUTES, CLAIM
LEAVING     RESUME_CLAIMED     ATTACHING   RESTORE_ROUTES, CLAIM (came back in the grace)
ATTACHING   READ_BACK          ATTACHING   READ_QUEUE_BACK
AWAY        READ_BACK          ATTACHING   STOP_AWAY, READ_QUEUE_BACK (back here)
ATTACHING   RESUME_FAILED      AWAY        KEEP_UNFINISHED
ATTACHING   ATTACH_FAILED      AWAY        (none: the next connect goes on)
AWAY        ATTACH_FAILED      AWAY -      (none: the resume failed already)
ATTACHING   ATTACHED           CONNECTED   MARK_OPEN
CONNECTED   CONNECTION_ENDED   AWAY        PUBLISH_WILL, MARK_AWAY, SPILL, ARM_TIMERS
ATTACHING   ADOPTED            AWAY        SPILL, ARM_TIMERS
ATTACHING   HANDOFF_OPENED     LEAVING     GATHER_TAIL
ATTACHING   MOVED_AWAY         CLOSED      STOP_AWAY, QUEUE_HANDOFF, TELL_READER
CONNECTED   MOVED_AWAY         CLOSED      STOP_AWAY, QUEUE_HANDOFF, TELL_READER
AWAY        MOVED_AWAY         CLOSED      STOP_AWAY, QUEUE_HANDOFF, TELL_READER
LEAVING     HANDOFF_DONE       CLOSED      WRITE_TAIL_END, REMOVE_ROUTES
any but     TAKEN_OVER         CLOSED      STOP_AWAY, PUBLISH_WILL, REMOVE_ROUTES,
CLOSED                                     TELL_READER
any but     ENDED              CLOSED      STOP_AWAY, PUBLISH_WILL, REMOVE_ROUTES,
CLOSED                                     REMOVE_STATE, TELL_READER
any but     UNCLAIMED_DROPPED  CLOSED      REMOVE_ROUTES
CLOSED
AWAY        EXPIRED            CLOSED      STOP_AWAY, PUBLISH_WILL, REMOVE_ROUTES,
                                           REMOVE_STATE
any but     NODE_STOPPED       CLOSED      TELL_READER (Redis keeps the session)
CLOSED
=========== ================== =========== ===========================================

A session begins in ATTACHING (:data:`INITIAL`); CLOSED is final. Only ATTACHED leads
to CONNECTED, only a move to AWAY starts the spiller (SPILL): a connected client's
copies never go to the away queue.

Where each event comes from in the driver today (:mod:`router.cluster.sessions`):

* RESUME_CLAIMED: ``SessionLifecycle._claim_here``, a connect without clean start that
  resumes a stored session (a new one opened here, or one kept here, away or leaving);
* READ_BACK: ``SessionKeeper.come_back``, what was queued goes first into the session;
* RESUME_FAILED: ``SessionKeeper.come_back``, Redis failed under the read back;
* ATTACH_FAILED: ``SessionLifecycle._take_on``, Redis failed before the client attached;
* ATTACHED: ``SessionLifecycle._take_on``, the session is marked open;
* CONNECTION_ENDED: ``SessionKeeper.put_away``, the connection ended, the session kept;
* ADOPTED: ``SessionKeeper.put_away_adopted`` and ``put_away(marked=True)``, a dead
  node's session put away here;
* MOVED_AWAY: ``LocalSessions.hand_on``, another node resumed the session;
* HANDOFF_OPENED: ``LocalSessions.hand_on``, the copy that gathers the grace's copies;
* HANDOFF_DONE: ``SessionLifecycle._handed`` at the end of a handoff's grace;
* TAKEN_OVER: ``SessionLifecycle._on_taken_over``, another node claimed a session that
  ends (no resume, or no expiry);
* ENDED: ``SessionLifecycle._close_session``, a disconnect, a clean start, a session
  without expiry whose connection ended;
* UNCLAIMED_DROPPED: ``SessionLifecycle._drop_unclaimed``, what a handoff kept here or
  what a connect that failed before its claim opened;
* EXPIRED: ``SessionLifecycle._end_session``, the away session's interval passed;
* NODE_STOPPED: ``RouterNode.stop``, every session still here is closed.

Still decided outside the table (the ``if``-chains the driver keeps, for now):

* ``SessionLifecycle._connect``: attached already and still held (no move), kept here
  and clean start (ENDED) or not (resume here), else claim here;
* ``SessionLifecycle._claim_here``: clean start (no move: a new session) or resume; a
  stored session without expiry is not resumed; hold the copies when it comes from
  another node;
* ``SessionLifecycle._take_on``: back here while away, claimed (takeover count, notify
  the previous node, read back or reset the queue) or neither;
* ``SessionLifecycle._put_away``: no expiry ends the session (ENDED) instead;
* ``SessionLifecycle._on_taken_over``: resume with expiry hands on (MOVED_AWAY), else
  TAKEN_OVER;
* ``SessionKeeper.come_back``: a tail of a move here still being read (nothing drained),
  an unfinished resume to go on with, a tail to follow;
* ``SessionKeeper.put_away``: a will without delay is published first; a tail under way
  defers the spill; Redis refusing the away mark leaves the spiller to retry it;
* ``SessionKeeper.hand_off`` / ``_queue_handoff``: with a grace or not, the client back
  during the grace (``handing_off``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Final

from router.errors import SessionStateError


class SessionState(Enum):
    """Where a session is in its lifecycle (:mod:`router.cluster.sessions.states`)."""

    ATTACHING = "attaching"
    CONNECTED = "connected"
    AWAY = "away"
    LEAVING = "leaving"
    CLOSED = "closed"


class SessionEvent(Enum):
    """What happens to a session (see the module docstring for where each comes from)."""

    RESUME_CLAIMED = "resume_claimed"
    READ_BACK = "read_back"
    RESUME_FAILED = "resume_failed"
    ATTACH_FAILED = "attach_failed"
    ATTACHED = "attached"
    CONNECTION_ENDED = "connection_ended"
    ADOPTED = "adopted"
    MOVED_AWAY = "moved_away"
    HANDOFF_OPENED = "handoff_opened"
    HANDOFF_DONE = "handoff_done"
    TAKEN_OVER = "taken_over"
    ENDED = "ended"
    UNCLAIMED_DROPPED = "unclaimed_dropped"
    EXPIRED = "expired"
    NODE_STOPPED = "node_stopped"


class Effect(Enum):
    """What the driver must do for a move."""

    CLAIM = "claim"  # claim the session in Redis (taking it over from its node)
    RESTORE_ROUTES = "restore_routes"  # its stored subscriptions and routes, here
    READ_QUEUE_BACK = "read_queue_back"  # drain its Redis queue into it, ahead of newer copies
    KEEP_UNFINISHED = "keep_unfinished"  # keep what a failed read back got, for the retry
    MARK_OPEN = "mark_open"  # mark it connected in Redis
    PUBLISH_WILL = "publish_will"  # the will: now (no delay, or the session ends) or on its timer
    MARK_AWAY = "mark_away"  # mark it away in Redis (its keys expire with the interval)
    SPILL = "spill"  # its QoS 1/2 copies go to its Redis queue (the spiller)
    ARM_TIMERS = "arm_timers"  # the session's end and the will's delay
    STOP_AWAY = "stop_away"  # stop the away session's timers and spiller (settle)
    QUEUE_HANDOFF = "queue_handoff"  # what it holds, then the handoff marker, to its queue
    GATHER_TAIL = "gather_tail"  # gather the copies still routed here for the grace
    WRITE_TAIL_END = "write_tail_end"  # the grace's copies, then the tail end marker
    REMOVE_ROUTES = "remove_routes"  # its filters and routes go from this node
    REMOVE_STATE = "remove_state"  # its state goes from Redis (fenced by its claim)
    TELL_READER = "tell_reader"  # its reader (the connection) is told why it closed


@dataclass(frozen=True, slots=True)
class Move:
    """Where an event takes a session and what the driver does for it."""

    state: SessionState
    effects: tuple[Effect, ...] = ()


INITIAL: Final = SessionState.ATTACHING
"""The state of a session just opened."""

_S, _E, _F = SessionState, SessionEvent, Effect
_RESUME = (_F.RESTORE_ROUTES, _F.CLAIM)
_MOVED = (_F.STOP_AWAY, _F.QUEUE_HANDOFF, _F.TELL_READER)
_TAKEN = (_F.STOP_AWAY, _F.PUBLISH_WILL, _F.REMOVE_ROUTES, _F.TELL_READER)
_ENDED = (_F.STOP_AWAY, _F.PUBLISH_WILL, _F.REMOVE_ROUTES, _F.REMOVE_STATE, _F.TELL_READER)
_OPEN = (_S.ATTACHING, _S.CONNECTED, _S.AWAY, _S.LEAVING)  # every state but CLOSED


def _from_each(
    states: Iterable[SessionState], event: SessionEvent, move: Move
) -> dict[tuple[SessionState, SessionEvent], Move]:
    return {(state, event): move for state in states}


TABLE: Final[Mapping[tuple[SessionState, SessionEvent], Move]] = MappingProxyType(
    {
        (_S.ATTACHING, _E.RESUME_CLAIMED): Move(_S.ATTACHING, _RESUME),
        (_S.AWAY, _E.RESUME_CLAIMED): Move(_S.ATTACHING, _RESUME),
        (_S.LEAVING, _E.RESUME_CLAIMED): Move(_S.ATTACHING, _RESUME),
        (_S.ATTACHING, _E.READ_BACK): Move(_S.ATTACHING, (_F.READ_QUEUE_BACK,)),
        (_S.AWAY, _E.READ_BACK): Move(_S.ATTACHING, (_F.STOP_AWAY, _F.READ_QUEUE_BACK)),
        (_S.ATTACHING, _E.RESUME_FAILED): Move(_S.AWAY, (_F.KEEP_UNFINISHED,)),
        (_S.ATTACHING, _E.ATTACH_FAILED): Move(_S.AWAY),
        (_S.AWAY, _E.ATTACH_FAILED): Move(_S.AWAY),
        (_S.ATTACHING, _E.ATTACHED): Move(_S.CONNECTED, (_F.MARK_OPEN,)),
        (_S.CONNECTED, _E.CONNECTION_ENDED): Move(
            _S.AWAY, (_F.PUBLISH_WILL, _F.MARK_AWAY, _F.SPILL, _F.ARM_TIMERS)
        ),
        (_S.ATTACHING, _E.ADOPTED): Move(_S.AWAY, (_F.SPILL, _F.ARM_TIMERS)),
        (_S.ATTACHING, _E.HANDOFF_OPENED): Move(_S.LEAVING, (_F.GATHER_TAIL,)),
        **_from_each((_S.ATTACHING, _S.CONNECTED, _S.AWAY), _E.MOVED_AWAY, Move(_S.CLOSED, _MOVED)),
        (_S.LEAVING, _E.HANDOFF_DONE): Move(_S.CLOSED, (_F.WRITE_TAIL_END, _F.REMOVE_ROUTES)),
        **_from_each(_OPEN, _E.TAKEN_OVER, Move(_S.CLOSED, _TAKEN)),
        **_from_each(_OPEN, _E.ENDED, Move(_S.CLOSED, _ENDED)),
        **_from_each(_OPEN, _E.UNCLAIMED_DROPPED, Move(_S.CLOSED, (_F.REMOVE_ROUTES,))),
        (_S.AWAY, _E.EXPIRED): Move(_S.CLOSED, _ENDED[:-1]),
        **_from_each(_OPEN, _E.NODE_STOPPED, Move(_S.CLOSED, (_F.TELL_READER,))),
    }
)
"""Every allowed (state, event) and its :class:`Move` (the module docstring's table)."""

NEXT: Final[Mapping[tuple[SessionState, SessionEvent], SessionState]] = MappingProxyType(
    {key: move.state for key, move in TABLE.items()}
)
"""(state, event) -> the next state alone: the shadow check's one dict lookup."""


def next_move(state: SessionState, event: SessionEvent, client_id: str = "?") -> Move:
    """Where ``event`` takes a session in ``state``; :class:`SessionStateError` when the
    state does not allow it (``client_id`` names the session in the error)."""
    move = TABLE.get((state, event))
    if move is None:
        raise SessionStateError(
            f"session of {client_id!r} in {state.value} cannot take {event.value}"
        )
    return move


class SessionMachine:
    """One session's machine: its state, moved by :meth:`step`."""

    def __init__(self, client_id: str = "?", state: SessionState = INITIAL) -> None:
        self.client_id = client_id
        self.state = state

    def step(self, event: SessionEvent) -> tuple[Effect, ...]:
        """Take ``event``: move to its next state and return what the driver must do;
        :class:`SessionStateError` (and no move) when the state does not allow it."""
        move = next_move(self.state, event, self.client_id)
        self.state = move.state
        return move.effects
