"""Router nodes in one process, each with its own Redis client, on real Redis and a cluster."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import pytest

from router import InvalidOptionsError, InvalidTopicError
from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core import topics
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import StartNode, die, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    await waiting.eventually(check, timeout, "the cluster state the test waits for")


async def test_publish_reaches_a_subscriber_on_another_node(start_node: StartNode) -> None:
    a, b, c = await start_node("a"), await start_node("b"), await start_node("c")
    await b.subscribe("phone", "home/+/temp", qos=1)
    await eventually(lambda: "b" in a.mirror.match("home/kitchen/temp").nodes)
    result = await a.publish("home/kitchen/temp", b"21.5", qos=1)
    assert result.nodes == ["b"]
    [delivery] = await take(b, "phone", 1)
    assert (delivery.topic, delivery.payload, delivery.qos) == ("home/kitchen/temp", b"21.5", 1)
    assert c.stats()["received"] == 0
    assert a.stats()["forwarded"] == 1


async def test_one_copy_per_node_whatever_the_subscribers(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    for index in range(5):
        await b.subscribe(f"client-{index}", "t/#")
    await eventually(lambda: "b" in a.mirror.match("t/x").nodes)
    await a.publish("t/x", b"1")
    for index in range(5):
        await take(b, f"client-{index}", 1)
    assert a.stats()["forwarded"] == 1
    assert b.stats()["received"] == 1


async def test_shared_group_across_nodes_gets_each_message_once(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    await a.subscribe("w1", "$share/workers/jobs/#")
    await b.subscribe("w2", "$share/workers/jobs/#")
    await eventually(lambda: a.mirror.group_nodes("$share/workers/jobs/#") == {"a": 1, "b": 1})
    for index in range(40):
        await a.publish(f"jobs/{index}", str(index).encode())
    await eventually(lambda: a.stats()["local_deliveries"] + b.stats()["local_deliveries"] == 40)
    got = [
        d.payload
        for node, c in ((a, "w1"), (b, "w2"))
        for d in await take(node, c, node.stats()["local_deliveries"])
    ]
    assert sorted(got) == sorted(str(i).encode() for i in range(40))
    assert a.stats()["local_deliveries"] > 0 and b.stats()["local_deliveries"] > 0


async def test_unsubscribe_stops_forwarding(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    await b.subscribe("c", "x")
    await eventually(lambda: "b" in a.mirror.match("x").nodes)
    assert await b.unsubscribe("c", "x") is True
    assert await b.unsubscribe("c", "x") is False
    await eventually(lambda: a.mirror.match("x").nodes == {})
    result = await a.publish("x", b"")
    assert result.nodes == []


async def test_graceful_stop_removes_routes_everywhere(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    await b.subscribe("c", "#")
    await eventually(lambda: "b" in a.mirror.nodes() and a.mirror.routes("b") == {"#": 1})
    await b.stop()
    await eventually(lambda: "b" not in a.mirror.nodes())
    assert await a.routes.snapshot("b") == (await a.routes.snapshot("b"))._replace(routes={})


async def test_local_subscriber_gets_local_publish(start_node: StartNode) -> None:
    a = await start_node("a")
    await a.subscribe("me", "self/#", no_local=True)
    await a.subscribe("other", "self/#")
    result = await a.publish("self/x", b"p", publisher="me")
    assert result.local_deliveries == 1
    [delivery] = await take(a, "other", 1)
    assert delivery.publisher == "me"
    assert a.sessions.session("me").pending() == 0


async def test_bad_input_is_refused(start_node: StartNode) -> None:
    a = await start_node("a")
    with pytest.raises(InvalidTopicError):
        await a.subscribe("c", "a/#/b")
    with pytest.raises(InvalidTopicError):
        await a.publish("a/+", b"")
    assert a.sessions.routes() == {}


async def test_reconcile_finds_and_repairs_missing_and_stale_routes(
    start_node: StartNode,
) -> None:
    a, b = await start_node("a"), await start_node("b")
    await b.subscribe("c", "kept/#")
    await eventually(lambda: a.mirror.routes("b") == {"kept/#": 1})
    # Damage b's route set behind its back: drop a route it needs, plant one it does not.
    await b.routes.apply("b", b.incarnation, [("kept/#", 0), ("planted", 1)])
    found = await b.reconcile(repair=False)
    assert (found.missing, found.stale, found.repaired) == ({"kept/#": 1}, ["planted"], False)
    found = await b.reconcile()
    assert found.repaired
    assert (await b.routes.snapshot("b")).routes == {"kept/#": 1}
    await eventually(lambda: a.mirror.routes("b") == {"kept/#": 1})
    clean = await b.reconcile()
    assert (clean.missing, clean.stale, clean.repaired) == ({}, [], False)


async def test_a_restart_with_the_same_id_drops_the_old_incarnation(
    start_node: StartNode, redis_connect: Any, keys: Keys
) -> None:
    a = await start_node("a")
    redis = await redis_connect()
    old = RouterNode(redis, NodeConfig("b", prefix=keys.prefix, heartbeat_interval=0.2))
    await old.start()
    await old.subscribe("c", "old/#")
    await eventually(lambda: a.mirror.routes("b") == {"old/#": 1})
    # The old process vanishes without stopping (no purge); a new one takes the id.
    await die(old)
    new = await start_node("b")
    await eventually(lambda: a.mirror.routes("b") == {})
    await new.subscribe("d", "new/#")
    await eventually(lambda: a.mirror.routes("b") == {"new/#": 1})
    assert new.incarnation != old.incarnation


async def test_shared_no_local_is_refused_before_anything_is_written(
    start_node: StartNode,
) -> None:
    a = await start_node("a")
    with pytest.raises(InvalidOptionsError):
        await a.subscribe("c", "$share/g/x", no_local=True)
    assert await a.subscriptions.subscriptions("c") == {}
    assert a.sessions.routes() == {}


async def test_start_returns_with_every_live_node_loaded(start_node: StartNode) -> None:
    a = await start_node("a")
    await a.subscribe("c", "loaded/#")
    b = await start_node("b")
    assert b.mirror.routes("a") == {"loaded/#": 1}
    assert (await b.publish("loaded/x", b"")).nodes == ["a"]


async def test_a_node_knows_when_another_process_took_its_id(
    start_node: StartNode, redis_connect: Any, keys: Keys
) -> None:
    a = await start_node("a")
    assert a.running
    usurper = RouterNode(await redis_connect(), NodeConfig("a", prefix=keys.prefix))
    await usurper.registry.register("a", "another-incarnation")
    async with asyncio.timeout(5):
        await a.wait_taken_over()
    assert not a.running


async def test_a_vanished_inbox_is_started_anew(start_node: StartNode, keys: Keys) -> None:
    a, b = await start_node("a"), await start_node("b", inbox_poll=0.2)
    await b.subscribe("phone", "t")
    await eventually(lambda: "b" in a.mirror.match("t").nodes)
    await a.publish("t", b"1")
    await take(b, "phone", 1)
    redis = b._redis
    await redis.delete(keys.channel_cursor(keys.inbox("b"), "b"))
    await eventually(lambda: b._inbox.restarts == 1)
    await a.publish("t", b"2")
    [delivery] = await take(b, "phone", 1)
    assert delivery.payload == b"2"


def count_validations(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Wrap ``validate_topic`` / ``validate_filter`` wherever a router module bound them."""
    counts = {"validate_topic": 0, "validate_filter": 0}
    for name in counts:
        original = getattr(topics, name)

        def counting(text: str, _name: str = name, _original: Any = original) -> Any:
            counts[_name] += 1
            return _original(text)

        for module in list(sys.modules.values()):
            if module.__name__.startswith("router.") and getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)
    return counts


async def test_a_filter_and_a_topic_are_validated_once_where_they_enter(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = await start_node("b")  # alone, so no other node's mirror reads the route meanwhile
    counts = count_validations(monkeypatch)
    await b.subscribe("phone", "home/+/temp", qos=1)  # local trie, Redis, route set, retained
    assert counts == {"validate_topic": 0, "validate_filter": 1}
    a = await start_node("a")
    await eventually(lambda: "b" in a.mirror.match("home/kitchen/temp").nodes)
    counts["validate_filter"] = 0  # a's mirror read b's route from Redis, where it entered a
    for _ in range(2):  # a cold publish (cache misses everywhere), then a hot one
        await a.publish("home/kitchen/temp", b"21.5", qos=1, retain=True)
    await take(b, "phone", 2)
    assert counts == {"validate_topic": 2, "validate_filter": 0}
