"""The verdicts on peers (router.core.peer_verdicts), driven sample by sample: no Redis, no clock.

Each sample is one listing of the registry as :class:`NodeInfo` rows judged at one Redis
time; the driver's part (leases won, adoptions ended) is played by the test."""

from __future__ import annotations

import time

import pytest

from router.core.peer_verdicts import (
    EXPIRY_MARGIN,
    LEASE_INTERVALS,
    Beat,
    PeerVerdicts,
    Round,
)
from router.state.node_registry import NodeInfo

NOW = 5_000  # Redis time of the samples, ms (1970: nothing here is the wall clock)
INTERVAL = 1.0


def beat(node_id: str, expires_in_ms: int, *, retired: bool = False, inc: str = "") -> NodeInfo:
    """``node_id`` as the registry lists it at ``NOW``, its heartbeat expiring in
    ``expires_in_ms`` (negative: expired)."""
    return NodeInfo(node_id, inc or f"i{node_id}", NOW + expires_in_ms, NOW, retired=retired)


def judge(
    verdicts: PeerVerdicts,
    *nodes: NodeInfo,
    may_purge: bool = True,
    may_adopt_retired: bool = True,
) -> Round:
    return verdicts.judge(nodes, may_purge=may_purge, may_adopt_retired=may_adopt_retired)


def ids(nodes: tuple[Beat, ...]) -> list[str]:
    return [node.node_id for node in nodes]


def test_a_peer_alive_is_left_alone_and_its_expiry_sets_the_pause() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    round_ = judge(verdicts, beat("a", 3_000), beat("b", 400))
    assert round_.alive == {"a", "b"} and round_.dead == frozenset()
    assert (round_.told_down, round_.purge, round_.adopt) == ((), (), ())
    assert round_.next_expiry == pytest.approx(0.4)  # (b's, not this node's own)
    assert verdicts.pause() == pytest.approx(0.4 + EXPIRY_MARGIN)


def test_the_pause_is_an_interval_unless_a_peer_expires_sooner() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    assert verdicts.pause() == INTERVAL  # (before the first round)
    judge(verdicts, beat("a", 100))
    assert verdicts.pause() == INTERVAL  # (alone: its own expiry is not waited for)
    judge(verdicts, beat("a", 3_000), beat("b", 2_500))
    assert verdicts.pause() == INTERVAL
    judge(verdicts, beat("a", 3_000), beat("b", 0))
    assert verdicts.pause() == INTERVAL  # (b expired: not alive, so not waited for)
    judge(verdicts, beat("a", 3_000), beat("b", 1), beat("c", 700))
    assert verdicts.pause() == pytest.approx(0.001 + EXPIRY_MARGIN)


def test_a_peer_expired_is_told_down_once_and_adopted_under_a_lease() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    first = judge(verdicts, beat("a", 3_000), beat("b", -1))
    assert first.alive == {"a"} and first.dead == {"b"} and first.retired == frozenset()
    assert ids(first.told_down) == ["b"] and ids(first.adopt) == ["b"] and first.purge == ()
    assert verdicts.lease == LEASE_INTERVALS * INTERVAL
    again = judge(verdicts, beat("a", 3_000), beat("b", -1_001))
    assert again.told_down == ()  # (once per incarnation)
    assert ids(again.adopt) == ["b"]  # (no lease won yet: asked again)
    restarted = judge(verdicts, beat("a", 3_000), beat("b", -1, inc="ib2"))
    assert ids(restarted.told_down) == ["b"]  # (a new incarnation died)


def test_an_expiry_at_the_very_millisecond_is_dead() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    assert judge(verdicts, beat("b", 0)).dead == {"b"}
    assert judge(verdicts, beat("b", 1)).alive == {"b"}


def test_a_node_that_is_not_steady_tells_but_takes_no_expired_peer() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    round_ = judge(verdicts, beat("b", -1), may_purge=False)
    assert round_.dead == {"b"} and ids(round_.told_down) == ["b"]
    assert (round_.purge, round_.adopt) == ((), ())
    later = judge(verdicts, beat("b", -1), may_purge=True)  # (steady again)
    assert ids(later.adopt) == ["b"] and later.told_down == ()


