"""A cluster-wide bound on the bytes retained messages hold, with real clients (paho-mqtt)
on two ``router node run --retained-max-bytes N`` processes sharing one Redis: what one
node stored counts against what the other may store; a replacement no larger always
goes; a refused message is still routed and counted (``retained_refused``)."""

from __future__ import annotations

from contextlib import ExitStack

from router.state.keys import Keys
from tests.support.metrics import scrape
from tests.support.mqtt import TIMEOUT, V5, Paho, mqtt_node
from tests.support.servers import free_port
from tests.support.waiting import wait_until

BOUND = 30_000  # ($SYS topics take a little of it too)
BODY = 12_000  # two fit in BOUND, a third does not


def retained_topics(port: int, topic_filter: str, count: int) -> list[tuple[str, int]]:
    """(topic, payload size) of the retained messages a new subscriber gets."""
    reader = Paho(port, f"reader-{free_port()}", V5)
    try:
        assert reader.connected()[0] == 0
        reader.subscribe(topic_filter, 1)
        got = sorted((m.topic, len(m.payload)) for m in reader.take(count))
        assert reader.nothing_more()
        return got
    finally:
        reader.close()


def test_the_bound_holds_across_nodes(redis_standalone_url: str, keys: Keys) -> None:
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    limit = ("--retained-max-bytes", str(BOUND))
    with ExitStack() as stack:
        _, port_a = stack.enter_context(mqtt_node("a", env, *limit))
        _, port_b = stack.enter_context(mqtt_node("b", env, *limit, "--metrics", metrics))
        watcher = Paho(port_b, "watcher", V5)
        stack.callback(watcher.close)
        assert watcher.connected()[0] == 0
        watcher.subscribe("plant/#", 1)
        publisher_a = Paho(port_a, "pub-a", V5)
        publisher_b = Paho(port_b, "pub-b", V5)
        stack.callback(publisher_a.close)
        stack.callback(publisher_b.close)
        publisher_a.publish("plant/1", b"a" * BODY, 1, retain=True)
        publisher_b.publish("plant/2", b"b" * BODY, 1, retain=True)
        publisher_b.publish("plant/3", b"c" * BODY, 1, retain=True)  # past the bound
        # every message is routed all the same
        assert [m.topic for m in watcher.take(3)] == ["plant/1", "plant/2", "plant/3"]
        assert retained_topics(port_a, "plant/#", 2) == [("plant/1", BODY), ("plant/2", BODY)]

        publisher_a.publish("plant/1", b"A" * BODY, 1, retain=True)  # the same size: goes
        publisher_a.publish("plant/2", b"B" * (BODY * 2), 1, retain=True)  # grows: refused
        publisher_b.publish("plant/1", b"s" * 100, 1, retain=True)  # smaller: frees room
        publisher_b.publish("plant/3", b"c" * BODY, 1, retain=True)  # now fits
        watcher.take(4)
        assert retained_topics(port_b, "plant/#", 3) == [
            ("plant/1", 100),
            ("plant/2", BODY),
            ("plant/3", BODY),
        ]
        wait_until(
            lambda: scrape(metrics).get("router_retained_refused_total") == 1.0,
            TIMEOUT,
            "node b counted its refusal",
        )
