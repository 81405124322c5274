"""The session machine (router.core.session_machine): its table pair by pair, the table
its docstring draws, and random event sequences on the pure machine alone."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from router.core import session_machine
from router.core.session_machine import (
    INITIAL,
    NEXT,
    TABLE,
    Effect,
    SessionEvent,
    SessionMachine,
    SessionState,
    next_move,
)
from router.errors import SessionStateError

S, E, F = SessionState, SessionEvent, Effect
OPEN = (S.ATTACHING, S.CONNECTED, S.AWAY, S.LEAVING)

#: The documented next state of every allowed (state, event); any other pair is refused.
EXPECTED: dict[tuple[SessionState, SessionEvent], SessionState] = {
    (S.ATTACHING, E.RESUME_CLAIMED): S.ATTACHING,
    (S.AWAY, E.RESUME_CLAIMED): S.ATTACHING,
    (S.LEAVING, E.RESUME_CLAIMED): S.ATTACHING,
    (S.ATTACHING, E.READ_BACK): S.ATTACHING,
    (S.AWAY, E.READ_BACK): S.ATTACHING,
    (S.ATTACHING, E.RESUME_FAILED): S.AWAY,
    (S.ATTACHING, E.ATTACH_FAILED): S.AWAY,
    (S.AWAY, E.ATTACH_FAILED): S.AWAY,
    (S.ATTACHING, E.ATTACHED): S.CONNECTED,
    (S.CONNECTED, E.CONNECTION_ENDED): S.AWAY,
    (S.ATTACHING, E.ADOPTED): S.AWAY,
    (S.ATTACHING, E.HANDOFF_OPENED): S.LEAVING,
    (S.ATTACHING, E.MOVED_AWAY): S.CLOSED,
    (S.CONNECTED, E.MOVED_AWAY): S.CLOSED,
    (S.AWAY, E.MOVED_AWAY): S.CLOSED,
    (S.LEAVING, E.HANDOFF_DONE): S.CLOSED,
    (S.AWAY, E.EXPIRED): S.CLOSED,
    **{(state, E.TAKEN_OVER): S.CLOSED for state in OPEN},
    **{(state, E.ENDED): S.CLOSED for state in OPEN},
    **{(state, E.UNCLAIMED_DROPPED): S.CLOSED for state in OPEN},
    **{(state, E.NODE_STOPPED): S.CLOSED for state in OPEN},
}


@pytest.mark.parametrize(
    ("state", "event"), list(itertools.product(S, E)), ids=lambda x: x.name.lower()
)
def test_every_pair_moves_as_documented_or_is_refused(
    state: SessionState, event: SessionEvent
) -> None:
    machine = SessionMachine("c", state)
    if (state, event) in EXPECTED:
        assert machine.step(event) == TABLE[state, event].effects
        assert machine.state is EXPECTED[state, event] is NEXT[state, event]
    else:
        with pytest.raises(SessionStateError, match=f"{state.value} cannot take {event.value}"):
            machine.step(event)
        assert machine.state is state  # (a refused event moves nothing)
        assert (state, event) not in NEXT


def test_the_table_holds_the_documented_pairs_only() -> None:
    assert set(TABLE) == set(EXPECTED)


def test_the_effects_say_what_the_driver_does() -> None:
    assert next_move(S.CONNECTED, E.CONNECTION_ENDED).effects == (
        F.PUBLISH_WILL,
        F.MARK_AWAY,
        F.SPILL,
        F.ARM_TIMERS,
    )
    assert next_move(S.ATTACHING, E.ATTACHED).effects == (F.MARK_OPEN,)
    assert next_move(S.AWAY, E.READ_BACK).effects == (F.STOP_AWAY, F.READ_QUEUE_BACK)
    assert F.QUEUE_HANDOFF in next_move(S.CONNECTED, E.MOVED_AWAY).effects
    assert F.REMOVE_STATE in next_move(S.AWAY, E.EXPIRED).effects
    assert F.REMOVE_STATE not in next_move(S.CONNECTED, E.TAKEN_OVER).effects
    assert next_move(S.ATTACHING, E.ATTACH_FAILED).effects == ()


def documented_rows() -> set[tuple[SessionState, SessionEvent, SessionState]]:
    """(state, event, next) of each row of the table the module docstring draws."""
    doc = session_machine.__doc__
    assert doc is not None
    found = set()
    for line in doc.splitlines():
        words = line.replace("any but", "any").split()  # (any but CLOSED)
        if len(words) < 3 or words[0] not in {*S.__members__, "any"}:
            continue
        if words[1] not in E.__members__:  # (an effect continued on the next line)
            continue
        states = OPEN if words[0] == "any" else (S[words[0]],)
        found |= {(state, E[words[1]], S[words[2]]) for state in states}
    return found


def test_the_docstring_draws_the_table() -> None:
    assert documented_rows() == {
        (state, event, move.state) for (state, event), move in TABLE.items()
    }


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(list(E)), max_size=40))
def test_random_event_sequences_keep_the_lifecycle_rules(events: list[SessionEvent]) -> None:
    """Whatever happens to a session: a refused event moves nothing; CLOSED is final;
    CONNECTED only by ATTACHED from ATTACHING; only a move to AWAY spills (a connected
    client's copies never go to the away queue), only ATTACHED marks it open; the copy
    that gathers a handoff's grace (LEAVING) is opened so, and only comes back or ends; every
    open state can end."""
    machine = SessionMachine("c")
    assert machine.state is INITIAL is S.ATTACHING
    for event in events:
        before = machine.state
        try:
            effects = machine.step(event)
        except SessionStateError:
            assert machine.state is before
            assert before is S.CLOSED or (before, event) not in TABLE
            continue
        after = machine.state
        assert before is not S.CLOSED
        if after is S.CONNECTED and before is not S.CONNECTED:
            assert (before, event) == (S.ATTACHING, E.ATTACHED)
        assert (F.SPILL in effects) <= (after is S.AWAY and before is not S.AWAY)
        assert (F.MARK_OPEN in effects) == (event is E.ATTACHED)
        if after is S.LEAVING:
            assert (before, event) == (S.ATTACHING, E.HANDOFF_OPENED)
        if before is S.LEAVING:  # (the gatherer never spills, nor attaches a client)
            assert after in (S.ATTACHING, S.CLOSED)
        if after is not S.CLOSED:
            assert NEXT[after, E.ENDED] is S.CLOSED
    if machine.state is S.CLOSED:
        assert all((S.CLOSED, event) not in TABLE for event in E)
