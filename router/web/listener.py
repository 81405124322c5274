"""The HTTP listener of a node: its application, its routes, and how it starts and stops.

``router node run --http HOST:PORT`` (or :func:`serve_http` from Python) serves, in the
node's event loop:

- ``/metrics`` and ``/healthz`` (:mod:`router.ops.metrics`), open to every client;
- ``/api/v1/...``: the JSON API (:mod:`router.web.api_cluster`, ``api_clients``,
  ``api_topics``, ``api_admin``, ``api_traces``), behind :mod:`router.web.access`;
- ``/`` and ``/static/...``: the dashboard, a single page over the API.

``router node run --metrics HOST:PORT`` serves the first two only (:func:`serve_http`
with ``api=False``). Every error an endpoint raises becomes a JSON reply
(:mod:`router.web.replies`); the listener never answers with a traceback. The API
shows the figures every node samples (:class:`~router.ops.telemetry.Telemetry`, which
:func:`~router.ops.node_process.run_node` starts for every node and hands in); a
listener serving the API of a node without a sampler starts one for the block.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from router.cluster.node import RouterNode
from router.core.trusted_proxies import TrustedProxies
from router.errors import BodyTooLargeError, ListenerError
from router.mqtt.server import MqttServer, parse_address
from router.mqtt.settings import NO_PROXIES
from router.ops.metrics import NodeCollector, health
from router.ops.telemetry import Telemetry, listener_names
from router.state.console_store import ConsoleStore
from router.state.node_history import DEFAULT_INTERVAL
from router.web import api_admin, api_clients, api_cluster, api_topics, api_traces
from router.web.access import Access, access_middleware, is_loopback
from router.web.assets import missing
from router.web.context import CONTEXT, WebContext
from router.web.openapi import openapi_document
from router.web.replies import MAX_BODY, error_reply

log = logging.getLogger(__name__)

STATIC: Final = Path(__file__).resolve().parent / "static"
PROMETHEUS_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
HTTP_ERRORS: Final = {
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: BodyTooLargeError.__name__,
}
"""The error type an error of aiohttp itself is told as (by its status)."""
SECURITY_HEADERS: Final = {
    # Scripts and styles of this listener only (Alpine.js evaluates its attributes, hence
    # 'unsafe-eval'); no other site may frame the dashboard or receive its addresses.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' "
        "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


async def _secure(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer carries :data:`SECURITY_HEADERS`."""
    response.headers.update(SECURITY_HEADERS)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error as a JSON reply (HTTP errors of aiohttp itself, such as 404, too)."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.status < 400 or not request.path.startswith("/api/"):
            raise
        kind = HTTP_ERRORS.get(exc.status, "RequestError")
        return web.json_response({"error": kind, "message": exc.reason}, status=exc.status)
    except Exception as exc:
        return error_reply(exc)


@dataclass
class _Monitoring:
    collector: NodeCollector
    registry: CollectorRegistry

    async def metrics(self, request: web.Request) -> web.Response:
        await self.collector.refresh()
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": PROMETHEUS_TYPE})

    async def healthz(self, request: web.Request) -> web.Response:
        healthy, why = await health(self.collector.node, self.collector.mqtt)
        return web.Response(text=why + "\n", status=200 if healthy else 503)


