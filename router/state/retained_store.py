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
    rt:{retained}:bytes       string bytes the packed messages of every shard hold

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

Registry bytes: each shard script says by how many bytes it grew or shrank the stored
messages (``HSTRLEN`` of the packed message, before and after), and the store adds that to
one counter. ``max_bytes`` is judged inside the shard's script against the room the
counter left when the writer read it, so a message that would grow the store past it is
refused while a replacement of the same size or smaller always goes; writers racing on
several nodes may pass the bound by what they store at that moment.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Final

from router.core.messages import MessageProperties
from router.core.topics import (
    MULTI_LEVEL,
    SINGLE_LEVEL,
    TopicFilter,
    TopicName,
    validate_topic,
)
from router.errors import (
    RetainedArgumentError,
    RetainedBytesFullError,
    RetainedPayloadTooLargeError,
    RetainedStoreFullError,
)
from router.state.failures import translating
from router.state.keys import Keys
from router.state.retained_values import (
    DEFAULT_RETAINED,
    ExpiryRun,
    RetainedBatch,
    RetainedConfig,
    RetainedCursor,
    RetainedMessage,
    RetainedPage,
    check_limit,
    check_retained_input,
    effective_filter,
    first_level,
    pack_message,
    plain_filter,
    scan_plan,
    topic_text,
    unpack_rows,
)
from router.state.scripts import RedisClient, Scripts

__all__ = [
    "DEFAULT_RETAINED",
    "ExpiryRun",
    "RetainedBatch",
    "RetainedConfig",
    "RetainedCursor",
    "RetainedMessage",
    "RetainedPage",
    "RetainedStore",
    "check_retained_input",
    "first_level",
]

