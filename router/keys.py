"""Every Redis key name the router uses, built in this one module.

Layout (``rt`` is the default namespace prefix; ``ID`` is an escaped id, see below)::

    rt:{c:ID}:subs            hash   filter -> packed options          (client)
    rt:{c:ID}:alias:client    hash   alias -> topic, inbound aliases   (client)
    rt:{c:ID}:alias:server    hash   alias -> topic, outbound aliases  (client)
    rt:{c:ID}:owner           hash   node, epoch: the session owner    (client)
    rt:{n:ID}:routes          hash   route -> member count             (node)
    rt:{n:ID}:stream          stream route changes, one entry a change (node)
    rt:{n:ID}:meta            hash   incarnation, version, ...         (node)
    rt:{nodes}:registry       hash   node id -> incarnation            (registry)
    rt:{ch:ID}:...            keys of one channel (clock, cursors, bodies, dedup ids)

Every key carries the hash tag of the entity it belongs to, so all keys of one client,
one node or one channel live in one Redis Cluster slot and one Lua script may touch them
together. Ids come from users (MQTT client ids can hold any text), so inside a tag they are
escaped: ``%`` ``{`` ``}`` become ``%25`` ``%7B`` ``%7D``. The escaped id holds no ``}``,
so no id can end its tag early or move its keys to another slot, and the escaping is
one-to-one, so two ids never share a key. Entity kinds have distinct tag prefixes
(``c:``, ``n:``, ``ch:``), so a client never shares a key with a node or a channel.
"""

from __future__ import annotations

from typing import Final

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
    return value.translate(_ESCAPES)


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
        return self.client(client_id) + ":subs"

    def client_aliases(self, client_id: str, namespace: str) -> str:
        return f"{self.client(client_id)}:alias:{namespace}"

    def client_owner(self, client_id: str) -> str:
        return self.client(client_id) + ":owner"

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

    def registry(self) -> str:
        """The hash of registered nodes (one key, its own slot)."""
        return f"{self.prefix}:{{nodes}}:registry"

    # -- channels --------------------------------------------------------------------

    def channel(self, name: str) -> str:
        """The base of a channel's keys (``rt:{ch:ID}``)."""
        return self._tag("ch", name, "channel name")

    def channel_clock(self, name: str) -> str:
        return self.channel(name) + ":clock"

    def channel_wakeup(self, name: str) -> str:
        """The pub/sub channel that announces new messages (a hint, never a log)."""
        return self.channel(name) + ":wake"

    def pattern(self) -> str:
        """A SCAN MATCH pattern for every key of this namespace."""
        return f"{self.prefix}:*"