def build_app(
    node: RouterNode,
    mqtt: MqttServer | None = None,
    *,
    api: bool = True,
    loopback: bool = True,
    trusted: TrustedProxies = NO_PROXIES,
) -> web.Application:
    """The application of one listener (``loopback``: whether it listens on a loopback
    address only, which decides the access without accounts; ``trusted``: the reverse
    proxies whose forwarded headers name a request's client, :func:`forwarded_middleware`)."""
    collector = NodeCollector(node, mqtt)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    monitoring = _Monitoring(collector, registry)
    middlewares: list[Any] = [error_middleware]
    if trusted:
        middlewares.insert(0, forwarded_middleware(trusted))
    access = Access(ConsoleStore(node.registry.redis, node.keys), loopback=loopback)
    if api:
        middlewares.append(access_middleware(access))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    app.on_response_prepare.append(_secure)
    app.router.add_get("/metrics", monitoring.metrics)
    app.router.add_get("/healthz", monitoring.healthz)
    if not api:
        return app
    app[CONTEXT] = WebContext(node, mqtt, access.console)
    app.router.add_post("/api/v1/login", access.login)
    app.router.add_post("/api/v1/logout", access.logout)
    app.router.add_get("/api/v1/me", access.me)
    for module in (api_cluster, api_clients, api_topics, api_admin, api_traces):
        app.router.add_routes(module.routes)
    document = openapi_document(app)

    async def describe(request: web.Request) -> web.Response:
        return web.json_response(document)

    app.router.add_get("/api/v1/openapi.json", describe)
    app.router.add_get("/", _index)
    app.router.add_static("/static", STATIC, follow_symlinks=False)
    return app


async def _index(request: web.Request) -> web.StreamResponse:
    """The dashboard's page; 503 saying how to fetch its libraries when they are missing."""
    absent = missing()
    if absent:
        text = f"the dashboard's libraries are missing ({', '.join(absent)}): run make web-assets"
        return web.Response(text=text + "\n", status=503)
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def forwarded_middleware(trusted: TrustedProxies) -> Any:
    """A middleware that makes ``request.remote`` the client's address: the right-most
    untrusted hop of ``Forwarded`` or ``X-Forwarded-For`` when the peer is one of
    ``trusted`` (:meth:`TrustedProxies.client`), so the login throttle counts a client
    behind a reverse proxy under its own address."""

    @web.middleware
    async def forwarded(request: web.Request, handler: Any) -> web.StreamResponse:
        peer = request.remote
        if peer is not None and trusted.trusts(peer):
            headers = request.headers
            client = trusted.client(
                peer, headers.getall("Forwarded", []), headers.getall("X-Forwarded-For", [])
            )
            if client != peer:
                request = request.clone(remote=client)
        response: web.StreamResponse = await handler(request)
        return response

    return forwarded


@contextlib.asynccontextmanager
async def serve_http(
    node: RouterNode,
    address: str,
    mqtt: MqttServer | None = None,
    *,
    api: bool = True,
    tls: ssl.SSLContext | None = None,
    telemetry: Telemetry | None = None,
    telemetry_interval: float = DEFAULT_INTERVAL,
    auth: str = "",
    trusted: TrustedProxies = NO_PROXIES,
) -> AsyncIterator[tuple[str, int]]:
    """Serve ``node``'s HTTP listener on ``HOST:PORT`` (port 0: any free one) until the
    block ends; yields the bound address. ``api=False``: ``/metrics`` and ``/healthz``
    only. ``telemetry``: the node's running sampler, which the API reads and which is
    told this listener's address; None: the listener starts one for the block, every
    ``telemetry_interval`` seconds, telling ``auth`` (where the node takes its users and
    rules from; "": not told). ``trusted``: the reverse proxies whose forwarded headers
    are believed. Raises :class:`ListenerError` if it cannot listen."""
    host, port = parse_address(address)
    app = build_app(node, mqtt, api=api, loopback=is_loopback(host), trusted=trusted)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise ListenerError(f"cannot serve HTTP on {address}: {exc.strerror or exc}") from None
        server: Any = site._server  # (aiohttp keeps the bound sockets there)
        bound = server.sockets[0].getsockname()
        if not api:
            yield bound[0], bound[1]
            return
        if missing():
            log.warning("the dashboard's libraries are missing: run make web-assets")
        address = f"{'https' if tls else 'http'}://{bound[0]}:{bound[1]}"
        if telemetry is not None:
            telemetry.add_listener(address)
            app[CONTEXT].telemetry = telemetry
            yield bound[0], bound[1]
            return
        async with Telemetry(
            node, mqtt, [*listener_names(mqtt), address], telemetry_interval, auth=auth
        ) as own:
            app[CONTEXT].telemetry = own
            yield bound[0], bound[1]
    finally:
        await runner.cleanup()
