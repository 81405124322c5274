"""The one exception hierarchy of the router.

Every error the library raises on purpose derives from :class:`RouterError`. Errors about
bad input also derive from :class:`ValueError`, so callers that already catch ``ValueError``
keep working. Data about the failure lives on attributes, not only in the message.
"""

from __future__ import annotations

from collections.abc import Callable


class RouterError(Exception):
    """Base class of every error raised by the router."""


class InvalidTopicError(RouterError, ValueError):
    """A topic name or topic filter breaks the MQTT rules (MQTT 5.0, 4.7).

    ``topic`` is the offending string as given, ``reason`` says which rule it breaks.
    """

    def __init__(self, topic: str, reason: str) -> None:
        self.topic = topic
        self.reason = reason
        shown = topic if len(topic) <= 80 else topic[:77] + "..."
        super().__init__(f"invalid topic {shown!r}: {reason}")


class InvalidAliasError(RouterError, ValueError):
    """A topic alias is outside 1..maximum, or its namespace is unknown."""

    def __init__(self, alias: object, reason: str) -> None:
        self.alias = alias
        self.reason = reason
        super().__init__(f"invalid topic alias {alias!r}: {reason}")


class InvalidOptionsError(RouterError, ValueError):
    """Subscription options that MQTT does not allow (QoS 3, retain handling 5, ...)."""


class UnknownStrategyError(RouterError, ValueError):
    """A shared-subscription strategy name that the router does not know."""


class InvalidIdError(RouterError, ValueError):
    """An identifier (client, node, channel, subscriber) that cannot be stored."""


class StateError(RouterError):
    """Shared state in Redis failed an operation or holds something it should not."""


class StateFailureError(StateError):
    """A call to Redis failed on the way or in Redis itself, not because the router's
    rules refused it (those raise their own errors: :class:`ScriptError`,
    :class:`SessionOwnershipError`...). Raised as is for a command Redis refused (OOM
    under ``noeviction``, READONLY from a replica, WRONGTYPE) or a reply that could not
    be read; the subclasses say more. ``cause`` is redis-py's exception (also the
    ``__cause__``): the state layer lets no redis-py error out (router.state.failures)."""

    def __init__(self, cause: BaseException, what: str = "Redis error") -> None:
        self.cause = cause
        super().__init__(f"{what}: {str(cause) or type(cause).__name__}")


class StateUnavailableError(StateFailureError):
    """Redis could not be reached or did not answer in time: no connection, a timeout, a
    full connection pool, a server still loading its data; on a Redis Cluster, a slot
    that cannot be served now (CLUSTERDOWN during a failover, TRYAGAIN during a
    migration, no node answering). The same call may well succeed a moment later; a
    timeout does not say whether a write happened (what is retried must be idempotent
    or deduplicated)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause, "cannot reach Redis")


class StateAccessError(StateFailureError):
    """Redis refused the router's credentials (``credentials`` True), or its ACL denies a
    command the router needs: a problem of configuration, which waiting does not mend."""

    def __init__(self, cause: BaseException, *, credentials: bool) -> None:
        self.credentials = credentials
        what = (
            "Redis refused the credentials"
            if credentials
            else "Redis denies a command the router needs (see docs/operations.md)"
        )
        super().__init__(cause, what)


class CorruptStateError(StateError):
    """A value read from Redis is not what the router wrote there (a non-integer clock...)."""


class ScriptError(StateError):
    """A Lua script refused its arguments; nothing was changed."""


class SessionOwnershipError(StateError):
    """A node changed a client's state after another node (or a newer epoch) took it over."""


class SessionStateError(RouterError):
    """A local session was asked to move between states its lifecycle does not allow
    (router.cluster.sessions.states): a defect of the node, reported instead of acted on."""


class SubscriptionNotFoundError(StateError, LookupError):
    """The channel subscriber (its cursor) or the channel clock does not exist (anymore)."""


class MalformedAckHandleError(StateError, ValueError):
    """An ack handle that is not well formed or belongs to another channel or subscriber."""


