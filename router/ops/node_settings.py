"""What one node process is made of: :class:`NodeProcessSettings`, checked on creation.

``router node run`` builds one from its options (each field is an option of the same
name, ``--heartbeat-ttl`` for ``heartbeat_ttl``, and a ``ROUTER_*`` variable); an
application that embeds a node builds one in code and hands it to
:func:`router.ops.node_process.run_node`::

    NodeProcessSettings(
        redis_url="redis://127.0.0.1:6379/0",      Redis and the node: router.connect
        node_id="n1", heartbeat_ttl=3.0, ...
        mqtt=MqttSettings(allow_anonymous=False),  how the listeners treat clients
        mqtt_listeners=("0.0.0.0:1883",),          where: TCP, TLS, WebSocket (ws, wss)
        tls_listeners=(...), tls_cert=..., tls_key=...,
        password_file="passwd", acl_file=...,      users and rules: one source
        jwt_secret=...,                            JWT passwords (with any source)
        http="127.0.0.1:8080", metrics=...,        the HTTP listeners
    )

Creating one checks every field and how they go together, reading nothing and
connecting nowhere: a value out of range or settings that contradict each other raise
:class:`NodeSettingError` naming the field (a bad listener address
:class:`InvalidSettingError`, a bad prefix or node id :class:`InvalidIdError`). What
lives in files (certificates, keys, the password and ACL files) is read when the node
starts, before it connects (:func:`router.ops.node_process.run_node`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from router.api import REDIS_TIMEOUT
from router.cluster.config import NodeConfig
from router.core.sharing import STRATEGY_NAMES
from router.core.trusted_proxies import TrustedProxies
from router.errors import NodeSettingError
from router.mqtt.drain import DrainSettings
from router.mqtt.server import parse_address
from router.mqtt.settings import DEFAULT_SETTINGS, NO_PROXIES, MqttSettings
from router.mqtt.websocket import DEFAULT_PATH
from router.ops.auth_sources import check_auth_sources
from router.state.connection import DEFAULT_POOL_SIZE
from router.state.keys import DEFAULT_PREFIX, Keys, check_id
from router.state.retained_store import DEFAULT_RETAINED, RetainedConfig

if TYPE_CHECKING:
    from router.cluster.jwt_auth import JwtVerifier

_NODE: Final = NodeConfig("defaults")
DEFAULT_DRAIN: Final = DrainSettings()
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
SHARE_STRATEGIES: Final = (*STRATEGY_NAMES, "local")
# The settings that are lists of HOST:PORT addresses, and those that are one (or None).
_LISTENER_LISTS: Final = (
    "mqtt_listeners",
    "tls_listeners",
    "websocket_listeners",
    "wss_listeners",
)
_ADDRESSES: Final = ("metrics", "http", "mqtt_advertise")
# Sources of user names and passwords, as the reason of a missing one names them.
_HTTP_TLS: Final = ("http", "http_tls_cert", "http_tls_key")
_AUTHENTICATORS: Final = ("password_file", "auth_redis", "emqx_url", "jwt_secret", "jwt_public_key")


@dataclass(frozen=True)
class NodeProcessSettings:
    """Everything a node process runs with (times in seconds; see the module docstring).

    Redis and the node, as :func:`router.connect` takes them: ``redis_url`` (None:
    ``$ROUTER_REDIS_URL`` or the local Redis), ``prefix``, ``node_id`` (None: hostname-pid
    when it starts) and the :class:`NodeConfig` fields below, ``retained`` the limits of
    the retained store. The MQTT listeners: ``mqtt`` how they treat clients, plain TCP on
    ``mqtt_listeners``, TLS on ``tls_listeners`` (with ``tls_cert`` and ``tls_key``;
    ``tls_ca`` checks client certificates, ``tls_require_client_cert`` refuses clients
    without one), WebSocket on ``websocket_listeners`` at ``websocket_path``, and
    WebSocket over TLS (``wss://``) on ``wss_listeners``, with the same certificate and
    client certificate checks as ``tls_listeners``; ``limits_file`` amends the live
    limits of ``mqtt`` (:mod:`router.mqtt.live_limits`), read at start and on reload.
    ``mqtt_advertise``: the HOST:PORT its MQTT clients reach it at, where a draining peer
    sends its MQTT 5.0 clients. Leaving (SIGTERM, ``router node drain``), the node drains
    for ``drain_grace`` seconds at most, ending ``drain_rate`` connections a second with
    at most ``drain_window`` persistent sessions on their way to other nodes
    (:mod:`router.ops.draining`; a grace of 0: no drain, every connection ends at once).
    Users and
    rules from one source (:mod:`router.ops.auth_sources`): ``password_file`` and
    ``acl_file`` (``acl_default`` what no rule matches), or ``auth_redis``, or
    ``emqx_url`` with ``emqx_password_hash``; JWTs as passwords with ``jwt_secret`` or
    ``jwt_public_key`` (:func:`router.cluster.jwt_auth.jwt_verifier`). HTTP: ``metrics``
    serves ``/metrics`` and ``/healthz`` only, ``http`` the dashboard and the API too (over
    TLS with ``http_tls_cert`` and ``http_tls_key``); ``http_proxy_trusted``, the reverse
    proxies whose ``X-Forwarded-For``/``Forwarded`` name a request's client (none by
    default). ``log_level`` is for a process that
    logs to stderr (:func:`router.ops.node_process.serve_forever`).

    Raises :class:`NodeSettingError` (and the errors the module docstring names) on
    creation; secrets and URLs, which may hold a password, are left out of ``repr``.
    """

    redis_url: str | None = field(default=None, repr=False)
    prefix: str = DEFAULT_PREFIX
    node_id: str | None = None
    share_strategy: str = _NODE.share_strategy
    heartbeat_interval: float = _NODE.heartbeat_interval
    heartbeat_ttl: float = _NODE.heartbeat_ttl
    redis_timeout: float = REDIS_TIMEOUT
    redis_pool_size: int = DEFAULT_POOL_SIZE
    redis_replicas: int = 0
    publish_timeout: float = _NODE.publish_timeout
    allow_eviction: bool = False
    shared_sessions: bool = False
    queue_limit: int = _NODE.queue_limit
    queue_bytes: int = _NODE.queue_bytes
    max_queued: int = _NODE.max_queued
    max_queued_bytes: int = _NODE.max_queued_bytes
    traffic_dir: str | None = None
    traffic_sample: float = _NODE.traffic_sample
    retained: RetainedConfig = DEFAULT_RETAINED

    mqtt: MqttSettings = DEFAULT_SETTINGS
    mqtt_listeners: tuple[str, ...] = ()
    tls_listeners: tuple[str, ...] = ()
    websocket_listeners: tuple[str, ...] = ()
    wss_listeners: tuple[str, ...] = ()
    websocket_path: str = DEFAULT_PATH
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_require_client_cert: bool = False
    limits_file: str | None = None
    mqtt_advertise: str | None = None
    drain_grace: float = DEFAULT_DRAIN.grace
    drain_rate: int = DEFAULT_DRAIN.rate
    drain_window: int = DEFAULT_DRAIN.window

    password_file: str | None = None
    acl_file: str | None = None
    acl_default: str | None = None
    auth_redis: bool = False
    emqx_url: str | None = field(default=None, repr=False)
    emqx_password_hash: str | None = None
    jwt_secret: str | None = field(default=None, repr=False)
    jwt_public_key: str | None = None
    jwt_algorithms: str | None = None
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_username_claim: str = "sub"
    jwt_leeway: float = 5.0

    metrics: str | None = None
    http: str | None = None
    http_tls_cert: str | None = None
    http_tls_key: str | None = None
    http_proxy_trusted: TrustedProxies = NO_PROXIES
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        self._check_ranges()
        if self.heartbeat_ttl <= self.heartbeat_interval:
            raise NodeSettingError(
                "heartbeat_ttl", "must be longer than {}", ("heartbeat_interval",)
            )
        Keys(self.prefix)  # (InvalidIdError)
        if self.node_id is not None:
            check_id(self.node_id, "node id")
        for name in _LISTENER_LISTS:
            self._check_address_list(name)
        for address in filter(None, (getattr(self, name) for name in _ADDRESSES)):
            parse_address(address)  # (InvalidSettingError naming the address)
        for name in ("tls_listeners", "wss_listeners"):
            if getattr(self, name) and (self.tls_cert is None or self.tls_key is None):
                raise NodeSettingError(name, "needs {} and {}", ("tls_cert", "tls_key"))
        http_tls = (self.http, self.http_tls_cert, self.http_tls_key)
        if any(http_tls[1:]) and not all(http_tls):
            raise NodeSettingError("http_tls_cert", "needs {}, {} and {}", _HTTP_TLS)
        check_auth_sources(
            self.password_file,
            self.acl_file,
            self.auth_redis,
            self.emqx_url,
            self.emqx_password_hash,
        )
        if not self.mqtt.allow_anonymous and not any(getattr(self, n) for n in _AUTHENTICATORS):
            raise NodeSettingError(
                "mqtt.allow_anonymous",
                "needs an authentication source ({}, {}, {}, {}, {}): without one any user "
                "name and password would be accepted",
                _AUTHENTICATORS,
            )

    def _check_ranges(self) -> None:
        seconds = ("heartbeat_interval", "heartbeat_ttl", "redis_timeout", "publish_timeout")
        checks: dict[str, bool] = {
            **{name: _finite(v := getattr(self, name)) and v > 0 for name in seconds},
            "redis_pool_size": _int_at_least(self.redis_pool_size, 1),
            "redis_replicas": _int_at_least(self.redis_replicas, 0),
            "queue_limit": _int_at_least(self.queue_limit, 1),
            "queue_bytes": _int_at_least(self.queue_bytes, 0),
            "max_queued": _int_at_least(self.max_queued, 1),
            "max_queued_bytes": _int_at_least(self.max_queued_bytes, 0),
            "traffic_sample": _finite(self.traffic_sample) and 0 < self.traffic_sample <= 1,
            "jwt_leeway": _finite(self.jwt_leeway) and self.jwt_leeway >= 0,
            "drain_grace": _finite(self.drain_grace) and self.drain_grace >= 0,
            "drain_rate": _int_at_least(self.drain_rate, 0),
            "drain_window": _int_at_least(self.drain_window, 0),
            "share_strategy": self.share_strategy in SHARE_STRATEGIES,
            "acl_default": self.acl_default in (None, "allow", "deny"),
            "log_level": isinstance(self.log_level, str) and self.log_level.upper() in LOG_LEVELS,
            "retained": isinstance(self.retained, RetainedConfig),
            "mqtt": isinstance(self.mqtt, MqttSettings),
            "http_proxy_trusted": isinstance(self.http_proxy_trusted, TrustedProxies),
        }
        for name, valid in checks.items():
            if not valid:
                value = repr(getattr(self, name)).replace("{", "{{").replace("}", "}}")
                raise NodeSettingError(name, f"{_RANGES[name]}, not {value}")

    def _check_address_list(self, name: str) -> None:
        addresses = getattr(self, name)
        if isinstance(addresses, str) or not all(isinstance(a, str) for a in addresses):
            raise NodeSettingError(name, "is a tuple of HOST:PORT addresses")
        object.__setattr__(self, name, tuple(addresses))  # (a list given: frozen as a tuple)
        for address in addresses:
            parse_address(address)

    @property
    def drain(self) -> DrainSettings:
        """How the node drains as it leaves (:mod:`router.mqtt.drain`)."""
        return DrainSettings(self.drain_grace, self.drain_rate, self.drain_window)

    def connect_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`router.connect` (all but the URL and the ACL,
        which comes from the node's source of rules)."""
        return {
            "node_id": self.node_id,
            "prefix": self.prefix,
            "share_strategy": self.share_strategy,
            "heartbeat_interval": self.heartbeat_interval,
            "heartbeat_ttl": self.heartbeat_ttl,
            "redis_timeout": self.redis_timeout,
            "redis_pool_size": self.redis_pool_size,
            "redis_replicas": self.redis_replicas,
            "publish_timeout": self.publish_timeout,
            "allow_eviction": self.allow_eviction,
            "shared_sessions": self.shared_sessions,
            "queue_limit": self.queue_limit,
            "queue_bytes": self.queue_bytes,
            "max_queued": self.max_queued,
            "max_queued_bytes": self.max_queued_bytes,
            "traffic_dir": self.traffic_dir,
            "traffic_sample": self.traffic_sample,
            "retained": self.retained,
        }

    def jwt_verifier(self) -> JwtVerifier | None:
        """The verifier of the ``jwt_*`` settings, its key file read; None without
        ``jwt_secret`` or ``jwt_public_key``. Raises :class:`JwtSettingError`."""
        if self.jwt_secret is None and self.jwt_public_key is None:
            return None
        from router.cluster.jwt_auth import jwt_verifier  # (PyJWT loads only when used)

        return jwt_verifier(
            self.jwt_secret,
            self.jwt_public_key,
            self.jwt_algorithms,
            audience=self.jwt_audience,
            issuer=self.jwt_issuer,
            username_claim=self.jwt_username_claim,
            leeway=self.jwt_leeway,
        )


