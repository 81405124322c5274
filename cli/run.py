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
``node ID ready`` once it has joined, serves its inbox until SIGINT or SIGTERM (SIGHUP
rereads its files: :mod:`router.ops.reloading`), then leaves gracefully (routes removed,
deregistered) and logs ``node ID stopped`` with its counters. ``router node reload`` asks
running nodes to reread their files (:mod:`router.ops.reload_requests`), ``router node
drain`` to drain and leave (:mod:`router.ops.drain_requests`).

The command only parses: its options become :class:`NodeProcessSettings` (one field per
option, ``--heartbeat-ttl`` for ``heartbeat_ttl``) and :func:`serve_forever` runs the node
(:mod:`router.ops.node_process`). Settings that do not go together are a usage error
naming the options; a file that cannot be used is one ``Error:`` line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from router.api import REDIS_TIMEOUT
from router.cluster.config import NodeConfig
from router.errors import NodeSettingError
from router.mqtt.drain import DrainSettings
from router.mqtt.settings import NO_PROXIES
from router.ops.drain_requests import DrainAnswer, drain_nodes
from router.ops.node_process import serve_forever
from router.ops.node_settings import LOG_LEVELS, SHARE_STRATEGIES, NodeProcessSettings
from router.ops.reload_requests import ReloadAnswer, reload_nodes
from router.state.connection import DEFAULT_POOL_SIZE
from router.state.retained_store import RetainedConfig
from router.web.listener import serve_http

from .common import Target, echo_json, json_option, redis_client, run, target_options as target
from .mqtt_options import TRUSTED_PROXIES, mqtt_options, mqtt_settings

_DEFAULTS = NodeConfig("defaults")
_DRAIN = DrainSettings()
Command = TypeVar("Command", bound=Callable[..., Any])


@click.group()
def node() -> None:
    """Run a router node."""


def setting(flag: str, *decls: str, **kwargs: Any) -> Callable[[Command], Command]:
    """A ``click.option`` that also reads ``ROUTER_<FLAG>`` (``--queue-limit``:
    ``ROUTER_QUEUE_LIMIT``), named in its ``--help`` as ``(env ROUTER_...)``; a default
    other than None shows there too. (Not click's ``show_envvar``: it would name the
    variable in the error for a bad value given on the command line.)"""
    envvar = "ROUTER_" + flag.removeprefix("--").replace("-", "_").upper()
    kwargs.setdefault("show_default", kwargs.get("default") is not None)
    text = str(kwargs.get("help") or "")
    if envvar not in text:
        kwargs["help"] = f"{text.rstrip('.')} (env {envvar}).".lstrip()
    return click.option(flag, *decls, envvar=envvar, **kwargs)


