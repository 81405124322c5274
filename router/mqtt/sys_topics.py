"""``$SYS/broker/...``: live figures of each node and of the cluster, Mosquitto's way.

Every ``sys_interval`` seconds (:class:`~router.mqtt.settings.MqttSettings`; 0: off) a
node with MQTT listeners publishes retained messages whose payloads are ASCII text, as
Mosquitto's are::

    $SYS/broker/nodes/<node id>/clients/connected         this node's MQTT clients
    $SYS/broker/nodes/<node id>/messages/received         PUBLISH packets from clients
    $SYS/broker/nodes/<node id>/messages/sent             PUBLISH packets to clients
    $SYS/broker/nodes/<node id>/subscriptions/count       its local clients' subscriptions
    $SYS/broker/nodes/<node id>/retained messages/count   the (shared) retained store's size
    $SYS/broker/nodes/<node id>/uptime                    "<n> seconds" since it started
    $SYS/broker/nodes/<node id>/version                   "router 0.2.0"
    $SYS/broker/clients/connected, ...                    the same names for the cluster

Cluster-wide figures add up the live nodes' figures (uptime: the oldest live node's;
version: every version running, comma-separated; the retained count is the one shared
store's, not a sum). To know the others' figures, each node writes its own into Redis
every interval (:mod:`router.state.node_figures`: an expiring hash, deleted when the node
stops) and reads those of the live nodes (the registry's heartbeats decide who is live).
A ``/``, ``+``, ``#`` or NUL in a node id becomes ``_`` in its topic level.

**Who publishes the cluster-wide topics.** One node: the live node with the smallest id
among those that wrote figures (nodes without MQTT listeners, such as the CLI's
short-lived tool nodes, write none and are never chosen). Letting every node publish them
would work too (the sums are the same), but each node reads the figures at a slightly
different moment, so subscribers would see the values flicker between nodes' readings,
and N nodes would store the same retained messages N times an interval. The election
needs no extra state: every node reads the same live figures and agrees, and when the
chosen node leaves, the next one takes over on its next interval. The chosen node also
deletes the ``$SYS/broker/nodes/<id>/...`` topics of nodes that are no longer live (a
node that stops deletes its own; one that crashed cannot).

As Mosquitto does, a topic is published only when its value changed (so a subscriber to
``$SYS/#`` hears of changes; the retained messages hold the latest values), and every
topic again every :data:`REFRESH_TICKS` intervals, in case the retained store lost them.

MQTT rules (:mod:`router.core.topics`): a filter starting with ``#`` or ``+`` never
matches ``$SYS/...``; clients subscribe to ``$SYS/#`` explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import Iterable
from typing import Final

from router.cluster.tasks import stop_task
from router.errors import StateError
from router.mqtt.connection_host import ConnectionHost
from router.state.node_figures import NodeFigures, NodeFigureStore

log = logging.getLogger(__name__)

SYS_PREFIX: Final = "$SYS/broker/"
NODES_PREFIX: Final = SYS_PREFIX + "nodes/"
TTL_INTERVALS: Final = 3  # a node's figures in Redis outlive this many missed intervals
MIN_TTL: Final = 1.0  # seconds, however short the interval
REFRESH_TICKS: Final = 60  # every topic is published again this often, changed or not
NAMES: Final = (
    "clients/connected",
    "messages/received",
    "messages/sent",
    "subscriptions/count",
    "retained messages/count",
    "uptime",
    "version",
)


def _version() -> str:
    try:
        return "router " + importlib.metadata.version("router")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover (run from a checkout)
        return "router unknown"


VERSION: Final = _version()


def node_level(node_id: str) -> str:
    """The topic level that names ``node_id`` (``/ + #`` and NUL replaced by ``_``)."""
    return node_id.translate({ord(c): "_" for c in "/+#\x00"})


def payloads(figures: NodeFigures, retained: int) -> dict[str, bytes]:
    """Topic name (under a prefix) -> payload, for each of :data:`NAMES`."""
    values = (
        figures.clients,
        figures.messages_received,
        figures.messages_sent,
        figures.subscriptions,
        retained,
        f"{figures.uptime} seconds",
        figures.version,
    )
    return {
        name: str(value).encode("ascii", "replace")
        for name, value in zip(NAMES, values, strict=True)
    }


def cluster_figures(nodes: Iterable[NodeFigures]) -> NodeFigures:
    """The cluster's figures: counts summed, the longest uptime, every version (sorted)."""
    found = list(nodes)
    return NodeFigures(
        clients=sum(f.clients for f in found),
        messages_received=sum(f.messages_received for f in found),
        messages_sent=sum(f.messages_sent for f in found),
        subscriptions=sum(f.subscriptions for f in found),
        uptime=max((f.uptime for f in found), default=0),
        version=", ".join(sorted({f.version for f in found if f.version})),
    )


class SysTopics:
    """The ``$SYS`` publisher of one :class:`MqttServer` (see the module docstring)."""

    def __init__(self, server: ConnectionHost) -> None:
        self.server = server
        self.node = server.node
        self.store = NodeFigureStore(self.node.registry.redis, self.node.keys)
        self.prefix = NODES_PREFIX + node_level(self.node.node_id) + "/"
        self._task: asyncio.Task[None] | None = None
        self._started = time.monotonic()
        self._ticks = 0
        self._sent_node: dict[str, bytes] = {}  # topic -> payload last published
        self._sent_cluster: dict[str, bytes] = {}

    @property
    def interval(self) -> float:
        return self.server.settings.sys_interval

    def start(self) -> None:
        """Publish now and then every interval, until :meth:`stop` (no-op if running)."""
        if self._task is None:
            self._started = time.monotonic()
            self._task = asyncio.create_task(self._run(), name=f"sys:{self.node.node_id}")

    async def stop(self) -> None:
        """Stop publishing; delete this node's figures and ``$SYS/broker/nodes/<id>/...``
        topics, and the cluster-wide ones if no other node publishes. Never raises for
        Redis trouble (logged): the node is leaving anyway. No-op if never started."""
        if self._task is None:
            return
        await stop_task(self._task)
        self._task = None
        try:
            await self.store.delete(self.node.node_id)
            await self.node.retained.delete(self.prefix + "#")
            if not await self.store.live(self.node.registry):
                for name in NAMES:
                    await self.node.retained.delete(SYS_PREFIX + name)
        except StateError:
            log.warning("$SYS topics of node %s left behind", self.node.node_id, exc_info=True)
        except Exception as error:
            self.node.internal_error("$SYS topics' removal", error)

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except StateError:
                log.warning("$SYS update of node %s failed", self.node.node_id, exc_info=True)
            except Exception as error:
                self.node.internal_error("$SYS update", error)
            await asyncio.sleep(self.interval)

    def figures(self) -> NodeFigures:
        """This node's figures now."""
        stats = self.server.stats()
        return NodeFigures(
            clients=stats["mqtt_clients"],
            messages_received=stats["mqtt_messages_received"],
            messages_sent=stats["mqtt_messages_sent"],
            subscriptions=len(self.node.sessions.trie),
            uptime=int(time.monotonic() - self._started),
            version=VERSION,
        )

    async def tick(self) -> None:
        """One interval's work: write and publish this node's figures; if this node is
        the chosen one, publish the cluster's and delete the topics of departed nodes."""
        if self._ticks % REFRESH_TICKS == 0:
            self._sent_node.clear()
            self._sent_cluster.clear()
        self._ticks += 1
        own = self.figures()
        await self.store.write(self.node.node_id, own, max(TTL_INTERVALS * self.interval, MIN_TTL))
        retained = await self.node.retained.size()
        await self._publish(self.prefix, payloads(own, retained), self._sent_node)
        live = await self.store.live(self.node.registry)
        if min(live, default=None) != self.node.node_id:
            self._sent_cluster.clear()  # another node publishes them; resend all if chosen
            return
        totals = payloads(cluster_figures(live.values()), retained)
        await self._publish(SYS_PREFIX, totals, self._sent_cluster)
        await self._delete_departed()

    async def _publish(self, prefix: str, values: dict[str, bytes], sent: dict[str, bytes]) -> None:
        for name, payload in values.items():
            topic = prefix + name
            if sent.get(topic) != payload:
                await self.node.publish(topic, payload, retain=True)
                sent[topic] = payload

    async def _delete_departed(self) -> None:
        """Delete the per-node topics of nodes that are not live. The retained topics are
        read *before* the registry: a node registers before it publishes, so a node whose
        topics were seen and that is not live afterwards really left."""
        levels = set()
        async for message in self.node.retained.iter_match(NODES_PREFIX + "+/version"):
            levels.add(message.topic[len(NODES_PREFIX) :].partition("/")[0])
        live = {node_level(node.node_id) for node in await self.node.registry.live_nodes()}
        for level in sorted(levels - live):
            with contextlib.suppress(ValueError):  # a level no filter can name
                deleted = await self.node.retained.delete(f"{NODES_PREFIX}{level}/#")
                log.info("deleted %d $SYS topics of departed node %s", deleted, level)
