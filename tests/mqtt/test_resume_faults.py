"""A persistent session whose node died resumes on another node and gets everything that
was acknowledged to its publisher, even when Redis fails in the middle of the resume or
the node adopts the dead node's sessions at the same time.

Node x serves the session of ``sub`` (QoS 1) and dies (as ``kill -9``: no goodbye); node
z acknowledges messages for it meanwhile (stored in x's inbox). The client reconnects to
z with a raw MQTT 5.0 connection. z waits ``handoff_timeout`` for a handoff x never
writes, then recovers the copies from x's inbox. Real ``redis-server`` with an
append-only file (``appendfsync always``), killed and restarted in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.errors import RouterError
from router.mqtt.server import serve
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support import waiting
from tests.support.nodes import die, take
from tests.support.raw_mqtt import RawClient
from tests.support.servers import RedisServer

EXPIRY = 300
SERVER_UNAVAILABLE = 0x88

StartNode = Callable[..., Any]


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory(aof=True)


@pytest.fixture
async def start_node(server: RedisServer, keys: Keys) -> AsyncIterator[StartNode]:
    """Nodes on the test's own Redis (stopped at the end unless the test killed them)."""
    started: list[tuple[RouterNode, RedisClient]] = []

    async def start(node_id: str, **config: Any) -> RouterNode:
        redis = await open_redis(server.url, socket_timeout=1, socket_connect_timeout=1)
        settings = NodeConfig(node_id, prefix=keys.prefix, heartbeat_interval=0.2, **config)
        node = await RouterNode(redis, settings).start()
        started.append((node, redis))
        return node

    try:
        yield start
    finally:
        for node, redis in reversed(started):
            if node.running:
                with contextlib.suppress(RouterError):  # (Redis restarted)
                    await node.stop()
            await redis.aclose()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[int], Any]]:
    """Connects ``sub`` (clean start 0) to a port; every connection is closed at the end."""
    made: list[RawClient] = []

    async def open_one(port: int) -> RawClient:
        client = await RawClient.connect(port, "sub", clean_start=False, expiry=EXPIRY)
        made.append(client)
        return client

    try:
        yield open_one
    finally:
        for client in made:
            client.drop()


async def dead_with_backlog(
    start_node: StartNode, **z_config: Any
) -> tuple[RouterNode, RouterNode]:
    """x served ``sub`` and died; z acknowledged messages 0-4 for it since (in x's inbox)."""
    x = await start_node("x", heartbeat_ttl=z_config.get("heartbeat_ttl", 30.0))
    z = await start_node("z", **z_config)
    await x.connect("sub", clean_start=False, expiry=EXPIRY)
    await x.subscribe("sub", "news/#", qos=1)
    await waiting.eventually(lambda: "x" in z.mirror.match("news/t").nodes, 5, "z routes to x")
    await die(x)
    for n in range(5):
        await z.publish("news/t", str(n).encode(), qos=1)
    return x, z


async def claimed_by(z: RouterNode) -> bool:
    [owner] = await z.subscriptions.owners(["sub"])
    return owner is not None and owner.node_id == "z"


async def every_message(client: RawClient, z: RouterNode) -> None:
    """Messages 0-4 reach the client, then 20 more published now: none of them goes to
    the session's away queue."""
    got = await client.take(5, deadline=10)
    client.acknowledge(got)
    assert sorted(int(p.payload) for p in got) == list(range(5))
    for n in range(5, 25):
        await z.publish("news/t", b"%d" % n, qos=1)
    after = await client.take(20, deadline=5)
    client.acknowledge(after)
    assert [int(p.payload) for p in after] == list(range(5, 25))


async def test_a_resume_that_redis_fails_after_its_claim_is_finished_by_the_retry(
    server: RedisServer, start_node: StartNode, connect: Callable[[int], Any]
) -> None:
    """Redis dies while z waits for x's handoff (the session claimed already): CONNACK
    0x88. The client's retry, once Redis is back from its append-only file, gets Session
    Present and then every message; before, the retry found the session claimed and
    not away, answered Session Present at once and delivered nothing."""
    _x, z = await dead_with_backlog(start_node, handoff_timeout=3.0)
    async with serve(z, ["127.0.0.1:0"]) as mqtt:
        port = mqtt.addresses[0][1]
        first = asyncio.ensure_future(connect(port))
        await waiting.eventually(lambda: claimed_by(z), 5, "z claimed the session")
        server.kill()
        refused = await first
        assert refused.connack is not None
        assert refused.connack.reason_code == SERVER_UNAVAILABLE
        server.restart()

        retry = await connected_again(connect, port)

        await every_message(retry, z)


