"""``/api/v1/overview`` and ``/api/v1/nodes``: the cluster at a glance.

Each node serving the API samples its own figures and keeps the last hour of them, in
memory and in Redis (:mod:`router.web.telemetry`); these endpoints merge what every live
node wrote, so any node answers for the cluster. A node without an HTTP listener still
shows (alive or not, its heartbeat, its routes) with its figures unknown (null).
"""

from __future__ import annotations

from aiohttp import web

from router.web.context import context_of
from router.web.replies import page, reply
from router.web.telemetry import cluster_nodes, cluster_overview

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
    return reply(figures)


@routes.get("/api/v1/nodes")
async def nodes(request: web.Request) -> web.Response:
    """Every registered node, alive or not, with its health figures."""
    node = context_of(request).node
    counts = {node_id: node.mirror.route_count(node_id) for node_id in node.mirror.nodes()}
    return page(await cluster_nodes(node.registry.redis, node.keys, counts), None)