class ChannelArgumentError(RouterError, ValueError):
    """A channel got an argument it cannot use: content that is not bytes, a ``max`` out of
    range, a negative ``wait``, an expiry that is not a positive number of seconds."""


class StaleIncarnationError(StateError):
    """A node wrote with an incarnation that is no longer its current one.

    A newer process of the same node id took over (or the node was purged and registered
    again); the old process must stop writing.
    """


class NodeNotRegisteredError(StateError, LookupError):
    """A heartbeat for a node that is not in the registry (never registered, or purged)."""


class UnknownNodeError(StateError, LookupError):
    """A node id that is neither registered nor has a route set (``node_id`` names it)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"unknown node {node_id!r}: not registered and no route set in Redis")


class RouteSetMissingError(StateError):
    """A node's route set is gone (purged as dead, or Redis lost its data).

    The node must claim its route set again and republish every route it holds.
    """


class RouteWriteError(StateError):
    """A node's route change is not durable in Redis yet (Redis refused or could not be
    reached through every retry). The node keeps the change and writes it when Redis
    takes writes again; until then other nodes may not route to the new subscription."""

    def __init__(self, node_id: str, cause: BaseException) -> None:
        self.node_id = node_id
        super().__init__(
            f"route changes of node {node_id!r} are not in Redis yet ({type(cause).__name__}: "
            f"{cause}); the node keeps retrying them"
        )


class PublishTimeoutError(StateError):
    """A publish did not finish within the node's ``publish_timeout`` (Redis too slow or
    unreachable). Its copies may still be stored later: a retry may deliver it twice,
    which is at-least-once; it was never acknowledged as done."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"a publish did not finish within {seconds:g} s (is Redis answering?)")


class ResyncRequiredError(StateError):
    """A reader of a node's route changes cannot continue from where it is.

    ``reason`` is ``"trimmed"`` (it fell behind the stream's trim point), ``"generation"``
    (the route set was claimed again: a new incarnation or a republish), ``"gone"`` (the
    route set vanished: purged, or Redis flushed or restarted) or ``"ahead"`` (the reader
    holds a version the route set never reached); from a paged snapshot, ``"churn"`` (the
    set was claimed again or trimmed past the read each time it was tried). Take a new
    snapshot.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"route changes cannot be followed ({reason}): take a new snapshot")


class InvalidGuidError(InvalidIdError):
    """A message id (or one of its parts) that is not well formed or out of range."""


class HookError(RouterError, ValueError):
    """A hook registration the registry refuses: an unknown hook point, a callback that is
    not callable, a priority that is not an int."""


class DuplicateHookError(HookError):
    """The same callback is already registered at this hook point."""


class AclRuleError(RouterError, ValueError):
    """An ACL rule that cannot be used: a bad line of an ACL file, or a bad rule in code.

    ``reason`` says what is wrong; ``path`` and ``line`` (1-based) locate it in a file,
    or are None for a rule built in code.
    """

    def __init__(self, reason: str, path: str | None = None, line: int | None = None) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        where = f"{path}:{line}: " if path is not None and line is not None else ""
        super().__init__(f"{where}{reason}")


class PasswordFileError(RouterError, ValueError):
    """A password file (the mosquitto_passwd format) that cannot be used, or a bad hash.

    ``reason`` says what is wrong; ``path`` names the file and ``line`` (1-based) the bad
    line. ``line`` is None for an unreadable file; both are None for a hash or entry built
    in code. The message never quotes the line (it holds a password hash).
    """

    def __init__(self, reason: str, path: str | None = None, line: int | None = None) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        if path is None:
            where = ""
        elif line is None:
            where = f"{path}: "
        else:
            where = f"{path}:{line}: "
        super().__init__(f"{where}{reason}")


class InvalidSettingError(RouterError, ValueError):
    """A tuning setting outside its allowed range (cache sizes, thresholds, periods)."""


class JwtSettingError(InvalidSettingError):
    """JWT authentication cannot be set up as asked: a key file that cannot be read or
    is not a PEM public key, a secret too short for its algorithm, an algorithm that is
    unknown, ``none`` or of the wrong family for the key (:mod:`router.cluster.jwt_auth`)."""


class TokenRefusedError(RouterError, ValueError):
    """A JWT a client presented is not accepted (bad signature or algorithm, expired,
    not yet valid, wrong audience, issuer or user name, a bad ``acl`` claim). ``reason``
    says which check failed; it never quotes the token."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class NotAuthorizedError(RouterError):
    """Authentication or the ACL (or a hook) refused what a client asked; nothing changed.

    ``client_id`` names the client, ``action`` is ``"connect"``, ``"publish"`` or
    ``"subscribe"``, ``topic`` the topic or filter (None for connect) and ``reason`` the
    decision's reason.
    """

    def __init__(self, client_id: str, action: str, topic: str | None, reason: str) -> None:
        self.client_id = client_id
        self.action = action
        self.topic = topic
        self.reason = reason
        what = action if topic is None else f"{action} {topic!r}"
        super().__init__(f"client {client_id!r} may not {what}: {reason}")


