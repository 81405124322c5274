"""Shared-subscription strategies."""

from __future__ import annotations

from collections import Counter

import pytest

from router import (
    HashClientStrategy,
    HashTopicStrategy,
    LocalFirstStrategy,
    RandomStrategy,
    RoundRobinStrategy,
    SubscriptionTrie,
    UnknownStrategyError,
    strategy_by_name,
)
from router.core.sharing import ShareGroup

MEMBERS = ["m0", "m1", "m2", "m3", "m4"]
# Upper 0.1% point of the chi-square distribution with 4 degrees of freedom.
CHI2_4_P001 = 18.467


def group() -> ShareGroup:
    return ShareGroup("$share/g/t", list(MEMBERS))


def test_round_robin_cycles_exactly() -> None:
    strategy, shared = RoundRobinStrategy(), group()
    picks = [strategy.choose(shared, "t", None) for _ in range(3 * len(MEMBERS))]
    assert picks == MEMBERS * 3


def test_random_is_uniform_by_chi_square() -> None:
    strategy, shared = RandomStrategy(seed=1234), group()
    draws = 50_000
    counts = Counter(strategy.choose(shared, "t", None) for _ in range(draws))
    expected = draws / len(MEMBERS)
    chi2 = sum((counts[m] - expected) ** 2 / expected for m in MEMBERS)
    assert chi2 < CHI2_4_P001, counts


def test_random_is_not_constant() -> None:
    strategy, shared = RandomStrategy(seed=1), group()
    assert len({strategy.choose(shared, "t", None) for _ in range(200)}) == len(MEMBERS)


def test_hash_client_is_stable_per_publisher_and_spreads() -> None:
    strategy, shared = HashClientStrategy(seed=1), group()
    first = {p: strategy.choose(shared, "t", p) for p in (f"pub-{i}" for i in range(100))}
    again = {p: strategy.choose(shared, f"other/{p}", p) for p in first}
    assert first == again
    assert len(set(first.values())) == len(MEMBERS)


def test_hash_topic_is_stable_per_topic_and_across_member_order() -> None:
    strategy = HashTopicStrategy()
    shuffled = ShareGroup("$share/g/t", sorted(MEMBERS))
    picks = {t: strategy.choose(group(), t, None) for t in (f"t/{i}" for i in range(100))}
    assert picks == {t: strategy.choose(shuffled, t, "anyone") for t in picks}
    assert len(set(picks.values())) == len(MEMBERS)


def test_local_first_prefers_local_members() -> None:
    strategy = LocalFirstStrategy(lambda member: member in {"m1", "m3"}, seed=3)
    picks = {strategy.choose(group(), "t", None) for _ in range(100)}
    assert picks == {"m1", "m3"}
    nobody_local = LocalFirstStrategy(lambda member: False, RoundRobinStrategy())
    shared = group()
    assert [nobody_local.choose(shared, "t", None) for _ in range(3)] == ["m0", "m1", "m2"]


def test_strategies_by_name() -> None:
    assert isinstance(strategy_by_name("round_robin"), RoundRobinStrategy)
    assert isinstance(strategy_by_name("random", seed=1), RandomStrategy)
    assert isinstance(strategy_by_name("hash_client"), HashClientStrategy)
    assert isinstance(strategy_by_name("hash_topic"), HashTopicStrategy)
    with pytest.raises(UnknownStrategyError):
        strategy_by_name("sticky-ish")


def test_hash_client_in_a_trie_uses_the_publisher() -> None:
    trie = SubscriptionTrie(strategy=HashClientStrategy())
    for member in MEMBERS:
        trie.subscribe(member, "$share/g/data/#")
    assert len(set().union(*(trie.match(f"data/{i}", publisher="p-7") for i in range(50)))) == 1
