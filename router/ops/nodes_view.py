"""The cluster's nodes as their telemetry tells (:mod:`router.ops.telemetry`): the rows
of ``/api/v1/nodes`` and ``router nodes`` (:func:`cluster_nodes`), the figures of
``/api/v1/overview`` (:func:`cluster_overview`) and which nodes enforce the users and
rules kept in Redis (:func:`auth_enforcement`); docs/http-api.md.

Sums and rates add up the live nodes that reported lately (their telemetry hash exists);
the history is merged on the coarsest sampling interval of those nodes
(:func:`~router.state.node_history.merge_histories`). A node that died stays listed for
:data:`~router.ops.telemetry.DEPARTED_SHOWN` seconds, with the time it was told down. A
node that stopped gracefully while it held persistent sessions (``retired``) is listed
until the live node that adopts them purged it: not alive, and not down.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from router.cluster.config import NodeConfig
from router.ops.telemetry import DEPARTED_SHOWN
from router.state.event_log import Event, EventLog
from router.state.keys import Keys
from router.state.node_history import (
    DEFAULT_INTERVAL,
    SHARED_AUTH,
    NodeHistoryStore,
    NodeRecord,
    NodeTelemetry,
    Rates,
    latest_rates,
    merge_histories,
)
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient

DEFAULT_HEARTBEAT_TTL_MS: Final = round(NodeConfig.heartbeat_ttl * 1000)


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
    mirror: no route set is read), else from the node's telemetry; ``retired`` is True for
    a node that left gracefully and whose persistent sessions a live node adopts now (it
    is not alive, nor down: the row goes with its purge); the other figures
    from the node's telemetry, None for a node that is not alive or wrote none (a node
    embedded with :func:`router.connect` alone). Raises :class:`StateUnavailableError`
    when Redis does not answer, :class:`CorruptStateError` for bad state."""
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
        row["retired"] = info.retired
        rows.append(row)
    for node_id in departed:  # (purged from the registry: dead, last heard of this long ago)
        heard = seen.get(node_id)
        since = _down_since(down, node_id)
        if heard is None and since is not None:
            heard = since / 1000
        age = max(0, int((now - (heard or now)) * 1000))
        row = _node_row(node_id, False, None, age, None, now)
        row["down_since_ms"] = since
        row["retired"] = False
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
    :func:`cluster_nodes`) but those that ``retired`` (their ids: they left gracefully,
    their sessions are being adopted); the live nodes' ``connections``, ``sessions``,
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
                if not row["alive"] and not row["retired"]
            ],
            "retired": [row["node_id"] for row in nodes if row["retired"]],
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
    and ``unknown`` (live nodes that did not say: embedded without a sampler, or an
    older version). Each list sorted by node id. Raises
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
