"""Node telemetry for the dashboard: each node samples its own figures, keeps the last
hour, and publishes them to Redis; any node reads and merges the cluster's.

**Sampling** (:class:`Telemetry`, one asyncio task per node serving HTTP): every
``interval`` seconds it reads the node's counters (``node.stats()``, ``mqtt.stats()``),
the process's resident memory (``/proc/self/statm``), its CPU use since the previous
sample (``time.process_time()`` over the wall time, x100: one core fully busy is 100),
how late its own sleep woke (the event loop's lag) and the time one Redis PING took. It
keeps the last ``keep`` traffic samples in memory (1800 at 2 s: the last hour) and writes
the figures and the sample in one transaction (:class:`NodeHistoryStore`): the figures
expire after :data:`TTL_INTERVALS` intervals, the history after the hour. A Redis error
is logged and the next interval goes on; stopping deletes the node's keys.

**The traffic figures** are counters since the node started::

    in        "published"          messages published at this node (its MQTT clients, the
                                   HTTP API, wills, $SYS): each message counts once, at the
                                   node where it entered the cluster
    out       "local_deliveries"   copies handed to this node's sessions (connected or away):
                                   each delivery counts once, at the node of its subscriber
    dropped   DROPPED              copies lost: full queues, expired, oversized, a share
                                   group without members

so the sums across nodes are the cluster's, with nothing counted twice.

**Reading** (:func:`cluster_nodes`, :func:`cluster_overview`): the rows of
``/api/v1/nodes`` and the figures of ``/api/v1/overview`` (docs/http-api.md). Sums and
rates add up the live nodes that reported lately (their telemetry hash exists); the
history is merged on the coarsest sampling interval of those nodes
(:func:`~router.state.node_history.merge_histories`).

Cost on the node: one PING and one MULTI/EXEC an interval, one read of a small file, and
``node.stats()`` (which counts the node's routes and sessions' drops: linear in them).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final

from router.cluster.client_stats import DropRates, node_figures, slowest
from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.cluster.tasks import stop_task
from router.mqtt.server import MqttServer
from router.mqtt.sys_topics import VERSION
from router.state.client_figures import ClientFigureStore, NodeDrops
from router.state.event_log import Event, EventLog
from router.state.keys import Keys
from router.state.node_history import (
    DEFAULT_INTERVAL,
    SHARED_AUTH,
    NodeHistoryStore,
    NodeRecord,
    NodeTelemetry,
    Rates,
    TrafficSample,
    latest_rates,
    merge_histories,
)
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient

log = logging.getLogger(__name__)

TTL_INTERVALS: Final = 3  # a node's figures outlive this many missed intervals
MIN_TTL: Final = 1.0  # seconds, however short the interval
PING_TIMEOUT: Final = 1.0  # seconds; a PING not answered by then: latency unknown (None)
STATM: Final = "/proc/self/statm"
DROPPED: Final = (
    "queue_drops",  # a connected client's queue was full
    "session_queue_drops",  # an away session's queue in Redis was full
    "expired_dropped",  # expired while an away session's queue held it
    "undeliverable",  # a share group with no member left on any node
    "mqtt_expired_dropped",  # expired before its client could take it
    "mqtt_oversized_dropped",  # larger than its client's Maximum Packet Size
)
"""The counters of ``node.stats()`` and ``mqtt.stats()`` that add up to "dropped"."""
DEFAULT_HEARTBEAT_TTL_MS: Final = round(NodeConfig.heartbeat_ttl * 1000)
DEPARTED_SHOWN: Final = 3600.0
"""Seconds a node that died (purged from the registry, never said goodbye) stays listed."""


def resident_kib() -> int:
    """The process's resident memory in KiB: ``/proc/self/statm`` where there is one,
    else the peak resident size (``getrusage``; bytes on macOS, KiB elsewhere)."""
    try:
        with open(STATM, "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak


class Telemetry:
    """The sampler of one node (see the module docstring); ``async with`` starts it (the
    first sample at once) and stops it (the node's keys deleted).

    ``listeners``: "scheme://host:port" of the node's listeners, as the dashboard shows
    them. ``interval``: seconds between samples (> 0). ``keep``: samples kept, in memory
    and in Redis (>= 2). ``started_at``: the node's start (unix seconds; default now).
    ``auth``: where the node takes its users and rules from
    (:data:`~router.state.node_history.SHARED_AUTH`, ...; "": not told), written with its
    figures so that the dashboard can say which nodes enforce the users and rules it
    edits. Raises ``ValueError`` for a bad interval or keep."""

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
        self.store = NodeHistoryStore(node.registry.redis, node.keys)
        self.clients = ClientFigureStore(node.registry.redis, node.keys)
        self.latest: NodeTelemetry | None = None  # the figures of the last sample
        self._stats: Mapping[str, int] = {}  # (the counters of the last sample)
        self._drop_rates = DropRates()
        self._samples: collections.deque[TrafficSample] = collections.deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None
        self._cpu = (time.monotonic(), time.process_time())

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
        except Exception:
            log.warning("telemetry of node %s left behind", self.node.node_id, exc_info=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            lag = max(0.0, loop.time() - due)
            try:
                await self.tick(lag)
            except Exception:
                log.warning("telemetry of node %s not written", self.node.node_id, exc_info=True)
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
        (totals, rates since the last tick) and its slowest clients
        (:mod:`router.state.client_figures`)."""
        at_ms = int(now * 1000)
        figures = node_figures(self.node.sessions.held(), self.node.node_id, at_ms)
        totals, rates = self._drop_rates.sample(now, self._stats)
        drops = NodeDrops(at_ms, totals, rates, slowest(figures))
        await self.clients.write(self.node.node_id, figures, drops, ttl_s)

    async def _ping(self) -> float | None:
        """Milliseconds one PING took; None if it failed or took over :data:`PING_TIMEOUT`."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                await self.store.redis.ping()
        except Exception:  # (Redis not answering: the write that follows logs it)
            return None
        return round((time.perf_counter() - started) * 1000, 3)


# -- reading the cluster's -----------------------------------------------------------------


async def cluster_nodes(
    redis: RedisClient, keys: Keys, route_counts: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """The rows of ``/api/v1/nodes``: every registered node, alive or not, and every node
    no longer registered that died in the last :data:`DEPARTED_SHOWN` seconds (told down
    in the event log, or wrote telemetry then and did not stop gracefully: ``alive``
    false, ``heartbeat_age_ms`` since it was last heard of), sorted by id. A node that
    stopped gracefully is forgotten at once.

    ``alive`` and ``heartbeat_age_ms`` (since its last heartbeat, by Redis server time;
    the node's TTL from its telemetry, else the default's) come from the registry;
    ``down_since_ms`` (Unix ms) from the event that told the node down, None for a live
    node or one no event tells of; ``routes`` from ``route_counts`` (the asking node's
    mirror: no route set is read), else from the node's telemetry; the other figures
    from the node's telemetry, None for a node that is not alive or wrote none (no HTTP
    listener). Raises :class:`StateUnavailableError` when Redis does not answer,
    :class:`CorruptStateError` for bad state."""
    rows, _ = await _cluster_view(redis, keys, route_counts)
    return rows


async def _cluster_view(
    redis: RedisClient, keys: Keys, route_counts: Mapping[str, int] | None
) -> tuple[list[dict[str, Any]], dict[str, NodeRecord]]:
    """:func:`cluster_nodes`' rows, and the records of every node they name (read once:
    the overview's history needs them too)."""
    registered = await NodeRegistry(redis, keys).nodes()
    now = time.time()
    store = NodeHistoryStore(redis, keys)
    seen = await store.seen_since(now - DEPARTED_SHOWN)
    lives = await EventLog(redis, keys).lives(int(DEPARTED_SHOWN * 1000))
    down = {node: event for node, event in lives.items() if event.kind == "node_down"}
    stopped = {node for node, event in lives.items() if event.kind == "node_stopped"}
    names = {info.node_id for info in registered}
    departed = sorted((set(seen) - stopped | set(down)) - names)
    records = await store.read([*(info.node_id for info in registered), *departed])
    rows = []
    for info in sorted(registered, key=lambda i: i.node_id):
        stored = records[info.node_id].telemetry
        ttl_ms = stored.heartbeat_ttl_ms if stored and stored.heartbeat_ttl_ms else None
        expires_in_ms = info.expires_ms - info.now_ms
        age = (DEFAULT_HEARTBEAT_TTL_MS if ttl_ms is None else ttl_ms) - expires_in_ms
        shown = stored if info.alive else None
        routes = None if route_counts is None else route_counts.get(info.node_id)
        if routes is None and shown is not None:
            routes = shown.routes
        row = _node_row(info.node_id, info.alive, shown, max(0, age), routes, now)
        row["down_since_ms"] = None if info.alive else _down_since(down, info.node_id)
        rows.append(row)
    for node_id in departed:  # (purged from the registry: dead, last heard of this long ago)
        heard = seen.get(node_id)
        since = _down_since(down, node_id)
        if heard is None and since is not None:
            heard = since / 1000
        age = max(0, int((now - (heard or now)) * 1000))
        row = _node_row(node_id, False, None, age, None, now)
        row["down_since_ms"] = since
        rows.append(row)
    rows.sort(key=lambda row: row["node_id"])
    return rows, records