class SessionUserError(NotAuthorizedError):
    """The client id's session belongs to another user: the session records the user
    that made it, and only that user's clients may resume or take it over (CONNACK
    0x87, 3.1.1 return code 5), unless the node shares sessions between users."""

    def __init__(
        self, client_id: str = "", reason: str = "its session belongs to another user"
    ) -> None:
        super().__init__(client_id, "connect", None, reason)


# -- Redis connections ---------------------------------------------------------------------


class BadRedisURLError(RouterError, ValueError):
    """A Redis URL that redis-py cannot parse."""


class UnsupportedServerError(RouterError):
    """A Redis server that lacks what the router needs (a cluster older than 7.0)."""


class UnsafeRedisError(RouterError):
    """A Redis configured so that it may lose the router's state without an error (a
    ``maxmemory-policy`` that evicts keys)."""


# -- The retained store --------------------------------------------------------------------


class RetainedStoreFullError(RouterError):
    """The store holds ``max_count`` topics: a new topic is refused (nothing changed)."""

    def __init__(self, topic: str, max_count: int) -> None:
        self.topic = topic
        self.max_count = max_count
        super().__init__(f"the retained store is full ({max_count} topics): {topic!r} refused")


class RetainedBytesFullError(RetainedStoreFullError):
    """The store's messages hold ``max_bytes``: a message that would grow them is refused
    (nothing changed); one that replaces a message of its size or larger still goes."""

    def __init__(self, topic: str, max_bytes: int) -> None:
        RouterError.__init__(
            self, f"the retained store is full ({max_bytes} bytes): {topic!r} refused"
        )
        self.topic = topic
        self.max_count = 0
        self.max_bytes = max_bytes


class RetainedPayloadTooLargeError(RouterError, ValueError):
    """A payload above ``max_payload`` bytes is not retained (nothing changed)."""

    def __init__(self, topic: str, size: int, max_payload: int) -> None:
        self.topic = topic
        self.size = size
        self.max_payload = max_payload
        super().__init__(f"a retained payload is at most {max_payload} bytes; {topic!r} has {size}")


class RetainedArgumentError(RouterError, ValueError):
    """An argument the store cannot use: a QoS, expiry, limit, page or cursor out of range."""


# -- The cluster runtime -------------------------------------------------------------------


class MalformedMessageError(RouterError, ValueError):
    """A packed message or batch that this router did not write."""


class ClientNotConnectedError(RouterError, LookupError):
    """The client has no session on this node."""


class BroadcastMessageError(RouterError, TypeError):
    """A message the broadcaster backend cannot publish: not ``str``, bytes or a number
    (:mod:`router.integrations.broadcast_backend`). ``message`` is what was given."""

    def __init__(self, message: object) -> None:
        self.message = message
        super().__init__(
            f"a broadcast message is str, bytes or a number, not {type(message).__name__}"
        )


