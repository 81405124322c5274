"""``router node run``: a long-running router node, configured by options or environment.

Every option has an environment variable (for docker-compose): ``ROUTER_REDIS_URL``,
``ROUTER_PREFIX``, ``ROUTER_NODE_ID``, ``ROUTER_SHARE_STRATEGY``,
``ROUTER_HEARTBEAT_INTERVAL``, ``ROUTER_HEARTBEAT_TTL``, ``ROUTER_REDIS_POOL_SIZE``,
``ROUTER_QUEUE_LIMIT``,
``ROUTER_ACL``, ``ROUTER_ACL_DEFAULT``, ``ROUTER_TRAFFIC_DIR``, ``ROUTER_TRAFFIC_SAMPLE``,
``ROUTER_RETAINED_MAX_PAYLOAD``, ``ROUTER_RETAINED_MAX_COUNT``,
``ROUTER_RETAINED_CLEAR_INTERVAL``, ``ROUTER_LOG_LEVEL``, and the MQTT options
(``ROUTER_MQTT``, ``ROUTER_MQTT_MAX_CONNECTIONS``, ...; see ``router node run --help``).
With ``--mqtt HOST:PORT`` the node serves MQTT clients there. An ACL file is read before
the node connects; a bad one is one error line naming the file and line. The node logs
``node ID ready`` once it has joined, serves its inbox until SIGINT or SIGTERM, then
leaves gracefully (routes removed, deregistered) and logs ``node ID stopped`` with its
counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

import click

from router.api import REDIS_TIMEOUT, connect, default_node_id
from router.cluster.config import NodeConfig
from router.core.sharing import STRATEGY_NAMES
from router.errors import StaleIncarnationError
from router.mqtt.server import parse_address, serve, tls_context
from router.ops.node_process import settle_collector
from router.state.connection import DEFAULT_POOL_SIZE
from router.state.retained_store import RetainedConfig
from router.web.listener import serve_http

from .auth_sources import auth_sources, install
from .common import Target, log_to_stderr, run, stop_on_signals, target_options as target
from .mqtt_options import jwt_verifier, mqtt_options, mqtt_settings

_DEFAULTS = NodeConfig("defaults")
Command = TypeVar("Command", bound=Callable[..., Any])
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@click.group()
def node() -> None:
    """Run a router node."""


def setting(flag: str, *decls: str, **kwargs: Any) -> Callable[[Command], Command]:
    """A ``click.option`` that also reads ``ROUTER_<FLAG>`` (``--queue-limit``:
    ``ROUTER_QUEUE_LIMIT``); a default other than None shows in ``--help``."""
    envvar = "ROUTER_" + flag.removeprefix("--").replace("-", "_").upper()
    kwargs.setdefault("show_default", kwargs.get("default") is not None)
    return click.option(flag, *decls, envvar=envvar, **kwargs)


@node.command("run")
@target
@setting("--node-id", default=None, help="Node id (env ROUTER_NODE_ID) [default: hostname-pid].")
@setting(
    "--share-strategy",
    type=click.Choice([*STRATEGY_NAMES, "local"]),
    default=_DEFAULTS.share_strategy,
    help="How a share group's member is chosen.",
)
@setting(
    "--heartbeat-interval",
    type=click.FloatRange(min=0.001),
    default=_DEFAULTS.heartbeat_interval,
    help="Seconds between heartbeats (and route-table refreshes).",
)
@setting(
    "--heartbeat-ttl",
    type=click.FloatRange(min=0.001),
    default=_DEFAULTS.heartbeat_ttl,
    help="Seconds without a heartbeat after which other nodes purge this one.",
)
@setting(
    "--redis-timeout",
    type=click.FloatRange(min=0.001),
    default=REDIS_TIMEOUT,
    help="Seconds a Redis connect or reply may take before the call fails.",
)
@setting(
    "--redis-pool-size",
    type=click.IntRange(min=1),
    default=DEFAULT_POOL_SIZE,
    help="Redis connections the node opens at most (to each cluster master); "
    "when all are busy a call waits its turn.",
)
@setting(
    "--publish-timeout",
    type=click.FloatRange(min=0.001),
    default=_DEFAULTS.publish_timeout,
    help="Seconds a publish may take (an MQTT publish then gets no acknowledgement).",
)
@setting(
    "--allow-evicting-redis",
    "allow_eviction",
    is_flag=True,
    default=False,
    show_default=False,
    help="Start even if Redis's maxmemory-policy may evict keys (logged as an error).",
)
@setting(
    "--share-sessions-between-users",
    "shared_sessions",
    is_flag=True,
    default=False,
    show_default=False,
    help="Let any user resume or take over a client id's session (by default only the "
    "user that made it; others get CONNACK 0x87).",
)
@setting(
    "--metrics",
    default=None,
    metavar="HOST:PORT",
    help="Serve Prometheus /metrics and /healthz over HTTP here (only those: --http "
    "serves them too, with the API and the dashboard).",
)
@setting(
    "--http",
    "http_address",
    default=None,
    metavar="HOST:PORT",
    help="Serve the dashboard, the JSON API (/api/v1), /metrics and /healthz here.",
)
@setting(
    "--http-tls-cert",
    default=None,
    metavar="PEM",
    type=click.Path(exists=True, dir_okay=False),
    help="Serve --http over TLS with this certificate chain (needs --http-tls-key).",
)
@setting(
    "--http-tls-key",
    default=None,
    metavar="PEM",
    type=click.Path(exists=True, dir_okay=False),
    help="The private key of --http-tls-cert.",
)
@setting(
    "--queue-limit",
    type=click.IntRange(min=1),
    default=_DEFAULTS.queue_limit,
    help="Deliveries queued per local client before the overflow policy drops one.",
)
@setting(
    "--queue-bytes",
    type=click.IntRange(min=0),
    default=_DEFAULTS.queue_bytes,
    help="Payload bytes queued per local client before the overflow policy drops one "
    "(one message always fits; 0: no bound).",
)
@setting(
    "--mqtt-max-queued",
    "max_queued",
    type=click.IntRange(min=1),
    default=_DEFAULTS.max_queued,
    help="Messages kept in Redis per persistent session while its client is away "
    "(then the overflow policy drops one, counted).",
)
@setting(
    "--mqtt-max-queued-bytes",
    "max_queued_bytes",
    type=click.IntRange(min=0),
    default=_DEFAULTS.max_queued_bytes,
    help="Bytes kept in Redis per persistent session while its client is away (then the "
    "overflow policy drops one, counted; one message always fits; 0: no bound).",
)
@setting(
    "--acl",
    "acl_file",
    default=None,
    metavar="FILE",
    help="ACL file: allow/deny rules for publish and subscribe (see README).",
)
@setting(
    "--acl-default",
    type=click.Choice(["allow", "deny"]),
    default=None,
    help="What the ACL decides when no rule matches [default: deny].",
)
@setting(
    "--auth-redis",
    is_flag=True,
    default=False,
    help="Users and ACL rules from Redis, shared by the cluster (router users, router acl); "
    "instead of --password-file and --acl.",
)
@setting(
    "--auth-emqx-redis",
    "emqx_url",
    default=None,
    metavar="URL",
    help="Users and ACL entries where EMQX keeps them (mqtt_user:NAME, mqtt_acl:NAME) in "
    "the Redis at URL; with --emqx-password-hash.",
)
@setting(
    "--emqx-password-hash",
    "emqx_hash",
    default=None,
    metavar="SPEC",
    help="How EMQX hashed the passwords: plain, bcrypt, md5|sha|sha256|sha512"
    "[,prefix|suffix|disable], pbkdf2,MAC,ITERATIONS[,DK_LENGTH].",
)
@setting(
    "--traffic-dir",
    default=None,
    metavar="DIR",
    help="Write a traffic log (JSON lines, for `router pipeline report`) into DIR.",
)
@setting(
    "--traffic-sample",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=_DEFAULTS.traffic_sample,
    help="Fraction of publishes the traffic log keeps (with --traffic-dir).",
)
@setting(
    "--retained-max-payload",
    type=click.IntRange(min=0),
    default=_DEFAULTS.retained.max_payload,
    help="Largest retained payload in bytes this node stores (0: no limit).",
)
@setting(
    "--retained-max-count",
    type=click.IntRange(min=0),
    default=_DEFAULTS.retained.max_count,
    help="Retained topics beyond which this node stores no new one (0: no limit).",
)
@setting(
    "--retained-max-bytes",
    type=click.IntRange(min=0),
    default=_DEFAULTS.retained.max_bytes,
    help="Bytes the cluster's retained messages may hold in Redis, beyond which this node "
    "stores no message that grows them (0: no limit).",
)
@setting(
    "--retained-clear-interval",
    type=click.FloatRange(min=0.0),
    default=_DEFAULTS.retained.clear_interval,
    help="Seconds between this node's runs that remove expired retained messages (0: never).",
)
@setting("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO")
@mqtt_options(setting)
def node_run(
    target: Target,
    node_id: str | None,
    share_strategy: str,
    heartbeat_interval: float,
    heartbeat_ttl: float,
    redis_timeout: float,
    redis_pool_size: int,
    publish_timeout: float,
    allow_eviction: bool,
    shared_sessions: bool,
    metrics: str | None,
    http_address: str | None,
    http_tls_cert: str | None,
    http_tls_key: str | None,
    queue_limit: int,
    queue_bytes: int,
    max_queued: int,
    max_queued_bytes: int,
    acl_file: str | None,
    acl_default: str | None,
    auth_redis: bool,
    emqx_url: str | None,
    emqx_hash: str | None,
    traffic_dir: str | None,
    traffic_sample: float,
    retained_max_payload: int,
    retained_max_count: int,
    retained_max_bytes: int,
    retained_clear_interval: float,
    log_level: str,
    mqtt_listeners: tuple[str, ...],
    tls_listeners: tuple[str, ...],
    websocket_listeners: tuple[str, ...],
    websocket_path: str,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    tls_require_client_cert: bool,
    password_file: str | None,
    **mqtt: Any,
) -> None:
    """Join the cluster as a node and serve until SIGINT or SIGTERM."""
    if heartbeat_ttl <= heartbeat_interval:
        raise click.BadParameter(
            "must be longer than --heartbeat-interval", param_hint="--heartbeat-ttl"
        )
    node_id = node_id or default_node_id()
    settings = mqtt_settings(mqtt)
    verifier = jwt_verifier(mqtt)  # (a bad key file or option: one error line)
    for address in (
        *mqtt_listeners,
        *tls_listeners,
        *websocket_listeners,
        *filter(None, [metrics, http_address]),
    ):
        parse_address(address)  # a bad address is one error line, before connecting
    sources = auth_sources(password_file, acl_file, acl_default, auth_redis, emqx_url, emqx_hash)
    if not settings.allow_anonymous and not sources.authenticates and verifier is None:
        raise click.BadParameter(
            "needs an authentication source (--password-file, --auth-redis, "
            "--auth-emqx-redis, --jwt-secret, --jwt-public-key): without one any user name "
            "and password would be accepted",
            param_hint="--no-allow-anonymous",
        )
    tls = None
    if tls_listeners:
        if tls_cert is None or tls_key is None:
            raise click.BadParameter("needs --tls-cert and --tls-key", param_hint="--mqtt-tls")
        tls = tls_context(tls_cert, tls_key, tls_ca, require_client_cert=tls_require_client_cert)
    http_tls = http_tls_context(http_address, http_tls_cert, http_tls_key)
    retained = RetainedConfig(
        max_payload=retained_max_payload,
        max_count=retained_max_count,
        max_bytes=retained_max_bytes,
        clear_interval=retained_clear_interval,
    )

    async def main() -> None:
        with log_to_stderr(log_level.upper()) as log, stop_on_signals() as stop:
            async with (
                connect(
                    target.url,
                    node_id=node_id,
                    prefix=target.prefix,
                    share_strategy=share_strategy,
                    heartbeat_interval=heartbeat_interval,
                    heartbeat_ttl=heartbeat_ttl,
                    redis_timeout=redis_timeout,
                    redis_pool_size=redis_pool_size,
                    publish_timeout=publish_timeout,
                    allow_eviction=allow_eviction,
                    shared_sessions=shared_sessions,
                    queue_limit=queue_limit,
                    queue_bytes=queue_bytes,
                    max_queued=max_queued,
                    max_queued_bytes=max_queued_bytes,
                    acl=sources.acl,
                    traffic_dir=traffic_dir,
                    traffic_sample=traffic_sample,
                    retained=retained,
                ) as running,
                contextlib.AsyncExitStack() as stack,
            ):
                await install(sources, running, settings.allow_anonymous, stack, log)
                if verifier is not None:  # (before the password file: router.cluster.jwt_auth)
                    from router.cluster.jwt_auth import install_jwt

                    anonymous = settings.allow_anonymous
                    install_jwt(
                        running, verifier, passwords=sources.passwords, allow_anonymous=anonymous
                    )
                    log.info("JWT authentication: %s", verifier.describe())
                async with (
                    serve(
                        running,
                        mqtt_listeners,
                        settings,
                        tls=tls_listeners,
                        tls_context=tls,
                        websocket=websocket_listeners,
                        websocket_path=websocket_path,
                    ) as front,
                    contextlib.AsyncExitStack() as extras,
                ):
                    for scheme, host, port in front.listeners:
                        kind = {"mqtt": "MQTT", "mqtts": "MQTT TLS", "ws": "MQTT WS"}[scheme]
                        log.info("%s on %s:%d", kind, host, port)
                        if settings.allow_anonymous and not is_loopback(host):
                            log.warning(
                                "%s on %s:%d accepts anonymous clients from the network "
                                "(--no-allow-anonymous with --password-file refuses them)",
                                kind,
                                host,
                                port,
                            )
                    if metrics is not None:
                        bound = await extras.enter_async_context(
                            serve_http(running, metrics, front, api=False)
                        )
                        log.info("metrics on http://%s:%d/metrics", *bound)
                    if http_address is not None:
                        bound = await extras.enter_async_context(
                            serve_http(running, http_address, front, tls=http_tls)
                        )
                        scheme = "https" if http_tls else "http"
                        log.info("HTTP on %s://%s:%d", scheme, *bound)
                        warn_open_http(log, bound[0])
                    settle_collector()
                    log.info("node %s ready", running.node_id)
                    signalled = asyncio.create_task(stop.wait())
                    taken_over = asyncio.create_task(running.wait_taken_over())
                    await asyncio.wait({signalled, taken_over}, return_when=asyncio.FIRST_COMPLETED)
                    for task in (signalled, taken_over):
                        task.cancel()
                if taken_over.done() and not taken_over.cancelled():
                    raise StaleIncarnationError(
                        f"node {running.node_id} was taken over by another process"
                    )
                log.info("node %s stopping", running.node_id)
            log.info("node %s stopped: %s", running.node_id, running.stats())

    run(main())


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_open_http(log: Any, host: str) -> None:
    """Say how a dashboard on a network address is opened: only with an account."""
    if not is_loopback(host):
        log.warning(
            "HTTP on %s is reachable from the network: its API and dashboard refuse "
            "everyone until a dashboard account exists (router dashboard users add)",
            host,
        )


def http_tls_context(
    address: str | None, cert: str | None, key: str | None
) -> ssl.SSLContext | None:
    """The TLS context of ``--http`` (None: plain HTTP)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None or address is None:
        raise click.BadParameter(
            "needs --http, --http-tls-cert and --http-tls-key", param_hint="--http-tls-cert"
        )
    return tls_context(cert, key)