@node.command("run")
@target
@setting("--node-id", default=None, help="Node id (env ROUTER_NODE_ID) [default: hostname-pid].")
@setting(
    "--share-strategy",
    type=click.Choice(SHARE_STRATEGIES),
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
    "--redis-replicas",
    type=click.IntRange(min=0),
    default=0,
    help="Replicas that must acknowledge every write before the node acknowledges it "
    "(Redis WAIT, within half of --redis-timeout; standalone or Sentinel): a failover "
    "then loses no acknowledged message (0: none waited for).",
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
    "http",
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
    "--http-proxy-trusted",
    "http_proxy_trusted",
    default=None,
    type=TRUSTED_PROXIES,
    help="Reverse proxies whose X-Forwarded-For or Forwarded name the client of an --http "
    "request (the right-most hop not among them) [default: none].",
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
    help="ACL file: allow/deny rules for publish and subscribe (see docs/security.md).",
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
    "emqx_password_hash",
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
@setting(
    "--mqtt-advertise",
    default=None,
    metavar="HOST:PORT",
    help="The MQTT address clients reach this node at: a draining peer sends its MQTT 5.0 "
    "clients here (DISCONNECT 0x9C with this Server Reference) [default: none].",
)
@setting(
    "--drain-grace",
    type=click.FloatRange(min=0.0),
    default=_DRAIN.grace,
    help="Seconds a leaving node (SIGTERM, router node drain) drains at most: it accepts "
    "no client, ends its connections and hands their sessions on (0: no drain).",
)
@setting(
    "--drain-rate",
    type=click.IntRange(min=0),
    default=_DRAIN.rate,
    help="Connections a draining node ends a second (0: no bound but --drain-window).",
)
@setting(
    "--drain-window",
    type=click.IntRange(min=0),
    default=_DRAIN.window,
    help="Persistent sessions a draining node has on their way to other nodes at most "
    "(ended, not resumed yet): the pace follows how fast the others take them (0: no bound).",
)
@setting("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="INFO")
@mqtt_options(setting)
def node_run(
    target: Target,
    node_id: str | None,
    retained_max_payload: int,
    retained_max_count: int,
    retained_max_bytes: int,
    retained_clear_interval: float,
    **options: Any,
) -> None:
    """Join the cluster as a node and serve until SIGINT or SIGTERM (SIGHUP: reload)."""
    retained = RetainedConfig(
        max_payload=retained_max_payload,
        max_count=retained_max_count,
        max_bytes=retained_max_bytes,
        clear_interval=retained_clear_interval,
    )
    mqtt = mqtt_settings(options)  # (the MqttSettings fields, taken out of options)
    if options["http_proxy_trusted"] is None:
        options["http_proxy_trusted"] = NO_PROXIES
    try:
        settings = NodeProcessSettings(
            redis_url=target.url,
            prefix=target.prefix,
            node_id=node_id or None,
            retained=retained,
            mqtt=mqtt,
            **options,
        )
    except NodeSettingError as exc:
        raise bad_option(exc) from None
    serve_forever(settings, http=serve_http)


@node.command("reload")
@target
@click.argument("node_ids", nargs=-1, metavar="[NODE_ID]...")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds to wait for the nodes' answers.",
)
@json_option
def node_reload(target: Target, node_ids: tuple[str, ...], timeout: float, as_json: bool) -> None:
    """Ask running nodes (default: every live node) to reread their password, ACL, TLS
    and limits files, as SIGHUP does; one line per node. Exits 1 when a node kept its
    configuration or did not answer."""

    async def main() -> list[ReloadAnswer]:
        async with redis_client(target) as redis:
            return await reload_nodes(redis, target.keys, node_ids, timeout=timeout)

    answers = run(main())
    if as_json:
        echo_json([answer.as_dict() for answer in answers])
    elif not answers:
        click.echo("no live node to reload")
    for answer in [] if as_json else answers:
        click.echo(answer.text)
    if any(answer.ok is not True for answer in answers):
        raise SystemExit(1)


@node.command("drain")
@target
@click.argument("node_ids", nargs=-1, required=True, metavar="NODE_ID...")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds to wait until every node named drained and left.",
)
@json_option
def node_drain(target: Target, node_ids: tuple[str, ...], timeout: float, as_json: bool) -> None:
    """Ask running nodes to drain and leave, as SIGTERM does: each accepts no new client,
    ends its connections (MQTT 5.0: 0x9C to a peer that advertises an address, else
    0x8B), hands their sessions on, and leaves; one line per node. Exits 1 when a node
    was not alive or did not leave within the timeout."""

    async def main() -> list[DrainAnswer]:
        async with redis_client(target) as redis:
            return await drain_nodes(redis, target.keys, node_ids, timeout=timeout)

    answers = run(main())
    if as_json:
        echo_json([answer.as_dict() for answer in answers])
    for answer in [] if as_json else answers:
        click.echo(answer.text)
    if any(answer.ok is not True for answer in answers):
        raise SystemExit(1)


def bad_option(error: NodeSettingError) -> click.BadParameter:
    """The usage error of settings that do not go together, named by the options that
    set them (``mqtt.allow_anonymous`` False: ``--no-allow-anonymous``)."""
    ctx = click.get_current_context()
    options = {param.name: param for param in ctx.command.params if param.name}

    def flag(setting: str) -> str:
        param = options.get(setting.rpartition(".")[2])
        if not isinstance(param, click.Option):
            return setting
        if param.secondary_opts and ctx.params.get(param.name) is False:
            return param.secondary_opts[0]
        return param.opts[0]

    return click.BadParameter(error.explain(flag), ctx=ctx, param_hint=flag(error.setting))
