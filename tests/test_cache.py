"""The hot-topic match cache: always the trie's answer, and exactly the right invalidations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.bench.hot import run_hot
from router.cache import CachedMatcher
from router.errors import InvalidSettingError, InvalidTopicError, RouterError
from router.sharing import (
    HashClientStrategy,
    HashTopicStrategy,
    RoundRobinStrategy,
    ShareStrategy,
)
from router.trie import SubscriptionTrie


def eager(strategy: ShareStrategy | None = None, **settings_: Any) -> CachedMatcher:
    """A matcher that caches a topic from its second publish on, cost not considered."""
    options: dict[str, Any] = {
        "create_threshold": 2.0,
        "drop_threshold": 0.5,
        "min_cost_ns": 0,
        "period": 1000,
    }
    options.update(settings_)
    return CachedMatcher(strategy or HashTopicStrategy(), **options)


def warm(matcher: CachedMatcher, *topics: str) -> None:
    for topic in topics:
        while not matcher.is_cached(topic):
            matcher.match(topic)


# -- the property: a cached answer is always the full trie's answer ------------------------

CLIENTS = [f"c{i}" for i in range(5)]
LEVELS = ["a", "b", "", "$x"]
TOPICS = ["a", "a/b", "b/a", "a/b/a", "$x/a", "a/", "/a"]
topic_names = st.sampled_from(TOPICS)


@st.composite
def filters(draw: st.DrawFn) -> str:
    """Plain and shared filters, mostly made from the topics published, with wildcards."""
    if draw(st.booleans()):
        levels = draw(topic_names).split("/")
        if draw(st.booleans()):
            levels[draw(st.integers(0, len(levels) - 1))] = "+"
        cut = draw(st.integers(0, len(levels)))
        if cut < len(levels) or draw(st.booleans()):
            levels = [*levels[:cut], "#"]
    else:
        levels = draw(st.lists(st.sampled_from([*LEVELS, "+"]), min_size=0, max_size=3))
        if draw(st.booleans()) or not levels or levels == [""]:
            levels.append("#")
    text = "/".join(levels)
    if draw(st.integers(0, 3)) == 0:
        text = f"$share/{draw(st.sampled_from(['g1', 'g2']))}/{text}"
    return text


operation = st.one_of(
    st.tuples(st.just("sub"), st.sampled_from(CLIENTS), filters(), st.integers(0, 2)),
    st.tuples(st.just("unsub"), st.sampled_from(CLIENTS), filters()),
    st.tuples(st.just("remove"), st.sampled_from(CLIENTS)),
    st.tuples(st.just("pub"), topic_names, st.one_of(st.none(), st.sampled_from(CLIENTS))),
    st.tuples(st.just("pub"), topic_names, st.none()),
    st.tuples(st.just("pub"), topic_names, st.none()),
)

STRATEGIES: dict[str, Callable[[], ShareStrategy]] = {
    "hash_topic": HashTopicStrategy,
    "round_robin": RoundRobinStrategy,
    "hash_client": lambda: HashClientStrategy(seed=3),
}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(operation, max_size=80),
    st.sampled_from(sorted(STRATEGIES)),
    st.integers(1, 5),  # capacity
    st.integers(3, 40),  # period
    st.sampled_from([1.0, 2.0, 3.0]),  # create threshold
)
def test_cached_answers_equal_a_full_trie_match(
    ops: list[tuple[Any, ...]], strategy: str, capacity: int, period: int, create: float
) -> None:
    make = STRATEGIES[strategy]
    cached = CachedMatcher(
        make(),
        capacity=capacity,
        period=period,
        create_threshold=create,
        drop_threshold=0.5,
        min_cost_ns=0,
    )
    plain = SubscriptionTrie(make())
    for op in ops:
        if op[0] == "sub":
            _, client_id, topic_filter, qos = op
            no_local = False
            assert cached.subscribe(client_id, topic_filter, qos=qos, no_local=no_local) == (
                plain.subscribe(client_id, topic_filter, qos=qos, no_local=no_local)
            )
        elif op[0] == "unsub":
            assert cached.unsubscribe(op[1], op[2]) == plain.unsubscribe(op[1], op[2])
        elif op[0] == "remove":
            assert cached.remove_client(op[1]) == plain.remove_client(op[1])
        else:
            _, topic, publisher = op
            assert cached.match(topic, publisher) == plain.match(topic, publisher), op
            continue
        # Right after a change, every cached answer must already be right.
        for topic in cached.cached_topics():
            assert cached.match(topic) == plain.match(topic), (op, topic)
        assert len(cached.cached_topics()) <= capacity
    # Every topic once more: cached or not, the same answer.
    for topic in TOPICS:
        assert cached.match(topic) == plain.match(topic)
    stats = cached.stats()
    assert stats.hits + stats.misses == stats.publishes


def test_the_cache_is_used() -> None:
    cached, plain = eager(), SubscriptionTrie(HashTopicStrategy())
    for target in (cached, plain):
        target.subscribe("c1", "a/+")
        target.subscribe("c2", "a/b")
        target.subscribe("c3", "$share/g/a/#")
        target.subscribe("c4", "$share/g/a/#")
    for _ in range(100):
        assert cached.match("a/b") == plain.match("a/b")
    stats = cached.stats()
    assert stats.hits == 98  # the first publish counts, the second builds the answer
    assert stats.builds == 1
    assert cached.is_cached("a/b")
    assert cached.cached_topics() == ["a/b"]


def test_round_robin_turns_are_shared_between_hits_and_misses() -> None:
    cached = eager(RoundRobinStrategy())
    for client in ("m1", "m2", "m3"):
        cached.subscribe(client, "$share/g/t/+")
    # t/1 becomes hot; t/2 stays cold (never cached, one publish a pass) but uses the
    # same group: the turns continue across both.
    seen = [cached.match(topic)[0] for topic in ["t/1", "t/1", "t/1", "t/2", "t/1", "t/1"]]
    assert seen == ["m1", "m2", "m3", "m1", "m2", "m3"]
    assert cached.is_cached("t/1") and not cached.is_cached("t/2")


# -- invalidation touches exactly the topics the filter matches ---------------------------


def matcher_with_hot_topics() -> CachedMatcher:
    matcher = eager()
    matcher.subscribe("base", "#")
    matcher.subscribe("sys", "$SYS/#")
    warm(matcher, "a/1", "a/2", "b/1", "$SYS/x")
    assert matcher.cached_topics() == ["$SYS/x", "a/1", "a/2", "b/1"]
    return matcher


def test_a_plain_subscribe_updates_exactly_the_matched_topics() -> None:
    matcher = matcher_with_hot_topics()
    matcher.subscribe("new", "a/+")
    stats = matcher.stats()
    assert stats.updates == 2
    assert stats.invalidations == 0
    assert all(matcher.is_cached(t) for t in ("a/1", "a/2", "b/1", "$SYS/x"))
    assert matcher.match("a/1") == ["base", "new"]
    assert matcher.match("b/1") == ["base"]
    builds = matcher.stats().builds
    matcher.subscribe("wide", "+/#")  # first-level wildcards skip '$SYS/x'
    assert matcher.stats().updates == 5
    assert matcher.match("$SYS/x") == ["sys"]
    assert matcher.match("b/1") == ["base", "wide"]
    assert matcher.stats().builds == builds  # nothing was recomputed


def test_an_exact_subscribe_updates_one_topic() -> None:
    matcher = matcher_with_hot_topics()
    matcher.subscribe("one", "a/2")
    assert matcher.stats().updates == 1
    assert matcher.match("a/2") == ["base", "one"]
    assert matcher.match("a/1") == ["base"]


def test_options_changes_do_not_touch_answers() -> None:
    matcher = matcher_with_hot_topics()
    version = matcher.version
    assert matcher.subscribe("base", "#", qos=1) is False
    assert matcher.version == version + 1
    assert matcher.stats().updates == 0


def test_unsubscribe_rechecks_the_clients_other_filters() -> None:
    matcher = matcher_with_hot_topics()
    matcher.subscribe("x", "a/+")
    matcher.subscribe("x", "a/1")
    matcher.unsubscribe("x", "a/+")
    assert matcher.match("a/1") == ["base", "x"]  # still there through a/1
    assert matcher.match("a/2") == ["base"]
    assert all(matcher.is_cached(t) for t in ("a/1", "a/2"))
    assert matcher.unsubscribe("x", "a/+") is False
    matcher.unsubscribe("x", "a/1")
    assert matcher.match("a/1") == ["base"]


def test_a_shared_change_drops_exactly_the_matched_answers() -> None:
    matcher = matcher_with_hot_topics()
    matcher.subscribe("s1", "$share/g/a/1")
    stats = matcher.stats()
    assert stats.invalidations == 1
    assert not matcher.is_cached("a/1")
    assert a_few_cached(matcher) == ["$SYS/x", "a/2", "b/1"]
    assert matcher.match("a/1") == ["base", "s1"]  # rebuilt on its next publish
    assert matcher.is_cached("a/1")
    matcher.unsubscribe("s1", "$share/g/a/1")
    assert not matcher.is_cached("a/1")
    assert matcher.match("a/1") == ["base"]


def a_few_cached(matcher: CachedMatcher) -> list[str]:
    return [t for t in matcher.cached_topics() if matcher.is_cached(t)]


def test_remove_client_updates_every_topic_it_touched() -> None:
    matcher = matcher_with_hot_topics()
    matcher.subscribe("gone", "a/1")
    matcher.subscribe("gone", "b/#")
    matcher.subscribe("gone", "$share/g/a/2")
    assert matcher.remove_client("gone") == 3
    assert matcher.remove_client("gone") == 0
    assert not matcher.is_cached("a/2")  # the shared filter dropped that answer
    assert matcher.is_cached("a/1") and matcher.is_cached("b/1")
    for topic in ("a/1", "a/2", "b/1"):
        assert matcher.match(topic) == ["base"]


# -- versions -------------------------------------------------------------------------------


def test_an_answer_computed_before_a_change_is_not_installed() -> None:
    matcher = eager()
    matcher.subscribe("a", "x/+")
    compute = matcher._compute

    def racing(topic: str) -> Any:
        result = compute(topic)
        matcher.subscribe("b", "x/#")  # lands between computing and installing
        return result

    matcher._compute = racing  # type: ignore[method-assign]
    assert matcher.match("x/1") == ["a"]  # counted
    assert matcher.match("x/1") == ["a"]  # computed at the old version: served, not kept
    assert matcher.stats().refused == 1
    assert not matcher.is_cached("x/1")
    del matcher._compute
    assert matcher.match("x/1") == ["a", "b"]
    assert matcher.is_cached("x/1")
    assert matcher.stats().builds == 1


# -- popularity -----------------------------------------------------------------------------


def test_cold_topics_are_dropped_and_thresholds_do_not_flap() -> None:
    matcher = eager(period=4, create_threshold=2.0, drop_threshold=0.5, decay=0.5)
    matcher.subscribe("c", "#")
    warm(matcher, "hot")  # two publishes
    assert matcher.is_cached("hot")
    # One publish of "hot" a period keeps it: 1 + 1/2 + 1/4 + ... stays above 0.5.
    for _ in range(10):
        for topic in ("hot", "o1", "o2", "o3"):
            matcher.match(topic)
        assert matcher.is_cached("hot")
    # Those same once-a-period topics never reach the create threshold of 2.
    assert matcher.cached_topics() == ["hot"]
    # Silence: dropped after a few passes, not at once.
    for round_ in range(4):
        for topic in ("o1", "o2", "o3", "o4"):
            matcher.match(topic)
        assert ("hot" in matcher.cached_topics()) is (round_ < 1)
    assert matcher.stats().drops == 1


def test_capacity_and_eviction_of_the_least_popular() -> None:
    matcher = eager(capacity=2, period=50)
    matcher.subscribe("c", "#")
    warm(matcher, "t1", "t2")
    for _ in range(3):
        matcher.match("t1")
    for _ in range(10):
        matcher.match("t3")  # hot, but the cache is full until the next pass
    assert matcher.cached_topics() == ["t1", "t2"]
    for _ in range(40):
        matcher.match("t3")
    assert matcher.cached_topics() == ["t1", "t3"]  # t2 was the least popular
    assert matcher.stats().evictions == 1
    assert matcher.match("t2") == ["c"]


def test_cheap_topics_are_not_cached() -> None:
    ticks = iter(range(0, 10**9, 10))  # every match "costs" 10 ns
    matcher = eager(min_cost_ns=100, clock_ns=lambda: next(ticks))
    matcher.subscribe("c", "#")
    for _ in range(20):
        assert matcher.match("t") == ["c"]
    assert not matcher.is_cached("t")
    assert matcher.stats().cheap == 1  # measured once, then left alone until a pass
    costly = eager(min_cost_ns=5, clock_ns=lambda: next(ticks))
    costly.subscribe("c", "#")
    warm(costly, "t")


def test_invalid_topics_raise_and_are_not_tracked() -> None:
    matcher = eager()
    for bad in ("a/+", "", None, ["a"]):
        with pytest.raises(InvalidTopicError):
            matcher.match(bad)  # type: ignore[arg-type]
    stats = matcher.stats()
    assert stats.candidates == 0
    assert (stats.publishes, stats.misses, stats.hits) == (4, 4, 0)


def test_the_hot_benchmark_runs_and_finds_no_wrong_answer() -> None:
    result = run_hot(subscriptions=3000, publishes=12_000, warmup=4000, segment=4000)
    assert result["wrong_answers"] == 0
    assert result["subscription_changes"] == 16
    assert result["hit_rate"] > 0.5
    for key in ("cached_matches_per_s", "uncached_matches_per_s", "cache_speedup"):
        assert result[key] > 0


@pytest.mark.parametrize(
    "bad",
    [
        {"capacity": 0},
        {"capacity": 1.5},
        {"period": 0},
        {"candidate_limit": 0},
        {"decay": 1.0},
        {"decay": 0},
        {"min_cost_ns": -1},
        {"drop_threshold": -0.1},
        {"create_threshold": 0.5, "drop_threshold": 0.5},
        {"create_threshold": "2"},
    ],
)
def test_settings_out_of_range(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettingError) as caught:
        CachedMatcher(**bad)
    assert isinstance(caught.value, RouterError)


def test_clear_and_reading() -> None:
    matcher = matcher_with_hot_topics()
    assert matcher.trie.subscriptions("base") == {"#": matcher.trie.subscriptions("base")["#"]}
    assert isinstance(matcher.strategy, HashTopicStrategy)
    assert set(matcher.match_subscriptions("a/1")) == {"base"}
    version = matcher.version
    matcher.clear()
    assert matcher.cached_topics() == []
    assert matcher.version == version + 1
    assert matcher.match("a/1") == ["base"]


def test_the_topic_index_keeps_no_empty_nodes() -> None:
    matcher = eager(capacity=3, period=6)
    matcher.subscribe("c", "#")
    warm(matcher, "a/b/c", "a/b", "x")
    assert matcher._index.matching("#") != []
    for number in range(30):  # passes with no hits: all three are dropped
        matcher.match(f"other/{number}")
    assert matcher.cached_topics() == []
    assert matcher._index._root == {}
