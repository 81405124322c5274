"""The subscription trie, case by case."""

from __future__ import annotations

from typing import Any

import pytest

from router import (
    HashTopicStrategy,
    InvalidIdError,
    InvalidOptionsError,
    InvalidTopicError,
    MatchedSubscription,
    RoundRobinStrategy,
    SubscriptionOptions,
    SubscriptionTrie,
)
from router.core.filter_index import PureFilterIndex
from tests.support.indexes import INDEXES


def make(*subscriptions: tuple[str, str], index: Any = None) -> SubscriptionTrie:
    trie = SubscriptionTrie(strategy=HashTopicStrategy(), index=index)
    for client_id, topic_filter in subscriptions:
        trie.subscribe(client_id, topic_filter)
    return trie


def test_subscribe_reports_new_and_replaced() -> None:
    trie = SubscriptionTrie()
    assert trie.subscribe("c", "a/+", qos=1) is True
    assert trie.subscribe("c", "a/+", qos=2) is False
    assert trie.subscriptions("c") == {"a/+": SubscriptionOptions(qos=2)}
    assert len(trie) == 1


def test_options_are_stored_and_returned() -> None:
    trie = SubscriptionTrie()
    trie.subscribe(
        "c",
        "a/#",
        qos=1,
        no_local=True,
        retain_as_published=True,
        retain_handling=2,
        subscription_identifier=42,
    )
    [(topic_filter, options)] = trie.match_subscriptions("a/b")["c"]
    assert topic_filter == "a/#"
    assert options == SubscriptionOptions(1, True, True, 2, 42)


def test_overlapping_subscriptions_are_one_client_with_all_filters() -> None:
    trie = make(("c", "a/+"), ("c", "a/#"), ("c", "a/b"), ("d", "#"))
    assert trie.match("a/b") == {"c", "d"}
    assert sorted(s.filter for s in trie.match_subscriptions("a/b")["c"]) == ["a/#", "a/+", "a/b"]


def test_results_are_sorted() -> None:
    clients = [f"client-{i}" for i in (5, 3, 9, 1, 7)]
    trie = make(*[(c, "x/#") for c in clients], ("a", "x/y"))
    assert trie.match("x/y") == {*clients, "a"}


@pytest.mark.parametrize(
    ("subscribed", "topic", "expected"),
    [
        # mr_rax concatenated levels: a/b/c and ab/c collided
        ([("c1", "a/b/c"), ("c2", "ab/c")], "ab/c", ["c2"]),
        ([("c1", "a/b/c"), ("c2", "ab/c")], "abc", []),
        ([("c1", "a/b/+"), ("c2", "ab/+")], "ab/c", ["c2"]),
        # mr_rax missed these
        ([("c1", "+/#")], "sport", ["c1"]),
        ([("c1", "foo/+/#")], "foo/bar", ["c1"]),
        # no 32-level truncation
        ([("c1", "/".join(["l"] * 40) + "/x")], "/".join(["l"] * 40) + "/y", []),
        ([("c1", "/".join(["+"] * 40))], "/".join(["l"] * 40), ["c1"]),
        ([("c1", "/".join(["+"] * 40))], "/".join(["l"] * 41), []),
        # $ topics
        ([("c1", "#"), ("c2", "+/x"), ("c3", "$SYS/#")], "$SYS/x", ["c3"]),
        ([("c1", "#"), ("c2", "+/x")], "sys/x", ["c1", "c2"]),
        # empty levels
        ([("c1", "+/+"), ("c2", "/+"), ("c3", "+")], "/", ["c1", "c2"]),
        ([("c1", "a//b"), ("c2", "a/+/b")], "a//b", ["c1", "c2"]),
    ],
)
def test_match_cases(subscribed: list[tuple[str, str]], topic: str, expected: list[str]) -> None:
    for make_index in INDEXES.values():
        trie = make(*subscribed, index=make_index())
        assert trie.match(topic) == set(expected)


