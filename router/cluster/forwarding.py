"""Moving messages between nodes through their inbox channels.

Every node has an inbox: a channel-clock channel (:mod:`router.state.channels`) named after the
node, read only by that node. A publisher sends each interested node exactly one copy of
a message, whatever the number of subscribers there.

Outbound (:class:`Forwarder`): copies for one node gather while the previous write to that
node is in flight and go out together as one channel message (group commit), so the Redis
cost is paid per batch, not per message. A batch's channel id is a digest of its message
ids: a retried batch is recognised by the channel's dedup window and stored once.

Publishers *push* (``Channel.publish(..., push=True)``): the inbox's wake-up announcement
carries the batch itself, so the receiving node dispatches it without reading Redis.

Besides batches, an inbox carries notices (:mod:`router.cluster.inbox`): a node that
took a client's session over tells the node that served it (:meth:`Forwarder.notify`,
a :class:`~router.cluster.inbox.Takeover`), which closes its copy; an operator's kick
(a :class:`~router.cluster.inbox.Kick`) ends a client's connection where it is.

Inbound (:class:`InboxReader`): a :class:`~router.cluster.follower.ChannelFollower` of the node's
own inbox hands on each batch as it is announced (reading Redis only to catch up); it is
dispatched to local clients, then acknowledged, so a node that dies before acking gets
the batch again (at-least-once between nodes). The node drops message ids it already
dispatched, so a client never receives a redelivered copy twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable

from router.cluster.follower import ChannelFollower
from router.cluster.inbox import (
    Drain,
    Forward,
    Kick,
    Notice,
    Reload,
    pack_batch,
    pack_notice,
    unpack_record,
)
from router.errors import (
    MalformedMessageError,
    StateFailureError,
    StateUnavailableError,
    SubscriptionNotFoundError,
)
from router.state.channels import Channel, FetchedMessage
from router.state.keys import Keys
from router.state.scripts import RedisClient

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
WAIT = 0.5  # seconds an inbox reader waits after a transient error


def batch_id(forwards: list[Forward]) -> str:
    """The dedup id of a batch: a digest of its message ids (the same for a retry)."""
    digest = hashlib.blake2b(digest_size=16)
    for forward in forwards:
        digest.update(forward.message.id)
    return digest.hexdigest()


class _Outbox:
    __slots__ = ("channel", "pending", "task")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        # Each send: its forwards and the future that resolves once they are stored.
        self.pending: list[tuple[list[Forward], asyncio.Future[None]]] = []
        self.task: asyncio.Task[None] | None = None


class Forwarder:
    """Sends forwards to other nodes' inboxes, batched per node."""

    def __init__(
        self, redis: RedisClient, keys: Keys, expire: float, max_batch: int = 1024
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._expire = expire
        self._max_batch = max_batch
        self._outboxes: dict[str, _Outbox] = {}
        self.batches = 0
        self.forwarded = 0
        self.retries = 0  # writes tried again after a transient Redis error

    def stats(self) -> dict[str, int]:
        return {
            "forwarded": self.forwarded,
            "forward_batches": self.batches,
            "forward_retries": self.retries,
        }

    def _outbox(self, node_id: str) -> _Outbox:
        outbox = self._outboxes.get(node_id)
        if outbox is None:
            channel = Channel(self._redis, self._keys.inbox(node_id), self._expire, self._keys)
            outbox = self._outboxes[node_id] = _Outbox(channel)
        return outbox

    def send(self, node_id: str, forwards: list[Forward]) -> asyncio.Future[None]:
        """Queue copies for ``node_id``; the future resolves once they are in its inbox."""
        outbox = self._outbox(node_id)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        outbox.pending.append((forwards, waiter))
        if outbox.task is None:
            outbox.task = asyncio.create_task(self._drain(outbox), name=f"forward:{node_id}")
        return waiter

    def _take(self, outbox: _Outbox) -> tuple[list[Forward], list[asyncio.Future[None]]]:
        """Whole sends from the queue, up to ``max_batch`` forwards (at least one send)."""
        batch: list[Forward] = []
        waiters: list[asyncio.Future[None]] = []
        taken = 0
        for forwards, waiter in outbox.pending:
            if batch and len(batch) + len(forwards) > self._max_batch:
                break
            batch += forwards
            waiters.append(waiter)
            taken += 1
        del outbox.pending[:taken]
        return batch, waiters

    async def _drain(self, outbox: _Outbox) -> None:
        try:
            while outbox.pending:
                batch, waiters = self._take(outbox)
                try:
                    await self._write(outbox.channel, batch)
                except Exception as exc:  # (to its senders as it is: Redis failed, or a bug)
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                self.batches += 1
                self.forwarded += len(batch)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            outbox.task = None

    async def notify(self, node_id: str, notice: Notice) -> None:
        """Store a notice in ``node_id``'s inbox (a takeover notice once, however often
        retried; every kick, reload and drain is a notice of its own)."""
        if isinstance(notice, Kick | Reload | Drain):
            record_id = f"{type(notice).__name__.lower()}:{uuid.uuid4().hex}"
        else:
            digest = hashlib.blake2b(f"{notice.epoch}:{notice.client_id}".encode(), digest_size=16)
            record_id = "takeover:" + digest.hexdigest()
        await self._store(self._outbox(node_id).channel, (record_id, pack_notice(notice)))

    async def _write(self, channel: Channel, batch: list[Forward]) -> None:
        await self._store(channel, (batch_id(batch), pack_batch(batch)))

    async def _store(self, channel: Channel, record: tuple[str, bytes]) -> None:
        """Write ``record``; a transient error (Redis unreachable, the inbox's slot failing
        over or split by a migration) is retried after each of RETRY_DELAYS, then raised.
        A retry stores nothing twice: the record's id is deduplicated."""
        for delay in (*RETRY_DELAYS, None):
            try:
                await channel.publish([record], push=True)
                return
            except StateUnavailableError:
                if delay is None:
                    raise
                self.retries += 1
                await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Finish what is queued, then release the channels."""
        tasks = [o.task for o in self._outboxes.values() if o.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        for outbox in self._outboxes.values():
            await outbox.channel.aclose()
        self._outboxes.clear()


class SeenIds:
    """The message ids dispatched lately, to drop a copy stored twice (a retry lands
    within seconds of the first try).

    Two generations of ids, plain sets (the dispatch path checks every copy): new ids
    join the young one, which becomes the old one (the old one is forgotten) once it is
    ``window / 2`` seconds old or holds ``limit / 2`` ids. So an id is remembered for
    ``window / 2`` seconds at least, unless ``limit / 2`` newer ids came since; at most
    ``limit`` ids are held, none added more than ``window`` seconds before the last add.
    The time bound keeps memory flat at a low rate; the count bound at a high one."""

    def __init__(
        self, limit: int, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._half_limit = max(limit // 2, 1)
        self._half_window = window / 2
        self._clock = clock
        self.young: set[bytes] = set()
        self.old: set[bytes] = set()
        self._young_since = clock()

    def __len__(self) -> int:
        return len(self.young | self.old)

    def known(self, message_id: bytes) -> bool:
        return message_id in self.young or message_id in self.old

    def add(self, message_id: bytes) -> None:
        """Remember ``message_id`` (see the class docstring)."""
        self.add_many((message_id,))

    def add_many(self, message_ids: Iterable[bytes]) -> None:
        """Remember every id of ``message_ids`` (a dispatched batch)."""
        now = self._clock()
        age = now - self._young_since
        if age >= self._half_window or len(self.young) >= self._half_limit:
            self.old = self.young if age < 2 * self._half_window else set()
            self.young = set()
            self._young_since = now
        self.young.update(message_ids)


Dispatch = Callable[[list[Forward]], Awaitable[None]]
NoticeHandler = Callable[[Notice], Awaitable[None]]


class InboxReader:
    """Reads this node's inbox and dispatches every batch before acknowledging it;
    notices go to ``on_notice``."""

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys,
        node_id: str,
        expire: float,
        dispatch: Dispatch,
        on_notice: NoticeHandler,
        *,
        poll: float = 5.0,
        max_fetch: int = 64,
        remember: int = 200_000,
    ) -> None:
        self._node_id = node_id
        self._channel = Channel(redis, keys.inbox(node_id), expire, keys)
        self._follower = ChannelFollower(self._channel, node_id, max_fetch=max_fetch, poll=poll)
        self._dispatch = dispatch
        self._on_notice = on_notice
        self._seen = SeenIds(remember)
        self.received = 0
        self.duplicates = 0
        self.malformed = 0
        self.restarts = 0
        self.waits = 0  # reads that met a transient Redis error and waited
        self.unavailable = False  # waiting out such an error now (notices are not read)

    def stats(self) -> dict[str, int]:
        return {
            "received": self.received,
            "duplicates_dropped": self.duplicates,
            "inbox_restarts": self.restarts,
            "inbox_waits": self.waits,
        }

    async def open(self) -> None:
        """Make sure the inbox cursor exists (a restart keeps it); then :meth:`run` reads."""
        await self._channel.add_subscriber(self._node_id)

    async def backlog(self) -> int:
        """Inbox records stored and not yet acknowledged (the inbox lag)."""
        return await self._channel.backlog(self._node_id)

    @property
    def listening(self) -> bool:
        """True while the reader hears new records as they are stored: a notice written
        now is handled within moments (not while it waits out an outage of Redis, or
        catches up after one)."""
        return not self.unavailable and self._follower.listening

    async def read_through(self, timeout: float, poll: float = 0.01) -> bool:
        """Wait until every record stored in the inbox now is handled; False when
        ``timeout`` seconds passed first (or Redis could not say where the inbox is)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            position = await self._channel.position(self._node_id)
        except StateFailureError:
            return False
        if position is None:
            return False
        clock, cursor = position
        while clock != cursor and not self._follower.handled_through(clock):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True

    async def stop(self) -> None:
        """Release the inbox (once :meth:`run` was cancelled by its supervisor)."""
        await self._follower.close()
        await self._channel.aclose()

    async def run(self) -> None:
        """Read and dispatch until cancelled. Waits out a transient error (Redis
        unreachable, the inbox's slot failing over or split by a migration: a node that
        cannot read its inbox then, is not broken, nobody can write to it either) and
        starts a vanished inbox anew; raises anything else, for the node's supervisor to
        restart it (a batch that failed part-way is read again from the first record
        not handled)."""
        while True:
            try:
                await self.read_once()
            except StateUnavailableError as exc:
                self.waits += 1
                log.warning("inbox of node %s unavailable (%s); retrying", self._node_id, exc)
                self.unavailable = True
                try:
                    await asyncio.sleep(WAIT)
                finally:
                    self.unavailable = False
            except SubscriptionNotFoundError:
                log.error(
                    "inbox of node %s vanished from Redis (flushed, or lost in a restart); "
                    "reading it anew from the first copy stored since",
                    self._node_id,
                )
                await self._channel.add_subscriber(self._node_id, lost=True)
                self._follower.forget()
                self.restarts += 1

    async def read_once(self) -> int:
        """Dispatch one batch of the inbox and acknowledge it; return the copies dispatched.

        Should a record fail (a re-dispatch or takeover write that Redis refused), the
        records not yet handled are read again by the next call: none is skipped. The
        message ids of a record count as seen only once it is dispatched, so the retry is
        not taken for a repeat (copies delivered before the failure may come twice)."""
        dispatched = 0
        try:
            for stored in await self._follower.next():
                dispatched += await self._handle(stored)
                self._follower.handled(stored.clock)
        except BaseException:
            self._follower.rewind()
            raise
        self._follower.done()
        # Announced batches need no I/O: let the clients' consumers (and heartbeats) run.
        await asyncio.sleep(0)
        return dispatched

    async def _handle(self, stored: FetchedMessage) -> int:
        try:
            record = unpack_record(stored.content)
        except MalformedMessageError:
            self.malformed += 1
            log.error("dropped a malformed inbox record %s on node %s", stored.id, self._node_id)
            return 0
        if not isinstance(record, list):
            await self._on_notice(record)
            return 0
        young, old = self._seen.young, self._seen.old
        fresh = [f for f in record if f.message.id not in young and f.message.id not in old]
        self.duplicates += len(record) - len(fresh)
        if fresh:
            await self._dispatch(fresh)
            self._seen.add_many([forward.message.id for forward in fresh])
        self.received += len(fresh)
        return len(fresh)
