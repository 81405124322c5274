"""The route mirror: snapshots, ordered changes, gaps, dropped nodes and share slots."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from router.core.route_mirror import RouteMirror
from router.core.sharing import RoundRobinStrategy


def test_snapshot_then_changes_in_order() -> None:
    mirror = RouteMirror()
    mirror.load("n1", "g1", 2, {"a/+": 1, "b/#": 1})
    assert mirror.match("a/x").nodes == {"n1": []}
    assert mirror.apply("n1", "g1", [(3, "a/+", 0), (4, "c", 1)])
    assert mirror.match("a/x").nodes == {}
    assert mirror.match("c").nodes == {"n1": []}
    assert mirror.position("n1") == ("g1", 4)


def test_old_changes_are_skipped_and_gaps_refused() -> None:
    mirror = RouteMirror()
    mirror.load("n1", "g1", 5, {"a": 1})
    assert mirror.apply("n1", "g1", [(4, "a", 0), (5, "a", 0)])  # already seen
    assert mirror.routes("n1") == {"a": 1}
    assert not mirror.apply("n1", "g1", [(7, "b", 1)])  # 6 is missing
    assert mirror.routes("n1") == {"a": 1}
    assert not mirror.apply("n1", "other-generation", [(6, "b", 1)])
    assert not mirror.apply("unknown", "g1", [(1, "b", 1)])


def test_drop_forgets_every_route() -> None:
    mirror = RouteMirror()
    mirror.load("n1", "g", 0, {"#": 1, "$share/g/x": 2})
    mirror.load("n2", "g", 0, {"x": 1})
    version = mirror.version
    assert mirror.drop("n1")
    assert not mirror.drop("n1")
    assert mirror.version > version
    assert mirror.match("x").nodes == {"n2": []}
    assert mirror.nodes() == ["n2"]


def test_reload_replaces_routes() -> None:
    mirror = RouteMirror()
    mirror.load("n1", "g1", 3, {"a": 1, "b": 1})
    mirror.load("n1", "g2", 0, {"b": 1})
    assert mirror.table() == {"b": {"n1": 1}}


def test_match_explains_filters_per_node() -> None:
    mirror = RouteMirror()
    mirror.load("n1", "g", 0, {"a/+": 1, "a/#": 1})
    mirror.load("n2", "g", 0, {"a/b": 1})
    result = mirror.match("a/b")
    assert result.nodes == {"n1": [], "n2": []}
    assert {n: sorted(f) for n, f in result.filters.items()} == {
        "n1": ["a/#", "a/+"],
        "n2": ["a/b"],
    }


def test_share_group_slots_follow_member_counts() -> None:
    mirror = RouteMirror(strategy=RoundRobinStrategy())
    mirror.load("n1", "g", 0, {"$share/w/jobs/#": 2})
    mirror.load("n2", "g", 0, {"$share/w/jobs/#": 1, "jobs/#": 1})
    picks = Counter()
    for _ in range(30):
        result = mirror.match("jobs/1")
        chosen = [n for n, groups in result.nodes.items() if groups == ["$share/w/jobs/#"]]
        assert len(chosen) == 1
        picks[chosen[0]] += 1
        assert "n2" in result.nodes  # the plain route always reaches n2
    assert picks == {"n1": 20, "n2": 10}
    assert mirror.group_nodes("$share/w/jobs/#") == {"n1": 2, "n2": 1}
    assert mirror.apply("n1", "g", [(1, "$share/w/jobs/#", 0)])
    assert all(mirror.match("jobs/1").nodes["n2"] == ["$share/w/jobs/#"] for _ in range(5))


routes = st.sampled_from(["a", "a/+", "#", "b/#", "$share/g/a", "$share/h/#"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), routes, st.integers(0, 3))))
def test_mirror_equals_the_union_of_route_sets(changes: list[tuple[str, str, int]]) -> None:
    truth: dict[str, dict[str, int]] = {"n1": {}, "n2": {}, "n3": {}}
    versions = dict.fromkeys(truth, 0)
    mirror = RouteMirror()
    for node_id in truth:
        mirror.load(node_id, "g", 0, {})
    for node_id, route, wanted in changes:
        count = wanted if route.startswith("$share/") else min(wanted, 1)
        if truth[node_id].get(route, 0) == count:
            continue
        versions[node_id] += 1
        if count:
            truth[node_id][route] = count
        else:
            truth[node_id].pop(route, None)
        assert mirror.apply(node_id, "g", [(versions[node_id], route, count)])
    expected: dict[str, dict[str, int]] = {}
    for node_id, mine in sorted(truth.items()):
        for route, count in mine.items():
            expected.setdefault(route, {})[node_id] = count
    assert mirror.table() == dict(sorted(expected.items()))
