"""A process whose work is one router node: :func:`run_node` and :func:`serve_forever`.

``router node run`` parses its options into :class:`NodeProcessSettings`
(:mod:`router.ops.node_settings`) and calls :func:`serve_forever`; an application that
embeds a node awaits :func:`run_node` in its own event loop::

    stop = asyncio.Event()
    task = asyncio.create_task(run_node(settings, stop, http=serve_http))
    ...                    # the node serves MQTT (and HTTP) until
    stop.set()             # it leaves the cluster gracefully
    await task

A run goes: read what the settings name in files (JWT key, password and ACL files,
TLS certificates: a bad one is a typed error before anything connects), join the
cluster (:func:`router.connect`), put the users and rules on the node, open the MQTT
listeners, install the node's reloader (:mod:`router.ops.reloading`), start the node's
telemetry (:mod:`router.ops.telemetry`: its figures and its clients' in Redis, for every
node's API and the CLI), then open the HTTP listeners, log ``node ID ready``; serve
until ``stop`` is set, ``router node drain`` asks, or another process takes the node id
over (:class:`StaleIncarnationError`); drain (:mod:`router.ops.draining`: the clients go
to other nodes, their sessions with them; unless ``drain_grace`` is 0), close the
listeners, leave (routes removed, or left for a peer to adopt the persistent sessions
still here) and log ``node ID stopped`` with its counters.

The HTTP listeners live in the web room (:func:`router.web.listener.serve_http`), which
this room may not import (tests/system/test_layering.py): the caller hands it in as
``http``. :func:`serve_forever` adds what only a process of its own may do: log to
stderr, stop on SIGINT or SIGTERM, reload on SIGHUP, and :func:`settle_collector` once
the node is ready. An application that embeds a node keeps its own garbage-collector
policy, logging and signals: :func:`run_node` touches none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from router.api import connect
from router.cluster.node import RouterNode
from router.core.trusted_proxies import TrustedProxies
from router.errors import InvalidSettingError, StaleIncarnationError
from router.mqtt.certificates import ServerCertificates
from router.mqtt.live_limits import read_limits
from router.mqtt.server import MqttServer, serve, tls_context
from router.mqtt.settings import NO_PROXIES, MqttSettings
from router.ops.auth_sources import AuthSources, auth_sources, install
from router.ops.draining import drain_node
from router.ops.node_settings import NodeProcessSettings
from router.ops.reloading import ProcessReloader
from router.ops.telemetry import Telemetry, listener_names

if TYPE_CHECKING:
    from router.cluster.jwt_auth import JwtVerifier

log = logging.getLogger(__name__)

# Allocations (less deallocations) of tracked objects between two young collections.
YOUNG_THRESHOLD = 10_000
LISTENER_KINDS = {"mqtt": "MQTT", "mqtts": "MQTT TLS", "ws": "MQTT WS", "wss": "MQTT WSS"}


class HttpServing(Protocol):
    """Serves a node's HTTP listener on ``address`` for the block, yielding the bound
    (host, port): :func:`router.web.listener.serve_http`. ``api=False``: ``/metrics``
    and ``/healthz`` only. ``telemetry``: the node's sampler, whose figures the API
    shows (None: the listener samples for itself, telling ``auth``: where the node takes
    its users and rules from, :meth:`AuthSources.kind`). ``trusted``: the reverse
    proxies whose forwarded headers name a request's client."""

    def __call__(
        self,
        node: RouterNode,
        address: str,
        mqtt: MqttServer | None = None,
        *,
        api: bool = True,
        tls: ssl.SSLContext | None = None,
        telemetry: Telemetry | None = None,
        auth: str = "",
        trusted: TrustedProxies = NO_PROXIES,
    ) -> AbstractAsyncContextManager[tuple[str, int]]: ...


@dataclass(frozen=True)
class ReadyNode:
    """A node that has joined and listens: what :func:`run_node` hands ``on_ready``.
    ``metrics`` and ``http`` are the bound addresses of the HTTP listeners (None: not
    served); ``mqtt.listeners`` names the MQTT ones."""

    node: RouterNode
    mqtt: MqttServer
    metrics: tuple[str, int] | None = None
    http: tuple[str, int] | None = None


@dataclass(frozen=True)
class _Loaded:
    """What the settings name in files, read before the node connects."""

    sources: AuthSources
    verifier: JwtVerifier | None
    tls: ServerCertificates | None
    http_tls: ssl.SSLContext | None
    mqtt: MqttSettings  # (the options' limits, amended by the limits file)