def test_invalid_input_raises_and_changes_nothing() -> None:
    trie = make(("c", "a/b"))
    before = trie.dump()
    with pytest.raises(InvalidTopicError):
        trie.subscribe("c", "a/#/b")
    with pytest.raises(InvalidTopicError):
        trie.subscribe("c", "$share/g")
    with pytest.raises(InvalidIdError):
        trie.subscribe("", "a/b")
    with pytest.raises(InvalidOptionsError):
        trie.subscribe("c", "x", qos=3)
    with pytest.raises(InvalidOptionsError):
        trie.subscribe("c", "x", colour="blue")
    with pytest.raises(InvalidOptionsError):
        trie.subscribe("c", "$share/g/x", no_local=True)
    with pytest.raises(InvalidTopicError):
        trie.match("")
    with pytest.raises(InvalidTopicError):
        trie.match("a/+")
    with pytest.raises(InvalidTopicError):
        trie.unsubscribe("c", "a+")
    assert trie.dump() == before
    assert len(trie) == 1


def test_unsubscribe_and_remove_client() -> None:
    trie = make(("c", "a/+"), ("c", "b/#"), ("c", "x"), ("d", "a/+"))
    assert trie.unsubscribe("c", "a/+") is True
    assert trie.unsubscribe("c", "a/+") is False
    assert trie.unsubscribe("nobody", "a/+") is False
    assert trie.match("a/1") == {"d"}
    assert trie.remove_client("c") == 2
    assert trie.remove_client("c") == 0
    assert trie.subscriptions("c") == {}
    assert trie.match("b/1") == set()
    assert trie.match("x") == set()


def test_removing_everything_leaves_no_nodes() -> None:
    trie = make(
        ("c", "a/b/c/d"),
        ("c", "a/+/c/#"),
        ("d", "a/+/c/#"),
        ("d", "+/+"),
        ("e", "$share/g/a/#"),
        ("f", "$share/g/a/#"),
        ("e", "#"),
        ("f", "a//b/+"),
    )
    assert trie.node_count() > 0
    trie.unsubscribe("c", "a/+/c/#")
    # d by a/+/c/#, e by '#', and the group's pick (e or f)
    assert trie.match("a/x/c") in ({"d", "e"}, {"d", "e", "f"})
    for client_id in "cdef":
        trie.remove_client(client_id)
    assert trie.node_count() == 0
    assert len(trie) == 0
    assert trie.dump() == "(root)\n"


def test_unsubscribing_a_prefix_keeps_the_longer_filter() -> None:
    trie = make(("c", "a/+"), ("d", "a/+/b"))
    trie.unsubscribe("c", "a/+")
    assert trie.match("a/x/b") == {"d"}
    assert trie.match("a/x") == set()


def test_shared_group_gets_one_member_per_message() -> None:
    trie = SubscriptionTrie(strategy=RoundRobinStrategy())
    for member in ("m1", "m2", "m3"):
        trie.subscribe(member, "$share/g/jobs/#")
    trie.subscribe("watcher", "jobs/#")
    picks = []
    for _ in range(6):
        result = trie.match("jobs/1")
        assert "watcher" in result
        assert len(result) == 2
        picks.extend(c for c in result if c != "watcher")
    assert picks == ["m1", "m2", "m3", "m1", "m2", "m3"]


def test_groups_with_the_same_name_and_other_filters_are_separate() -> None:
    trie = SubscriptionTrie(strategy=RoundRobinStrategy())
    trie.subscribe("a", "$share/g/x/+")
    trie.subscribe("b", "$share/g/x/#")
    found = trie.match_subscriptions("x/y")
    assert {s.filter for subs in found.values() for s in subs} == {"$share/g/x/+", "$share/g/x/#"}


