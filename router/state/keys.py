"""Every Redis key name the router uses, built in this one module.

Layout (``rt`` is the default namespace prefix; ``ID`` is an escaped id, see below)::

    rt:{c:ID}:subs            hash   filter -> packed options          (client)
    rt:{c:ID}:alias:client    hash   alias -> topic, inbound aliases   (client)
    rt:{c:ID}:alias:server    hash   alias -> topic, outbound aliases  (client)
    rt:{c:ID}:alias:NS:topics hash   topic -> alias, reverse of NS     (client)
    rt:{c:ID}:alias:max       hash   namespace -> Topic Alias Maximum  (client)
    rt:{c:ID}:owner           hash   node, epoch: the session owner    (client)
    rt:{c:ID}:session         hash   the session: node, connected, expiry, ... (client)
    rt:{n:ID}:routes          hash   route -> member count             (node)
    rt:{n:ID}:stream          stream route changes, one entry a change (node)
    rt:{n:ID}:meta            hash   incarnation, version, ...         (node)
    rt:{n:ID}:figures         hash   figure -> value, expiring ($SYS)  (node)
    rt:{n:ID}:clients         hash   client id -> its packed figures, expiring (node)
    rt:{n:ID}:drops           hash   drops by reason, slowest clients, expiring (node)
    rt:{nodes}:registry       hash   node id -> incarnation            (registry)
    rt:{nodes}:heartbeats     zset   node id -> expiry, server ms      (registry)
    rt:{nodes}:retired        hash   node id -> incarnation that retired (registry)
    rt:{ch:ID}:clock          string the channel clock, an integer in +-(2^53-1)  (channel)
    rt:{ch:ID}:epoch          string a token, new whenever the channel is made anew (channel)
    rt:{ch:ID}:sub:SUB        string a subscriber's cursor (last acked clock)     (channel)
    rt:{ch:ID}:m:CLOCK        string the message stored at CLOCK (id + content)   (channel)
    rt:{ch:ID}:id:MSGID       string the clock MSGID was stored at (dedup window) (channel)
    rt:{ch:ID}:wake           pub/sub channel (not a key): new-message wake-ups   (channel)
    rt:{r:LEVEL}:topics       zset   topics of one first level, lexicographic  (retained shard)
    rt:{r:LEVEL}:messages     hash   topic -> packed retained message          (retained shard)
    rt:{r:LEVEL}:expiry       zset   topic -> expiry time, server ms           (retained shard)
    rt:{retained}:shards      zset   first levels that hold retained topics    (retained registry)
    rt:{retained}:counts      hash   first level -> topics stored (or reserved) (retained registry)
    rt:{retained}:total       string topics stored (or reserved) in all shards  (retained registry)
    rt:{console}:...          the dashboard's users, API keys, logins and login attempts
                              (router.state.console_store, router.state.login_attempts)

Every key carries the hash tag of the entity it belongs to, so all keys of one client,
one node or one channel live in one Redis Cluster slot and one Lua script may touch them
together. Ids come from users (MQTT client ids can hold any text), so inside a tag they are
escaped: ``%`` ``{`` ``}`` become ``%25`` ``%7B`` ``%7D``. The escaped id holds no ``}``,
so no id can end its tag early or move its keys to another slot, and the escaping is
one-to-one, so two ids never share a key. Entity kinds have distinct tag prefixes
(``c:``, ``n:``, ``ch:``, ``r:``), so a client never shares a key with a node or a channel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

from router.core.aliases import NAMESPACES
from router.errors import InvalidIdError

DEFAULT_PREFIX: Final = "rt"
MAX_ID_BYTES: Final = 65535

_ESCAPES: Final = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def check_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it can name an entity: a non-empty, well-formed str.

    Raises :class:`InvalidIdError` otherwise.
    """
    if type(value) is not str or not value:
        raise InvalidIdError(f"a {what} must be a non-empty str, not {value!r}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidIdError(f"a {what} must be well-formed UTF-8 text") from None
    if size > MAX_ID_BYTES:
        raise InvalidIdError(f"a {what} is at most {MAX_ID_BYTES} UTF-8 bytes")
    return value


def escape_id(value: str) -> str:
    """The one-to-one escaped form of an id, safe inside a hash tag."""
    if "%" not in value and "{" not in value and "}" not in value:
        return value  # (most ids: three scans in C, no new string)
    return value.translate(_ESCAPES)


def unescape_id(value: str) -> str:
    """The id whose :func:`escape_id` form is ``value`` (for ids read back from key names)."""
    return value.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


def glob_escape(text: str) -> str:
    """``text`` with the SCAN MATCH glob characters (``* ? [ ] \\``) escaped."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


# What follows a client's base (:meth:`Keys.client`) in the name of each of its keys.
_SUBS, _OWNER, _SESSION = ":subs", ":owner", ":session"
_ALIAS_MAX, _TOPICS = ":alias:max", ":topics"


def _alias(namespace: str) -> str:
    return f":alias:{namespace}"


# What follows a channel's base (:meth:`Keys.channel`) in the name of each of its keys.
_CLOCK, _EPOCH, _BODIES, _WAKE, _BYTES = ":clock", ":epoch", ":m:", ":wake", ":bytes"


class ChannelKeys(NamedTuple):
    """The fixed keys of one channel (:meth:`Keys.channel_keys`): its base, clock, epoch,
    the base of its body keys, its wake-up channel, and its byte count."""

    base: str
    clock: str
    epoch: str
    bodies: str
    wakeup: str
    bytes: str


class Keys:
    """Key names under one namespace prefix (default ``rt``)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        check_id(prefix, "namespace prefix")
        if "{" in prefix or "}" in prefix:
            raise InvalidIdError("a namespace prefix must not contain '{' or '}'")
        self.prefix = prefix

    def _tag(self, kind: str, value: str, what: str) -> str:
        return f"{self.prefix}:{{{kind}:{escape_id(check_id(value, what))}}}"

    # -- clients ---------------------------------------------------------------------

    def client(self, client_id: str) -> str:
        """The base of a client's keys (``rt:{c:ID}``); scripts append fixed suffixes."""
        return self._tag("c", client_id, "client id")

    def client_subscriptions(self, client_id: str) -> str:
        return self.client(client_id) + _SUBS

    def client_aliases(self, client_id: str, namespace: str) -> str:
        return self.client(client_id) + _alias(namespace)

    def client_alias_topics(self, client_id: str, namespace: str) -> str:
        """The reverse (topic -> alias) hash of one alias namespace."""
        return self.client(client_id) + _alias(namespace) + _TOPICS

    def client_alias_maximum(self, client_id: str) -> str:
        return self.client(client_id) + _ALIAS_MAX

    def client_owner(self, client_id: str) -> str:
        return self.client(client_id) + _OWNER

    def client_session(self, client_id: str) -> str:
        return self.client(client_id) + _SESSION

    def client_keys(self, client_id: str) -> list[str]:
        """Every key of the client, in the order the client scripts take them: its
        subscriptions, its owner, each alias namespace's hash and reverse hash, its
        alias maximum, its session (the id checked and escaped once for all of them)."""
        base = self.client(client_id)
        aliases = [base + _alias(n) + tail for n in NAMESPACES for tail in ("", _TOPICS)]
        return [base + _SUBS, base + _OWNER, *aliases, base + _ALIAS_MAX, base + _SESSION]

    def client_queue(self, client_id: str) -> str:
        """The name of the channel (see :mod:`router.state.channels`) that queues a
        persistent session's messages while its client is away."""
        return "session:" + check_id(client_id, "client id")

    # -- nodes -----------------------------------------------------------------------

    def node(self, node_id: str) -> str:
        """The base of a node's keys (``rt:{n:ID}``)."""
        return self._tag("n", node_id, "node id")

    def node_routes(self, node_id: str) -> str:
        return self.node(node_id) + ":routes"

    def node_stream(self, node_id: str) -> str:
        return self.node(node_id) + ":stream"

    def node_meta(self, node_id: str) -> str:
        return self.node(node_id) + ":meta"

    def node_route_acks(self, node_id: str) -> str:
        """The hash of how far each reader's route mirror holds the node's route set
        (see :mod:`router.state.route_acks`)."""
        return self.node(node_id) + ":route-acks"

    def node_adoption(self, node_id: str) -> str:
        """The lease of the live node that adopts a dead node's sessions before it
        purges the node (see :meth:`router.state.node_registry.NodeRegistry.lease_adoption`)."""
        return self.node(node_id) + ":adoption"

    def registry(self) -> str:
        """The hash of registered nodes (one key, its own slot)."""
        return f"{self.prefix}:{{nodes}}:registry"

    def registry_heartbeats(self) -> str:
        """The sorted set of registered nodes scored by heartbeat expiry (server ms)."""
        return f"{self.prefix}:{{nodes}}:heartbeats"

    def registry_retired(self) -> str:
        """The hash of registered nodes that left gracefully, node id -> the incarnation
        that retired (see :meth:`router.state.node_registry.NodeRegistry.retire`)."""
        return f"{self.prefix}:{{nodes}}:retired"

    def node_figures(self, node_id: str) -> str:
        """A node's live figures for ``$SYS`` (see :mod:`router.state.node_figures`)."""
        return self.node(node_id) + ":figures"

    def node_telemetry(self, node_id: str) -> str:
        """A node's health figures for the dashboard (see :mod:`router.state.node_history`)."""
        return self.node(node_id) + ":telemetry"

    def node_history(self, node_id: str) -> str:
        """A node's last hour of traffic samples (see :mod:`router.state.node_history`)."""
        return self.node(node_id) + ":history"

    def node_clients(self, node_id: str) -> str:
        """A node's figures of each client it holds (see :mod:`router.state.client_figures`)."""
        return self.node(node_id) + ":clients"

    def node_drops(self, node_id: str) -> str:
        """A node's drops by reason and its slowest clients (see
        :mod:`router.state.client_figures`)."""
        return self.node(node_id) + ":drops"

    def telemetry_seen(self) -> str:
        """The nodes that wrote telemetry lately, scored by when (Unix seconds)."""
        return f"{self.prefix}:{{telemetry}}:seen"

    # -- the cluster's events --------------------------------------------------------

    def events_log(self) -> str:
        """The cluster's events, a stream (see :mod:`router.state.event_log`)."""
        return f"{self.prefix}:{{events}}:log"

    def event_once(self, token: str) -> str:
        """The mark that an event told once was told (``token`` any text: its bytes go
        after the tag, never inside it)."""
        return f"{self.prefix}:{{events}}:once:{token}"

    # -- traces ----------------------------------------------------------------------

    def trace_specs(self) -> str:
        """The traces in force (see :mod:`router.state.trace_store`)."""
        return f"{self.prefix}:{{traces}}:specs"

    def trace_records(self, trace_id: str) -> str:
        """What the nodes saw of one trace, a stream (its own slot)."""
        return f"{self.prefix}:{{trace:{escape_id(trace_id)}}}:records"

    # -- the dashboard's accounts ----------------------------------------------------

    def console_users(self) -> str:
        """The dashboard's users (see :mod:`router.state.console_store`)."""
        return f"{self.prefix}:{{console}}:users"

    def console_api_keys(self) -> str:
        """The dashboard's API keys (see :mod:`router.state.console_store`)."""
        return f"{self.prefix}:{{console}}:keys"

    def console_login(self, token_digest: str) -> str:
        """One login session of the dashboard, by the digest of its cookie's token."""
        return f"{self.prefix}:{{console}}:login:{token_digest}"

    def console_login_attempts(self, kind: str, subject: str) -> str:
        """The recent login attempts of one user (``kind`` ``user``, ``subject`` a digest
        of the name) or one source address (``address``, the address), a sorted set
        (see :mod:`router.state.login_attempts`)."""
        return f"{self.prefix}:{{console}}:attempts:{kind}:{subject}"

    # -- channels --------------------------------------------------------------------

    def channel(self, name: str) -> str:
        """The base of a channel's keys (``rt:{ch:ID}``)."""
        return self._tag("ch", name, "channel name")

    def channel_keys(self, name: str) -> ChannelKeys:
        """Every fixed key of a channel (the name checked and escaped once for all)."""
        base = self.channel(name)
        return ChannelKeys(
            base, base + _CLOCK, base + _EPOCH, base + _BODIES, base + _WAKE, base + _BYTES
        )

    def channel_bytes(self, name: str) -> str:
        """The bytes a channel's stored messages hold, where its owner counts them (a
        session's queue: :class:`~router.state.session_queue.SessionQueue`)."""
        return self.channel(name) + _BYTES

    def channel_clock(self, name: str) -> str:
        return self.channel(name) + _CLOCK

    def channel_wakeup(self, name: str) -> str:
        """The pub/sub channel that announces new messages (a hint, never a log)."""
        return self.channel(name) + _WAKE

    def channel_epoch(self, name: str) -> str:
        """A token that is new whenever the channel is made anew (FLUSHALL, data loss)."""
        return self.channel(name) + _EPOCH

    def channel_cursor(self, name: str, subscriber: str) -> str:
        """A subscriber's cursor: the last clock it acknowledged.

        The subscriber id follows the tag, so it needs no escaping: it cannot move the key
        to another slot, and ``:sub:`` keeps it apart from the channel's other keys.
        """
        return f"{self.channel(name)}:sub:{check_id(subscriber, 'subscriber id')}"

    def channel_bodies(self, name: str) -> str:
        """The base of the per-clock body keys: the body stored at clock C is base + str(C).

        Only the publish and fetch scripts know which clocks they touch, so they derive the
        body keys from this base (declared in their KEYS, same hash tag).
        """
        return self.channel(name) + _BODIES

    def channel_body(self, name: str, clock: int) -> str:
        """The key of the body stored at ``clock`` (what the scripts derive)."""
        return self.channel_bodies(name) + str(clock)

    def channel_dedup(self, name: str, message_ids: Iterable[str]) -> list[str]:
        """The dedup keys (message id -> clock) of a batch of message ids, in order."""
        base = self.channel(name) + ":id:"
        return [base + check_id(message_id, "message id") for message_id in message_ids]

    # -- retained messages -------------------------------------------------------------

    def retained_shard(self, first_level: str) -> str:
        """The base of one retained shard's keys (``rt:{r:LEVEL}``): the topics whose first
        level is ``first_level`` (which may be empty: topic ``/a`` has the first level '')."""
        return f"{self.prefix}:{{r:{escape_id(first_level)}}}"

    def retained_shard_keys(self, first_level: str) -> list[str]:
        """A shard's topics zset, messages hash and expiry zset, in the scripts' KEYS order."""
        base = self.retained_shard(first_level)
        return [base + ":topics", base + ":messages", base + ":expiry"]

    def retained_registry_keys(self) -> list[str]:
        """The shard registry: shards zset, counts hash and total, in the scripts' KEYS order."""
        base = f"{self.prefix}:{{retained}}"
        return [base + ":shards", base + ":counts", base + ":total"]

    def retained_bytes(self) -> str:
        """The bytes the retained messages hold, every shard together (a counter)."""
        return f"{self.prefix}:{{retained}}:bytes"

    # -- cluster -----------------------------------------------------------------------

    def route_hints(self) -> str:
        """The pub/sub channel (not a key) where nodes announce route changes: a hint."""
        return f"{self.prefix}:route-hints"

    def route_fences(self) -> str:
        """The pub/sub channel (not a key) where a node asks its peers to settle the
        subscriptions they have read, and they answer (:mod:`router.state.route_fence_channel`)."""
        return f"{self.prefix}:route-fences"

    def node_departures(self) -> str:
        """The pub/sub channel (not a key) where a node that retired tells its peers to
        adopt its sessions now (see :mod:`router.cluster.membership`)."""
        return f"{self.prefix}:node-departures"

    def route_acks_channel(self, node_id: str) -> str:
        """The pub/sub channel (not a key) where readers tell a node how far they hold
        its route set."""
        return self.node(node_id) + ":route-acks"

    def inbox(self, node_id: str) -> str:
        """The *channel name* of a node's inbox (a channel-clock channel)."""
        return "inbox:" + check_id(node_id, "node id")

    def pattern(self) -> str:
        """A SCAN MATCH pattern for every key of this namespace."""
        return f"{self.prefix}:*"

    # -- scanning (operator tools read state back from key names) ---------------------

    def node_keys_pattern(self) -> str:
        """A SCAN MATCH pattern for every key of every node's route set."""
        return f"{glob_escape(self.prefix)}:{{n:*}}:*"

    def client_owners_pattern(self) -> str:
        """A SCAN MATCH pattern for every client's session-owner key."""
        return f"{glob_escape(self.prefix)}:{{c:*}}:owner"

    def client_subscriptions_pattern(self) -> str:
        """A SCAN MATCH pattern for every client's subscriptions hash."""
        return f"{glob_escape(self.prefix)}:{{c:*}}:subs"

    def client_sessions_pattern(self) -> str:
        """A SCAN MATCH pattern for every client's session hash."""
        return f"{glob_escape(self.prefix)}:{{c:*}}:session"

    def channel_clocks_pattern(self) -> str:
        """A SCAN MATCH pattern for every channel's clock key."""
        return f"{glob_escape(self.prefix)}:{{ch:*}}:clock"

    def channel_cursors_pattern(self, name: str) -> str:
        """A SCAN MATCH pattern for the subscriber cursors of one channel."""
        return glob_escape(self.channel(name) + ":sub:") + "*"

    def _tagged_id(self, key: str, kind: str, suffixes: tuple[str, ...]) -> str | None:
        head = f"{self.prefix}:{{{kind}:"
        if not key.startswith(head):
            return None
        escaped, close, rest = key[len(head) :].partition("}")
        if not close or not escaped or rest not in suffixes:
            return None
        return unescape_id(escaped)

    def node_of_key(self, key: str) -> str | None:
        """The node id of a route-set key (routes, stream or meta), or None for other keys."""
        return self._tagged_id(key, "n", (":routes", ":stream", ":meta"))

    def client_of_owner_key(self, key: str) -> str | None:
        """The client id of a session-owner key, or None for other keys."""
        return self._tagged_id(key, "c", (":owner",))

    def client_of_subscriptions_key(self, key: str) -> str | None:
        """The client id of a subscriptions hash key, or None for other keys."""
        return self._tagged_id(key, "c", (":subs",))

    def client_of_session_key(self, key: str) -> str | None:
        """The client id of a session hash key, or None for other keys."""
        return self._tagged_id(key, "c", (":session",))

    def channel_of_clock_key(self, key: str) -> str | None:
        """The channel name of a channel clock key, or None for other keys."""
        return self._tagged_id(key, "ch", (":clock",))

    def subscriber_of_cursor_key(self, name: str, key: str) -> str | None:
        """The subscriber id of one of channel ``name``'s cursor keys, or None."""
        head = self.channel(name) + ":sub:"
        if not key.startswith(head) or len(key) == len(head):
            return None
        return key[len(head) :]
