"""``/api/v1/clients``: find clients and their sessions, kick one, clear a session.

The rows and details are those of ``router clients`` (:mod:`router.ops.client_view`),
read from Redis, so every node answers for the whole cluster; a client's figures are
those its node published with its telemetry (at most an interval old), or this node's
own, now, for a client it serves. A client id is one path
segment of any characters, percent-encoded by the caller (``{client_id:[^/]+}``: aiohttp's
default pattern would refuse ``{`` and ``}``; an encoded ``/`` is decoded after matching).
"""

from __future__ import annotations

import time

from aiohttp import web

from router.cluster.client_stats import figures_of
from router.errors import RequestError
from router.ops.client_view import (
    PROTOCOL_NAMES,
    STATE_NAMES,
    ClientFilter,
    clear_session,
    client_detail,
    client_page,
    kick_client,
)
from router.web.context import context_of
from router.web.replies import cursor_of, limit_of, page, query, reply

routes = web.RouteTableDef()


def _choice(request: web.Request, name: str, choices: tuple[str, ...]) -> str | None:
    value = query(request, name)
    if value is not None and value not in choices:
        raise RequestError(f"{name} is one of {', '.join(choices)}, not {value!r}")
    return value


@routes.get("/api/v1/clients")
async def list_clients(request: web.Request) -> web.Response:
    """Sessions in client-id order: ``?prefix=&user=&node=&state=&protocol=``, paged."""
    context = context_of(request)
    after = cursor_of(request)
    if after is not None and not isinstance(after, str):
        raise RequestError("cursor is not one a page of this API gave")
    which = ClientFilter(
        prefix=query(request, "prefix"),
        user=query(request, "user"),
        node_id=query(request, "node"),
        state=_choice(request, "state", STATE_NAMES),  # type: ignore[arg-type]
        protocol=_choice(request, "protocol", PROTOCOL_NAMES),
    )
    redis, keys = context.node.registry.redis, context.node.keys
    rows, following = await client_page(redis, keys, which, after=after, limit=limit_of(request))
    return page([row.as_dict() for row in rows], following)


@routes.get("/api/v1/clients/{client_id:[^/]+}")
async def show_client(request: web.Request) -> web.Response:
    """One client's session, subscriptions, queue and figures (from the node that serves
    it) and, when this node serves it, its connection's counters."""
    context = context_of(request)
    client_id = request.match_info["client_id"]
    node = context.node
    found = await client_detail(node.registry.redis, node.keys, client_id)
    detail = found.as_dict()
    session = node.sessions.find(client_id)
    if session is not None and found.row.node_id == node.node_id:  # (now, not a sample)
        figures = figures_of(session, node.node_id, int(time.time() * 1000))
        detail["figures"] = figures.as_dict()
        detail["queued_memory"] = figures.queued
        detail["queued"] = figures.queued + found.row.queued_redis
    if context.mqtt is not None:
        detail["connection"] = context.mqtt.describe_client(client_id)
    return reply(detail)


@routes.post("/api/v1/clients/{client_id:[^/]+}/kick")
async def kick(request: web.Request) -> web.Response:
    """Ask the node serving the client to end its connection (DISCONNECT 0x98 in 5.0)."""
    node = context_of(request).node
    sent = await kick_client(node.registry.redis, node.keys, request.match_info["client_id"])
    return reply({**sent.as_dict(), "kicked": True})


@routes.delete("/api/v1/clients/{client_id:[^/]+}/session")
async def clear(request: web.Request) -> web.Response:
    """End an away client's session (409 while it is connected: kick it first)."""
    client_id = request.match_info["client_id"]
    cleared = await clear_session(context_of(request).node, client_id)
    return reply({"client_id": client_id, "cleared": cleared})