def test_a_member_that_left_is_never_chosen() -> None:
    trie = SubscriptionTrie(strategy=RoundRobinStrategy())
    trie.subscribe("m1", "$share/g/t")
    trie.subscribe("m2", "$share/g/t")
    trie.unsubscribe("m1", "$share/g/t")
    assert set().union(*(trie.match("t") for _ in range(4))) == {"m2"}
    assert trie.subscribers("$share/g/t") == {"m2": SubscriptionOptions()}
    trie.remove_client("m2")
    assert trie.match("t") == set()


def test_subscribers_of_a_filter() -> None:
    trie = make(("c", "a/+"), ("d", "a/+"))
    trie.subscribe("c", "a/+", qos=1)
    assert trie.subscribers("a/+") == {"c": SubscriptionOptions(qos=1), "d": SubscriptionOptions()}
    assert trie.subscribers("zzz") == {}
    assert trie.filters() == ["a/+"]
    assert sorted(trie.clients()) == ["c", "d"]


def test_dump_draws_every_filter() -> None:
    trie = make(("thermo", "home/+/temp"), ("log", "home/#"), ("ops", "$SYS/#"))
    trie.subscribe("w1", "$share/workers/jobs/#", qos=1)
    trie.subscribe("k", "home/kitchen/temp", qos=2)
    trie.subscribe("e", "a//b")
    assert trie.dump() == (
        "(root)\n"
        "├── $SYS\n"
        "│   └── #  <- ops\n"
        "├── a\n"
        "│   └── ''\n"
        "│       └── b  <- e\n"
        "├── home\n"
        "│   ├── #  <- log\n"
        "│   ├── +\n"
        "│   │   └── temp  <- thermo\n"
        "│   └── kitchen\n"
        "│       └── temp  <- k (qos 2)\n"
        "└── jobs\n"
        "    └── #  <- $share/workers: [w1 (qos 1)]\n"
    )


@pytest.mark.parametrize("index", INDEXES)
def test_every_mix_of_literal_and_plus_levels_matches(index: str) -> None:
    trie = SubscriptionTrie(index=INDEXES[index]())
    for mask in range(64):
        levels = ["+" if mask >> i & 1 else f"l{i}" for i in range(6)]
        trie.subscribe(f"c{mask:02}", "/".join(levels))
    topic = "/".join(f"l{i}" for i in range(6))
    assert trie.match(topic) == {f"c{i:02}" for i in range(64)}


def test_many_shapes_fall_back_to_the_walk_with_the_same_answers() -> None:
    shapes, walk = PureFilterIndex(max_shapes=1000), PureFilterIndex(max_shapes=0)
    tries = [SubscriptionTrie(index=shapes), SubscriptionTrie(index=walk)]
    for trie in tries:
        for mask in range(64):
            levels = ["+" if mask >> i & 1 else f"l{i}" for i in range(6)]
            trie.subscribe(f"c{mask:02}", "/".join(levels))
    topic = "/".join(f"l{i}" for i in range(6))
    assert tries[0].match(topic) == tries[1].match(topic)
    assert len(tries[0].match(topic)) == 64


def test_only_groups_limits_the_groups_served() -> None:
    trie = make(("p", "t/#"), ("a", "$share/g1/t/#"), ("b", "$share/g2/t/+"))
    served = trie.match_subscriptions("t/x", only_groups={"$share/g2/t/+"})
    assert served == {
        "b": [MatchedSubscription("$share/g2/t/+", SubscriptionOptions())],
        "p": [MatchedSubscription("t/#", SubscriptionOptions())],
    }
    assert set(trie.match_subscriptions("t/x", only_groups=())) == {"p"}


def test_candidates_lists_every_member_without_choosing() -> None:
    trie = make(("p", "t/#"), ("p", "t/+"), ("a", "$share/g/t/#"), ("b", "$share/g/t/#"))
    found = trie.candidates("t/x")
    assert {c: sorted(fs) for c, fs in found.plain.items()} == {"p": ["t/#", "t/+"]}
    assert found.groups == {"$share/g/t/#": ["a", "b"]}
    assert trie.candidates("u") == ({}, {})