def _down_since(down: Mapping[str, Event], node_id: str) -> int | None:
    event = down.get(node_id)
    return None if event is None else event.at_ms


def _node_row(
    node_id: str,
    alive: bool,
    shown: NodeTelemetry | None,
    heartbeat_age_ms: int,
    routes: int | None,
    now: float,
) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "alive": alive,
        "listeners": list(shown.listeners) if shown else None,
        "uptime_s": max(0, int(now - shown.started_at)) if shown else None,
        "version": shown.version if shown else None,
        "connections": shown.connections if shown else None,
        "rss_kib": shown.rss_kib if shown else None,
        "cpu_percent": shown.cpu_percent if shown else None,
        "loop_lag_ms": shown.loop_lag_ms if shown else None,
        "redis_latency_ms": shown.redis_latency_ms if shown else None,
        "heartbeat_age_ms": heartbeat_age_ms,
        "routes": routes,
        "auth": (shown.auth or None) if shown else None,
        "reload": _reload(shown) if shown else None,
    }


def _reload(shown: NodeTelemetry) -> dict[str, Any]:
    """A node's reloads as its row tells them (``router node reload``, SIGHUP)."""
    return {
        "reloads": shown.reloads,
        "failures": shown.reload_failures,
        "last_ms": shown.reload_last_ms or None,
        "error": shown.reload_error or None,
        "loaded": shown.loaded or None,
    }