def _load(settings: NodeProcessSettings, http: HttpServing | None) -> _Loaded:
    if http is None and (settings.metrics or settings.http):
        raise InvalidSettingError(
            "serving metrics or http needs run_node's http argument "
            "(router.web.listener.serve_http)"
        )
    verifier = settings.jwt_verifier()
    sources = auth_sources(
        settings.password_file,
        settings.acl_file,
        settings.acl_default,
        settings.auth_redis,
        settings.emqx_url,
        settings.emqx_password_hash,
    )
    tls = None
    if settings.tls_listeners or settings.wss_listeners:
        assert settings.tls_cert is not None and settings.tls_key is not None  # (checked)
        tls = ServerCertificates(
            settings.tls_cert,
            settings.tls_key,
            settings.tls_ca,
            require_client_cert=settings.tls_require_client_cert,
        )
    http_tls = None
    if settings.http_tls_cert is not None and settings.http_tls_key is not None:
        http_tls = tls_context(settings.http_tls_cert, settings.http_tls_key)
    mqtt = settings.mqtt
    if settings.limits_file is not None:
        mqtt = read_limits(settings.limits_file, settings.mqtt)
    return _Loaded(sources, verifier, tls, http_tls, mqtt)


async def run_node(
    settings: NodeProcessSettings,
    stop: asyncio.Event | None = None,
    *,
    http: HttpServing | None = None,
    on_ready: Callable[[ReadyNode], None] | None = None,
) -> None:
    """Run one node as ``settings`` say until ``stop`` is set (None: until cancelled),
    then leave the cluster gracefully; see the module docstring.

    ``http`` serves the ``metrics`` and ``http`` listeners (pass
    :func:`router.web.listener.serve_http`; needed only when the settings name one).
    ``on_ready`` is called once the node listens, before ``node ID ready`` is logged.

    Before anything connects, raises the typed error of a file that cannot be used
    (:class:`PasswordFileError`, :class:`AclRuleError`, :class:`JwtSettingError`,
    :class:`InvalidSettingError` for a certificate or an EMQX hash spec); then
    :class:`ListenerError` for an address it cannot listen on, the errors of
    :func:`router.connect`, and :class:`StaleIncarnationError` when another process took
    the node id over (this one stopped serving and left).
    """
    loaded = _load(settings, http)
    stop = stop if stop is not None else asyncio.Event()
    anonymous = settings.mqtt.allow_anonymous
    async with (
        connect(settings.redis_url, acl=loaded.sources.acl, **settings.connect_options()) as node,
        contextlib.AsyncExitStack() as stack,
    ):
        limits = None if settings.limits_file is None else (settings.limits_file, settings.mqtt)
        reloader = ProcessReloader(node, loaded.sources, loaded.tls, limits)
        await install(loaded.sources, node, anonymous, stack, reloader.passwords)
        if loaded.verifier is not None:  # (before the password file: router.cluster.jwt_auth)
            from router.cluster.jwt_auth import install_jwt

            passwords = loaded.sources.passwords
            reloader.jwt = install_jwt(
                node, loaded.verifier, passwords=passwords, allow_anonymous=anonymous
            )
            log.info("JWT authentication: %s", loaded.verifier.describe())
        async with (
            serve(
                node,
                settings.mqtt_listeners,
                loaded.mqtt,
                tls=settings.tls_listeners,
                tls_context=None if loaded.tls is None else loaded.tls.context,
                websocket=settings.websocket_listeners,
                websocket_path=settings.websocket_path,
                wss=settings.wss_listeners,
            ) as front,
            contextlib.AsyncExitStack() as extras,
        ):
            _log_listeners(front, anonymous)
            node.reloads.install(reloader.serving(front), reloader.describe())
            auth = loaded.sources.kind(jwt=loaded.verifier is not None)
            advertised = settings.mqtt_advertise or ""
            names = listener_names(front)
            telemetry = Telemetry(node, front, names, auth=auth, advertised=advertised)
            await extras.enter_async_context(telemetry)
            metrics = served = None
            if settings.metrics is not None and http is not None:
                listener = http(node, settings.metrics, front, api=False)
                metrics = await extras.enter_async_context(listener)
                log.info("metrics on http://%s:%d/metrics", *metrics)
            if settings.http is not None and http is not None:
                listener = http(
                    node,
                    settings.http,
                    front,
                    tls=loaded.http_tls,
                    telemetry=telemetry,
                    trusted=settings.http_proxy_trusted,
                )
                served = await extras.enter_async_context(listener)
                log.info("HTTP on %s://%s:%d", "https" if loaded.http_tls else "http", *served)
                warn_open_http(served[0])
            if on_ready is not None:
                on_ready(ReadyNode(node, front, metrics, served))
            log.info("node %s ready", node.node_id)
            taken_over = await _serve_until(stop, node)
            if not taken_over and settings.drain_grace > 0 and node.running:
                await drain_node(node, front, settings.drain, telemetry)
        if taken_over:
            raise StaleIncarnationError(f"node {node.node_id} was taken over by another process")
        log.info("node %s stopping", node.node_id)
    log.info("node %s stopped: %s", node.node_id, node.stats())


async def _serve_until(stop: asyncio.Event, node: RouterNode) -> bool:
    """Wait for ``stop``, a drain request (``router node drain``) or a takeover of the
    node id; True for a takeover."""
    signalled = asyncio.create_task(stop.wait())
    asked = asyncio.create_task(node.drain_asked.wait())
    taken_over = asyncio.create_task(node.wait_taken_over())
    waits = (signalled, asked, taken_over)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    if asked.done() and not asked.cancelled():
        log.info("node %s asked to drain by %s", node.node_id, node.drain_asked_by)
    return taken_over.done() and not taken_over.cancelled()