class ForeignChannelError(RouterError, ValueError):
    """``receive()`` on a process-specific channel of another process: the Django Channels
    layer delivers a channel's messages only in the process that made it
    (:mod:`router.integrations.channels_layer`). ``channel`` is the name; ``process`` this
    process's part of its own channels' names."""

    def __init__(self, channel: str, process: str) -> None:
        self.channel = channel
        self.process = process
        super().__init__(
            f"channel {channel!r} belongs to another process (this one's channels are "
            f"'<prefix>.{process}!...')"
        )


class ChannelMessageError(RouterError, TypeError):
    """A message the Django Channels layer cannot serialize (msgpack refused it: a value
    of a type it does not know, an int too large). ``message`` is what was given."""

    def __init__(self, message: object, reason: str) -> None:
        self.message = message
        super().__init__(f"a channel message msgpack cannot pack: {reason}")


# -- Operator tools ------------------------------------------------------------------------


class DemoTimeoutError(RouterError):
    """The demo cluster did not reach the expected state in time."""


class EmbeddedServerError(RouterError):
    """No embedded Redis could be started."""


class ProcessStartError(RouterError):
    """A child process that serves something (a ``redis-server``, a broker, a node) did not
    become ready (:mod:`router.ops.processes`). ``name`` names it; ``returncode`` is its exit
    status, or None when it still ran at the deadline; ``log_tail`` is the end of its
    output ("" without a log)."""

    def __init__(self, name: str, returncode: int | None, log_tail: str = "") -> None:
        self.name = name
        self.returncode = returncode
        self.log_tail = log_tail
        state = "was not ready in time" if returncode is None else f"exited with {returncode}"
        super().__init__(f"{name} {state}" + (f":\n{log_tail}" if log_tail else ""))


class NodeSettingError(InvalidSettingError):
    """Settings of a node process that do not go together, or one out of its range
    (:mod:`router.ops.node_settings`), found before anything connects.

    ``setting`` names the field at fault (``heartbeat_ttl``, ``mqtt.allow_anonymous``);
    ``reason`` says what is wrong, a :meth:`str.format` template whose ``{}`` stand for
    the settings named in ``others``, in order (literal braces doubled). The message
    names them by their fields; :meth:`explain` lets a front end name them its own way
    (the CLI by its options).
    """

    def __init__(self, setting: str, reason: str, others: tuple[str, ...] = ()) -> None:
        self.setting = setting
        self.reason = reason
        self.others = others
        super().__init__(f"{setting}: {self.explain()}")

    def explain(self, name: Callable[[str], str] = str) -> str:
        """The reason, each of ``others`` shown as ``name(field)``."""
        return self.reason.format(*(name(other) for other in self.others))


class TraceNotFoundError(RouterError, LookupError):
    """No trace ``trace_id`` runs and none left records (HTTP 404)."""

    def __init__(self, trace_id: str) -> None:
        self.trace_id = trace_id
        super().__init__(f"no trace {trace_id!r}: none runs and none left records")


class ClientNotFoundError(RouterError, LookupError):
    """No such client to show or act on: ``client_id`` has no session in Redis (never
    had one, it ended or expired), or, for an action on its connection (a kick), it is
    not connected. ``reason`` says which, after the client id in the message."""

    def __init__(self, client_id: str, reason: str) -> None:
        self.client_id = client_id
        self.reason = reason
        super().__init__(f"client {client_id!r} {reason}")


# -- The Spark pipeline --------------------------------------------------------------------


class PipelineError(RouterError):
    """A pipeline job could not run or failed (the message says why)."""


class SparkUnavailableError(PipelineError):
    """pyspark is not installed, or no Java 17+ is available to run it."""


class PipelineInputError(PipelineError, ValueError):
    """An input the job cannot use: a missing path, an unknown format, a missing column."""


class ImportRowError(RouterError, ValueError):
    """A row the import cannot load (the message is the reason)."""


# -- Benchmarks ----------------------------------------------------------------------------


class BenchSetupError(RouterError, ValueError):
    """The benchmark cannot run as asked (bad sizes, or a server it does not measure)."""


