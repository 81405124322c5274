"""Node telemetry: each node samples its own figures, keeps the last hour, and publishes
them to Redis, where any node's API and the CLI read and merge the cluster's
(:mod:`router.ops.nodes_view`).

**Sampling** (:class:`Telemetry`, one asyncio task per node, which
:func:`router.ops.node_process.run_node` starts for every node, with or without an HTTP
listener): every ``interval`` seconds it reads the node's counters (``node.stats()``,
``mqtt.stats()``), the process's resident memory (``/proc/self/statm``), its CPU use
since the previous sample (``time.process_time()`` over the wall time, x100: one core
fully busy is 100), how late its own sleep woke (the event loop's lag) and the time one
Redis PING took. It keeps the
last ``keep`` traffic samples in memory (1800 at 2 s: the last hour) and writes the
figures and the sample in one transaction (:class:`NodeHistoryStore`), then the figures
of every client it holds (:mod:`router.state.client_figures`): the figures expire after
:data:`TTL_INTERVALS` intervals, the history after the hour. A Redis error is logged and
the next interval goes on; stopping deletes the node's keys.

**The traffic figures** are counters since the node started::

    in        "published"          messages published at this node (its MQTT clients, the
                                   HTTP API, wills, $SYS): each message counts once, at the
                                   node where it entered the cluster
    out       "local_deliveries"   copies handed to this node's sessions (connected or away):
                                   each delivery counts once, at the node of its subscriber
    dropped   DROPPED              copies lost: full queues, expired, oversized, a share
                                   group without members

so the sums across nodes are the cluster's, with nothing counted twice.

Cost on the node: one PING and two MULTI/EXECs an interval, one read of a small file,
and ``node.stats()`` (which counts the node's routes and sessions' drops: linear in them).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final

from router.cluster.client_stats import DropRates, FigureChanges
from router.cluster.filter_traffic import busiest
from router.cluster.node import RouterNode
from router.cluster.tasks import stop_task
from router.errors import StateError
from router.mqtt.pressure import resident_kib
from router.mqtt.server import MqttServer
from router.mqtt.sys_topics import VERSION
from router.state.client_figures import ClientFigureStore, NodeDrops
from router.state.failures import REDIS_ERRORS
from router.state.node_history import (
    DEFAULT_INTERVAL,
    NodeHistoryStore,
    NodeTelemetry,
    Rates,
    TrafficSample,
    latest_rates,
)

log = logging.getLogger(__name__)

TTL_INTERVALS: Final = 3  # a node's figures outlive this many missed intervals
MIN_TTL: Final = 1.0  # seconds, however short the interval
PING_TIMEOUT: Final = 1.0  # seconds; a PING not answered by then: latency unknown (None)
DROPPED: Final = (
    "queue_drops",  # a connected client's queue was full
    "session_queue_drops",  # an away session's queue in Redis was full
    "expired_dropped",  # expired while an away session's queue held it
    "undeliverable",  # a share group with no member left on any node
    "mqtt_expired_dropped",  # expired before its client could take it
    "mqtt_oversized_dropped",  # larger than its client's Maximum Packet Size
)
"""The counters of ``node.stats()`` and ``mqtt.stats()`` that add up to "dropped"."""
DEPARTED_SHOWN: Final = 3600.0
"""Seconds a node that died (purged from the registry, never said goodbye) stays listed."""


def listener_names(mqtt: MqttServer | None) -> list[str]:
    """The MQTT listeners of ``mqtt`` as the dashboard shows them: "scheme://host:port"."""
    return [f"{scheme}://{host}:{port}" for scheme, host, port in (mqtt.listeners if mqtt else [])]


class Telemetry:
    """The sampler of one node (see the module docstring); ``async with`` starts it (the
    first sample at once) and stops it (the node's keys deleted).

    ``listeners``: "scheme://host:port" of the node's listeners, as the dashboard shows
    them. ``interval``: seconds between samples (> 0). ``keep``: samples kept, in memory
    and in Redis (>= 2). ``started_at``: the node's start (unix seconds; default now).
    ``auth``: where the node takes its users and rules from
    (:data:`~router.state.node_history.SHARED_AUTH`, ...; "": not told), written with its
    figures so that the dashboard can say which nodes enforce the users and rules it
    edits. ``advertised``: the MQTT address the node's clients use (``--mqtt-advertise``),
    where a draining peer sends its MQTT 5.0 clients (:mod:`router.mqtt.drain`). Raises
    ``ValueError`` for a bad interval or keep."""

    def __init__(
        self,
        node: RouterNode,
        mqtt: MqttServer | None,
        listeners: Sequence[str],
        interval: float = DEFAULT_INTERVAL,
        keep: int = 1800,
        *,
        started_at: float | None = None,
        auth: str = "",
        advertised: str = "",
    ) -> None:
        if not isinstance(interval, int | float) or not interval > 0:
            raise ValueError(f"interval must be a number > 0, not {interval!r}")
        if type(keep) is not int or keep < 2:
            raise ValueError(f"keep must be an int >= 2, not {keep!r}")
        self.node = node
        self.mqtt = mqtt
        self.listeners = tuple(listeners)
        self.interval = float(interval)
        self.keep = keep
        self.started_at = time.time() if started_at is None else started_at
        self.auth = auth
        self.advertised = advertised
        self.store = NodeHistoryStore(node.registry.redis, node.keys)
        self.clients = ClientFigureStore(node.registry.redis, node.keys)
        self.latest: NodeTelemetry | None = None  # the figures of the last sample
        self._stats: Mapping[str, int] = {}  # (the counters of the last sample)
        self._drop_rates = DropRates()
        self._changes = FigureChanges()  # (the clients' figures written: only changes)
        self._filters_since = time.time()  # (the busiest filters count from then)
        self._samples: collections.deque[TrafficSample] = collections.deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None
        self._cpu = (time.monotonic(), time.process_time())

    def add_listener(self, listener: str) -> None:
        """Name one more listener ("scheme://host:port") from the next sample on (the
        HTTP listener, bound after the sampler started)."""
        if listener not in self.listeners:
            self.listeners = (*self.listeners, listener)

    @property
    def history(self) -> list[TrafficSample]:
        """This node's samples in memory, oldest first (at most ``keep``)."""
        return list(self._samples)

    def rates(self) -> Rates | None:
        """This node's rates over its last two samples (None before the second, or
        right after a counter went down)."""
        return latest_rates(self._samples)

    async def __aenter__(self) -> Telemetry:
        self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Sample now and then every interval, until :meth:`stop` (no-op if running)."""
        if self._task is None:
            self._cpu = (time.monotonic(), time.process_time())
            self._task = asyncio.create_task(self._run(), name=f"telemetry:{self.node.node_id}")

    async def stop(self) -> None:
        """Stop sampling and delete the node's telemetry and history from Redis. Never
        raises for Redis trouble (logged: the keys expire anyway). No-op if not running."""
        if self._task is None:
            return
        await stop_task(self._task)
        self._task = None
        try:
            await self.store.delete(self.node.node_id)
            await self.clients.delete(self.node.node_id)
        except StateError:
            log.warning("telemetry of node %s left behind", self.node.node_id, exc_info=True)
        except Exception as error:
            self.node.internal_error("telemetry's removal", error)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            lag = max(0.0, loop.time() - due)
            try:
                await self.tick(lag)
            except StateError:
                log.warning("telemetry of node %s not written", self.node.node_id, exc_info=True)
            except Exception as error:
                self.node.internal_error("telemetry", error)
            due += self.interval
            now = loop.time()
            due = max(due, now)  # (fell behind, the loop stalled: start the grid anew)
            await asyncio.sleep(due - now)

    def figures(self, lag_s: float, redis_latency_ms: float | None) -> NodeTelemetry:
        """This node's figures now (CPU use since the previous call)."""
        stats: dict[str, int] = dict(self.node.stats())
        if self.mqtt is not None:
            stats.update(self.mqtt.stats())
        self._stats = stats
        now, cpu = time.monotonic(), time.process_time()
        (then, cpu_then), self._cpu = self._cpu, (now, cpu)
        cpu_percent = 100.0 * max(0.0, cpu - cpu_then) / (now - then) if now > then else 0.0
        reload = self.node.reloads.last
        return NodeTelemetry(
            listeners=self.listeners,
            started_at=self.started_at,
            version=VERSION,
            interval_s=self.interval,
            heartbeat_ttl_ms=max(0, round(self.node.registry.ttl * 1000)),
            connections=stats.get("mqtt_connections", 0),
            sessions=stats.get("mqtt_clients", 0) + stats.get("sessions_away", 0),
            subscriptions=len(self.node.sessions.trie),
            routes=stats.get("routes", 0),
            rss_kib=resident_kib(),
            cpu_percent=round(cpu_percent, 1),
            loop_lag_ms=round(lag_s * 1000, 3),
            redis_latency_ms=redis_latency_ms,
            messages_in=stats.get("published", 0),
            messages_out=stats.get("local_deliveries", 0),
            dropped=sum(stats.get(name, 0) for name in DROPPED),
            auth=self.auth,
            reloads=stats.get("reloads", 0),
            reload_failures=stats.get("reload_failures", 0),
            reload_last_ms=stats.get("reload_last_ms", 0),
            loaded=reload.loaded,
            reload_error="" if reload.ok else reload.text,
            advertised=self.advertised,
            draining=stats.get("mqtt_draining", 0),
        )

    async def tick(self, lag_s: float = 0.0) -> NodeTelemetry:
        """One interval's work: time a PING, sample, keep the sample, write both to Redis
        (raises what the write raised; the sample is kept in memory all the same).
        ``lag_s``: how late this tick started."""
        latency = await self._ping()
        telemetry = self.figures(lag_s, latency)
        sample = TrafficSample(
            time.time(), telemetry.messages_in, telemetry.messages_out, telemetry.dropped
        )
        self._samples.append(sample)
        self.latest = telemetry
        ttl = max(TTL_INTERVALS * self.interval, MIN_TTL)
        await self.store.write(
            self.node.node_id,
            telemetry,
            sample,
            ttl,
            self.keep,
            history_ttl_s=max(self.keep * self.interval, ttl),
        )
        await self.store.mark_seen(self.node.node_id, sample.t, sample.t - DEPARTED_SHOWN)
        await self.write_clients(sample.t, ttl)
        return telemetry

    async def write_clients(self, now: float, ttl_s: float) -> None:
        """Publish the figures of every client this node holds, its drops by reason
        (totals, rates since the last tick), its slowest clients and its busiest topic
        filters since the last tick (:mod:`router.state.client_figures`)."""
        at_ms = int(now * 1000)
        held = self.node.sessions.held()
        figures, gone, slow, full = self._changes.since(held, self.node.node_id, at_ms)
        totals, rates = self._drop_rates.sample(now, self._stats)
        counted, self._filters_since = self._filters_since, now
        filters = busiest(self.node.filter_traffic.rates(max(now - counted, 1e-3)))
        drops = NodeDrops(at_ms, totals, rates, slow, filters)
        try:
            await self.clients.write(
                self.node.node_id, figures, drops, ttl_s, gone=gone, replace=full
            )
        except BaseException:
            self._changes.lost()
            raise
        self._changes.written()

    async def _ping(self) -> float | None:
        """Milliseconds one PING took; None if it failed or took over :data:`PING_TIMEOUT`."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                await self.store.redis.ping()
        except (*REDIS_ERRORS, TimeoutError):  # (not answering: the write that follows logs it)
            return None
        return round((time.perf_counter() - started) * 1000, 3)
