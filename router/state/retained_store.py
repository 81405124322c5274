"""Retained messages in Redis, shared by every node (EMQX retainer semantics, EIP-0025).

Rules (MQTT 5.0 3.3.1.3): one message per topic; storing an empty payload deletes the
topic's message; a wildcard delete removes every match; a message with an expiry
interval is invisible once it expired (Redis server time, judged inside the scripts)
even before :meth:`RetainedStore.clear_expired` removes it, and is read back with the
interval reduced by the time it was stored. A filter whose first level is ``+`` or ``#``
never matches a topic starting with ``$``. Limits: a payload above ``max_payload`` is
refused (the node still routes it), and a store holding ``max_count`` topics refuses new
topics but still replaces existing ones (0: no limit).

Layout: one *shard* per first topic level, plus a small registry of shards::

    rt:{r:sensors}:topics     zset   sensors, sensors/a/t, sensors/b/t  (scores 0: byte order)
    rt:{r:sensors}:messages   hash   topic -> msgpack [payload, qos, message id, publisher]
    rt:{r:sensors}:expiry     zset   topic -> expiry time (server ms), expiring topics only
    rt:{retained}:shards      zset   "", "$SYS", "sensors", ...  (scores 0: byte order)
    rt:{retained}:counts      hash   shard -> topics stored or reserved in it
    rt:{retained}:total       string topics stored or reserved in every shard

Why: every topic a filter can match shares the filter's first level unless that level is
a wildcard, so a filter with a literal first level touches exactly one shard (one hash
tag, one script, one slot on Redis Cluster), and inside the shard the sorted set answers
the filter's literal prefix (``sensors/a/`` for ``sensors/a/+/t``) with a ZRANGEBYLEX
range: no topic outside the prefix is ever read (:attr:`RetainedBatch.examined` counts
what was). A filter starting with a wildcard visits the registered shards in order (``$``
shards skipped), each by its own prefix. Memory stays bounded: a script looks at most at
``SCAN_BUDGET`` topics and a call returns at most ``limit`` messages with a cursor.
:meth:`~RetainedStore.size` reads one counter; :meth:`~RetainedStore.page` skips whole
shards by their registry counts (one script over the shards before the page, no topic
read: its cost grows with first levels, never with topics) and reads only the topics it
returns. Shards spread over the masters of a cluster by first level; a
single huge first level stays on one master (the price of one-slot prefix ranges).

Registry counts: a new topic first *reserves* room in the registry (refused when the store
is full), then is created in its shard; deletions give the room back. The two steps are
separate scripts (different slots), so a process that dies between them leaves a count one
too high (never too low): the store never loses sight of a shard that holds topics, and at
worst looks a little fuller. ``size`` counts stored messages, expired ones included until
they are cleared, as EMQX does; so does the ``max_count`` limit.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Final

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.core.messages import MessageProperties
from router.core.topics import (
    MULTI_LEVEL,
    SINGLE_LEVEL,
    TopicFilter,
    TopicName,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import (
    CorruptStateError,
    InvalidSettingError,
    InvalidTopicError,
    RetainedArgumentError,
    RetainedPayloadTooLargeError,
    RetainedStoreFullError,
)
from router.state.keys import Keys
from router.state.scripts import RedisClient, Scripts

SCAN_BUDGET: Final = 1000  # topics one script call looks at, at most
SHARD_BATCH: Final = 100  # shards read from the registry at once
MAX_LIMIT: Final = 10_000  # messages one call returns, at most
MAX_POSITION: Final = 10**15 - 1  # the last position a page may start at (Lua: 15 digits)
MAX_EXPIRY_INTERVAL: Final = 2**32 - 1  # seconds: MQTT's four-byte integer


@dataclass(frozen=True, slots=True)
class RetainedConfig:
    """Limits of the store and how often a node clears expired messages.

    ``max_payload`` bytes (0: no limit), ``max_count`` topics (0: no limit; by default
    100,000, so that clients cannot grow the shared store without end),
    ``clear_interval`` seconds between a node's clearing runs (0: never).
    """

    max_payload: int = 0
    max_count: int = 100_000
    clear_interval: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_payload", "max_count"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise InvalidSettingError(f"{name} must be an int >= 0, not {value!r}")
        interval = self.clear_interval
        if not isinstance(interval, int | float) or not 0 <= interval < math.inf:
            raise InvalidSettingError(f"clear_interval must be seconds >= 0, not {interval!r}")


DEFAULT_RETAINED: Final = RetainedConfig()


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """A retained message as read back: ``expiry_interval`` is the seconds it has left
    (rounded up), None when it never expires; ``properties`` are its MQTT 5 properties."""

    topic: str
    payload: bytes
    qos: int = 0
    message_id: bytes = b""
    publisher: str | None = None
    expiry_interval: int | None = None
    properties: MessageProperties | None = None


@dataclass(frozen=True, slots=True)
class RetainedCursor:
    """Where a match or scan goes on: in ``shard``, after topic ``after`` (None: from the
    shard's start). Opaque to callers; plain data, so it can be stored or shipped."""

    shard: str
    after: str | None = None


@dataclass(frozen=True, slots=True)
class RetainedBatch:
    """Messages of one call, the cursor for the next (None: nothing more), and how many
    stored topics the scripts looked at to find them."""

    messages: list[RetainedMessage]
    cursor: RetainedCursor | None
    examined: int


@dataclass(frozen=True, slots=True)
class RetainedPage:
    """One page of the whole store in topic order; ``has_next`` says whether more follow."""

    messages: list[RetainedMessage]
    page: int
    limit: int
    has_next: bool


@dataclass(frozen=True, slots=True)
class ExpiryRun:
    """What one :meth:`RetainedStore.clear_expired` call removed; pass ``cursor`` to the next
    call (None: the run went through every shard)."""

    removed: int
    cursor: str | None


def first_level(topic: str) -> str:
    """The first level of a topic or filter: the shard it lives in."""
    return topic.partition("/")[0]


def _plain_filter(topic_filter: str) -> TopicFilter:
    checked = validate_filter(topic_filter)
    if parse_shared(checked) is not None:
        raise InvalidTopicError(topic_filter, "retained messages are matched by plain filters")
    return checked


def _effective_filter(topic_filter: str | None, shard: str) -> str:
    """The filter as it applies inside ``shard``: its first level made literal.

    None (every topic) and ``#`` become ``shard/#``; ``+/rest`` becomes ``shard/rest``.
    """
    head, separator, rest = (topic_filter or MULTI_LEVEL).partition("/")
    if head == MULTI_LEVEL:
        return shard + "/" + MULTI_LEVEL
    if head == SINGLE_LEVEL:
        return shard + separator + rest
    return topic_filter or ""


def _scan_plan(effective: str) -> tuple[str, str]:
    """(topic to look at on its own, literal prefix of the range) for a literal-first filter.

    ``a/b`` -> (``a/b``, no range); ``a/b/#`` -> (``a/b``, ``a/b/``); ``a/+/c`` -> (no topic,
    ``a/``). Everything the filter matches is that topic or starts with that prefix.
    """
    levels = effective.split("/")
    for index, level in enumerate(levels):
        if level == MULTI_LEVEL:
            parent = "/".join(levels[:index])
            return parent, parent + "/"
        if level == SINGLE_LEVEL:
            return "", "/".join(levels[:index]) + "/"
    return effective, ""


def _check_limit(limit: int, what: str = "limit") -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise RetainedArgumentError(f"{what} must be an int in 1..{MAX_LIMIT}, not {limit!r}")
    return limit


def _text(value: Any) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored retained topic is not UTF-8: {value!r}") from None


def _pack(
    payload: bytes,
    qos: int,
    message_id: bytes,
    publisher: str | None,
    properties: MessageProperties | None,
) -> bytes:
    row = None if properties is None else properties.as_row()
    packed: bytes = msgpack.packb([payload, qos, message_id, publisher, row], use_bin_type=True)
    return packed


def _unpack(topic: str, packed: Any, left_ms: Any) -> RetainedMessage:
    try:
        payload, qos, message_id, publisher, *rest = msgpack.unpackb(bytes(packed), raw=False)
        row = rest[0] if rest else None  # (stored before properties were kept: none)
        left = int(left_ms)
        return RetainedMessage(
            topic,
            bytes(payload),
            int(qos),
            bytes(message_id),
            publisher if publisher is None else str(publisher),
            None if left < 0 else max(1, math.ceil(left / 1000)),
            None if row is None else MessageProperties.from_row(row),
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptStateError(f"a stored retained message is malformed: {exc}") from None


def _unpack_rows(rows: list[Any]) -> list[RetainedMessage]:
    return [_unpack(_text(rows[i]), rows[i + 1], rows[i + 2]) for i in range(0, len(rows), 3)]


class RetainedStore:
    """The retained messages of the whole cluster, in one Redis (or Redis Cluster)."""

    def __init__(
        self, redis: RedisClient, keys: Keys | None = None, config: RetainedConfig | None = None
    ) -> None:
        self.redis = redis
        self.keys = keys if keys is not None else Keys()
        self.config = config if config is not None else RetainedConfig()
        self._scripts = Scripts(redis)
        self._registry = self.keys.retained_registry_keys()

    # -- writing ---------------------------------------------------------------------

    async def store(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        message_id: bytes = b"",
        publisher: str | None = None,
        expiry_interval: int | None = None,
        properties: MessageProperties | None = None,
    ) -> bool:
        """Retain ``payload`` as the message of ``topic``; True when the topic is new.

        An empty payload deletes the topic's message instead (returns False).
        ``expiry_interval`` is seconds (1..2^32-1) or None for never. Raises
        :class:`InvalidTopicError`, :class:`RetainedArgumentError` or ``TypeError`` on bad
        input, :class:`RetainedPayloadTooLargeError` above ``max_payload`` and
        :class:`RetainedStoreFullError` for a new topic in a full store; nothing changes then.
        """
        checked = validate_topic(topic)
        check_retained_input(payload, qos, expiry_interval)
        if not isinstance(message_id, bytes) or not (publisher is None or type(publisher) is str):
            raise TypeError("message_id must be bytes and publisher a str or None")
        return await self.put(
            checked, payload, qos, message_id, publisher, expiry_interval, properties
        )

    async def put(
        self,
        topic: TopicName,
        payload: bytes,
        qos: int,
        message_id: bytes,
        publisher: str | None,
        expiry_interval: int | None,
        properties: MessageProperties | None = None,
    ) -> bool:
        """:meth:`store` for a publish validated where it entered (the node's publish, then
        :func:`check_retained_input`): raises only for the store's limits."""
        if not payload:
            await self._delete(topic)
            return False
        limit = self.config.max_payload
        if limit and len(payload) > limit:
            raise RetainedPayloadTooLargeError(topic, len(payload), limit)
        expiry_ms = 0 if expiry_interval is None else expiry_interval * 1000
        args = [
            topic,
            _pack(bytes(payload), qos, message_id, publisher, properties),
            str(expiry_ms),
        ]
        shard = first_level(topic)
        shard_keys = self.keys.retained_shard_keys(shard)
        # Replacing (the common case) is one call; a new topic reserves room first.
        if await self._scripts.run("retained_store", shard_keys, [*args, "0"]) == 0:
            return False
        reserved = await self._scripts.run(
            "retained_reserve", self._registry, [shard, str(self.config.max_count)]
        )
        if not reserved:
            raise RetainedStoreFullError(topic, self.config.max_count)
        created = await self._scripts.run("retained_store", shard_keys, [*args, "1"])
        if created != 1:  # another writer created it meanwhile: give the room back
            await self._release(shard, 1)
        return bool(created == 1)

    async def delete(self, topic_or_filter: str) -> int:
        """Delete the message of a topic, or of every topic a filter matches (expired ones
        too); returns how many were deleted. Raises :class:`InvalidTopicError`."""
        return await self._delete(_plain_filter(topic_or_filter))

    async def _delete(self, topic_filter: str) -> int:
        deleted = 0
        async for shard in self._shards_of(topic_filter, None):
            deleted += await self._delete_in_shard(_effective_filter(topic_filter, shard), shard)
        return deleted

    async def clean(self) -> int:
        """Delete every retained message (``$`` topics included); returns how many."""
        deleted = 0
        async for shard in self._registered(None, inclusive=False, skip_dollar=False):
            deleted += await self._delete_in_shard(_effective_filter(None, shard), shard)
        return deleted

    async def clear_expired(
        self, cursor: str | None = None, *, limit: int = 1000, max_shards: int = SHARD_BATCH
    ) -> ExpiryRun:
        """Remove expired messages: at most ``limit`` of them in at most ``max_shards``
        shards, starting at shard ``cursor`` (None: the first). Call again with the
        returned cursor to go on; it is None once the last shard was cleared."""
        if cursor is not None and (
            type(cursor) is not str or cursor.encode("utf-8", "replace").decode() != cursor
        ):  # a lone surrogate does not survive the round trip
            raise RetainedArgumentError(f"a cursor is a shard (UTF-8 text), not {cursor!r:.80}")
        _check_limit(limit)
        _check_limit(max_shards, "max_shards")
        removed = visited = 0
        shards = self._registered(cursor, inclusive=True, skip_dollar=False)
        async with aclosing(shards):
            async for shard in shards:
                if visited >= max_shards:
                    return ExpiryRun(removed, shard)
                keys = self.keys.retained_shard_keys(shard)
                gone = await self._scripts.run("retained_expire", keys, [str(limit - removed)])
                await self._release(shard, int(gone))
                removed += int(gone)
                visited += 1
                if removed >= limit:  # the shard may hold more: start there next time
                    return ExpiryRun(removed, shard)
        return ExpiryRun(removed, None)

    # -- reading ---------------------------------------------------------------------

    async def get(self, topic: str) -> RetainedMessage | None:
        """The visible retained message of ``topic``, or None."""
        validate_topic(topic)
        _, _, _, rows = await self._scan(first_level(topic), "read", topic, topic, "", "", 1)
        messages = _unpack_rows(rows)
        return messages[0] if messages else None

    async def match(
        self, topic_filter: str, cursor: RetainedCursor | None = None, *, limit: int = 100
    ) -> RetainedBatch:
        """Up to ``limit`` visible messages matching ``topic_filter`` in (shard, topic) order,
        from ``cursor`` on; pass the returned cursor to continue (None: no more).

        Raises :class:`InvalidTopicError` for an invalid or shared filter and
        :class:`RetainedArgumentError` for a bad limit or a cursor of another filter.
        """
        topic_filter = _plain_filter(topic_filter)
        return await self._walk(topic_filter, cursor, _check_limit(limit))

    def iter_match(
        self, topic_filter: str, *, batch_size: int = 100
    ) -> AsyncGenerator[RetainedMessage, None]:
        """Every visible message matching ``topic_filter``, fetched ``batch_size`` at a time.

        Raises :class:`InvalidTopicError` for an invalid or shared filter when called,
        before anything is read."""
        return self.matching(_plain_filter(topic_filter), batch_size=batch_size)

    async def matching(
        self, topic_filter: TopicFilter, *, batch_size: int = 100
    ) -> AsyncGenerator[RetainedMessage, None]:
        """:meth:`iter_match` for a plain filter validated where it entered (a subscribe)."""
        limit = _check_limit(batch_size)
        cursor = None
        while True:
            batch = await self._walk(topic_filter, cursor, limit)
            for message in batch.messages:
                yield message
            if batch.cursor is None:
                return
            cursor = batch.cursor

    async def scan(
        self, cursor: RetainedCursor | None = None, *, limit: int = 500
    ) -> RetainedBatch:
        """Up to ``limit`` visible messages of every topic (``$`` topics included) in
        (shard, topic) order, from ``cursor`` on; the returned cursor goes on (None: done)."""
        return await self._walk(None, cursor, _check_limit(limit))

    async def iter_batches(
        self, *, batch_size: int = 500
    ) -> AsyncGenerator[list[RetainedMessage], None]:
        """Every visible retained message, in lists of at most ``batch_size`` (for exports)."""
        cursor = None
        while True:
            batch = await self.scan(cursor, limit=batch_size)
            if batch.messages:
                yield batch.messages
            if batch.cursor is None:
                return
            cursor = batch.cursor

    async def page(self, page: int = 1, *, limit: int = 100) -> RetainedPage:
        """Page ``page`` (1-based) of ``limit`` positions over the whole store in (shard,
        topic) order. Expired messages not yet cleared keep their position but are not
        shown, so a page may hold fewer than ``limit`` messages."""
        _check_limit(limit)
        if type(page) is not int or page < 1:
            raise RetainedArgumentError(f"page must be an int >= 1, not {page!r}")
        position = (page - 1) * limit
        if position > MAX_POSITION:  # past every topic a store can hold
            return RetainedPage([], page, limit, False)
        found = await self._scripts.run("retained_locate", self._registry[:2], [str(position)])
        if not found:
            return RetainedPage([], page, limit, False)
        shard, position = _text(found[0]), int(found[1])
        messages: list[RetainedMessage] = []
        wanted = limit
        while True:
            keys = self.keys.retained_shard_keys(shard)
            reply = await self._scripts.run("retained_range", keys, [str(position), str(wanted)])
            size = int(reply[0])
            messages += _unpack_rows(reply[1:])
            consumed = min(wanted, max(size - position, 0))
            wanted -= consumed
            if wanted == 0 and position + consumed < size:
                return RetainedPage(messages, page, limit, True)
            following = await self._next_shard(shard, skip_dollar=False)
            if wanted == 0 or following is None:
                return RetainedPage(messages, page, limit, following is not None)
            shard, position = following, 0

    async def size(self) -> int:
        """How many messages are stored (expired ones too, until they are cleared)."""
        total = await self.redis.get(self._registry[2])
        return int(total or 0)

    # -- shards ----------------------------------------------------------------------

    async def _shards_of(
        self, topic_filter: str | None, cursor: RetainedCursor | None
    ) -> AsyncGenerator[str, None]:
        """The shards a filter may match, in order, from the cursor's shard on."""
        head = first_level(topic_filter) if topic_filter is not None else MULTI_LEVEL
        if head not in (SINGLE_LEVEL, MULTI_LEVEL):
            if cursor is not None and cursor.shard != head:
                raise RetainedArgumentError("the cursor belongs to another filter")
            yield head
            return
        start = None if cursor is None else cursor.shard
        skip_dollar = topic_filter is not None
        async for shard in self._registered(start, inclusive=True, skip_dollar=skip_dollar):
            yield shard

    async def _registered(
        self, start: str | None, *, inclusive: bool, skip_dollar: bool
    ) -> AsyncGenerator[str, None]:
        """Registered shards in byte order, from ``start`` (None: the first) on."""
        low = b"-" if start is None else (b"[" if inclusive else b"(") + start.encode()
        while True:
            batch = await self.redis.zrangebylex(
                self._registry[0], low, b"+", start=0, num=SHARD_BATCH
            )
            if not batch:
                return
            for raw in batch:
                shard = _text(raw)
                if not (skip_dollar and shard.startswith("$")):
                    yield shard
            low = b"(" + _text(batch[-1]).encode()

    async def _next_shard(self, shard: str, *, skip_dollar: bool) -> str | None:
        shards = self._registered(shard, inclusive=False, skip_dollar=skip_dollar)
        async with aclosing(shards):
            async for following in shards:
                return following
        return None

    async def _release(self, shard: str, count: int) -> None:
        if count:
            await self._scripts.run("retained_release", self._registry, [shard, str(count)])

    # -- scanning one shard ----------------------------------------------------------

    async def _scan(
        self, shard: str, mode: str, effective: str, lone: str, prefix: str, after: str, limit: int
    ) -> tuple[bool, str, int, list[Any]]:
        """One ``retained_scan`` call: (range done, last topic looked at, examined, rest)."""
        reply = await self._scripts.run(
            "retained_scan",
            self.keys.retained_shard_keys(shard),
            [mode, effective, lone, prefix, after, str(SCAN_BUDGET), str(limit)],
        )
        return bool(reply[0]), _text(reply[1]), int(reply[2]), list(reply[3:])

    def _resume(self, effective: str, after: str | None) -> tuple[str, str, str]:
        """(lone topic, prefix, range cursor) to go on in a shard after topic ``after``."""
        lone, prefix = _scan_plan(effective)
        if after is None:
            return lone, prefix, ""
        return "", prefix, after if prefix and after.startswith(prefix) else ""

    async def _delete_in_shard(self, effective: str, shard: str) -> int:
        if not effective:  # '+' in shard '': only the empty topic, which is invalid
            return 0
        deleted = 0
        after = None
        while True:
            lone, prefix, range_after = self._resume(effective, after)
            done, last, _, rest = await self._scan(
                shard, "delete", effective, lone, prefix, range_after, 1
            )
            gone = int(rest[0])
            await self._release(shard, gone)
            deleted += gone
            if done:
                return deleted
            after = last

    async def _walk(
        self, topic_filter: str | None, cursor: RetainedCursor | None, limit: int
    ) -> RetainedBatch:
        """Read matches shard by shard until ``limit`` messages or the last shard."""
        messages: list[RetainedMessage] = []
        examined = 0
        shards = self._shards_of(topic_filter, cursor)
        async with aclosing(shards):
            async for shard in shards:
                if len(messages) >= limit:
                    return RetainedBatch(messages, RetainedCursor(shard), examined)
                effective = _effective_filter(topic_filter, shard)
                if not effective:  # '+' in shard '': only the empty topic, which is invalid
                    continue
                after = cursor.after if cursor is not None and cursor.shard == shard else None
                while True:
                    lone, prefix, range_after = self._resume(effective, after)
                    done, after, seen, rows = await self._scan(
                        shard, "read", effective, lone, prefix, range_after, limit - len(messages)
                    )
                    examined += seen
                    messages += _unpack_rows(rows)
                    if done:
                        break
                    if len(messages) >= limit:
                        return RetainedBatch(messages, RetainedCursor(shard, after), examined)
        return RetainedBatch(messages, None, examined)


def check_retained_input(payload: object, qos: object, expiry_interval: object) -> None:
    """Refuse what :meth:`RetainedStore.store` cannot store, before anything changes."""
    if not isinstance(payload, bytes | bytearray):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    if type(qos) is not int or not 0 <= qos <= 2:
        raise RetainedArgumentError(f"qos must be 0, 1 or 2, not {qos!r}")
    if expiry_interval is not None and (
        type(expiry_interval) is not int or not 1 <= expiry_interval <= MAX_EXPIRY_INTERVAL
    ):
        raise RetainedArgumentError(
            f"expiry_interval must be None or 1..{MAX_EXPIRY_INTERVAL} seconds, "
            f"not {expiry_interval!r}"
        )