class Refused(Exception):
    """A CONNACK other than 0x00."""


async def connected_again(connect: Callable[[int], Any], port: int) -> RawClient:
    """Reconnect until CONNACK 0x00 (Redis may still be on its way back): Session Present."""

    async def attempt() -> RawClient:
        client: RawClient = await connect(port)
        assert client.connack is not None
        if client.connack.reason_code != 0:
            raise Refused(f"CONNACK {client.connack.reason_code:#x}")
        return client

    client = await waiting.retried(attempt, 10, (Refused,))
    assert client.connack is not None and client.connack.session_present
    return client


async def test_a_client_that_connects_while_its_node_adopts_the_session_gets_everything(
    start_node: StartNode, connect: Callable[[int], Any]
) -> None:
    """z purges x and adopts its session (a resume that waits for x's handoff, then puts
    the session away) while the client connects to z: the client's resume waits for the
    adoption and then takes the session; before, it was answered at once and the
    adoption then put the connected session away, its copies going to the Redis queue."""
    _x, z = await dead_with_backlog(start_node, heartbeat_ttl=1.0, handoff_timeout=3.0)
    await waiting.eventually(lambda: claimed_by(z), 10, "z adopted the session")
    async with serve(z, ["127.0.0.1:0"]) as mqtt:
        client = await connect(mqtt.addresses[0][1])
        assert client.connack is not None and client.connack.session_present
        await waiting.eventually(lambda: z.stats()["sessions_adopted"] == 1, 10, "adopted")

        queued = z.stats()["session_queued"]

        await every_message(client, z)
        assert z.stats()["session_queued"] == queued  # (nothing went to the away queue)
        assert z.stats()["sessions_away"] == 0


async def test_a_connection_that_ends_while_redis_is_down_keeps_its_session(
    server: RedisServer,
    start_node: StartNode,
    connect: Callable[[int], Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's socket closes while Redis is gone: the session cannot be marked away
    (logged, not an unhandled error), and stays on the node for the client's return."""
    z = await start_node("z")
    async with serve(z, ["127.0.0.1:0"]) as mqtt:
        port = mqtt.addresses[0][1]
        first = await connect(port)
        await first.subscribe("news/#", 1)
        for n in range(5):
            await z.publish("news/t", b"%d" % n, qos=1)
        sent = await first.take(5)
        server.kill()
        first.drop()
        await waiting.eventually(lambda: not mqtt.clients(), 5, "the connection ended")
        server.restart()

        back = await connected_again(connect, port)

        again = await back.take(5)
        assert [(p.payload, p.packet_id, p.dup) for p in again] == [
            (p.payload, p.packet_id, True) for p in sent
        ]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_copy_for_an_away_session_that_redis_could_not_take_is_kept_and_queued_later(
    server: RedisServer, start_node: StartNode, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the model test (tests/cluster/test_session_model.py): a copy acknowledged
    for an away session while Redis restarted was dropped when the node could not move
    it to the session's queue; its node then died, and the client resumed elsewhere
    without it. Now the copy stays in the session and goes to the queue once Redis is
    back."""
    x = await start_node("x", heartbeat_ttl=30.0)
    z = await start_node("z", handoff_timeout=1.0)
    await x.connect("sub", clean_start=False, expiry=EXPIRY)
    await x.subscribe("sub", "news/#", qos=1)
    await x.put_away("sub")
    server.kill()
    await x.publish("news/t", b"while redis restarts", qos=1)  # (x serves it alone)
    await waiting.eventually(
        lambda: any("could not queue" in r.getMessage() for r in caplog.records), 5, "a spill"
    )
    server.restart()
    await waiting.eventually(lambda: x.stats()["session_queued"] == 1, 10, "queued")
    await die(x)

    assert await connected(z)

    [delivery] = await take(z, "sub", 1)
    assert delivery.payload == b"while redis restarts"


async def connected(node: RouterNode) -> bool:
    """Resume ``sub`` on ``node`` (Redis may still be on its way back: tried again)."""

    async def attempt() -> bool:
        return await node.connect("sub", clean_start=False, expiry=EXPIRY)

    return await waiting.retried(attempt, 10, (RouterError,))
