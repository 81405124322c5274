"""Persistent MQTT sessions in Redis: each session's description.

A session outlives its connection when the client asks for a Session Expiry Interval
(MQTT 5) or connects with clean session 0 (3.1.1). What lives in Redis, all under the
client's hash tag except the queue (see :mod:`router.state.keys`)::

    rt:{c:ID}:session   hash   node, connected (1/0), since (server ms), expiry (s),
                               protocol, keepalive, username, qos2 (inbound QoS 2 ids)
    rt:{ch:session:ID}  channel  the session's queue (:mod:`router.state.session_queue`)

:meth:`SessionStore.mark_open` and :meth:`SessionStore.mark_away` are one fenced script
each (``session_mark.lua``): only the claim's owner may write, and *away* makes every key
of the client expire after the Session Expiry Interval, on Redis server time. So a
session whose node died still ends on time; *open* makes them persist again.
:meth:`SessionStore.adopt_many` claims a dead node's sessions and marks them away in one
script each (``session_adopt.lua``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from router.core.options import SubscriptionOptions
from router.errors import CorruptStateError, InvalidIdError, RouterError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import command, read_each
from router.state.scan import SCAN_COUNT, scan_pages
from router.state.scripts import RedisClient, Scripts
from router.state.subscriptions import Owner, SubscriptionStore, _owner_args, unpack_filters

#: The Session Expiry Interval that means "never" (MQTT 5, 3.3.2.3.2).
NEVER: Final = 0xFFFFFFFF


@dataclass(frozen=True)
class SessionInfo:
    """A session as Redis describes it: ``since`` is when it connected (``connected``)
    or went away, in server milliseconds; ``expiry`` its Session Expiry Interval in
    seconds (:data:`NEVER`: never); ``protocol`` the MQTT level (0: the embedding API)."""

    client_id: str
    node_id: str
    connected: bool
    since: int
    expiry: int
    protocol: int
    keepalive: int
    username: str | None
    awaiting_release: tuple[int, ...] = ()


class AdoptedSession(NamedTuple):
    """A session an adoption claimed (:meth:`SessionStore.adopt_many`): the adopter's new
    claim, the session as marked away, and its filters."""

    owner: Owner
    info: SessionInfo
    filters: dict[str, SubscriptionOptions]


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", "replace") if value is not None else ""


def _number(fields: dict[Any, Any], name: bytes) -> int:
    text = _text(fields.get(name)) or "0"
    if not text.lstrip("-").isdigit():
        raise CorruptStateError(f"session field {name.decode()} is not an integer: {text!r}")
    return int(text)


def _check_ints(**values: object) -> None:
    """TypeError unless every value is an int (a float or a bool would be stored as text
    that :func:`parse_session` refuses later)."""
    for name, value in values.items():
        if type(value) is not int:
            raise TypeError(f"{name} must be an int, not {value!r}")


def open_fields(
    expiry: int, protocol: int = 0, keepalive: int = 0, username: str | None = None
) -> list[str | int]:
    """The field/value pairs a connected session's hash holds (see
    :meth:`SessionStore.mark_open`); raises as it does for bad values."""
    _check_ints(expiry=expiry, protocol=protocol, keepalive=keepalive)
    if username is not None:
        if type(username) is not str:
            raise TypeError(f"username must be a str or None, not {username!r}")
        if "\x00" in username or not _utf8(username):
            raise InvalidIdError("a user name must be UTF-8 text without U+0000")
    pairs: list[str | int] = ["expiry", expiry, "protocol", protocol, "keepalive", keepalive]
    return [*pairs, "username", "\x00" if username is None else username, "qos2", ""]


def parse_session(client_id: str, fields: dict[Any, Any]) -> SessionInfo | None:
    """The :class:`SessionInfo` a session hash holds (None: no session);
    :class:`CorruptStateError` for a hash the router did not write."""
    if not fields:
        return None
    qos2 = _text(fields.get(b"qos2"))
    try:
        awaiting = tuple(int(part) for part in qos2.split(",") if part)
    except ValueError:
        raise CorruptStateError(f"session field qos2 is not a list of ids: {qos2!r}") from None
    username = fields.get(b"username")
    return SessionInfo(
        client_id,
        _text(fields.get(b"node")),
        _text(fields.get(b"connected")) == "1",
        _number(fields, b"since"),
        _number(fields, b"expiry"),
        _number(fields, b"protocol"),
        _number(fields, b"keepalive"),
        None if username is None or username == b"\x00" else _text(username),
        awaiting,
    )


class SessionStore:
    """Session descriptions of clients (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys, subscriptions: SubscriptionStore) -> None:
        self.redis = redis
        self.keys = keys
        self._subscriptions = subscriptions
        self._scripts = Scripts(redis)

    async def mark_open(
        self,
        client_id: str,
        owner: Owner,
        *,
        expiry: int,
        protocol: int = 0,
        keepalive: int = 0,
        username: str | None = None,
    ) -> int:
        """The client is connected to ``owner``'s node: describe it, and keep every key of
        the client until :meth:`mark_away`. Returns the server time (ms). Raises
        :class:`SessionOwnershipError` if ``owner`` lost the claim, :class:`InvalidIdError`
        for a user name that is not UTF-8 text without U+0000, ``TypeError`` for numbers that
        are not ints; nothing changed then."""
        pairs = open_fields(expiry, protocol, keepalive, username)
        return await self._mark(client_id, owner, "open", -1, pairs)

    async def mark_away(
        self, client_id: str, owner: Owner, *, expiry: int, awaiting_release: Iterable[int] = ()
    ) -> int:
        """The client left; the session stays for ``expiry`` seconds (:data:`NEVER`:
        always), then every key of the client expires. ``awaiting_release`` are the inbound
        QoS 2 packet ids whose PUBREL has not come. Returns the server time (ms). Raises
        like :meth:`mark_open`, and :class:`InvalidIdError` for a packet id outside 1..65535."""
        _check_ints(expiry=expiry)
        packet_ids = list(awaiting_release)
        for packet_id in packet_ids:
            _check_ints(packet_id=packet_id)
            if not 1 <= packet_id <= 0xFFFF:
                raise InvalidIdError(f"a packet id is 1..65535, not {packet_id}")
        ids = ",".join(str(packet_id) for packet_id in sorted(packet_ids))
        ms = -1 if expiry >= NEVER else expiry * 1000
        return await self._mark(client_id, owner, "away", ms, ["expiry", expiry, "qos2", ids])

    async def _mark(
        self, client_id: str, owner: Owner, mode: str, ms: int, pairs: list[str | int]
    ) -> int:
        if owner is None:
            raise TypeError("owner must be an Owner, not None")
        keys = self._subscriptions.client_keys(client_id)
        args = [*_owner_args(owner), mode, str(ms), *pairs]
        return int(await self._scripts.run("session_mark", keys, args))

    async def describe(self, client_id: str) -> SessionInfo | None:
        """The client's session, None when it has none (never had, ended, or expired)."""
        with translating:
            fields = await command(self.redis, "HGETALL", self.keys.client_session(client_id))
        return parse_session(client_id, fields)

    async def describe_many(self, client_ids: Sequence[str]) -> list[SessionInfo | None]:
        """:meth:`describe` for each client (see :func:`read_each`)."""
        session_keys = [self.keys.client_session(client_id) for client_id in client_ids]
        replies = await read_each(self.redis, "HGETALL", session_keys)
        return [parse_session(c, r) for c, r in zip(client_ids, replies, strict=True)]

    async def adopt(self, client_id: str, dead: Owner, node_id: str) -> AdoptedSession | None:
        """Adopt the persistent session that ``dead`` (a dead node's claim) holds:
        ``node_id`` claims it with a new epoch and marks it away for its Session Expiry
        Interval from now, in one script (``session_adopt.lua``). Returns what it claimed,
        or None when ``dead`` no longer holds it (the client resumed it somewhere, or it
        ended) or it is not persistent: nothing changes then. :class:`CorruptStateError`
        if a stored value is not what the router wrote."""
        [adopted] = await self.adopt_many([(client_id, dead)], node_id)
        return adopted

    async def adopt_many(
        self, sessions: Sequence[tuple[str, Owner]], node_id: str
    ) -> list[AdoptedSession | None]:
        """:meth:`adopt` for each (client id, dead claim) of ``sessions``, pipelined on a
        standalone server (see :meth:`Scripts.run_many
        <router.state.scripts.Scripts.run_many>`); raises the first refusal."""
        check_id(node_id, "node id")
        never = str(NEVER)
        calls = [
            (self._subscriptions.client_keys(client_id), [*_owner_args(dead), node_id, never])
            for client_id, dead in sessions
        ]
        replies = await self._scripts.run_many("session_adopt", calls)
        adopted: list[AdoptedSession | None] = []
        for (client_id, _), reply in zip(sessions, replies, strict=True):
            if isinstance(reply, RouterError):
                raise reply
            if not reply:
                adopted.append(None)
                continue
            epoch, session, filters = reply
            fields = {session[i]: session[i + 1] for i in range(0, len(session), 2)}
            info = parse_session(client_id, fields)
            if info is None:
                raise CorruptStateError(f"session_adopt described no session for {client_id}")
            adopted.append(
                AdoptedSession(Owner(node_id, int(epoch)), info, unpack_filters(filters))
            )
        return adopted

    async def client_id_pages(
        self, page: int = 1_000, count: int = SCAN_COUNT
    ) -> AsyncGenerator[list[str], None]:
        """Every client with a session, in pages of at most ``page`` ids (a SCAN of
        ``count`` keys a call: no limit on the total, no command that blocks Redis on a
        large keyspace)."""
        pattern = self.keys.client_sessions_pattern()
        async for keys in scan_pages(self.redis, pattern, page=page, count=count):
            ids = (self.keys.client_of_session_key(key) for key in keys)
            yield [i for i in ids if i is not None]
