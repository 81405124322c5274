"""Persistent MQTT sessions in Redis: each session's description and its offline queue.

A session outlives its connection when the client asks for a Session Expiry Interval
(MQTT 5) or connects with clean session 0 (3.1.1). What lives in Redis, all under the
client's hash tag except the queue (see :mod:`router.state.keys`)::

    rt:{c:ID}:session   hash   node, connected (1/0), since (server ms), expiry (s),
                               protocol, keepalive, username, qos2 (inbound QoS 2 ids)
    rt:{ch:session:ID}  channel  the session's queue (see router.state.channels)

:meth:`SessionStore.mark_open` and :meth:`SessionStore.mark_away` are one fenced script
each (``session_mark.lua``): only the claim's owner may write, and *away* makes every key
of the client expire after the Session Expiry Interval, on Redis server time. So a
session whose node died still ends on time; *open* makes them persist again.

The queue is a channel with one subscriber (``session``): :class:`SessionQueue` appends
deliveries in order (QoS 1/2 messages for an away client, and what a node held for the
client when it let the session go), bounded by ``limit`` with the node's overflow policy,
and by ``max_bytes`` in bytes, counted beside the queue (``rt:{ch:session:ID}:bytes``:
every append adds what it stored, every drain and trim takes away what it removed), and a
reader drains them (fetch, then ack and delete what was read). A *handoff marker*
(a message with id ``handoff:EPOCH`` whose content lists the inbound QoS 2 packet
ids still awaiting PUBREL) ends what the node that served the session
before wrote for the claim of that epoch: the new owner drains until it sees it. A
marker that says ``;tail`` after the ids is followed by the copies that node gathered
in its grace after the move, up to the *tail end* marker ``handoff-end:EPOCH``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from itertools import count, takewhile
from typing import Any, Final, Literal, NamedTuple

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.core.messages import Delivery, MessageProperties
from router.core.options import SubscriptionOptions
from router.errors import CorruptStateError, InvalidIdError, MalformedMessageError, RouterError
from router.state.channels import Channel, ChannelMessage, FetchedMessage, Published
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import command, commands_each, read_each
from router.state.scan import SCAN_COUNT, scan_pages
from router.state.scripts import RedisClient, Scripts
from router.state.subscriptions import Owner, SubscriptionStore, _owner_args, unpack_filters

#: The Session Expiry Interval that means "never" (MQTT 5, 3.3.2.3.2).
NEVER: Final = 0xFFFFFFFF
#: The one subscriber of a session queue.
READER: Final = "session"
HANDOFF: Final = "handoff:"
HANDOFF_END: Final = "handoff-end:"
#: Seconds a queue keeps its messages when the session never expires (ten years).
NEVER_TTL: Final = 10 * 365 * 24 * 3600

Overflow = Literal["drop_oldest", "drop_newest"]


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


# -- the queue -------------------------------------------------------------------------


def pack_delivery(delivery: Delivery) -> bytes:
    """One queued delivery as bytes (read back by :func:`unpack_delivery`)."""
    properties = delivery.properties
    packed: bytes = msgpack.packb(
        [
            delivery.topic,
            delivery.payload,
            delivery.qos,
            delivery.retain,
            delivery.message_id,
            delivery.publisher,
            list(delivery.subscription_ids),
            None if properties is None else properties.as_row(),
            delivery.expires_at,
            delivery.packet_id,
            delivery.released,
            delivery.expiry_interval,
        ],
        use_bin_type=True,
    )
    return packed


def unpack_delivery(data: bytes) -> Delivery:
    """The delivery :func:`pack_delivery` packed; :class:`MalformedMessageError` else."""
    try:
        row = msgpack.unpackb(data, raw=False)
        (topic, payload, qos, retain, message_id, publisher, ids, props) = row[:8]
        expires_at, packet_id, released, interval = row[8:12]
        return Delivery(
            str(topic),
            bytes(payload),
            int(qos),
            bool(retain),
            bytes(message_id),
            None if publisher is None else str(publisher),
            tuple(int(i) for i in ids),
            expiry_interval=None if interval is None else int(interval),
            properties=None if props is None else MessageProperties.from_row(props),
            expires_at=None if expires_at is None else float(expires_at),
            packet_id=None if packet_id is None else int(packet_id),
            released=bool(released),
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise MalformedMessageError(f"not a queued delivery: {exc}") from None


@dataclass(frozen=True)
class Handoff:
    """A handoff marker: the claim's epoch, the inbound QoS 2 packet ids whose PUBREL
    had not come when the previous node let the session go, and whether a tail follows
    (up to the tail end marker of the epoch)."""

    epoch: int
    awaiting_release: tuple[int, ...]
    tail: bool = False


@dataclass(frozen=True)
class Drained:
    """What one :meth:`SessionQueue.drain` read: the deliveries in order, the handoff
    markers among them, the epochs of the tail end markers, and whether more wait."""

    deliveries: list[Delivery]
    handoffs: list[Handoff]
    more: bool
    tail_ends: tuple[int, ...] = ()


_serial = count()


def _stored_bytes(messages: Sequence[ChannelMessage], published: Sequence[Published]) -> int:
    """The bytes of ``messages`` a publish stored (a duplicate stores nothing)."""
    duplicates = {p.id for p in published if p.duplicate}
    return sum(len(m.content) for m in messages if m.id not in duplicates)


def _fitting(messages: list[ChannelMessage], max_bytes: int, held: int) -> list[ChannelMessage]:
    """The first of ``messages`` that fit in ``max_bytes`` beside ``held`` bytes (into
    an empty queue, one always fits)."""
    fitting: list[ChannelMessage] = []
    for message in messages:
        size = len(message.content)
        if held + size > max_bytes and (held or fitting):
            break
        fitting.append(message)
        held += size
    return fitting


def _queued(delivery: Delivery) -> ChannelMessage:
    """``delivery`` as a queue message, under an id of its own."""
    return ChannelMessage(f"{delivery.message_id.hex()}.{next(_serial)}", pack_delivery(delivery))


class SessionQueue:
    """The offline queue of one session (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys, client_id: str, expiry: int) -> None:
        ttl = NEVER_TTL if expiry >= NEVER else max(expiry, 1)
        self.client_id = check_id(client_id, "client id")
        self.channel = Channel(redis, keys.client_queue(client_id), ttl, keys)
        self._redis = redis
        self._keys = keys
        # What bounds the backlog without reading it: the reader's cursor when last read
        # (reads only move it on) and the clock after this object's last append.
        self._cursor: int | None = None
        self._clock: int | None = None
        self._bytes_key = self.channel.key_set.bytes
        self._bytes = 0  # the count after this object's last change of it

    async def reset(self) -> None:
        """Forget every queued message (a clean start, or a new session)."""
        self._cursor = None
        await self.channel.remove_subscriber(READER)
        with translating:
            await command(self._redis, "DEL", self._bytes_key)
        await self.channel.add_subscriber(READER)

    async def queued_bytes(self) -> int:
        """The bytes the queued messages hold (packed, markers included)."""
        with translating:
            return max(int(await command(self._redis, "GET", self._bytes_key) or 0), 0)

    def _counting(self, change: int) -> list[tuple[Any, ...]]:
        """The commands that add ``change`` bytes to the count, which lives as long as
        the queue's messages."""
        return [("INCRBY", self._bytes_key, change), ("EXPIRE", self._bytes_key, self.channel.ttl)]

    async def _count(self, change: int) -> None:
        if change:
            [[total, _]] = await commands_each(self._redis, [self._counting(change)])
            self._bytes = int(total)

    async def ensure(self) -> None:
        """Create the queue's reader if it is missing (keeps what is queued)."""
        self._cursor = None  # (made anew, the channel's clock starts again)
        await self.channel.add_subscriber(READER)

    async def backlog(self) -> int:
        """How many messages wait (markers included)."""
        position = await self.channel.position(READER)
        if position is None:
            self._cursor = None
            return 0
        self._clock, self._cursor = position
        return max(self._clock - self._cursor, 0)

    def _surely_within(self, limit: int) -> bool:
        """Whether at most ``limit`` messages wait, known without a read right after an
        append: the clock it reached less the cursor last read is an upper bound while
        the channel lives (its reader only moves the cursor on)."""
        if self._cursor is None or self._clock is None:
            return False
        return 0 <= self._clock - self._cursor <= limit

    async def append(
        self,
        deliveries: Sequence[Delivery],
        limit: int,
        overflow: Overflow,
        max_bytes: int = 0,
    ) -> tuple[int, int]:
        """Queue ``deliveries`` in order, keeping at most ``limit`` waiting and, unless
        ``max_bytes`` is 0, at most that many bytes (one message always fits): with
        ``drop_newest`` the ones that do not fit are refused, with ``drop_oldest`` the
        oldest waiting ones make room. Returns (stored, dropped)."""
        if not deliveries:
            return 0, 0
        dropped = 0
        messages = [_queued(d) for d in deliveries]
        if overflow == "drop_newest":  # (another writer may have appended since)
            room = max(limit - await self.backlog(), 0)
            dropped = max(len(messages) - room, 0)
            messages = messages[:room]
            if max_bytes:
                fitting = _fitting(messages, max_bytes, await self.queued_bytes())
                dropped += len(messages) - len(fitting)
                messages = fitting
        stored = await self._publish(messages)
        await self._count(stored)
        if overflow == "drop_oldest":
            if not self._surely_within(limit):
                dropped += await self._trim(limit)
            if max_bytes and stored and self._bytes > max_bytes:  # (the count just read)
                dropped += await self._trim_bytes(max_bytes)
        return len(messages), dropped

    @staticmethod
    async def ensure_each(queues: Sequence[SessionQueue]) -> None:
        """:meth:`ensure` each of ``queues`` (of one Redis client) and learn where its
        reader stands: two pipelined steps on a standalone server, whatever their number.
        Raises the first refusal, or the :class:`StateFailureError` that stopped a step."""
        channels = [queue.channel for queue in queues]
        await Channel.add_subscribers(channels, READER)
        for queue, position in zip(queues, await Channel.positions(channels, READER), strict=True):
            queue._clock, queue._cursor = position if position is not None else (None, None)

    @staticmethod
    async def append_each(
        batches: Sequence[tuple[SessionQueue, Sequence[Delivery]]],
        limit: int,
        overflow: Overflow,
        max_bytes: int = 0,
    ) -> list[tuple[int, int] | RouterError]:
        """:meth:`append` each (queue, deliveries) of ``batches``: with ``drop_oldest`` in
        one pipelined step (and one for their byte counts), then a trim where a queue may
        have passed ``limit`` or ``max_bytes``. Returns (stored, dropped) of each, or the
        refusal it met; raises the :class:`StateFailureError` that stopped a step (some
        may have stored theirs)."""
        if overflow == "drop_newest":  # (each reads its room first)
            return [
                await queue.append(deliveries, limit, overflow, max_bytes)
                for queue, deliveries in batches
            ]
        messages = [[_queued(d) for d in deliveries] for _, deliveries in batches]
        published = await Channel.publish_each(
            [(queue.channel, batch) for (queue, _), batch in zip(batches, messages, strict=True)]
        )
        grown: list[tuple[SessionQueue, int]] = []  # (each queue's count is read anew)
        results: list[tuple[int, int] | RouterError] = []
        for (queue, _), batch, outcome in zip(batches, messages, published, strict=True):
            if not isinstance(outcome, RouterError):
                queue._learn_clock(outcome)
                grown.append((queue, _stored_bytes(batch, outcome)))
        counted = [(queue, change) for queue, change in grown if change]
        if counted:
            redis = counted[0][0]._redis
            totals = await commands_each(redis, [q._counting(change) for q, change in counted])
            for (queue, _), (total, _) in zip(counted, totals, strict=True):
                queue._bytes = int(total)
        for (queue, _), batch, outcome in zip(batches, messages, published, strict=True):
            if isinstance(outcome, RouterError):
                results.append(outcome)
                continue
            dropped = 0 if queue._surely_within(limit) else await queue._trim(limit)
            if max_bytes and _stored_bytes(batch, outcome) and queue._bytes > max_bytes:
                dropped += await queue._trim_bytes(max_bytes)
            results.append((len(batch), dropped))
        return results

    def _learn_clock(self, published: list[Published]) -> None:
        stored = [p.clock for p in published if not p.duplicate]
        if stored:
            self._clock = stored[-1]

    async def _publish(self, messages: list[ChannelMessage]) -> int:
        """Publish ``messages``; returns the bytes stored (duplicates store nothing)."""
        published = await self.channel.publish(messages)
        self._learn_clock(published)
        return _stored_bytes(messages, published)

    async def _trim(self, limit: int) -> int:
        """Drop the oldest waiting messages beyond ``limit``, but never a marker nor what
        waits behind one: a moved session's new owner reads up to its marker, and the
        queue may hold more than ``limit`` until it has. Returns how many were dropped."""
        excess = await self.backlog() - limit
        if excess <= 0:
            return 0
        result = await self.channel.fetch(READER, max=min(excess, 10_000))
        dropped = list(
            takewhile(lambda m: not m.id.startswith((HANDOFF, HANDOFF_END)), result.messages)
        )
        handle = result.ack_handle
        if len(dropped) < len(result.messages):
            handle = self.channel.handle(READER, dropped[-1].clock) if dropped else None
        if handle is not None:
            await self.channel.ack(READER, handle)
            await self._discard(dropped)
        return len(dropped)

    async def _trim_bytes(self, max_bytes: int) -> int:
        """Drop the oldest waiting messages until the queue holds at most ``max_bytes``,
        but never a marker nor what waits behind one, and never the newest message (one
        always fits). Returns how many were dropped."""
        excess = self._bytes - max_bytes
        waiting = await self.backlog()
        if excess <= 0 or waiting <= 1:
            return 0
        result = await self.channel.fetch(READER, max=min(waiting - 1, 10_000))
        dropped: list[FetchedMessage] = []
        for message in result.messages:
            if excess <= 0 or message.id.startswith((HANDOFF, HANDOFF_END)):
                break
            dropped.append(message)
            excess -= len(message.content)
        if dropped:
            await self.channel.ack(READER, self.channel.handle(READER, dropped[-1].clock))
            await self._discard(dropped)
        return len(dropped)

    async def mark_handoff(
        self, epoch: int, awaiting_release: Sequence[int] = (), *, tail: bool = False
    ) -> None:
        """Append the handoff marker for the claim of ``epoch`` (see the module docstring);
        with ``tail``, it says that a tail follows, ended by :meth:`mark_tail_end`."""
        content = ",".join(str(packet_id) for packet_id in awaiting_release).encode()
        if tail:
            content += b";tail"
        await self._count(await self._publish([ChannelMessage(f"{HANDOFF}{epoch}", content)]))

    async def mark_tail_end(self, epoch: int) -> None:
        """Append the tail end marker for the claim of ``epoch``."""
        await self._count(await self._publish([ChannelMessage(f"{HANDOFF_END}{epoch}", b"")]))

    async def handed_off(self, epoch: int) -> bool:
        """Whether the handoff marker of ``epoch`` was appended (read or not): one key
        read, the marker's dedup entry, which lives as long as the queue's messages."""
        [key] = self._keys.channel_dedup(self.channel.name, [f"{HANDOFF}{epoch}"])
        with translating:
            return bool(await self._redis.exists(key))

    async def drain(self, max: int = 1000) -> Drained:
        """Take up to ``max`` queued messages: they are acknowledged and deleted here, so
        the caller owns them now. A message that cannot be read is skipped."""
        result = await self.channel.fetch(READER, max=max)
        deliveries: list[Delivery] = []
        handoffs: list[Handoff] = []
        tail_ends: list[int] = []
        for message in result.messages:
            if message.id.startswith(HANDOFF):
                with contextlib.suppress(ValueError):
                    listed, _, flag = message.content.partition(b";")
                    ids = tuple(int(part) for part in listed.split(b",") if part)
                    epoch = int(message.id.removeprefix(HANDOFF))
                    handoffs.append(Handoff(epoch, ids, flag == b"tail"))
                continue
            if message.id.startswith(HANDOFF_END):
                with contextlib.suppress(ValueError):
                    tail_ends.append(int(message.id.removeprefix(HANDOFF_END)))
                continue
            try:
                deliveries.append(unpack_delivery(message.content))
            except MalformedMessageError:
                continue
        if result.ack_handle is not None:
            await self.channel.ack(READER, result.ack_handle)
            await self._discard(result.messages)
        return Drained(deliveries, handoffs, result.more, tuple(tail_ends))

    async def _discard(self, taken: Sequence[FetchedMessage]) -> None:
        """Delete the bodies of messages the reader acknowledged and take their bytes off
        the count, in one pipelined step."""
        if not taken:
            return
        name = self.channel.name
        bodies = [self._keys.channel_body(name, m.clock) for m in taken]
        change = -sum(len(m.content) for m in taken)
        [_, [total, _]] = await commands_each(
            self._redis, [[("DEL", *bodies)], self._counting(change)]
        )
        self._bytes = int(total)

    async def delete(self) -> None:
        """Remove the queue's reader and its byte count (its messages expire with their
        TTL)."""
        await self.channel.remove_subscriber(READER)
        with translating:
            await self._redis.delete(self._bytes_key)

    async def aclose(self) -> None:
        await self.channel.aclose()
