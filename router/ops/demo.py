"""The demo behind ``router demo`` / ``make demo``: three nodes on one Redis.

Without a URL it starts an embedded Redis (a real ``redis-server`` when installed,
fakeredis's TCP server otherwise). Three nodes join; clients subscribe on different
nodes; a publisher on node-1 sends sensor readings and jobs. The report shows the cluster
route table and, per node, the copies it received: a node with no interested client
received nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.topics import TopicFilter
from router.core.trie import SubscriptionTrie
from router.errors import DemoTimeoutError
from router.ops.embedded_redis import embedded_redis, kind_of
from router.state.connection import open_redis
from router.state.scripts import RedisClient

# node -> [(client, filter)]
SUBSCRIPTIONS: dict[str, list[tuple[str, str]]] = {
    "node-1": [("dashboard", "sensors/+/temperature")],
    "node-2": [("archiver", "sensors/#"), ("worker-a", "$share/workers/jobs/#")],
    "node-3": [("worker-b", "$share/workers/jobs/#"), ("pager", "alerts/#")],
}
ROOMS = ("kitchen", "garage", "attic")


def demo_publishes() -> list[tuple[str, bytes]]:
    """What node-1 publishes: readings of every room, and a few jobs."""
    readings = [
        (f"sensors/{room}/{kind}", f"{20 + index}".encode())
        for index, room in enumerate(ROOMS)
        for kind in ("temperature", "humidity")
    ]
    jobs = [(f"jobs/resize/{number}", b"photo.jpg") for number in range(6)]
    return readings + jobs


@dataclass
class DemoReport:
    """What the demo observed."""

    server: str
    routes: dict[TopicFilter, dict[str, int]]
    received: dict[str, int]
    deliveries: dict[str, Counter[str]] = field(default_factory=dict)
    copies: dict[str, Counter[str]] = field(default_factory=dict)

    def lines(self) -> Iterator[str]:
        yield f"Redis: {self.server}"
        yield ""
        yield "Cluster route table (filter -> nodes):"
        for route, nodes in self.routes.items():
            shown = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in nodes.items())
            yield f"  {route:28} {shown}"
        yield ""
        yield "Per node: copies received from other nodes, and deliveries per client:"
        for node_id, copies in self.received.items():
            clients = ", ".join(f"{c}={n}" for c, n in sorted(self.deliveries[node_id].items()))
            yield f"  {node_id}: {copies:3} copies   {clients or '(no deliveries)'}"
        yield ""
        yield "Copies per topic (from node-1's publishes; node-1's own clients count as node-1):"
        for root, per_node in self.copies.items():
            shown = ", ".join(f"{n}={per_node.get(n, 0)}" for n in self.received)
            left_out = [n for n in self.received if not per_node.get(n)]
            yield f"  {root + '/...':14} {shown}   (no copy to: {', '.join(left_out) or '-'})"


def expected_deliveries(publishes: list[tuple[str, bytes]]) -> int:
    """How many deliveries the publishes must make: every plain subscriber, plus one
    member per matching share group (computed with one trie holding every client)."""
    trie = SubscriptionTrie()
    for subscriptions in SUBSCRIPTIONS.values():
        for client_id, topic_filter in subscriptions:
            trie.subscribe(client_id, topic_filter)
    return sum(len(trie.match(topic)) for topic, _ in publishes)


async def _drain(node: RouterNode, client_id: str, counts: Counter[str]) -> None:
    async for _ in node.messages(client_id):
        counts[client_id] += 1


async def run_demo_on(url: str) -> DemoReport:
    """Run the demo on the Redis at ``url`` (a namespace of its own, removed after)."""
    prefix = f"demo{uuid.uuid4().hex[:6]}"
    clients: list[RedisClient] = []
    nodes: dict[str, RouterNode] = {}
    counts = {node_id: Counter[str]() for node_id in SUBSCRIPTIONS}
    consumers = []
    try:
        for node_id in SUBSCRIPTIONS:
            redis = await open_redis(url)
            clients.append(redis)
            nodes[node_id] = await RouterNode(
                redis, NodeConfig(node_id, prefix=prefix, heartbeat_interval=0.5)
            ).start()
        for node_id, subscriptions in SUBSCRIPTIONS.items():
            for client_id, topic_filter in subscriptions:
                await nodes[node_id].subscribe(client_id, topic_filter)
                consumers.append(
                    asyncio.create_task(_drain(nodes[node_id], client_id, counts[node_id]))
                )
        publisher = nodes["node-1"]
        await _until(
            lambda: (
                len(publisher.mirror.nodes()) == len(SUBSCRIPTIONS)
                and all(publisher.mirror.routes(n) for n in SUBSCRIPTIONS)
            )
        )
        publishes = demo_publishes()
        copies: dict[str, Counter[str]] = {}
        for topic, payload in publishes:
            result = await publisher.publish(topic, payload, publisher="demo-publisher")
            copies.setdefault(topic.split("/", 1)[0], Counter()).update(result.nodes)
        expected = expected_deliveries(publishes)
        await _until(lambda: sum(sum(c.values()) for c in counts.values()) >= expected)
        return DemoReport(
            server=kind_of(url),
            routes=publisher.mirror.table(),
            received={n: node.stats()["received"] for n, node in nodes.items()},
            deliveries=counts,
            copies=copies,
        )
    finally:
        for task in consumers:
            task.cancel()
        for node in nodes.values():
            await node.stop()
        for redis in clients:
            await redis.aclose()


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise DemoTimeoutError("the demo cluster did not reach the expected state in time")
        await asyncio.sleep(0.01)


def run_demo(url: str | None = None) -> DemoReport:
    """Run the demo on ``url``, or on an embedded Redis when ``url`` is None."""
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(embedded_redis())
        return asyncio.run(run_demo_on(url))
