"""``/api/v1``: subscriptions (the route table), ``match``, retained messages, publish.

The route table is read from the node's own mirror of the cluster's routes (what the
node matches every publish against), so it costs no Redis call. ``match`` takes the
nodes and filters from the mirror too, and every node's matching clients from Redis (a
bounded walk over the clients' subscriptions: :mod:`router.ops.receivers`). Retained
messages are read from Redis in their store's order (shard, topic).

An HTTP publish passes the gate of every publish (:func:`admit_http_publish`): a topic
name within the MQTT listener's limits, no ``$`` topic, a payload within the largest
packet, and the node's ACL and hooks for the dashboard user's name.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from aiohttp import web

from router.core.hooks import ClientInfo
from router.core.topics import validate_filter, validate_topic
from router.errors import NotAuthorizedError, RequestError
from router.mqtt.settings import DEFAULT_SETTINGS, MqttSettings
from router.ops.receivers import find_receivers
from router.ops.retained_view import retained_record
from router.ops.route_view import route_rows
from router.state.retained_store import RetainedCursor
from router.web.access import principal_of
from router.web.context import WebContext, context_of
from router.web.replies import body_of, cursor_of, field, limit_of, page, query, reply

routes = web.RouteTableDef()

HTTP_CLIENT_PREFIX = "$http/"
"""The client id an HTTP publish is judged as: this prefix and the user's name."""


@routes.get("/api/v1/subscriptions")
async def subscriptions(request: web.Request) -> web.Response:
    """The route table by filter: ``?filter=F`` (only filters overlapping F),
    ``?node=ID`` (only that node's), paged by filter."""
    node = context_of(request).node
    node_id = query(request, "node")
    rows = route_rows(node.mirror, query(request, "filter"))
    if node_id is not None:
        rows = [row for row in rows if node_id in row.nodes]
    after = cursor_of(request)
    if after is not None:
        rows = [row for row in rows if row.filter > str(after)]
    limit = limit_of(request)
    shown = rows[:limit]
    following = shown[-1].filter if len(rows) > limit else None
    return page([row.as_dict() for row in shown], following)


@routes.get("/api/v1/match")
async def match(request: web.Request) -> web.Response:
    """Which nodes would receive ``?topic=T``, by which filters, and which clients of
    every node (:func:`~router.ops.receivers.find_receivers`)."""
    node = context_of(request).node
    topic = query(request, "topic", required=True) or ""
    found = await find_receivers(node.registry.redis, node.keys, node.mirror, topic)
    return reply(found.as_dict())


# -- retained ----------------------------------------------------------------------------


@routes.get("/api/v1/retained")
async def retained(request: web.Request) -> web.Response:
    """Retained messages matching ``?filter=F`` (default ``#``), paged."""
    store = context_of(request).node.retained
    topic_filter = query(request, "filter") or "#"
    position = cursor_of(request)
    cursor = None
    if position is not None:
        if not (isinstance(position, list) and len(position) == 2):
            raise RequestError("cursor is not one a page of this API gave")
        cursor = RetainedCursor(str(position[0]), None if position[1] is None else str(position[1]))
    batch = await store.match(topic_filter, cursor, limit=limit_of(request))
    following = None if batch.cursor is None else [batch.cursor.shard, batch.cursor.after]
    return page([retained_record(m) for m in batch.messages], following)


@routes.delete("/api/v1/retained")
async def delete_retained(request: web.Request) -> web.Response:
    """Delete the retained messages of ``?filter=F`` (a topic name: that one)."""
    topic_filter = query(request, "filter", required=True) or ""
    validate_filter(topic_filter)
    deleted = await context_of(request).node.retained.delete(topic_filter)
    return reply({"deleted": deleted})


# -- publish -----------------------------------------------------------------------------


async def admit_http_publish(
    context: WebContext, user: str | None, topic: str, payload: bytes
) -> None:
    """The gate of an HTTP publish (see the module docstring); raises
    :class:`InvalidTopicError`, :class:`RequestError` or :class:`NotAuthorizedError`."""
    settings: MqttSettings = context.mqtt.settings if context.mqtt else DEFAULT_SETTINGS
    validate_topic(topic)
    if len(topic) > settings.max_topic_length or topic.count("/") >= settings.max_topic_levels:
        raise RequestError(
            f"the topic is past the listener's limits ({settings.max_topic_length} "
            f"characters, {settings.max_topic_levels} levels)"
        )
    name = user or "anonymous"
    if topic.startswith("$"):
        raise NotAuthorizedError(HTTP_CLIENT_PREFIX + name, "publish", topic, "a broker topic")
    if len(payload) > settings.max_packet_size:
        raise RequestError(f"the payload is over {settings.max_packet_size} bytes")
    await context.node.policy.admit_sender(ClientInfo(HTTP_CLIENT_PREFIX + name, user), topic)


def _payload(body: Any) -> bytes:
    text = field(body, "payload", str, "")
    encoding = field(body, "encoding", str, "utf-8")
    if encoding == "utf-8":
        return str(text).encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(str(text), validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("the payload is not base64") from None
    raise RequestError(f"encoding is utf-8 or base64, not {encoding!r}")


@routes.post("/api/v1/publish")
async def publish(request: web.Request) -> web.Response:
    """Publish ``{"topic", "payload", "encoding", "qos", "retain"}`` through the gate."""
    context = context_of(request)
    body = await body_of(request)
    topic = field(body, "topic", str)
    payload = _payload(body)
    qos, retain = field(body, "qos", int, 0), field(body, "retain", bool, False)
    if qos not in (0, 1, 2):
        raise RequestError(f"qos is 0, 1 or 2, not {qos!r}")
    await admit_http_publish(context, principal_of(request).user, topic, payload)
    result = await context.node.publish(topic, payload, qos=qos, retain=retain)
    return reply({"id": result.message_id.hex(), "nodes": result.nodes})
