"""The trie against a brute-force model, over random filters, topics and changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from router import HashTopicStrategy, SubscriptionTrie
from router.core.topics import parse_shared
from tests.support.brute import BruteModel
from tests.support.indexes import INDEXES

LITERALS = ["a", "b", "", "$x", "$SYS", "ü", "a b", "日本"]
CLIENTS = [f"c{i}" for i in range(6)]

# Mostly two literals, so filters overlap and share trie nodes; the rest for the edge cases.
literal = st.one_of(st.sampled_from(["a", "b"]), st.sampled_from(LITERALS))
topics = st.lists(literal, min_size=1, max_size=7).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(literal, st.just("+")), min_size=0, max_size=6))
    if draw(st.booleans()) or not levels:
        levels.append("#")
    text = "/".join(levels)
    if not text:
        text = "+"
    if draw(st.integers(0, 4)) == 0:
        text = f"$share/{draw(st.sampled_from(['g1', 'g2']))}/{text}"
    return text


operation = st.one_of(
    st.tuples(st.just("sub"), st.sampled_from(CLIENTS), filters(), st.integers(0, 2)),
    st.tuples(st.just("unsub"), st.sampled_from(CLIENTS), filters()),
    st.tuples(st.just("remove"), st.sampled_from(CLIENTS)),
)


def check_topic(trie: SubscriptionTrie, model: BruteModel, topic: str) -> None:
    found = trie.match_subscriptions(topic)
    plain = model.plain_clients(topic)
    groups = model.groups(topic)
    picks = {}
    for share_filter, members in groups.items():
        pickers = [c for c, subs in found.items() if any(s.filter == share_filter for s in subs)]
        assert len(pickers) == 1, (topic, share_filter, pickers)
        assert pickers[0] in members
        picks[share_filter] = pickers[0]
    assert set(found) == plain | set(picks.values()), topic
    for client_id, subs in found.items():
        for sub in subs:
            if parse_shared(sub.filter) is None:
                assert model.subs[client_id][sub.filter] == sub.options.qos
    # match() agrees with match_subscriptions() under a deterministic strategy.
    assert trie.match(topic) == set(found)


def topics_near(topic_filter: str) -> list[str]:
    """Topics that the filter matches or nearly matches, made by filling its wildcards."""
    plain = topic_filter.split("/", 2)[2] if topic_filter.startswith("$share/") else topic_filter
    near = []
    for fill, tail in (("a", ""), ("b", "/a"), ("", "/b/a")):
        levels = [fill if level == "+" else level for level in plain.split("/")]
        if levels[-1] == "#":
            levels[-1:] = [fill] if tail else []
        topic = "/".join(levels) + tail
        if topic:
            near.append(topic)
    return near


def run_against_model(ops: list[tuple], probe: list[str], make_index: Callable[[], Any]) -> None:
    probe = probe + [t for op in ops if op[0] == "sub" for t in topics_near(op[2])]
    trie = SubscriptionTrie(strategy=HashTopicStrategy(), index=make_index())
    model = BruteModel()
    for op in ops:
        if op[0] == "sub":
            _, client_id, topic_filter, qos = op
            assert trie.subscribe(client_id, topic_filter, qos=qos) == model.subscribe(
                client_id, topic_filter, qos
            )
        elif op[0] == "unsub":
            _, client_id, topic_filter = op
            assert trie.unsubscribe(client_id, topic_filter) == model.unsubscribe(
                client_id, topic_filter
            )
        else:
            assert trie.remove_client(op[1]) == model.remove_client(op[1])
        assert len(trie) == len(model)
    for topic in probe:
        check_topic(trie, model, topic)
    for client_id in CLIENTS:
        assert {f: o.qos for f, o in trie.subscriptions(client_id).items()} == model.subs.get(
            client_id, {}
        )
        trie.remove_client(client_id)
    assert trie.node_count() == 0
    assert len(trie) == 0
    assert trie.match(probe[0]) == set()


PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("index", INDEXES)
@PROPERTY_SETTINGS
@given(st.lists(operation, max_size=40), st.lists(topics, min_size=1, max_size=12))
def test_every_index_agrees_with_brute_force(
    index: str, ops: list[tuple], probe: list[str]
) -> None:
    run_against_model(ops, probe, INDEXES[index])
