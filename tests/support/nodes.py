"""Router nodes for tests: the ``start_node`` fixture and reading what a client got.

``start_node(node_id, **config)`` starts a :class:`RouterNode` on its own Redis client
of the test's backend (``redis_connect``) and namespace (``keys``), with a fast heartbeat
(0.2 s, TTL 1 s) unless the test sets its own; every node it started is stopped at the
end of the test, last started first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.messages import Delivery
from router.errors import RouterError
from router.state.connection import open_redis
from router.state.keys import Keys

StartNode = Callable[..., Awaitable[RouterNode]]


@pytest.fixture
async def start_node(redis_connect: Any, keys: Keys) -> AsyncIterator[StartNode]:
    nodes: list[RouterNode] = []

    async def start(node_id: str, **config: Any) -> RouterNode:
        config.setdefault("heartbeat_interval", 0.2)
        config.setdefault("heartbeat_ttl", 1.0)
        node = RouterNode(await redis_connect(), NodeConfig(node_id, prefix=keys.prefix, **config))
        await node.start()
        nodes.append(node)
        return node

    try:
        yield start
    finally:
        for node in reversed(nodes):
            await node.stop()


@pytest.fixture
async def restartable() -> AsyncIterator[RestartableNodes]:
    """Nodes on a Redis the test restarts (``RestartableNodes.start``); every node and
    client it started is stopped at the end of the test, whatever Redis does then."""
    nodes = RestartableNodes()
    try:
        yield nodes
    finally:
        await nodes.close()


class RestartableNodes:
    """Starts nodes on a given Redis server (a :class:`~tests.support.servers.RedisServer`
    the test may kill and restart) with short socket timeouts, and stops them all."""

    def __init__(self) -> None:
        self.nodes: list[RouterNode] = []
        self._clients: list[Any] = []

    async def start(self, url: str, keys: Keys, node_id: str, **config: Any) -> RouterNode:
        redis = await open_redis(url, socket_timeout=2, socket_connect_timeout=2)
        self._clients.append(redis)
        node = RouterNode(redis, NodeConfig(node_id, prefix=keys.prefix, **config))
        self.nodes.append(await node.start())
        return node

    async def close(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(RouterError):  # (just after a restart of Redis)
                await node.stop()
        for redis in self._clients:
            await redis.aclose()


async def take(
    node: RouterNode, client_id: str, count: int, timeout: float = 5.0
) -> list[Delivery]:
    """The next ``count`` deliveries queued for ``client_id``; TimeoutError after
    ``timeout`` seconds without them."""
    session = node.sessions.session(client_id)
    got: list[Delivery] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            delivery = await session.get()
            assert delivery is not None
            got.append(delivery)
    return got


async def roamer_node(
    redis_connect: Any, keys: Keys, node_id: str, heartbeat_ttl: float
) -> RouterNode:
    """A node the test will kill (:func:`die`; ``start_node`` would stop it) serving the
    persistent session of ``roamer`` (expiry 600 s), subscribed to ``news`` at QoS 1."""
    config = NodeConfig(
        node_id, prefix=keys.prefix, heartbeat_interval=0.2, heartbeat_ttl=heartbeat_ttl
    )
    node = RouterNode(await redis_connect(), config)
    await node.start()
    await node.connect("roamer", clean_start=False, expiry=600)
    await node.subscribe("roamer", "news", qos=1)
    return node


async def die(node: RouterNode) -> None:
    """Stop ``node`` as ``kill -9`` would, within one process: its background work ends
    without a goodbye (no purge, its routes and inbox stay in Redis, its heartbeat stops),
    and so does its sessions' (a tail it was reading, a handoff under way, spillers and
    timers: a dead node's task must not go on reading a session queue that another node
    resumed)."""
    await node._supervisor.stop()
    await node._writer.stop()
    await node._membership.stop_adopting()
    await node._sync.stop()
    await node._inbox.stop()
    await node.close_urgent()
    await node._lifecycle.locks.stop()
    keeper = node._keeper
    tasks = [*keeper._tails.values(), *keeper._tasks]
    tasks += [move.task for move in keeper._handoffs.values()]
    for away in keeper._away.values():
        tasks += [away.spiller] if away.spiller is not None else []
        for timer in (away.end, away.will):
            if timer is not None:
                timer.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