async def cluster_overview(redis: RedisClient, keys: Keys, retained_count: int) -> dict[str, Any]:
    """``/api/v1/overview``: ``nodes`` alive and total (registered, and those that died
    in the last :data:`DEPARTED_SHOWN` seconds and were purged since), with ``down``, the
    rows of the nodes not alive (``node_id``, ``down_since_ms``: see
    :func:`cluster_nodes`); the live nodes' ``connections``, ``sessions``,
    ``subscriptions`` and ``routes`` summed (a filter on two nodes is two routes),
    ``retained`` (``retained_count``, as given), ``rates`` per second (each live node's
    last two samples, summed) and the ``history`` of every node that reported in the
    last hour merged (oldest first: the traffic of a node that died stays in the past it
    covers). Raises :class:`StateUnavailableError` when Redis does not answer,
    :class:`CorruptStateError` for bad state."""
    nodes, records = await _cluster_view(redis, keys, None)
    alive = [row["node_id"] for row in nodes if row["alive"]]
    ended = [row["node_id"] for row in nodes if not row["alive"]]
    reporting = [
        (record.telemetry, record.history)
        for node_id in alive
        if (record := records[node_id]).telemetry is not None
    ]
    figures = [telemetry for telemetry, _ in reporting]
    interval = max((telemetry.interval_s for telemetry in figures), default=DEFAULT_INTERVAL)
    rates = Rates()
    for _, history in reporting:
        rates = rates.plus(latest_rates(history) or Rates())
    past = (records[node_id].history for node_id in ended)
    return {
        "nodes": {
            "alive": len(alive),
            "total": len(nodes),
            "down": [
                {"node_id": row["node_id"], "down_since_ms": row["down_since_ms"]}
                for row in nodes
                if not row["alive"]
            ],
        },
        "connections": sum(telemetry.connections for telemetry in figures),
        "sessions": sum(telemetry.sessions for telemetry in figures),
        "subscriptions": sum(telemetry.subscriptions for telemetry in figures),
        "routes": sum(telemetry.routes for telemetry in figures),
        "retained": retained_count,
        "rates": rates.as_dict(),
        "history": merge_histories((h for _, h in reporting), interval, past).as_dict(),
    }


async def auth_enforcement(redis: RedisClient, keys: Keys) -> dict[str, Any]:
    """Which live nodes enforce the users and ACL rules kept in Redis (the ones
    ``/api/v1/users`` and ``/api/v1/acl`` edit), as each said in its telemetry:
    ``enforced_by`` (node ids: started with ``--auth-redis``), ``not_enforced_by``
    (``[{"node_id", "auth"}]``: the source each takes its users and rules from instead)
    and ``unknown`` (live nodes that did not say: no HTTP listener, which is where the
    telemetry is written, or an older version). Each list sorted by node id. Raises
    :class:`StateUnavailableError` when Redis does not answer."""
    live = sorted(info.node_id for info in await NodeRegistry(redis, keys).live_nodes())
    records = await NodeHistoryStore(redis, keys).read(live)
    enforced, other, unknown = [], [], []
    for node_id in live:
        told = records[node_id].telemetry
        if told is None or not told.auth:
            unknown.append(node_id)
        elif told.auth == SHARED_AUTH:
            enforced.append(node_id)
        else:
            other.append({"node_id": node_id, "auth": told.auth})
    return {"enforced_by": enforced, "not_enforced_by": other, "unknown": unknown}
