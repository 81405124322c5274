"""The session lifecycle as a state machine (router.cluster.sessions.states): the moves a
session may make, the states a node's operations leave it in, on real Redis and the
3-master cluster, and the rule that only an AWAY session's copies go to its Redis queue.
"""

from __future__ import annotations

from collections import Counter

import pytest

from router.cluster.sessions import states
from router.cluster.sessions.local_sessions import ClientSession
from router.cluster.sessions.states import TRANSITIONS, SessionEvent, SessionState, check_move
from router.core.session_machine import NEXT
from router.errors import SessionStateError
from tests.support import waiting
from tests.support.nodes import StartNode

S = SessionState
E = SessionEvent
#: An event that takes a session to each state (the refused moves are refused before the
#: session machine's shadow check: router.core.session_machine).
TO = {
    S.ATTACHING: E.READ_BACK,
    S.CONNECTED: E.ATTACHED,
    S.AWAY: E.ATTACH_FAILED,
    S.LEAVING: E.HANDOFF_OPENED,
    S.CLOSED: E.ENDED,
}


def session_in(*path: SessionState) -> ClientSession:
    session = ClientSession("c", 10, "drop_oldest")
    for state in path:
        session.move_to(state, TO[state])
    return session


def test_every_state_can_end_and_an_ended_session_stays_ended() -> None:
    assert all(S.CLOSED in TRANSITIONS[state] for state in S if state is not S.CLOSED)
    assert TRANSITIONS[S.CLOSED] == frozenset()
    assert session_in().state is S.ATTACHING


def test_every_move_of_the_session_machine_is_one_the_lifecycle_allows() -> None:
    for (state, _event), target in NEXT.items():
        check_move("c", state, target)


def test_a_move_the_machine_would_not_make_raises_under_the_tests_and_is_counted_else(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(states, "_tally", Counter())
    session = session_in(S.CONNECTED)
    with pytest.raises(SessionStateError, match="connected \\+ attach_failed -> away"):
        session.move_to(S.AWAY, E.ATTACH_FAILED)  # (the machine: refused)
    assert session.state is S.CONNECTED and states.disagreements() == 1

    monkeypatch.setattr(states, "strict", False)  # (production: the move goes on)
    session.move_to(S.AWAY, E.ATTACH_FAILED)
    session.move_to(S.CLOSED, E.HANDOFF_DONE)  # (the machine: HANDOFF_DONE ends LEAVING only)
    assert session.state is S.CLOSED and states.disagreements() == 3
    assert [r.levelname for r in caplog.records if "disagrees" in r.message] == ["ERROR"]
    session_in(S.AWAY).move_to(S.ATTACHING, E.READ_BACK)  # (agreed: not counted)
    assert states.disagreements() == 3


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ((S.CONNECTED,), S.ATTACHING),  # a connected session is never reset under its client
        ((S.CONNECTED,), S.LEAVING),  # a handed on session is a new one (hand_on)
        ((S.AWAY,), S.CONNECTED),  # an away session is resumed (ATTACHING) first
        ((S.LEAVING,), S.AWAY),  # the grace's gatherer never spills as an away session
        ((S.CLOSED,), S.CONNECTED),
        ((S.CLOSED,), S.ATTACHING),
    ],
)
def test_a_move_the_lifecycle_does_not_allow_is_refused_and_changes_nothing(
    path: tuple[SessionState, ...], target: SessionState
) -> None:
    session = session_in(*path)
    with pytest.raises(SessionStateError):
        session.move_to(target, TO[target])
    assert session.state is path[-1]


pytestmark_backends = pytest.mark.parametrize(
    "redis_backend", ["standalone", "cluster"], indirect=True
)


@pytestmark_backends
async def test_connect_away_back_move_and_end_leave_the_states_the_lifecycle_names(
    start_node: StartNode,
) -> None:
    b = await start_node("b", handoff_grace=0.5)
    c = await start_node("c")
    await b.connect("roamer", clean_start=False, expiry=600)
    await b.subscribe("roamer", "news", qos=1)
    first = b.sessions.session("roamer")
    assert first.state is S.CONNECTED

    await b.put_away("roamer")
    assert first.state is S.AWAY
    assert await b.connect("roamer", clean_start=False, expiry=600)
    assert b.sessions.session("roamer") is first and first.state is S.CONNECTED

    assert await c.connect("roamer", clean_start=False, expiry=600)  # taken over by c
    assert c.sessions.session("roamer").state is S.CONNECTED
    await waiting.eventually(lambda: first.state is S.CLOSED, 5, "b closed its session")
    assert first.close_reason == "takenover"
    await waiting.eventually(
        lambda: b.sessions.find("roamer") is None, 5, "b's grace ended and its gatherer went"
    )

    ending = c.sessions.session("roamer")
    await c.disconnect("roamer")
    assert ending.state is S.CLOSED and c.sessions.find("roamer") is None


@pytestmark_backends
async def test_an_away_sessions_copies_go_to_its_redis_queue_only_while_it_is_away(
    start_node: StartNode,
) -> None:
    """Were a session to stop being AWAY without its spiller stopped first (a lifecycle
    defect), the spiller gives back what it took and ends: a client attached meanwhile
    would get it, and it is never queued in Redis behind the client's back."""
    node = await start_node("a")
    await node.connect("roamer", clean_start=False, expiry=600)
    await node.subscribe("roamer", "news", qos=1)
    await node.put_away("roamer")
    session = node.sessions.session("roamer")
    spiller = node._keeper._away["roamer"].spiller
    assert spiller is not None
    queued = node.stats()["session_queued"]

    session.move_to(S.ATTACHING, E.READ_BACK)  # (no settle: the spiller still runs)
    await node.publish("news", b"kept here", qos=1)

    await waiting.eventually(spiller.done, 5, "the spiller ended")
    assert [d.payload for d in session.take_all()] == [b"kept here"]
    assert node.stats()["session_queued"] == queued


async def test_an_away_session_whose_interval_passes_ends_as_expired(
    start_node: StartNode,
) -> None:
    """The move the session machine calls EXPIRED (AWAY -> CLOSED), made by the node's
    timer on its own, agrees with the machine (the shadow check raises under the tests)."""
    node = await start_node("a")
    await node.connect("brief", clean_start=False, expiry=1)
    await node.subscribe("brief", "news", qos=1)
    await node.put_away("brief")
    session = node.sessions.session("brief")
    assert session.state is S.AWAY

    await waiting.eventually(lambda: session.state is S.CLOSED, 5, "its interval passed")
    assert session.close_reason == "expired" and node.sessions.find("brief") is None
    assert node.stats()["sessions_expired"] == 1
    assert node.stats()["session_machine_disagreements"] == 0
