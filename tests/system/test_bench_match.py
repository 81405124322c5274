"""``router bench match``: what its figures count and what it checks, on tiny workloads."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Set
from typing import Any

import pytest

from router.bench import hot, match, match_workloads
from router.errors import BenchDisagreementError

LONG = 1000


def test_memory_counts_the_filter_strings_each_structure_keeps() -> None:
    # Each filter has a distinct 1,000-byte level: the trie keeps the whole filter, paho
    # keeps the level. Strings the structure keeps alive belong to its figure, however
    # they were made before.
    subscriptions = [(f"c{i}", f"{i}/{'x' * LONG}") for i in range(40)]
    workload = match_workloads.MatchWorkload("long", subscriptions, [f for _, f in subscriptions])
    report = match.run_workload(workload, rounds=1)
    assert report["router_bytes_per_sub"] > LONG
    assert report["paho_bytes_per_sub"] > LONG


def test_every_topic_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = match_workloads.make_workload("devices", 300, 2500, seed=3)
    odd = "site/0/device/0/odd-one"  # published once, last
    workload = dataclasses.replace(workload, topics=[*workload.topics, odd])

    class WrongOnce(match.PahoPeer):
        def match(self, topic: str) -> Set[str]:
            answer = super().match(topic)
            return {*answer, "intruder"} if topic == odd else answer

    monkeypatch.setattr(match, "PahoPeer", WrongOnce)
    with pytest.raises(BenchDisagreementError, match="odd-one"):
        match.run_workload(workload, rounds=1)


def test_the_report_names_the_core_that_ran_and_the_workloads_asked_for() -> None:
    report = match.run(subscriptions=300, topics=200, rounds=1, hot_publishes=3000)
    assert report["core"] == "compiled"  # make test builds it: the figures are its
    assert list(report["workloads"]) == ["devices", "dashboards", "fanout", "deep", "hot"]
    chosen = match.run(300, 200, rounds=1, hot_publishes=3000, workloads=("large", "deep"))
    assert list(chosen["workloads"]) == ["large", "deep"]
    assert chosen["workloads"]["large"]["subscriptions"] == 3000


def test_ratios_are_cut_never_rounded() -> None:
    def timed(action: Callable[[], Any]) -> tuple[Any, float]:
        """The router takes 1 s, paho 1.4272 s, for every timed action."""
        result = action()
        target = action.args[0]  # a partial: of a maker (build) or a subject (match)
        is_router = target is match.RouterSubject or isinstance(target, match.RouterSubject)
        return result, 1.0 if is_router else 1.4272

    report = match.run_workload(
        match_workloads.make_workload("devices", 200, 100, seed=3), rounds=1, timer=timed
    )
    assert report["match_ratio"] == 1.42  # 1.4272 cut; rounded it would read 1.43


# -- hot ------------------------------------------------------------------------------------


def tiny_hot(**extra: Any) -> dict[str, Any]:
    return hot.run_hot(subscriptions=2000, publishes=6000, warmup=2000, segment=2000, **extra)


def test_hot_reports_paho_on_the_same_stream() -> None:
    result = tiny_hot()
    assert result["wrong_answers"] == 0
    assert result["paho_matches_per_s"] > 0
    exact = result["cached_matches_per_s"] / result["paho_matches_per_s"]
    assert 0 < result["vs_paho"] <= exact + 0.01
    assert result["vs_paho"] == pytest.approx(exact, abs=0.011)
    # The ceiling is gone: it paid costs the cache does not, so it bounded nothing.
    assert not [key for key in result if key.startswith("ceiling")]
    # What does bound any cache that learns from publishes: first publishes miss.
    assert result["hit_rate"] <= result["hit_rate_bound"] <= 1


def test_hot_checks_every_paho_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = hot.SharingPahoPeer
    calls = {"n": 0}

    class WrongOnce(peer):
        def match(self, topic: str) -> Set[str]:
            calls["n"] += 1
            answer = super().match(topic)
            return {*answer, "intruder"} if calls["n"] == 7000 else answer

    monkeypatch.setattr(hot, "SharingPahoPeer", WrongOnce)
    with pytest.raises(BenchDisagreementError, match="paho"):
        tiny_hot()
