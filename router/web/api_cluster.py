"""``/api/v1/overview``, ``/api/v1/nodes`` and ``/api/v1/events``: the cluster at a glance.

Every node samples its own figures and keeps the last hour of them, in memory and in
Redis (:mod:`router.ops.telemetry`); these endpoints merge what every live node wrote,
so any node answers for the cluster. A node that wrote none (embedded without a sampler)
still shows (alive or not, its heartbeat, its routes) with its figures unknown (null). The
drops by reason, the slow subscribers and the busiest topic filters are those the live
nodes published with their telemetry (:mod:`router.ops.figures_view`). The
events are the cluster's event log (:mod:`router.state.event_log`), kept for a day.
"""

from __future__ import annotations

from aiohttp import web

from router.errors import RequestError
from router.ops.figures_view import (
    DEFAULT_SLOW,
    MAX_SLOW,
    busiest_filters,
    cluster_drops,
    slow_subscribers,
)
from router.ops.nodes_view import cluster_nodes, cluster_overview
from router.state.event_log import KINDS, EventLog
from router.web.context import context_of
from router.web.replies import limit_of, page, query, reply

routes = web.RouteTableDef()


@routes.get("/api/v1/overview")
async def overview(request: web.Request) -> web.Response:
    """The cluster's figures and rates, with the last hour of its traffic; ``topics`` is
    the number of distinct filters subscribed in the cluster (from this node's mirror)."""
    context = context_of(request)
    node = context.node
    retained = await node.retained.size()
    figures = await cluster_overview(node.registry.redis, node.keys, retained)
    figures["topics"] = context.topics()
    figures["drops"] = await cluster_drops(node.registry.redis, node.keys)
    return reply(figures)


@routes.get("/api/v1/slow-subscribers")
async def slow(request: web.Request) -> web.Response:
    """The clients with most queued in memory and most dropped, over every live node:
    ``?limit=`` (1 to 100, default 10) of each."""
    node = context_of(request).node
    return reply(await slow_subscribers(node.registry.redis, node.keys, _top(request)))


@routes.get("/api/v1/busiest-filters")
async def busiest(request: web.Request) -> web.Response:
    """The topic filters with most publishes a second over every live node's last
    interval: ``?limit=`` (1 to 100, default 10)."""
    node = context_of(request).node
    found = await busiest_filters(node.registry.redis, node.keys, _top(request))
    return reply({"items": found})


def _top(request: web.Request) -> int:
    text = query(request, "limit") or str(DEFAULT_SLOW)
    if not text.isdigit() or not 1 <= int(text) <= MAX_SLOW:
        raise RequestError(f"limit is a whole number from 1 to {MAX_SLOW}, not {text!r}")
    return int(text)


@routes.get("/api/v1/nodes")
async def nodes(request: web.Request) -> web.Response:
    """Every registered node, alive or not, with its health figures."""
    node = context_of(request).node
    counts = {node_id: node.mirror.route_count(node_id) for node_id in node.mirror.nodes()}
    return page(await cluster_nodes(node.registry.redis, node.keys, counts), None)


@routes.get("/api/v1/events")
async def events(request: web.Request) -> web.Response:
    """The cluster's events, newest first: ``?kind=`` (comma-separated kinds),
    ``?subject=`` (a node, client or ban), ``?since_ms=`` (Unix ms), ``?limit=``."""
    node = context_of(request).node
    kinds = None
    if (text := query(request, "kind")) is not None:
        kinds = text.split(",")
        if unknown := sorted(set(kinds) - KINDS):
            raise RequestError(f"not an event kind: {', '.join(unknown)}")
    since = query(request, "since_ms") or "0"
    if not since.isdigit() or len(since) > 15:
        raise RequestError(f"since_ms is Unix milliseconds, not {since!r}")
    found = await EventLog(node.registry.redis, node.keys).recent(
        limit_of(request), since_ms=int(since), kinds=kinds, subject=query(request, "subject")
    )
    return page([event.as_dict() for event in found], None)
