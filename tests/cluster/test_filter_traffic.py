"""Publishes counted per matching topic filter (router.cluster.filter_traffic), and the
route match that names each matching route once (router.core.route_mirror)."""

from __future__ import annotations

import math

from router.cluster.filter_traffic import FilterTraffic, busiest
from router.core.route_mirror import RouteMirror
from router.core.sharing import RandomStrategy
from router.core.topics import TopicFilter, TopicName


def test_a_steady_flow_reads_its_rate_and_a_silent_filter_fades_then_goes() -> None:
    traffic = FilterTraffic()
    for _ in range(600):  # ten minutes of 2 s intervals: 10 publishes a second to a/#
        traffic.count(["a/#"] * 20)
        rates = traffic.rates(2.0)
    assert math.isclose(rates["a/#"], 10.0, rel_tol=1e-3)
    faded = traffic.rates(60.0)  # a minute without a publish: a third of it is left
    assert math.isclose(faded["a/#"], 10.0 * math.exp(-1), rel_tol=1e-3)
    for _ in range(20):
        rates = traffic.rates(60.0)
    assert rates == {}  # (under the floor: forgotten)


def test_a_burst_stays_in_sight_for_a_while() -> None:
    traffic = FilterTraffic()
    traffic.count(["a/#", "a/+"])
    traffic.count(["a/#"])
    first = traffic.rates(2.0)
    assert first["a/#"] == 2 * first["a/+"] > 0
    assert 0 < traffic.rates(2.0)["a/#"] < first["a/#"]


def test_the_busiest_are_ranked_by_rate_then_name() -> None:
    rates = {"b": 2.0, "a": 2.0, "c": 5.0, "d": 0.5}
    assert busiest(rates, 3) == [("c", 5.0), ("a", 2.0), ("b", 2.0)]
    assert busiest({"x": 1 / 3}) == [("x", 0.333)]


def test_a_route_on_several_nodes_is_matched_once() -> None:
    mirror = RouteMirror(RandomStrategy(), cache=None)
    mirror.load("n1", "g1", 1, {TopicFilter("a/#"): 1, TopicFilter("$share/g/a/+"): 1})
    mirror.load("n2", "g2", 1, {TopicFilter("a/#"): 1, TopicFilter("other/#"): 1})
    routed = mirror.match(TopicName("a/b"))
    assert sorted(routed.matched) == ["$share/g/a/+", "a/#"]
    assert mirror.match(TopicName("none")).matched == ()
