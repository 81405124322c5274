"""Persistent sessions outlive their node: the node that purges a dead node adopts them.

A node that dies takes its memory with it, and its peers purge its routes once its
heartbeat expired, after which no publish is routed to its clients. Its *persistent*
sessions (Session Expiry Interval > 0, connected or away when it died) live on in Redis:
their subscriptions, their queue, their expiry. The live node whose purge removed the
dead node (exactly one: the purge reports ``purged`` once) adopts each of them:

1. it takes the session over as a resuming node would (a new owner epoch: the session is
   this node's now, and a later connect anywhere takes it from here), restores its
   subscriptions and writes their routes, then puts it away with its expiry: from then
   on its QoS 1/2 copies go to its Redis queue, after what was queued already, and its
   Session Expiry Interval runs on Redis time from the adoption;
2. as the resume waits in vain for the dead node's handoff, it reads what was stored in
   the dead node's inbox and never dispatched (copies routed there between the death
   and the purge) and queues the copies the session's subscriptions match, in the order
   they were stored (:meth:`Adoption.recover_for`). The inbox is read, not consumed:
   it expires with its TTL (a restart of the dead node under its id counts those
   copies as unmatched, having no client for them).

A client that reconnects to any node then resumes its session there with everything
queued, as after any takeover. A client that comes back *before* the purge resumes on
its new node, which recovers its copies from the dead node's inbox the same way. Before
it claims the session it marks where the dead node's reader stood (:meth:`Adoption.mark`,
a copy of the reader's cursor), so that a restart of the dead node under its id, which
reads its inbox's backlog, cannot move the recovery past those copies.

A node that restarts under its id adopts its previous incarnation's persistent sessions
the same way before it reads its inbox (:meth:`Adoption.adopt_own`): the backlog then
finds their subscriptions and goes to their queues, as what is routed to them next.

What this does not save: copies the dead node had already taken from its inbox (or from
its own publishers) into memory and not yet got acknowledged by the client, share-group
copies addressed to the dead node, and the wills of clients that were connected to it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from router.cluster.inbox import Forward, unpack_record
from router.core.messages import Delivery
from router.errors import MalformedMessageError, SubscriptionNotFoundError
from router.state.channels import Channel
from router.state.session_store import NEVER, SessionInfo

if TYPE_CHECKING:
    from router.cluster.node import RouterNode

log = logging.getLogger(__name__)

CONCURRENCY: Final = 32
"""Sessions adopted at the same time."""
FETCH: Final = 256


@dataclass(frozen=True, slots=True)
class Recovery:
    """Where the reader of ``dead``'s inbox stood before a session was claimed from it:
    the subscriber ``cursor`` of that inbox reads on from there."""

    dead: str
    cursor: str


class Adoption:
    """Adopts the persistent sessions of the nodes ``node`` purges and recovers copies
    from dead nodes' inboxes (see the module docstring); counts both."""

    def __init__(self, node: RouterNode) -> None:
        self._node = node
        self.sessions_adopted = 0
        self.copies_recovered = 0
        self.failed = 0

    async def adopt(self, dead: str) -> None:
        """Adopt ``dead``'s persistent sessions: those it still owns (a client that came
        back elsewhere since owns its session there)."""
        node = self._node
        ids, _ = await node.session_store.client_ids()
        infos = await node.session_store.describe_many(ids)
        candidates = [i for i in infos if i and i.node_id == dead and i.expiry]
        owners = await node.subscriptions.owners([i.client_id for i in candidates])
        orphans = [
            info
            for info, owner in zip(candidates, owners, strict=True)
            if owner is not None and owner.node_id == dead  # (not resumed elsewhere since)
        ]
        for first in range(0, len(orphans), CONCURRENCY):
            chunk = orphans[first : first + CONCURRENCY]
            results = await asyncio.gather(
                *(self._adopt_one(info) for info in chunk), return_exceptions=True
            )
            for info, result in zip(chunk, results, strict=True):
                if isinstance(result, BaseException):
                    self.failed += 1
                    log.error(
                        "session %s of dead node %s not adopted: %r", info.client_id, dead, result
                    )
                elif result:
                    self.sessions_adopted += 1
        if orphans:
            log.warning("adopted the %d persistent sessions of dead node %s", len(orphans), dead)

    async def adopt_own(self) -> None:
        """At start: adopt the persistent sessions this node id held in an earlier
        incarnation (the node restarted before anyone purged it)."""
        await self.adopt(self._node.node_id)

    async def mark(self, info: SessionInfo | None) -> Recovery | None:
        """Before a session of ``info`` is claimed from another node: a copy of that
        node's inbox cursor, for :meth:`recover_for` (None when the session was this
        node's or its old node has no inbox)."""
        node = self._node
        if info is None or info.node_id == node.node_id:
            return None
        cursor = f"recovery-{uuid.uuid4().hex}"
        channel = self._channel(info.node_id)
        try:
            made = await channel.copy_cursor(info.node_id, cursor)
        finally:
            await channel.aclose()
        return Recovery(info.node_id, cursor) if made else None

    async def release(self, recovery: Recovery | None) -> None:
        """Drop a mark that is not needed (the old node handed the session on)."""
        if recovery is not None:
            channel = self._channel(recovery.dead)
            try:
                await channel.remove_subscriber(recovery.cursor)
            finally:
                await channel.aclose()

    async def _adopt_one(self, info: SessionInfo) -> bool:
        """A resume here under the session's own user name, not authenticated again
        (the node's ACL judges its copies by it); it recovers the client's copies from
        the dead node's inbox (no handoff comes); then away with the session's expiry.
        One step for the client (no connect of it here runs in between), and only while
        the dead node still owns the session: a client that resumed it meanwhile (here,
        or on another node) keeps it. Returns whether the session was adopted."""
        node = self._node
        client_id = info.client_id
        expiry = min(info.expiry, NEVER)
        async with node.client_locks.hold(client_id):
            [owner] = await node.subscriptions.owners([client_id])
            if owner is None or owner.node_id != info.node_id or node.serves(client_id):
                return False
            await node.connect(
                client_id, info.username, clean_start=False, expiry=expiry, authenticate=False
            )
            await node.put_away(client_id, expiry=expiry)
        return True

    def _channel(self, dead: str) -> Channel:
        node = self._node
        return Channel(node.registry.redis, node.keys.inbox(dead), node.config.inbox_expire,
                       node.keys)  # fmt: skip

    async def recover_for(
        self, dead: str, client_id: str, recovery: Recovery | None = None
    ) -> list[Delivery]:
        """The copies for ``client_id`` (as its subscriptions here ask for them) left in
        the inbox of ``dead``, which held its session and did not hand it on: from the
        ``recovery`` mark made before the claim, else from the dead node's cursor. Read
        without acknowledging: the dead node's other clients may resume elsewhere."""
        channel = self._channel(dead)
        reader = recovery.cursor if recovery is not None and recovery.dead == dead else dead
        copies: list[Delivery] = []
        after: int | None = None
        try:
            while True:
                try:
                    result, after = await channel.read(reader, FETCH, after)
                except SubscriptionNotFoundError:  # (retired, or expired)
                    break
                for stored in result.messages:
                    for forward in _forwards(stored.content):
                        copies += self._node.sessions.copies_for(forward.message, client_id)
                if not result.more:
                    break
        finally:
            if reader != dead:
                await channel.remove_subscriber(reader)
            await channel.aclose()
        if recovery is not None and recovery.dead != dead:
            await self.release(recovery)
        self.copies_recovered += len(copies)
        if copies:
            log.warning(
                "recovered %d copies for %s from dead node %s", len(copies), client_id, dead
            )
        return copies


def _forwards(content: bytes) -> list[Forward]:
    """The plain forwards of one inbox record (none for a notice, a share group's copy
    or an unreadable record)."""
    try:
        record = unpack_record(content)
    except MalformedMessageError:
        return []
    if not isinstance(record, list):
        return []
    return [forward for forward in record if not forward.groups]
