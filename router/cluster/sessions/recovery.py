"""Copies a dead node never delivered: read back from its inbox for the sessions it held.

A node that dies leaves in its inbox the copies routed to it between its death and its
purge (and those it had not read yet). The node that resumes one of its sessions (a
client back elsewhere, or an adoption, :mod:`router.cluster.sessions.adoption`) reads
them for that client (:meth:`InboxRecovery.recover_for`) without consuming them: the dead
node's other clients may resume elsewhere, and the inbox expires with its TTL.

Before it claims such a session, a node marks where the dead node's reader stood
(:meth:`InboxRecovery.mark`, a copy of the reader's cursor), so that a restart of the dead
node under its id, which reads its inbox's backlog, cannot move the recovery past those
copies.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final

from router.cluster.sessions.backlogs import Backlogs, plain_forwards
from router.cluster.sessions.local_sessions import LocalSessions
from router.core.messages import Delivery
from router.errors import SubscriptionNotFoundError
from router.state.channels import Channel
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_store import SessionInfo

log = logging.getLogger(__name__)

FETCH: Final = 256
"""Inbox records read at a time."""


@dataclass(frozen=True, slots=True)
class Recovery:
    """Where the reader of ``dead``'s inbox stood before a session was claimed from it:
    the subscriber ``cursor`` of that inbox reads on from there."""

    dead: str
    cursor: str


class InboxRecovery:
    """Marks and reads dead nodes' inboxes for the sessions this node resumes (see the
    module docstring); counts the copies it recovered."""

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys,
        node_id: str,
        inbox_expire: float,
        sessions: LocalSessions,
        is_dead: Callable[[str], bool] = lambda _node_id: False,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._node_id = node_id
        self._inbox_expire = inbox_expire
        self._sessions = sessions
        self._is_dead = is_dead
        self.backlogs = Backlogs(inbox_expire, time.monotonic)
        self.copies_recovered = 0

    async def mark(self, info: SessionInfo | None) -> Recovery | None:
        """Before a session of ``info`` is claimed from another node: a copy of that
        node's inbox cursor, for :meth:`recover_for` (None when the session was this
        node's or its old node has no inbox)."""
        if info is None or info.node_id == self._node_id:
            return None
        return await self.mark_node(info.node_id)

    async def mark_node(self, dead: str) -> Recovery | None:
        """A copy of ``dead``'s inbox cursor (None when it has no inbox)."""
        cursor = f"recovery-{uuid.uuid4().hex}"
        channel = self._channel(dead)
        try:
            made = await channel.copy_cursor(dead, cursor)
        finally:
            await channel.aclose()
        return Recovery(dead, cursor) if made else None

    async def release(self, recovery: Recovery | None) -> None:
        """Drop a mark that is not needed (the old node handed the session on)."""
        if recovery is not None:
            await self._delete_cursor(recovery.dead, recovery.cursor)

    async def forget(self, dead: str) -> None:
        """``dead`` was purged or is alive again: drop its backlog and the backlog's cursor."""
        reader = self.backlogs.forget(dead)
        if reader is not None:
            await self._delete_cursor(dead, reader)

    async def _delete_cursor(self, dead: str, reader: str) -> None:
        channel = self._channel(dead)
        try:
            await channel.remove_subscriber(reader)
        finally:
            await channel.aclose()

    def _channel(self, dead: str) -> Channel:
        return Channel(self._redis, self._keys.inbox(dead), self._inbox_expire, self._keys)

    async def recover_for(
        self, dead: str, client_id: str, recovery: Recovery | None = None
    ) -> list[Delivery]:
        """The copies for ``client_id`` (as its subscriptions here ask for them) left in
        the inbox of ``dead``, which held its session and did not hand it on: from the
        ``recovery`` mark made before the claim, else from the dead node's cursor. Read
        without acknowledging: the dead node's other clients may resume elsewhere."""
        if self._is_dead(dead):
            copies = await self._from_backlog(dead, client_id, recovery)
        else:
            await self.forget(dead)  # (alive again: a backlog of it is read no more)
            copies = (await self.recover_all(dead, {client_id}, recovery)).get(client_id, [])
        if copies:
            log.info("recovered %d copies for %s from dead node %s", len(copies), client_id, dead)
        return copies

    async def _from_backlog(
        self, dead: str, client_id: str, recovery: Recovery | None
    ) -> list[Delivery]:
        """:meth:`recover_for` from the dead node's shared backlog: read once for every
        client resuming from it, from the first resume's mark
        (:mod:`router.cluster.sessions.backlogs`)."""
        start = recovery.cursor if recovery is not None and recovery.dead == dead else dead
        channel = self._channel(dead)
        try:
            backlog = self.backlogs.of(dead)
            await backlog.catch_up(channel, start)
        finally:
            await channel.aclose()
        await self.release(recovery)
        for stale, reader in self.backlogs.stale():
            await self._delete_cursor(stale, reader)
        filters = self._sessions.trie.subscriptions(client_id)
        copies = [
            copy
            for message in backlog.matching(filters)
            for copy in self._sessions.copies_for(message, client_id)
        ]
        self.copies_recovered += len(copies)
        return copies

    async def recover_all(
        self, dead: str, clients: Collection[str], recovery: Recovery | None = None
    ) -> dict[str, list[Delivery]]:
        """:meth:`recover_for` for many clients at once (an adoption), the inbox read once:
        client id -> its copies, in the order they were stored."""
        channel = self._channel(dead)
        reader = recovery.cursor if recovery is not None and recovery.dead == dead else dead
        copies: dict[str, list[Delivery]] = {}
        after: int | None = None
        try:
            while True:
                try:
                    result, after = await channel.read(reader, FETCH, after)
                except SubscriptionNotFoundError:  # (retired, or expired)
                    break
                for stored in result.messages:
                    for forward in plain_forwards(stored.content):
                        found = self._sessions.copies_for_clients(forward.message, clients)
                        for client_id, made in found.items():
                            copies.setdefault(client_id, []).extend(made)
                if not result.more:
                    break
        finally:
            if reader != dead:
                await channel.remove_subscriber(reader)
            await channel.aclose()
        if recovery is not None and recovery.dead != dead:
            await self.release(recovery)
        self.copies_recovered += sum(map(len, copies.values()))
        return copies
