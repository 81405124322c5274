"""Subscriptions in effect when acknowledged (router.cluster.visibility), on embedded nodes.

The MQTT view (arrival order, SUBACK across nodes) is in tests/mqtt/test_visibility.py;
here: what a subscribe waits for, that the wait is bounded, and that it is counted.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest

from router.cluster.node import RouterNode
from router.errors import RouterError
from router.state.keys import Keys
from router.state.route_acks import RouteAcks
from tests.support.nodes import RestartableNodes, StartNode, die, take
from tests.support.servers import RedisServer
from tests.support.waiting import eventually, retried

FENCE_HELD = 1.0
"""Seconds the fence test holds a copy after the peer's mirror took the change."""


async def knows(node: RouterNode, *others: str) -> None:
    """Wait until ``node``'s mirror holds ``others``: a SUBACK waits only for the nodes its
    node knows (one that joined a moment ago is not waited for, as docs/reliability.md
    says; it loaded the routes when it started and catches up by the hint)."""
    await eventually(lambda: set(others) <= set(node.mirror.nodes()), 10, f"{others} known")


async def test_a_subscribe_returns_once_every_other_node_routes_to_it(
    start_node: StartNode,
) -> None:
    """Each subscribe below adds a route; once it returns, the other nodes' mirrors
    route to it without waiting for anything."""
    a, b, c = await start_node("a"), await start_node("b"), await start_node("c")
    await knows(a, "b", "c")
    for i in range(20):
        await a.subscribe("client", f"t/{i}")
        for node in (b, c):  # (no waiting: routed at once)
            assert node.mirror.match(f"t/{i}", None).nodes.keys() == {"a"}
    assert a.stats()["subscribe_unconfirmed"] == 0
    assert a.stats()["subscribe_waited"] >= 1


async def test_the_acks_are_in_redis_for_a_writer_that_missed_them(
    start_node: StartNode, redis_client: object
) -> None:
    a, b = await start_node("a"), await start_node("b")
    await knows(a, "b")
    await a.subscribe("client", "t")
    generation, version = a.mirror.position("a") or (None, 0)
    assert generation is not None and version >= 1
    acks = await RouteAcks(b._redis, b.keys).read("a")
    assert acks["b"] == (generation, version)


async def test_a_mirror_acks_a_change_once_the_copies_matched_before_it_are_stored(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ack is a fence. Node p matched a copy for node a and its write to a's inbox
    is held; a then subscribes. p's mirror takes the new route at once, but p acks it
    (and a's subscribe returns) only once the held copy is stored. A node that adopts a
    dead node's sessions relies on this to read the dead node's inbox without a grace
    (tests/cluster/test_adoption.py)."""
    a, p = await start_node("a", heartbeat_ttl=10.0), await start_node("p", heartbeat_ttl=10.0)
    await knows(a, "p")
    await a.connect("client")
    await a.subscribe("client", "t")
    await eventually(lambda: "a" in p.mirror.match("t").nodes, 10, "p routes t to a")
    held = asyncio.Event()
    send = p._forwarder.send

    def held_to_a(node_id: str, forwards: list[Any]) -> asyncio.Future[None]:
        async def when_released() -> None:
            await held.wait()
            await send(node_id, forwards)

        return asyncio.ensure_future(when_released()) if node_id == "a" else send(node_id, forwards)

    monkeypatch.setattr(p._forwarder, "send", held_to_a)
    publish = asyncio.create_task(p.publish("t", b"held", qos=1))
    await eventually(lambda: p.forwards.pending, 10, "p's copy on its way")
    subscribe = asyncio.create_task(a.subscribe("client", "u"))
    await eventually(lambda: "a" in p.mirror.match("u").nodes, 10, "p routes u to a")
    # (nothing to wait for: without the fence, p's ack gets a's subscribe back within ms)
    done, _ = await asyncio.wait([subscribe], timeout=FENCE_HELD)
    assert not done, "a's subscribe returned while p's copy was still on its way"
    held.set()
    await subscribe
    await publish
    assert a.stats()["subscribe_unconfirmed"] == 0
    assert [d.payload for d in await take(a, "client", 1)] == [b"held"]


@pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)
async def test_a_node_that_never_acks_delays_a_subscribe_by_the_ttl_at_most(
    start_node: StartNode, redis_client: object
) -> None:
    """A node whose background work stopped (as under kill -9, before its heartbeat
    expired) cannot ack: the subscribe returns after the heartbeat TTL, counted."""
    a = await start_node("a", heartbeat_ttl=1.0)
    b = await start_node("b", heartbeat_ttl=30.0)  # (not purged as dead during the test)
    await die(b)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await a.subscribe("client", "t") is True
    assert loop.time() - started < 5.0  # (bounded: well within the test's patience)
    assert a.stats()["subscribe_unconfirmed"] == 1
    assert list(a.sessions.trie.subscriptions("client")) == ["t"]


@pytest.mark.redis
async def test_a_subscribe_after_a_redis_restart_waits_for_a_node_whose_join_was_lost(
    redis_server_factory: Callable[..., RedisServer], keys: Keys, restartable: RestartableNodes
) -> None:
    """Found by the model-based session test: b joined, and Redis restarted before a
    heard b's join (pub/sub hints are lost with the server), so a's SUBACK waited for
    nobody; b, which had missed a's route hint as well, acknowledged QoS 1 publishes for
    the new subscription as unrouted. A node whose hints connection failed reads the
    registry again before a subscribe may rely on whom it knows."""
    server = redis_server_factory(aof=True)
    timing = {"heartbeat_interval": 2.0, "heartbeat_ttl": 6.0}
    a = await restartable.start(server.url, keys, "a", **timing)
    b = await restartable.start(server.url, keys, "b", **timing)
    server.restart()  # (the loop stands still: a has not read b's join hint yet)
    await retried(  # (a pooled connection may meet the restart: refused, as a SUBACK 0x80)
        functools.partial(a.subscribe, "client", "t/#", qos=1), 5, (RouterError,), poll=0.1
    )

    result = await b.publish("t/1", b"after the SUBACK", qos=1)

    assert result.nodes == ["a"]
    [delivery] = await take(a, "client", 1)
    assert delivery.payload == b"after the SUBACK"