SCAN_BUDGET: Final = 1000  # topics one script call looks at, at most
SHARD_BATCH: Final = 100  # shards read from the registry at once
MAX_POSITION: Final = 10**15 - 1  # the last position a page may start at (Lua: 15 digits)


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
        self._bytes = self.keys.retained_bytes()

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
            pack_message(bytes(payload), qos, message_id, publisher, properties),
            str(expiry_ms),
        ]
        shard = first_level(topic)
        shard_keys = self.keys.retained_shard_keys(shard)
        room = await self._room()
        # Replacing (the common case) is one call; a new topic reserves room first.
        status, growth = await self._store(shard_keys, [*args, "0", room])
        if status == 0:
            await self._grew(growth)
            return False
        if status == -2:
            raise RetainedBytesFullError(topic, self.config.max_bytes)
        reserved = await self._scripts.run(
            "retained_reserve", self._registry, [shard, str(self.config.max_count)]
        )
        if not reserved:
            raise RetainedStoreFullError(topic, self.config.max_count)
        status, growth = await self._store(shard_keys, [*args, "1", room])
        if status != 1:  # another writer created it meanwhile, or no room: give it back
            await self._release(shard, 1)
        if status == -2:
            raise RetainedBytesFullError(topic, self.config.max_bytes)
        await self._grew(growth)
        return status == 1

    async def _store(self, shard_keys: list[str], args: list[Any]) -> tuple[int, int]:
        status, growth = await self._scripts.run("retained_store", shard_keys, args)
        return int(status), int(growth)

    async def _room(self) -> str:
        """The bytes the store may still grow by, for ``retained_store`` ('' unbounded).

        Read before the store, so writers racing on several nodes may together pass the
        bound by what they store at once (each message within ``max_payload``)."""
        if not self.config.max_bytes:
            return ""
        return str(max(self.config.max_bytes - await self.stored_bytes(), 0))

    async def _grew(self, growth: int) -> None:
        """Add ``growth`` bytes (negative: freed) to the store's byte count."""
        if growth:
            with translating:
                await self.redis.incrby(self._bytes, growth)

    async def stored_bytes(self) -> int:
        """The bytes the stored messages hold in Redis (packed, with their metadata).

        Counted since this version of the store: messages stored before it are not in
        the count (and deleting them never takes it below 0). Like the topic counts, a
        process that dies between a shard's script and the count leaves it off by that
        one message's bytes."""
        with translating:
            value = await self.redis.get(self._bytes)
        return max(int(value or 0), 0)

    async def delete(self, topic_or_filter: str) -> int:
        """Delete the message of a topic, or of every topic a filter matches (expired ones
        too); returns how many were deleted. Raises :class:`InvalidTopicError`."""
        return await self._delete(plain_filter(topic_or_filter))

    async def _delete(self, topic_filter: str) -> int:
        deleted = 0
        async for shard in self._shards_of(topic_filter, None):
            deleted += await self._delete_in_shard(effective_filter(topic_filter, shard), shard)
        return deleted

    async def clean(self) -> int:
        """Delete every retained message (``$`` topics included); returns how many."""
        deleted = 0
        async for shard in self._registered(None, inclusive=False, skip_dollar=False):
            deleted += await self._delete_in_shard(effective_filter(None, shard), shard)
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
        check_limit(limit)
        check_limit(max_shards, "max_shards")
        removed = visited = 0
        shards = self._registered(cursor, inclusive=True, skip_dollar=False)
        async with aclosing(shards):
            async for shard in shards:
                if visited >= max_shards:
                    return ExpiryRun(removed, shard)
                keys = self.keys.retained_shard_keys(shard)
                reply = await self._scripts.run("retained_expire", keys, [str(limit - removed)])
                gone, freed = int(reply[0]), int(reply[1])
                await self._release(shard, gone)
                await self._grew(-freed)
                removed += gone
                visited += 1
                if removed >= limit:  # the shard may hold more: start there next time
                    return ExpiryRun(removed, shard)
        return ExpiryRun(removed, None)

    # -- reading ---------------------------------------------------------------------

    async def get(self, topic: str) -> RetainedMessage | None:
        """The visible retained message of ``topic``, or None."""
        validate_topic(topic)
        _, _, _, rows = await self._scan(first_level(topic), "read", topic, topic, "", "", 1)
        messages = unpack_rows(rows)
        return messages[0] if messages else None

    async def match(
        self, topic_filter: str, cursor: RetainedCursor | None = None, *, limit: int = 100
    ) -> RetainedBatch:
        """Up to ``limit`` visible messages matching ``topic_filter`` in (shard, topic) order,
        from ``cursor`` on; pass the returned cursor to continue (None: no more).

        Raises :class:`InvalidTopicError` for an invalid or shared filter and
        :class:`RetainedArgumentError` for a bad limit or a cursor of another filter.
        """
        topic_filter = plain_filter(topic_filter)
        return await self._walk(topic_filter, cursor, check_limit(limit))

    def iter_match(
        self, topic_filter: str, *, batch_size: int = 100
    ) -> AsyncGenerator[RetainedMessage, None]:
        """Every visible message matching ``topic_filter``, fetched ``batch_size`` at a time.

        Raises :class:`InvalidTopicError` for an invalid or shared filter when called,
        before anything is read."""
        return self.matching(plain_filter(topic_filter), batch_size=batch_size)

    async def matching(
        self, topic_filter: TopicFilter, *, batch_size: int = 100
    ) -> AsyncGenerator[RetainedMessage, None]:
        """:meth:`iter_match` for a plain filter validated where it entered (a subscribe)."""
        limit = check_limit(batch_size)
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
        return await self._walk(None, cursor, check_limit(limit))

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
        check_limit(limit)
        if type(page) is not int or page < 1:
            raise RetainedArgumentError(f"page must be an int >= 1, not {page!r}")
        position = (page - 1) * limit
        if position > MAX_POSITION:  # past every topic a store can hold
            return RetainedPage([], page, limit, False)
        found = await self._scripts.run("retained_locate", self._registry[:2], [str(position)])
        if not found:
            return RetainedPage([], page, limit, False)
        shard, position = topic_text(found[0]), int(found[1])
        messages: list[RetainedMessage] = []
        wanted = limit
        while True:
            keys = self.keys.retained_shard_keys(shard)
            reply = await self._scripts.run("retained_range", keys, [str(position), str(wanted)])
            size = int(reply[0])
            messages += unpack_rows(reply[1:])
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
        with translating:
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
            with translating:
                batch = await self.redis.zrangebylex(
                    self._registry[0], low, b"+", start=0, num=SHARD_BATCH
                )
            if not batch:
                return
            for raw in batch:
                shard = topic_text(raw)
                if not (skip_dollar and shard.startswith("$")):
                    yield shard
            low = b"(" + topic_text(batch[-1]).encode()

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
        return bool(reply[0]), topic_text(reply[1]), int(reply[2]), list(reply[3:])

    def _resume(self, effective: str, after: str | None) -> tuple[str, str, str]:
        """(lone topic, prefix, range cursor) to go on in a shard after topic ``after``."""
        lone, prefix = scan_plan(effective)
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
            gone, freed = int(rest[0]), int(rest[1])
            await self._release(shard, gone)
            await self._grew(-freed)
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
                effective = effective_filter(topic_filter, shard)
                if not effective:  # '+' in shard '': only the empty topic, which is invalid
                    continue
                after = cursor.after if cursor is not None and cursor.shard == shard else None
                while True:
                    lone, prefix, range_after = self._resume(effective, after)
                    done, after, seen, rows = await self._scan(
                        shard, "read", effective, lone, prefix, range_after, limit - len(messages)
                    )
                    examined += seen
                    messages += unpack_rows(rows)
                    if done:
                        break
                    if len(messages) >= limit:
                        return RetainedBatch(messages, RetainedCursor(shard, after), examined)
        return RetainedBatch(messages, None, examined)