_RANGES: Final = {
    "heartbeat_interval": "must be seconds > 0",
    "heartbeat_ttl": "must be seconds > 0",
    "redis_timeout": "must be seconds > 0",
    "publish_timeout": "must be seconds > 0",
    "redis_pool_size": "must be an int >= 1",
    "redis_replicas": "must be an int >= 0",
    "queue_limit": "must be an int >= 1",
    "queue_bytes": "must be an int >= 0",
    "max_queued": "must be an int >= 1",
    "max_queued_bytes": "must be an int >= 0",
    "traffic_sample": "must be a fraction in (0, 1]",
    "jwt_leeway": "must be seconds >= 0",
    "drain_grace": "must be seconds >= 0",
    "drain_rate": "must be an int >= 0 (connections a second; 0: no bound)",
    "drain_window": "must be an int >= 0 (sessions on their way; 0: no bound)",
    "share_strategy": f"must be one of {', '.join(SHARE_STRATEGIES)}",
    "acl_default": "must be 'allow', 'deny' or None",
    "log_level": f"must be one of {', '.join(LOG_LEVELS)}",
    "retained": "must be a RetainedConfig",
    "mqtt": "must be an MqttSettings",
    "http_proxy_trusted": "must be a TrustedProxies",
}


def _finite(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_at_least(value: object, least: int) -> bool:
    return type(value) is int and value >= least
