"""Retained messages through the node API (router.cluster.retainer), on real Redis and a cluster:
retain publishes store and delete, subscribes deliver with retain handling 0/1/2."""

from __future__ import annotations

import pytest

from router.cluster.node import RouterNode
from router.core.messages import Outgoing
from router.errors import RetainedArgumentError
from router.state.retained_store import RetainedConfig
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


def queued(node: RouterNode, client_id: str) -> int:
    return node.sessions.session(client_id).pending()


async def test_a_subscribe_on_another_node_gets_the_retained_message(
    start_node: StartNode,
) -> None:
    a, b = await start_node("a"), await start_node("b")
    await a.publish("home/kitchen/temp", b"21.5", qos=2, retain=True, publisher="thermo")
    await a.publish("home/garage/temp", b"9", qos=0, retain=True)
    await a.publish("home/kitchen/light", b"on", retain=True, expiry_interval=600)
    await a.publish("home/attic/temp", b"not retained", qos=1)
    await b.subscribe("phone", "home/+/temp", qos=1, subscription_identifier=7)
    got = await take(b, "phone", 2)
    assert [(d.topic, d.payload, d.qos, d.retain, d.subscription_ids) for d in got] == [
        ("home/garage/temp", b"9", 0, True, (7,)),
        ("home/kitchen/temp", b"21.5", 1, True, (7,)),  # QoS min(subscription, message)
    ]
    assert got[1].publisher == "thermo" and len(got[1].message_id) == 16
    assert queued(b, "phone") == 0
    await b.subscribe("phone", "home/kitchen/light")
    [light] = await take(b, "phone", 1)
    assert (
        light.retain and light.expiry_interval is not None and 599 <= light.expiry_interval <= 600
    )
    assert b.stats()["retained_delivered"] == 3
    assert a.stats()["retained_stored"] == 3


async def test_an_empty_retain_publish_deletes_and_is_still_routed(start_node: StartNode) -> None:
    a = await start_node("a")
    await a.publish("s/t", b"1", retain=True)
    await a.subscribe("live", "s/t", retain_as_published=True)
    [first] = await take(a, "live", 1)
    assert (first.payload, first.retain) == (b"1", True)
    result = await a.publish("s/t", b"", retain=True)
    assert result.nodes == ["a"]
    [deleting] = await take(a, "live", 1)
    assert (deleting.payload, deleting.retain) == (b"", True)  # retain-as-published
    assert await a.retained.get("s/t") is None
    await a.subscribe("late", "s/#")
    assert queued(a, "late") == 0
    assert a.stats()["retained_deleted"] == 1


async def test_live_copies_keep_retain_only_with_retain_as_published(
    start_node: StartNode,
) -> None:
    a, b = await start_node("a"), await start_node("b")
    await b.subscribe("plain", "x/#", retain_handling=2)
    await b.subscribe("rap", "x/#", retain_as_published=True, retain_handling=2)
    await waiting.eventually(lambda: "b" in a.mirror.match("x/1").nodes, 5.0, "b's route")
    await a.publish("x/1", b"r", retain=True)
    await a.publish("x/2", b"n")
    assert [d.retain for d in await take(b, "plain", 2)] == [False, False]
    assert [d.retain for d in await take(b, "rap", 2)] == [True, False]
    # A non-retained publish never replaces the retained message.
    await a.publish("x/1", b"newer, not retained")
    kept = await a.retained.get("x/1")
    assert kept is not None and kept.payload == b"r"


async def test_retain_handling_decides_when_retained_messages_are_sent(
    start_node: StartNode,
) -> None:
    a = await start_node("a")
    await a.publish("r/t", b"kept", retain=True)
    await a.subscribe("always", "r/#", retain_handling=0)
    await a.subscribe("always", "r/#", retain_handling=0)  # again: sent again
    assert len(await take(a, "always", 2)) == 2
    assert await a.subscribe("once", "r/#", retain_handling=1)
    assert not await a.subscribe("once", "r/#", retain_handling=1)  # not new: none
    assert len(await take(a, "once", 1)) == 1
    assert queued(a, "once") == 0
    await a.subscribe("never", "r/#", retain_handling=2)
    await a.subscribe("shared", "$share/g/r/#")
    assert queued(a, "never") == 0 and queued(a, "shared") == 0


async def test_wildcard_subscribes_skip_dollar_topics(start_node: StartNode) -> None:
    a = await start_node("a")
    for topic in ["$SYS/uptime", "a/1", "b/1", "/c"]:
        await a.publish(topic, topic.encode(), retain=True)
    await a.subscribe("all", "#")
    assert sorted(d.topic for d in await take(a, "all", 3)) == ["/c", "a/1", "b/1"]
    await a.subscribe("sys", "$SYS/#")
    assert [d.topic for d in await take(a, "sys", 1)] == ["$SYS/uptime"]


async def test_limits_route_but_do_not_retain(start_node: StartNode) -> None:
    limits = RetainedConfig(max_payload=4, max_count=1)
    a = await start_node("a", retained=limits)
    await a.subscribe("live", "l/#", retain_handling=2)
    await a.publish("l/big", b"12345", retain=True)
    await a.publish("l/one", b"1", retain=True)
    await a.publish("l/two", b"2", retain=True)  # the store is full: a new topic is refused
    await a.publish("l/one", b"1b", retain=True)  # ... but an old one is replaced
    assert [d.topic for d in await take(a, "live", 4)] == ["l/big", "l/one", "l/two", "l/one"]
    assert [m.topic async for m in a.retained.iter_match("l/#")] == ["l/one"]
    replaced = await a.retained.get("l/one")
    assert replaced is not None and replaced.payload == b"1b"
    assert a.stats()["retained_refused"] == 2


async def test_publish_many_retains_and_checks_every_expiry_first(start_node: StartNode) -> None:
    a = await start_node("a")
    await a.publish_many(
        [
            Outgoing("m/1", b"1", retain=True, expiry_interval=60),
            Outgoing("m/2", b"2"),
            Outgoing("m/3", b"3", qos=1, retain=True),
        ]
    )
    assert [m.topic async for m in a.retained.iter_match("m/+")] == ["m/1", "m/3"]
    with pytest.raises(RetainedArgumentError):
        await a.publish_many(
            [
                Outgoing("m/4", b"4", retain=True),
                Outgoing("m/5", b"5", retain=True, expiry_interval=0),
            ]
        )
    with pytest.raises(RetainedArgumentError):
        await a.publish("m/6", b"6", retain=True, expiry_interval=-1)
    assert await a.retained.size() == 2


async def test_a_node_clears_expired_messages_in_the_background(start_node: StartNode) -> None:
    a = await start_node("a", retained=RetainedConfig(clear_interval=0.05))
    await a.publish("e/brief", b"x", retain=True, expiry_interval=1)
    await a.publish("e/stays", b"y", retain=True)
    assert await a.retained.size() == 2

    async def cleared() -> bool:
        return a.stats()["retained_cleared"] == 1

    await waiting.eventually(cleared, 5.0, "the node to clear the expired message")
    assert await a.retained.size() == 1
    assert [m.topic async for m in a.retained.iter_match("e/#")] == ["e/stays"]
