"""The match caches of several nodes: cached route and local answers equal full matches.

In process: each node is a :class:`LocalSessions` and a :class:`RouteMirror` with caches,
beside the same pair without caches; every route change a node's sessions report is
applied to every mirror in version order (what the node's mirror sync does); a mirror now
and then misses a change and loads a snapshot at its next one (a gap), and nodes are
reloaded from a snapshot or dropped and loaded again. Then on real
nodes: a subscribe on node B changes how node A routes a topic A had cached.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from router.cluster.config import NodeConfig
from router.cluster.sessions.local_sessions import LocalSessions
from router.core.hot_topics import CacheSettings
from router.core.options import DEFAULT_OPTIONS
from router.core.route_mirror import RouteMirror
from router.core.sharing import HashClientStrategy, HashTopicStrategy
from router.core.topics import validate_filter
from tests.support import waiting
from tests.support.nodes import StartNode, take

NODES = ["n0", "n1", "n2"]
TOPICS = ["a", "a/b", "b/a", "a/b/a", "$x/a"]
FILTERS = [
    "a",
    "a/b",
    "a/+",
    "+/a",
    "a/#",
    "#",
    "+/#",
    "$x/#",
    "b/a",
    "$share/g/a/#",
    "$share/g/+/a",
    "$share/h/#",
]
EAGER = CacheSettings(capacity=3, create_threshold=2.0, drop_threshold=0.5, min_cost_ns=0, period=7)


class Cluster:
    """Nodes with caches and the same nodes without, fed the same events."""

    def __init__(self) -> None:
        self.sessions = {
            cached: {
                n: LocalSessions(HashClientStrategy(seed=1), match_cache=EAGER if cached else None)
                for n in NODES
            }
            for cached in (True, False)
        }
        self.mirrors = {
            cached: {
                n: RouteMirror(HashTopicStrategy(), cache=EAGER if cached else None) for n in NODES
            }
            for cached in (True, False)
        }
        self.versions = dict.fromkeys(NODES, 0)
        for cached in (True, False):
            for mirror in self.mirrors[cached].values():
                for node in NODES:
                    mirror.load(node, "g", 0, {})

    def change(self, node: str, action: str, client: str, topic_filter: str, lag: str) -> None:
        """A subscribe or unsubscribe; the mirrors of ``lag`` miss its route change."""
        args = (client, validate_filter(topic_filter))
        if action == "subscribe":
            args += (DEFAULT_OPTIONS,)
        outcomes = [getattr(self.sessions[cached][node], action)(*args) for cached in (True, False)]
        assert outcomes[0] == outcomes[1]
        self._publish_changes(node, [] if outcomes[0][1] is None else [outcomes[0][1]], lag)

    def disconnect(self, node: str, client: str, lag: str) -> None:
        changes = [self.sessions[cached][node].disconnect(client) for cached in (True, False)]
        assert changes[0] == changes[1]
        self._publish_changes(node, changes[0], lag)

    def _publish_changes(self, node: str, changes: list[tuple[str, int]], lag: str) -> None:
        """Apply the node's changes to every mirror but ``lag``'s; a mirror that finds a
        gap (it missed one before) loads a snapshot, as the mirror sync does."""
        for route, count in changes:
            self.versions[node] += 1
            for cached in (True, False):
                for reader, mirror in self.mirrors[cached].items():
                    if reader == lag:
                        continue
                    if not mirror.apply(node, "g", [(self.versions[node], route, count)]):
                        routes = self.sessions[True][node].routes()
                        mirror.load(node, "g", self.versions[node], routes)

    def reload(self, reader: str, node: str, drop_first: bool) -> None:
        routes = self.sessions[True][node].routes()
        for cached in (True, False):
            mirror = self.mirrors[cached][reader]
            if drop_first:
                assert mirror.drop(node)
            mirror.load(node, "g", self.versions[node], routes)

    def publish(self, node: str, topic: str, publisher: str | None) -> None:
        cached, plain = self.mirrors[True][node], self.mirrors[False][node]
        route = cached.match(topic, publisher)
        assert route == plain.match(topic, publisher)
        for target, groups in route.nodes.items():
            found = self.sessions[True][target].trie.match_subscriptions(topic, publisher, groups)
            full = self.sessions[False][target].trie.match_subscriptions(topic, publisher, groups)
            assert found == full


clients = st.sampled_from(["c0", "c1", "c2"])
nodes = st.sampled_from(NODES)
lagging = st.sampled_from([*NODES, "", "", ""])  # whose mirrors miss a change ("": none)
operation = st.one_of(
    st.tuples(st.just("subscribe"), nodes, clients, st.sampled_from(FILTERS), lagging),
    st.tuples(st.just("unsubscribe"), nodes, clients, st.sampled_from(FILTERS), lagging),
    st.tuples(st.just("disconnect"), nodes, clients, lagging),
    st.tuples(st.just("reload"), nodes, nodes, st.booleans()),
    *[st.tuples(st.just("publish"), nodes, st.sampled_from(TOPICS), clients)] * 4,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, max_size=100))
@example(  # n1 caches a/b, misses n2's a/+, then loads n2's snapshot at the gap
    [
        ("subscribe", "n0", "c0", "a/#", ""),
        *[("publish", "n1", "a/b", "c1")] * 4,
        ("subscribe", "n2", "c0", "a/+", "n1"),
        ("subscribe", "n2", "c0", "b/a", ""),
        ("publish", "n1", "a/b", "c1"),
    ]
)
def test_cached_answers_equal_full_matches_across_nodes(ops: list[tuple[Any, ...]]) -> None:
    cluster = Cluster()
    for op in ops:
        kind = op[0]
        if kind in ("subscribe", "unsubscribe"):
            cluster.change(op[1], kind, op[2], op[3], op[4])
        elif kind == "disconnect":
            cluster.disconnect(op[1], op[2], op[3])
        elif kind == "reload":
            cluster.reload(op[1], op[2], op[3])
        else:
            cluster.publish(op[1], op[2], op[3])
    for node in NODES:
        for topic in TOPICS:
            cluster.publish(node, topic, None)


pytestmark_nodes = pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)

HOT_FOR_TESTS = CacheSettings(create_threshold=2.0, drop_threshold=0.5, min_cost_ns=0)


@pytestmark_nodes
async def test_a_subscribe_on_b_changes_how_a_routes_a_topic_it_had_cached(
    start_node: StartNode,
) -> None:
    a = await start_node("a", match_cache=HOT_FOR_TESTS)
    b = await start_node("b", match_cache=HOT_FOR_TESTS)
    await a.subscribe("local", "home/#")
    for _ in range(4):
        result = await a.publish("home/hall/temp", b"x")
        assert result.nodes == ["a"]
    assert a.stats()["route_cache_hits"] >= 1  # the topic is answered from A's cache
    assert a.stats()["route_cache_size"] == 1
    await b.subscribe("phone", "home/+/temp")
    await waiting.eventually(
        lambda: "b" in a.mirror.match("home/hall/temp").nodes, 5.0, "A routes the topic to B"
    )
    result = await a.publish("home/hall/temp", b"y")
    assert result.nodes == ["a", "b"]
    [delivery] = await take(b, "phone", 1)
    assert delivery.payload == b"y"
    stats = a.stats()
    assert stats["local_cache_hits"] >= 1
    assert stats["route_cache_size"] == 1


@pytestmark_nodes
async def test_a_node_without_caches_routes_the_same(start_node: StartNode) -> None:
    a = await start_node("a", match_cache=None)
    await a.subscribe("local", "home/#")
    for _ in range(4):
        assert (await a.publish("home/hall/temp", b"x")).nodes == ["a"]
    stats = a.stats()
    assert (stats["route_cache_hits"], stats["local_cache_size"]) == (0, 0)
    assert NodeConfig("x").match_cache is not None  # on by default