def test_a_retired_peer_is_never_told_down_and_is_adopted_at_once() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    # (retired: its heartbeat may not even have expired; the node is not steady yet)
    round_ = judge(verdicts, beat("b", 2_000, retired=True), may_purge=False)
    assert round_.dead == {"b"} and round_.retired == {"b"} and round_.alive == frozenset()
    assert round_.told_down == ()
    assert ids(round_.adopt) == ["b"]
    stopping = judge(verdicts, beat("b", -1, retired=True), may_adopt_retired=False)
    assert stopping.adopt == () and stopping.told_down == ()  # (the node stops: left alone)


def test_a_node_that_adopts_no_sessions_purges_without_adopting() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=False)
    round_ = judge(verdicts, beat("a", 3_000), beat("b", -1), beat("c", -1, retired=True))
    assert ids(round_.purge) == ["b", "c"] and round_.adopt == ()
    assert ids(round_.told_down) == ["b"]
    unsteady = judge(verdicts, beat("b", -1), beat("c", -1, retired=True), may_purge=False)
    assert ids(unsteady.purge) == ["c"]
    assert ids(judge(verdicts, beat("b", -1)).purge) == ["b"]  # (purges are idempotent)


def test_a_peer_whose_lease_another_node_holds_is_asked_for_each_round() -> None:
    """The lease is asked for in Redis by the driver; while another node holds it, the
    ask fails and nothing is recorded: every round offers the dead node again (should the
    holder die, its lease runs out and this node's ask wins)."""
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    for _ in range(3):  # (another node holds b's lease: the driver's ask fails each time)
        assert ids(judge(verdicts, beat("b", -1)).adopt) == ["b"]
    verdicts.lease_won("b")  # (the holder died, its lease ran out: this node's ask won)
    assert verdicts.adopting == {"b"}
    during = judge(verdicts, beat("b", -1), beat("c", -1))
    assert ids(during.adopt) == ["c"]  # (b adopted under way, under this node's lease)
    verdicts.adoption_ended("b")  # (it failed: b is still registered)
    assert verdicts.adopting == frozenset()
    assert ids(judge(verdicts, beat("b", -1)).adopt) == ["b"]


def test_after_an_adoption_the_node_purges_only_what_it_may_still_take() -> None:
    expired, retired = beat("b", -1), beat("c", -1, retired=True)
    take = PeerVerdicts.may_take
    assert take(expired, may_purge=True, may_adopt_retired=False)
    assert not take(expired, may_purge=False, may_adopt_retired=True)
    assert take(retired, may_purge=False, may_adopt_retired=True)
    assert not take(retired, may_purge=True, may_adopt_retired=False)


def test_this_node_is_never_told_down_by_itself() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    round_ = judge(verdicts, beat("a", -1), beat("b", 3_000))
    assert round_.dead == {"a"} and round_.told_down == ()


def test_the_verdicts_follow_redis_time_and_read_no_local_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_clock() -> float:
        raise AssertionError("a verdict read the local clock")

    for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, name, no_clock)
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    # Redis says 1970 and b alive; the wall clock (2026) would have it long expired.
    round_ = judge(verdicts, beat("a", 3_000), beat("b", 500))
    assert round_.alive == {"a", "b"} and verdicts.pause() == pytest.approx(0.5 + EXPIRY_MARGIN)
    # A row judged at a later Redis time finds it expired, whatever this machine's clock.
    late = NodeInfo("b", "ib", NOW + 500, NOW + 501)
    assert judge(verdicts, late).dead == {"b"}


def test_the_registry_rows_agree_with_the_verdicts() -> None:
    verdicts = PeerVerdicts("a", INTERVAL, adopts=True)
    rows = [beat("b", 1), beat("c", 0), beat("d", 9, retired=True), beat("e", -9)]
    round_ = judge(verdicts, *rows)
    assert round_.alive == {row.node_id for row in rows if row.alive}
    assert round_.dead == {row.node_id for row in rows if not row.alive}
