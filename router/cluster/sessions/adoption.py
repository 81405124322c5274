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
   they were stored (:mod:`router.cluster.sessions.recovery`). The inbox is read, not consumed:
   it expires with its TTL (a restart of the dead node under its id counts those
   copies as unmatched, having no client for them).

A client that reconnects to any node then resumes its session there with everything
queued, as after any takeover. A client that comes back *before* the purge resumes on
its new node, which recovers its copies from the dead node's inbox the same way. Before
it claims the session it marks where the dead node's reader stood (see
:mod:`router.cluster.sessions.recovery`).

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
from typing import Final

from router.cluster.sessions.lifecycle import SessionLifecycle
from router.state.session_store import NEVER, SessionInfo

log = logging.getLogger(__name__)

CONCURRENCY: Final = 32
"""Sessions adopted at the same time."""


class Adoption:
    """Adopts, through the node's session ``lifecycle``, the persistent sessions of the
    nodes this node purges (see the module docstring); counts them."""

    def __init__(self, lifecycle: SessionLifecycle) -> None:
        self._lifecycle = lifecycle
        self.sessions_adopted = 0
        self.failed = 0

    async def adopt(self, dead: str) -> None:
        """Adopt ``dead``'s persistent sessions: those it still owns (a client that came
        back elsewhere since owns its session there)."""
        store, subscriptions = self._lifecycle.store, self._lifecycle.subscriptions
        ids, _ = await store.client_ids()
        infos = await store.describe_many(ids)
        candidates = [i for i in infos if i and i.node_id == dead and i.expiry]
        owners = await subscriptions.owners([i.client_id for i in candidates])
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
        await self.adopt(self._lifecycle.node_id)

    async def _adopt_one(self, info: SessionInfo) -> bool:
        """A resume here under the session's own user name, not authenticated again
        (the node's ACL judges its copies by it); it recovers the client's copies from
        the dead node's inbox (no handoff comes); then away with the session's expiry.
        One step for the client (no connect of it here runs in between), and only while
        the dead node still owns the session: a client that resumed it meanwhile (here,
        or on another node) keeps it. Returns whether the session was adopted."""
        lifecycle = self._lifecycle
        client_id = info.client_id
        expiry = min(info.expiry, NEVER)
        async with lifecycle.locks.hold(client_id):
            [owner] = await lifecycle.subscriptions.owners([client_id])
            if owner is None or owner.node_id != info.node_id or lifecycle.serves(client_id):
                return False
            await lifecycle.connect(
                client_id, info.username, clean_start=False, expiry=expiry, authenticate=False
            )
            await lifecycle.put_away(client_id, expiry=expiry)
        return True