def _log_listeners(front: MqttServer, allow_anonymous: bool) -> None:
    settings = front.settings
    for scheme, host, port in front.listeners:
        kind = LISTENER_KINDS[scheme]
        log.info("%s on %s:%d", kind, host, port)
        if scheme in settings.proxy_protocol:
            log.info(
                "%s on %s:%d reads PROXY headers from %s", kind, host, port, settings.proxy_trusted
            )
        if allow_anonymous and not is_loopback(host):
            log.warning(
                "%s on %s:%d accepts anonymous clients from the network "
                "(--no-allow-anonymous with --password-file refuses them)",
                kind,
                host,
                port,
            )


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_open_http(host: str) -> None:
    """Say how a dashboard on a network address is opened: only with an account."""
    if not is_loopback(host):
        log.warning(
            "HTTP on %s is reachable from the network: its API and dashboard refuse "
            "everyone until a dashboard account exists (router dashboard users add)",
            host,
        )


# -- a process of its own ------------------------------------------------------------------


def serve_forever(settings: NodeProcessSettings, *, http: HttpServing | None = None) -> None:
    """Run the node as this process's whole work, on a new event loop, until SIGINT or
    SIGTERM, reloading on SIGHUP (:mod:`router.ops.reloading`; one before the node is
    ready is logged and ignored): the ``router`` loggers write to stderr at
    ``settings.log_level``, and the collector is settled once the node is ready
    (:func:`settle_collector`). Raises what :func:`run_node` raises."""

    async def until_signalled() -> None:
        with stop_on_signals() as stop, reload_on_hangup() as ready:

            def on_ready(node: ReadyNode) -> None:
                settle_collector()
                ready.append(node.node)

            await run_node(settings, stop, http=http, on_ready=on_ready)

    with log_to_stderr(settings.log_level.upper()):
        asyncio.run(until_signalled())


@contextlib.contextmanager
def stop_on_signals() -> Iterator[asyncio.Event]:
    """An event set by SIGINT or SIGTERM while the block runs (call inside a running loop).

    Outside the main thread (no signal handlers there) the event is only set by hand.
    """
    event = asyncio.Event()
    with _handling((signal.SIGINT, signal.SIGTERM), event.set):
        yield event


@contextlib.contextmanager
def reload_on_hangup() -> Iterator[list[RouterNode]]:
    """While the block runs, SIGHUP reloads the node put in the list it yields (its
    :attr:`RouterNode.reloads`); before one is there, it is logged and ignored."""
    ready: list[RouterNode] = []

    def hangup() -> None:
        if not ready:
            log.warning("SIGHUP before the node is ready: nothing reloaded")
            return
        ready[-1].reloads.reload("SIGHUP")

    with _handling((signal.SIGHUP,), hangup):
        yield ready


@contextlib.contextmanager
def _handling(signals: tuple[signal.Signals, ...], handler: Callable[[], None]) -> Iterator[None]:
    """Call ``handler`` on the loop for each of ``signals`` while the block runs (only in
    the main thread, which alone may handle signals)."""
    loop = asyncio.get_running_loop()
    installed = []
    if threading.current_thread() is threading.main_thread():
        for signum in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, handler)
                installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


@contextlib.contextmanager
def log_to_stderr(level: str) -> Iterator[logging.Logger]:
    """Send the ``router`` loggers to stderr at ``level`` for the block; yield this
    module's logger."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("router")
    previous = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield log
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


def settle_collector() -> None:
    """Collect once, take every object alive now out of the collector's scans, and
    collect the young generation only every ``YOUNG_THRESHOLD`` allocations.

    A started node holds what it will keep for its whole life (modules, its mirror,
    scripts, connections). ``gc.freeze`` moves those objects to the permanent
    generation, so later full collections scan only what was allocated since. On the
    2-core development machine full collections of a bench node took up to 57 ms, and
    delivery latency p99 at 5,000 msg/s fell from 2.8-7.6 ms to 2.4-3.3 ms with the
    freeze (``router bench cluster``).

    Every message makes about ten tracked objects (packet, message, forward, rows, ...)
    that live until its batch is written. At the default threshold of 700 a young
    collection ran every ~70 messages and scanned the batches in flight, then promoted
    them to be scanned again: a sampling profile (py-spy ``--native``) of
    ``router bench mqtt`` put 8-9% of each node's CPU in the collector. At 50,000 it
    measured under 0.1%, but the one 10-minute ``router bench soak`` run at 50,000
    measured RSS growth 1.05 MiB/min (target 1.0; 0.39-0.80 in five runs at 700): cyclic
    garbage of the reconnect storms after a fault may wait longer and raise the
    allocator's high-water mark (not proven by one run). At 10,000 the collector was
    again under 0.1% of the bench's profile and the soak measured 0.81 MiB/min.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
