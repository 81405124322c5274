"""The MQTT listener options of ``router node run`` (each also read from ``ROUTER_*``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from router.core.trusted_proxies import TrustedProxies
from router.errors import InvalidSettingError
from router.mqtt.settings import DEFAULT_SETTINGS, PROXIED_LISTENERS, MqttSettings
from router.mqtt.websocket import DEFAULT_PATH

Command = TypeVar("Command", bound=Callable[..., Any])

# option -> (MqttSettings field, click type, help)
_LIMITS: dict[str, tuple[str, Any, str]] = {
    "--mqtt-max-connecting": (
        "max_connecting",
        click.IntRange(min=1),
        "CONNECTs whose node work runs at once; the others wait their turn "
        "(0x89 once --mqtt-connect-timeout has passed since their accept).",
    ),
    "--mqtt-max-connections": (
        "max_connections",
        click.IntRange(min=1),
        "MQTT connections at once; more are closed.",
    ),
    "--mqtt-connect-timeout": (
        "connect_timeout",
        click.FloatRange(min=0.0, min_open=True),
        "Seconds a client has to send CONNECT after connecting.",
    ),
    "--mqtt-max-packet-size": (
        "max_packet_size",
        click.IntRange(min=64, max=268_435_460),
        "Largest packet a client may send, in bytes (0x95 above it).",
    ),
    "--mqtt-receive-maximum": (
        "receive_maximum",
        click.IntRange(min=1, max=65535),
        "Unanswered QoS 1/2 publishes a client may have (0x93 above it).",
    ),
    "--mqtt-max-keepalive": (
        "max_keepalive",
        click.IntRange(min=0, max=65535),
        "Cap on a client's keepalive, announced as Server Keep Alive (0: none).",
    ),
    "--mqtt-topic-alias-maximum": (
        "topic_alias_maximum",
        click.IntRange(min=0, max=65535),
        "Topic aliases a client may use towards the node.",
    ),
    "--mqtt-max-inflight": (
        "max_inflight",
        click.IntRange(min=1, max=65535),
        "QoS 1/2 deliveries a client may leave unacknowledged.",
    ),
    "--mqtt-max-inflight-bytes": (
        "max_inflight_bytes",
        click.IntRange(min=0),
        "Payload bytes of the QoS 1/2 deliveries a client may leave unacknowledged (more "
        "wait in its queue, but one always goes; 0: no limit).",
    ),
    "--mqtt-max-subscriptions": (
        "max_subscriptions",
        click.IntRange(min=0),
        "Filters one session may hold (0x97 Quota exceeded past it; 0: no limit).",
    ),
    "--mqtt-max-topic-levels": (
        "max_topic_levels",
        click.IntRange(min=1, max=65535),
        "Levels of a topic a client publishes or of a filter it subscribes, at most.",
    ),
    "--mqtt-max-topic-length": (
        "max_topic_length",
        click.IntRange(min=1, max=65535),
        "Characters of a topic a client publishes (DISCONNECT 0x90) or of a filter it "
        "subscribes (0x8F), at most.",
    ),
    "--mqtt-max-user-properties": (
        "max_user_properties",
        click.IntRange(min=0),
        "User properties one packet of a client may carry (DISCONNECT 0x97 past it; 0: no limit).",
    ),
    "--mqtt-max-user-properties-bytes": (
        "max_user_properties_bytes",
        click.IntRange(min=0),
        "UTF-8 bytes of the user properties' names and values in one packet of a client "
        "(DISCONNECT 0x97 past it; 0: no limit).",
    ),
    "--mqtt-max-publish-rate": (
        "max_publish_rate",
        click.FloatRange(min=0.0),
        "PUBLISH packets a client may send a second (beyond it the node stops reading "
        "from it a while; 0: no limit).",
    ),
    "--mqtt-max-publish-bytes-rate": (
        "max_publish_bytes_rate",
        click.IntRange(min=0),
        "Payload bytes a client may publish a second (as --mqtt-max-publish-rate).",
    ),
    "--mqtt-max-subscribe-rate": (
        "max_subscribe_rate",
        click.FloatRange(min=0.0),
        "Filters a client may subscribe or unsubscribe a second (beyond it the node stops "
        "reading from it a while; 0: no limit).",
    ),
    "--mqtt-max-connect-rate": (
        "max_connect_rate",
        click.FloatRange(min=0.0),
        "Connections one source address may open a second (more are closed at accept; "
        "0: no limit).",
    ),
    "--mqtt-overload-loop-lag": (
        "overload_loop_lag",
        click.FloatRange(min=0.0),
        "Seconds of event-loop lag at which the node is overloaded: it then defers new "
        "connections and slows its heaviest publishers (0: not watched).",
    ),
    "--mqtt-overload-busy-lag": (
        "overload_busy_lag",
        click.FloatRange(min=0.0),
        "Seconds of event-loop lag at which the node is busy: it then slows its heaviest "
        "clients, and defers connections only once overloaded (0: not watched).",
    ),
    "--mqtt-overload-busy-load": (
        "overload_busy_load",
        click.FloatRange(min=0.0, max=1.0),
        "Share of the time (0 to 1) the event loop works at which the node is busy: it "
        "then slows its heaviest clients, as at --mqtt-overload-busy-lag (0: not watched).",
    ),
    "--mqtt-overload-queued-bytes": (
        "overload_queued_bytes",
        click.IntRange(min=0),
        "Payload bytes queued in the node's memory for its clients at which it is "
        "overloaded (0: not watched).",
    ),
    "--mqtt-overload-memory": (
        "overload_memory",
        click.IntRange(min=0),
        "Resident bytes of the node's process at which it is overloaded (0: not watched).",
    ),
    "--mqtt-overload-redis-latency": (
        "overload_redis_latency",
        click.FloatRange(min=0.0),
        "Seconds one Redis PING takes at which the node is overloaded (0: not watched).",
    ),
    "--mqtt-flapping-max-connects": (
        "flapping_max_connects",
        click.IntRange(min=0),
        "More CONNECTs of one client id within --mqtt-flapping-window ban it on every "
        "node for --mqtt-flapping-ban seconds (0: never).",
    ),
    "--mqtt-flapping-window": (
        "flapping_window",
        click.FloatRange(min=0.0, min_open=True),
        "Seconds over which a client id's CONNECTs are counted.",
    ),
    "--mqtt-flapping-ban": (
        "flapping_ban",
        click.FloatRange(min=0.0, min_open=True),
        "Seconds a flapping client id stays banned.",
    ),
    "--mqtt-max-unfinished-bytes": (
        "max_unfinished_bytes",
        click.IntRange(min=0),
        "Bytes of packets begun and not yet whole, all the node's clients together; a "
        "client that would take them past it gets DISCONNECT 0x97 (0: no limit).",
    ),
    "--mqtt-packet-timeout": (
        "packet_timeout",
        click.FloatRange(min=0.0),
        "Seconds a packet may take to arrive whole from the read that began it "
        "(DISCONNECT 0x8D after it; 0: no limit).",
    ),
    "--mqtt-session-expiry-max": (
        "session_expiry_max",
        click.IntRange(min=0, max=0xFFFFFFFF),
        "Longest Session Expiry Interval granted, seconds (4294967295: never ends).",
    ),
    "--mqtt-sys-interval": (
        "sys_interval",
        click.FloatRange(min=0.0),
        "Seconds between updates of the $SYS/broker/... topics (0: none).",
    ),
}


# JWT authentication (router.cluster.jwt_auth): option, destination (the field of
# NodeProcessSettings), click.option arguments.
_JWT: tuple[tuple[str, str, dict[str, Any]], ...] = (
    (
        "--jwt-secret",
        "jwt_secret",
        {
            "default": None,
            "metavar": "SECRET",
            "help": (
                "Accept a JWT as the MQTT password, signed with this HMAC secret (32 bytes at "
                "least; prefer ROUTER_JWT_SECRET: a command line is visible to the machine's "
                "users)."
            ),
        },
    ),
    (
        "--jwt-public-key",
        "jwt_public_key",
        {
            "default": None,
            "metavar": "FILE",
            "help": (
                "Accept a JWT as the MQTT password, signed with the key of this PEM public key "
                "(or certificate) file."
            ),
        },
    ),
    (
        "--jwt-algorithms",
        "jwt_algorithms",
        {
            "default": None,
            "metavar": "LIST",
            "help": (
                "JWT algorithms accepted, comma-separated (never none) [default: HS256 with a "
                "secret; RS256 for an RSA key, ES256/384/512 for an EC key, EdDSA]."
            ),
        },
    ),
    (
        "--jwt-audience",
        "jwt_audience",
        {
            "default": None,
            "help": ("A JWT's aud must name this (tokens with an aud claim need it)."),
        },
    ),
    ("--jwt-issuer", "jwt_issuer", {"default": None, "help": "A JWT's iss must be this."}),
    (
        "--jwt-username-claim",
        "jwt_username_claim",
        {
            "default": "sub",
            "help": ("The JWT claim that must equal the CONNECT user name, when one is sent."),
        },
    ),
    (
        "--jwt-leeway",
        "jwt_leeway",
        {
            "default": 5.0,
            "type": click.FloatRange(min=0.0),
            "help": "Seconds of slack on a JWT's exp, nbf and iat (clocks that disagree).",
        },
    ),
)


_TLS_FILES = (
    ("--tls-cert", "tls_cert", "The certificate chain (PEM) of --mqtt-tls and --mqtt-wss."),
    ("--tls-key", "tls_key", "The private key of --tls-cert (PEM)."),
    ("--tls-ca", "tls_ca", "CA certificates (PEM) that client certificates are checked against."),
)


class TrustedProxiesType(click.ParamType[TrustedProxies]):
    """``CIDR[,CIDR...]`` -> :class:`TrustedProxies` (a bad network: a usage error)."""

    name = "CIDR[,CIDR]"

    def convert(self, value: Any, param: Any, ctx: Any) -> TrustedProxies:
        if isinstance(value, TrustedProxies):
            return value
        try:
            return TrustedProxies.parse(str(value))
        except InvalidSettingError as error:
            self.fail(str(error), param, ctx)


TRUSTED_PROXIES = TrustedProxiesType()


def mqtt_options(
    setting: Callable[..., Callable[[Command], Command]],
) -> Callable[[Command], Command]:
    """Add the MQTT options with ``setting`` (the run command's option maker)."""

    def decorate(command: Command) -> Command:
        for flag, (field, kind, text) in reversed(_LIMITS.items()):
            default = getattr(DEFAULT_SETTINGS, field)
            command = setting(flag, field, type=kind, default=default, help=text)(command)
        command = setting(
            "--allow-anonymous/--no-allow-anonymous",
            "allow_anonymous",
            default=DEFAULT_SETTINGS.allow_anonymous,
            help="Accept MQTT clients that send no user name.",
        )(command)
        for flag, dest, text in reversed(_TLS_FILES):
            command = setting(flag, dest, default=None, metavar="FILE", help=text)(command)
        command = setting(
            "--password-file",
            "password_file",
            default=None,
            metavar="FILE",
            help="Check MQTT users against FILE (the mosquitto_passwd format).",
        )(command)
        for flag, dest, kwargs in reversed(_JWT):
            command = setting(flag, dest, **kwargs)(command)
        command = setting(
            "--limits-file",
            "limits_file",
            default=None,
            metavar="FILE",
            help="NAME = VALUE lines (mqtt-max-publish-rate = 5000) that amend the limits "
            "which may change while the node serves; read at start and on reload "
            "(docs/operations.md).",
        )(command)
        command = setting(
            "--tls-require-client-cert",
            "tls_require_client_cert",
            is_flag=True,
            help="Refuse TLS clients without a certificate signed by --tls-ca.",
        )(command)
        command = setting(
            "--mqtt-proxy-protocol",
            "proxy_protocol",
            multiple=True,
            type=click.Choice(sorted(PROXIED_LISTENERS)),
            help="Connections to these listeners (mqtt: --mqtt, mqtts: --mqtt-tls, ws: "
            "--mqtt-ws, wss: --mqtt-wss; repeatable) from --mqtt-proxy-trusted open with a "
            "PROXY protocol header (v1 or v2, before TLS): the client's address is the one "
            "it names.",
        )(command)
        command = setting(
            "--mqtt-proxy-trusted",
            "proxy_trusted",
            default=None,
            type=TRUSTED_PROXIES,
            help="The load balancers believed: their PROXY headers, and the X-Forwarded-For "
            "or Forwarded of their WebSocket upgrades [default: none].",
        )(command)
        command = setting(
            "--mqtt-ws-path",
            "websocket_path",
            default=DEFAULT_PATH,
            help="The path of the WebSocket listeners (ws and wss).",
        )(command)
        command = setting(
            "--mqtt-wss",
            "wss_listeners",
            multiple=True,
            metavar="HOST:PORT",
            help="Serve MQTT over WebSocket over TLS here, the browsers' wss:// (repeatable; "
            "needs --tls-cert and --tls-key, checks clients as --mqtt-tls does).",
        )(command)
        command = setting(
            "--mqtt-ws",
            "websocket_listeners",
            multiple=True,
            metavar="HOST:PORT",
            help="Serve MQTT over WebSocket here (subprotocol mqtt; repeatable).",
        )(command)
        command = setting(
            "--mqtt-tls",
            "tls_listeners",
            multiple=True,
            metavar="HOST:PORT",
            help="Serve MQTT over TLS here (repeatable; needs --tls-cert and --tls-key).",
        )(command)
        return setting(
            "--mqtt",
            "mqtt_listeners",
            multiple=True,
            metavar="HOST:PORT",
            help="Serve MQTT over TCP here (repeatable; ROUTER_MQTT takes a space-separated list).",
        )(command)

    return decorate


def mqtt_settings(options: dict[str, Any]) -> MqttSettings:
    """The :class:`MqttSettings` of the options (removed from ``options``)."""
    fields = [field for field, _, _ in _LIMITS.values()] + ["allow_anonymous"]
    values = {field: options.pop(field) for field in fields}
    listeners = frozenset(options.pop("proxy_protocol"))
    trusted = options.pop("proxy_trusted") or DEFAULT_SETTINGS.proxy_trusted
    if listeners and not trusted:
        raise click.BadParameter(
            "needs --mqtt-proxy-trusted: the load balancers whose headers are believed",
            param_hint="--mqtt-proxy-protocol",
        )
    return MqttSettings(**values, proxy_protocol=listeners, proxy_trusted=trusted)