class BenchDisagreementError(RouterError):
    """Two subjects of a benchmark answered the same input differently: its figures
    would compare different work, so it reports none."""


class PipelineBenchError(RouterError):
    """The benchmark could not run, or the two reports disagreed."""


# -- MQTT -------------------------------------------------------------------------------------


class MqttError(RouterError):
    """An MQTT packet or stream that breaks the specification.

    ``reason_code`` is the MQTT 5 reason code the specification names for it (the server
    sends it in CONNACK or DISCONNECT before closing; 3.1.1 clients are just closed).
    ``level`` is the protocol level of the CONNECT it was raised decoding, once that
    CONNECT's level was read (its refusal is a CONNACK of that level); None otherwise.
    """

    reason_code = 0x80
    level: int | None = None

    def __init__(self, message: str, reason_code: int | None = None) -> None:
        if reason_code is not None:
            self.reason_code = reason_code
        super().__init__(message)


class MalformedPacketError(MqttError, ValueError):
    """A packet that cannot be parsed as the specification lays it out (0x81)."""

    reason_code = 0x81


class MqttProtocolError(MqttError):
    """A well-formed packet that the protocol does not allow here (0x82)."""

    reason_code = 0x82


class PacketTooLargeError(MqttError):
    """A packet above the maximum packet size, refused from its fixed header (0x95)."""

    reason_code = 0x95


class UnsupportedProtocolVersionError(MqttError):
    """A CONNECT with a protocol name or level the server does not speak (0x84).

    ``level`` is the protocol level the client sent.
    """

    reason_code = 0x84

    def __init__(self, message: str, level: int) -> None:
        self.level = level
        super().__init__(message)


class ConnectionEndedError(MqttError):
    """The MQTT connection ends: the client sent DISCONNECT, the stream ended, the keepalive
    ran out, or the node ends it. ``reason_code`` is the DISCONNECT to send first (None:
    none); ``keep_will`` is False when the client ended normally (its will is dropped)."""

    def __init__(self, reason_code: int | None, *, keep_will: bool = True) -> None:
        super().__init__("the MQTT connection ends")
        self.disconnect_code = reason_code
        self.keep_will = keep_will


class ProxyHeaderError(RouterError, ValueError):
    """The first bytes of a connection are not a PROXY protocol header that can be used
    (:mod:`router.core.proxy_header`): ``reason`` says why in one word (``signature``,
    ``version``, ``command``, ``family``, ``length``, ``address``, ``tlv``, ``too_long``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ListenerError(RouterError):
    """A listener could not be opened (the address is in use, or not this machine's)."""


class RequestError(RouterError, ValueError):
    """An HTTP API request the router cannot take: a body that is not the JSON object the
    endpoint reads, a missing or mistyped field, a bad paging cursor (HTTP 400)."""


class LoginRequiredError(RouterError):
    """An HTTP API request without a live login or API key (HTTP 401)."""


class AccessDeniedError(RouterError):
    """An HTTP API request its principal may not make: a viewer changing something, a
    missing CSRF token, a listener that refuses everyone until an account exists (HTTP
    403)."""


class LoginThrottledError(AccessDeniedError):
    """A login refused before its password is checked: its user, or its source address,
    made too many failed logins lately (HTTP 429). ``retry_after`` is the seconds until
    the first of them leaves the window."""

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class BodyTooLargeError(RequestError):
    """An HTTP API request body above ``limit`` bytes (HTTP 413)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the body is larger than the limit of {limit:,} bytes")


class WeakPasswordError(RouterError, ValueError):
    """A dashboard password shorter than ``minimum`` characters (refused before anything
    is written)."""

    def __init__(self, minimum: int) -> None:
        self.minimum = minimum
        super().__init__(f"a dashboard password has at least {minimum} characters")


class SessionInUseError(RouterError):
    """An operator asked to clear the session of a connected client: kick it first
    (HTTP 409)."""


class AssetFetchError(RouterError, ValueError):
    """A library of the dashboard could not be fetched as pinned: the registry refused or
    could not be reached, or a tarball did not match its published integrity."""
