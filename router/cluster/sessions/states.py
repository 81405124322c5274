"""The states of a session on a node, and the moves between them.

Every local session (:class:`~router.cluster.sessions.local_sessions.ClientSession`) is in one
state, and changes it only along :data:`TRANSITIONS`; any other move raises
:class:`~router.errors.SessionStateError` (a defect of the node, never of a client).

========== ==========================================================================
ATTACHING  the node is attaching a client: a new session, or a resume reading back what
           was queued for it (here, or handed on by its previous node). Copies wait in
           memory, held behind the older ones still on their way.
CONNECTED  a client is attached; its copies go to it.
AWAY       no client, a persistent session: its QoS 1/2 copies go to its Redis queue
           (the spiller runs in this state only), its expiry timer runs. An adopted
           session (its node died) is one the node resumed itself and put away.
LEAVING    another node resumed the session: this one gathers, for the handoff's
           grace, the copies still routed here and queues them behind the handoff.
CLOSED     ended (disconnect, clean start, expiry, takeover, grace over): nothing is
           queued to it any more.
========== ==========================================================================

How the lifecycle (:mod:`router.cluster.sessions.lifecycle`) moves them:

* connect: ATTACHING -> CONNECTED; a resume of a session kept here (AWAY, or LEAVING
  when its client came back within the grace) goes through ATTACHING again;
* a resume that Redis fails half-way: ATTACHING -> AWAY (the retry goes on from there);
* connection ends, session kept: CONNECTED -> AWAY; an adoption: ATTACHING ->
  CONNECTED -> AWAY under the node's lock for that client, with no client in between;
* taken over by another node: the session is CLOSED (its reader told ``takenover``) and
  a new one takes its place for the grace (opened, ATTACHING -> LEAVING);
* every end: -> CLOSED.

A connected client's copies never go to the away queue: only AWAY spills.

Each move names its event (:class:`~router.core.session_machine.SessionEvent`), and
:func:`shadow` checks that the session machine (:mod:`router.core.session_machine`, the
table that is to decide these moves) makes the same one: its shadow mode, until it drives.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Final

from router.core.session_machine import NEXT, SessionEvent, SessionState
from router.errors import SessionStateError

__all__ = ["TRANSITIONS", "SessionEvent", "SessionState", "check_move", "disagreements", "shadow"]

log = logging.getLogger(__name__)

#: Raise at a disagreement of the machine (:func:`shadow`) instead of counting it: the
#: tests set it (``tests/conftest.py``, or ``ROUTER_SESSION_MACHINE_STRICT=1`` for the
#: nodes they start in processes of their own).
strict = os.environ.get("ROUTER_SESSION_MACHINE_STRICT") == "1"
_tally: Counter[str] = Counter()  # (disagreements of this process)


_S = SessionState
TRANSITIONS: Final[dict[SessionState, frozenset[SessionState]]] = {
    _S.ATTACHING: frozenset({_S.CONNECTED, _S.AWAY, _S.LEAVING, _S.CLOSED}),
    _S.CONNECTED: frozenset({_S.AWAY, _S.CLOSED}),
    _S.AWAY: frozenset({_S.ATTACHING, _S.CLOSED}),
    _S.LEAVING: frozenset({_S.ATTACHING, _S.CLOSED}),
    _S.CLOSED: frozenset(),
}
"""The moves a session may make: state -> the states it may go to next (staying in a
state is no move)."""


def check_move(client_id: str, current: SessionState, target: SessionState) -> None:
    """Raise :class:`SessionStateError` unless ``current`` may go to ``target``."""
    if target is not current and target not in TRANSITIONS[current]:
        raise SessionStateError(
            f"session of {client_id!r} cannot go from {current.value} to {target.value}"
        )


def shadow(
    client_id: str, current: SessionState, event: SessionEvent, target: SessionState
) -> None:
    """The session machine's shadow check (:mod:`router.core.session_machine`): the
    lifecycle moves a session from ``current`` to ``target`` for ``event``; the machine
    must send it to the same state. A disagreement is counted (:func:`disagreements`)
    and logged at ERROR the first time; under :data:`strict` it raises
    :class:`SessionStateError` too, else the move goes on as the lifecycle chose."""
    chosen = NEXT.get((current, event))
    if chosen is target:
        return
    message = (
        f"session machine disagrees for {client_id!r}: {current.value} + {event.value} -> "
        f"{target.value} by the lifecycle, "
        f"{'refused' if chosen is None else chosen.value} by the machine"
    )
    _tally["disagreements"] += 1
    if _tally["disagreements"] == 1:
        log.error("%s (counted as session_machine_disagreements, logged once)", message)
    if strict:
        raise SessionStateError(message)


def disagreements() -> int:
    """The shadow check's disagreements in this process since it started."""
    return _tally["disagreements"]
