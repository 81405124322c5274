"""What a dead node's inbox holds, read once for every client that resumes from it.

When a node dies with thousands of clients, they come back elsewhere at once, and each
resume recovers its copies from the dead node's inbox
(:mod:`router.cluster.sessions.recovery`). Read anew for each client, the inbox (every
copy routed to the dead node since it died, for all of its clients) would be read and
matched once per client: a reconnect storm of N clients costs N times the inbox. A
:class:`Backlog` reads it once, from the dead node's own cursor (which no longer moves),
keeps its messages in order with an index by topic, and reads on only what was added
since; a client's copies are those of the topics its subscriptions match.

A backlog reads through a cursor of its own, a copy of the first resume's *mark* (where
the dead node's reader stood before that resume's claim): the dead node's own cursor is
not a safe start, because a node taken for dead may be restarting under its id and
reading its inbox's backlog, moving that cursor past the copies the resume needs. Later
resumes' marks stand at or after the first one's, so the backlog covers them too (a copy
it gives that a client also got another way is a duplicate, never a loss).

It is kept while its node is dead and dropped, its cursor deleted, once the node is
purged or alive again (:meth:`Backlogs.forget`) or after ``keep`` seconds unused (whose
cursor the next :meth:`Backlogs.stale` hands over for deleting; it also expires with the
inbox's TTL).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable

from router.cluster.inbox import Forward, unpack_record
from router.core.messages import Message
from router.core.topics import has_wildcard, matches
from router.errors import MalformedMessageError, SubscriptionNotFoundError
from router.state.channels import Channel

#: Inbox records read at a time.
FETCH = 256


class Backlog:
    """The plain messages of one dead node's inbox, in the order they were stored."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._by_topic: dict[str, list[int]] = {}
        self._after: int | None = None
        self._lock = asyncio.Lock()
        self.used = 0.0
        self.reader: str | None = None  # its own cursor in the inbox, once made

    async def catch_up(self, channel: Channel, start: str) -> None:
        """Read what the inbox holds after what was read before; the first time, from
        where the cursor ``start`` stands (copied into the backlog's own cursor,
        :attr:`reader`). A missing cursor reads nothing."""
        async with self._lock:
            if self.reader is None:
                own = f"backlog-{uuid.uuid4().hex}"
                if not await channel.copy_cursor(start, own):
                    return
                self.reader = own
            while True:
                try:
                    result, self._after = await channel.read(self.reader, FETCH, self._after)
                except SubscriptionNotFoundError:  # (retired, or expired)
                    return
                for stored in result.messages:
                    for message in (f.message for f in plain_forwards(stored.content)):
                        self._by_topic.setdefault(message.topic, []).append(len(self.messages))
                        self.messages.append(message)
                if not result.more:
                    return

    def matching(self, filters: Iterable[str]) -> list[Message]:
        """The messages whose topic one of ``filters`` matches, in stored order."""
        found: set[int] = set()
        for topic_filter in filters:
            if not has_wildcard(topic_filter):
                found.update(self._by_topic.get(topic_filter, ()))
                continue
            for topic, indexes in self._by_topic.items():
                if matches(topic_filter, topic):
                    found.update(indexes)
        return [self.messages[index] for index in sorted(found)]


class Backlogs:
    """The :class:`Backlog` of each dead node clients recover from (see the module
    docstring); ``now()`` is the event loop's clock."""

    def __init__(self, keep: float, now: Callable[[], float]) -> None:
        self._keep = keep
        self._now = now
        self._backlogs: dict[str, Backlog] = {}
        self._dropped: list[tuple[str, str]] = []  # (dead node, reader) of unused backlogs

    def of(self, dead: str) -> Backlog:
        now = self._now()
        for node_id in [n for n, b in self._backlogs.items() if now - b.used > self._keep]:
            self._drop(node_id)
        backlog = self._backlogs.get(dead)
        if backlog is None:
            backlog = self._backlogs[dead] = Backlog()
        backlog.used = now
        return backlog

    def forget(self, dead: str) -> str | None:
        """``dead`` was purged (or is alive again): its backlog goes. Returns the
        backlog's cursor, for the caller to delete (None if there is none)."""
        backlog = self._backlogs.pop(dead, None)
        return None if backlog is None else backlog.reader

    def stale(self) -> list[tuple[str, str]]:
        """(dead node, cursor) of each backlog dropped unused since the last call: the
        caller deletes them."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def _drop(self, dead: str) -> None:
        reader = self.forget(dead)
        if reader is not None:
            self._dropped.append((dead, reader))


def plain_forwards(content: bytes) -> list[Forward]:
    """The plain forwards of one inbox record (none for a notice, a share group's copy
    or an unreadable record)."""
    try:
        record = unpack_record(content)
    except MalformedMessageError:
        return []
    if not isinstance(record, list):
        return []
    return [forward for forward in record if not forward.groups]
