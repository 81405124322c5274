"""A persistent session's offline queue in Redis (the session's description:
:mod:`router.state.session_store`).

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
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count, takewhile
from typing import Any, Final, Literal

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.core.messages import Delivery, MessageProperties
from router.errors import MalformedMessageError, RouterError
from router.state.channels import Channel, ChannelMessage, FetchedMessage, Published
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import command, commands_each
from router.state.scripts import RedisClient
from router.state.session_store import NEVER

#: The one subscriber of a session queue.
READER: Final = "session"
HANDOFF: Final = "handoff:"
HANDOFF_END: Final = "handoff-end:"
#: Seconds a queue keeps its messages when the session never expires (ten years).
NEVER_TTL: Final = 10 * 365 * 24 * 3600

Overflow = Literal["drop_oldest", "drop_newest"]


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
        reader stands: one pipelined step on a standalone server, whatever their number,
        when every reader exists (an adoption's queues: the dead node made them), three
        when some must be made. Raises the first refusal, or the
        :class:`StateFailureError` that stopped a step."""
        channels = [queue.channel for queue in queues]
        positions = await Channel.subscribed(channels, READER)  # (mostly there already)
        missing = [c for c, at in zip(channels, positions, strict=True) if at is None]
        if missing:
            await Channel.add_subscribers(missing, READER)
            made = iter(await Channel.positions(missing, READER))
            positions = [at if at is not None else next(made) for at in positions]
        for queue, position in zip(queues, positions, strict=True):
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
