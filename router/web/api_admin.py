"""``/api/v1``: bans, and the MQTT users and ACL rules the cluster keeps in Redis.

The same stores as ``router bans`` and ``router users|acl``
(:mod:`router.state.ban_store`, :mod:`router.state.auth_store`): a change reaches every
node as it does from the CLI (within about a second). Users and rules take effect on the
nodes started with ``--auth-redis`` only: the lists of both say which live nodes enforce
them (``enforced_by``), which take their users and rules elsewhere (``not_enforced_by``)
and which did not say (``unknown``), as each node's telemetry tells
(:func:`~router.ops.nodes_view.auth_enforcement`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from router.ops.nodes_view import auth_enforcement
from router.state.auth_store import AuthStore
from router.state.ban_store import Ban, BanStore, ban_event, ban_lifted_event
from router.state.event_log import Event, EventLog
from router.web.access import principal_of
from router.web.context import context_of
from router.web.replies import body_of, field, page, reply

routes = web.RouteTableDef()


def ban_record(ban: Ban) -> dict[str, Any]:
    return {"kind": ban.kind, "value": ban.value, "until": ban.until or None, "reason": ban.reason}


def _bans(request: web.Request) -> BanStore:
    node = context_of(request).node
    return BanStore(node.registry.redis, node.keys)


def _auth(request: web.Request) -> AuthStore:
    node = context_of(request).node
    return AuthStore(node.registry.redis, node.keys)


@routes.get("/api/v1/bans")
async def list_bans(request: web.Request) -> web.Response:
    """Every ban in force (one page: a ban list stays small)."""
    return page([ban_record(ban) for ban in await _bans(request).bans()], None)


@routes.post("/api/v1/bans")
async def add_ban(request: web.Request) -> web.Response:
    """Ban ``{"kind", "value", "seconds", "reason"}`` (no seconds: until removed)."""
    body = await body_of(request)
    seconds = field(body, "seconds", (int, float), None)
    ban = await _bans(request).add(
        field(body, "kind", str),
        field(body, "value", str),
        seconds=None if seconds is None else float(seconds),
        reason=field(body, "reason", str, ""),
    )
    await _tell(request, ban_event(ban, _by(request)))
    return reply(ban_record(ban), 201)


@routes.delete("/api/v1/bans/{kind:[^/]+}/{value:[^/]+}")
async def remove_ban(request: web.Request) -> web.Response:
    kind, value = request.match_info["kind"], request.match_info["value"]
    removed = await _bans(request).remove(kind, value)
    if removed:
        await _tell(request, ban_lifted_event(kind, value, _by(request)))
    return reply({"removed": removed})


def _by(request: web.Request) -> str:
    """Who changes the bans: ``api`` and the user (or key) making the request."""
    principal = principal_of(request)
    return "api" if principal.user is None else f"api ({principal.user})"


async def _tell(request: web.Request, event: Event) -> None:
    node = context_of(request).node
    await EventLog(node.registry.redis, node.keys).add(event)


# -- MQTT users and rules ----------------------------------------------------------------


async def _enforcement(request: web.Request) -> dict[str, Any]:
    node = context_of(request).node
    return await auth_enforcement(node.registry.redis, node.keys)


@routes.get("/api/v1/users")
async def list_users(request: web.Request) -> web.Response:
    """Every user (one page), and which nodes enforce them (see the module docstring)."""
    users = await _auth(request).users()
    items = [{"name": u.name, "superuser": u.superuser} for u in users]
    return reply({"items": items, "next": None, **await _enforcement(request)})


@routes.post("/api/v1/users")
async def add_user(request: web.Request) -> web.Response:
    """Add ``{"name", "password", "superuser"}`` (409 when the name is taken)."""
    body = await body_of(request)
    name = field(body, "name", str)
    added = await _auth(request).add_user(
        name, field(body, "password", str), superuser=field(body, "superuser", bool, False)
    )
    if not added:
        return reply({"error": "UserExistsError", "message": f"user {name!r} exists"}, 409)
    return reply({"name": name, "added": True}, 201)


@routes.put("/api/v1/users/{name:[^/]+}/password")
async def set_password(request: web.Request) -> web.Response:
    body = await body_of(request)
    name = request.match_info["name"]
    changed = await _auth(request).set_password(name, field(body, "password", str))
    if not changed:
        return reply({"error": "UserNotFoundError", "message": f"no user {name!r}"}, 404)
    return reply({"name": name, "changed": True})


@routes.delete("/api/v1/users/{name:[^/]+}")
async def remove_user(request: web.Request) -> web.Response:
    return reply({"removed": await _auth(request).remove_user(request.match_info["name"])})


@routes.get("/api/v1/acl")
async def list_rules(request: web.Request) -> web.Response:
    """The rules in the order they are tried, and which nodes enforce them."""
    rules = [str(rule) for rule in await _auth(request).rules()]
    return reply({"rules": rules, **await _enforcement(request)})


@routes.post("/api/v1/acl")
async def add_rule(request: web.Request) -> web.Response:
    """Add ``{"rule", "position"}`` (position 0 or absent: at the end)."""
    body = await body_of(request)
    count = await _auth(request).add_rule(field(body, "rule", str), field(body, "position", int, 0))
    return reply({"position": count}, 201)


@routes.delete("/api/v1/acl")
async def remove_rule(request: web.Request) -> web.Response:
    """Remove the first rule ``{"rule"}``; answers the position it had (0: none)."""
    body = await body_of(request)
    return reply({"position": await _auth(request).remove_rule(field(body, "rule", str))})
