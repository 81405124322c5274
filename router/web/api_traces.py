"""``/api/v1/traces``: follow a client id or a topic filter on every node for a bounded
time, and read what the nodes saw (:mod:`router.state.trace_store`, the same traces as
``router trace``)."""

from __future__ import annotations

from aiohttp import web

from router.state.trace_store import TraceStore
from router.web.access import principal_of
from router.web.context import context_of
from router.web.replies import body_of, field, limit_of, page, query, reply

routes = web.RouteTableDef()


def _traces(request: web.Request) -> TraceStore:
    node = context_of(request).node
    return TraceStore(node.registry.redis, node.keys)


@routes.get("/api/v1/traces")
async def list_traces(request: web.Request) -> web.Response:
    """The traces in force (one page: at most 16 run)."""
    return page([spec.as_dict() for spec in await _traces(request).traces()], None)


@routes.post("/api/v1/traces")
async def start_trace(request: web.Request) -> web.Response:
    """Trace ``{"kind": "client"|"topic", "value", "seconds"}`` on every node (at most an
    hour; 60 s if not given)."""
    body = await body_of(request)
    principal = principal_of(request)
    spec = await _traces(request).start(
        field(body, "kind", str),
        field(body, "value", str),
        field(body, "seconds", (int, float), 60),
        by="api" if principal.user is None else f"api ({principal.user})",
    )
    return reply(spec.as_dict(), 201)


@routes.get("/api/v1/traces/{trace_id:[^/]+}")
async def trace_records(request: web.Request) -> web.Response:
    """What the nodes saw of a trace, oldest first; ``?after=`` a record id (the last
    one read) to read on from."""
    found = await _traces(request).records(
        request.match_info["trace_id"],
        after=query(request, "after") or "-",
        limit=limit_of(request),
    )
    return page([record.as_dict() for record in found], None)


@routes.delete("/api/v1/traces/{trace_id:[^/]+}")
async def stop_trace(request: web.Request) -> web.Response:
    """Stop a trace (its records stay an hour)."""
    return reply({"stopped": await _traces(request).stop(request.match_info["trace_id"])})
