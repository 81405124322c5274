"""Persistent sessions outlive their node: a live node adopts them before the dead node is purged.

A node that dies takes its memory with it. Its *persistent* sessions (Session Expiry
Interval > 0, connected or away when it died) live on in Redis: their subscriptions,
their queue, their expiry. Once its heartbeat expired, one live node takes the lease on
adopting them (:meth:`Membership.purge_dead <router.cluster.membership.Membership.purge_dead>`)
and, until every one is adopted, the dead node stays routed: copies for its sessions go
to its inbox. Then it purges the node. The adoption (:meth:`Adoption.adopt`) goes through
the sessions in pages (a SCAN: no cap on their number), claiming each batch as soon as
it is listed, and:

1. claims each persistent session the dead node still holds (the listing reads only
   the owners; the claim's script checks the session is persistent and answers with
   its description), in one script with marking it away here (``session_adopt.lua``: a
   client that resumed it anywhere meanwhile keeps it), opens it with its stored
   subscriptions, writes their routes, and holds back the
   copies that reach it from then on; no handoff is awaited (the owner is dead); the
   claims go in batches (:data:`BATCH`, pipelined), several at a time;
2. waits until every live node's route mirror holds the new routes: a mirror acks them
   once the publishes it matched before them have their copies in the inboxes
   (:class:`~router.cluster.visibility.ForwardsInFlight`), so from then on nothing routed
   to the dead node for these sessions is still on its way; this node waits for its own
   such publishes too (``landed``). Should a mirror not ack within the wait's bound, the
   adoption waits the grace (``handoff_grace``) instead;
3. reads the dead node's inbox once, from a copy of its reader's cursor, and gives each
   adopted session the copies its subscriptions ask for (:mod:`router.cluster.sessions.
   recovery`), ahead of those it held back, then puts it away with its expiry: from then
   on its QoS 1/2 copies go to its Redis queue, after what the dead node queued there,
   and its Session Expiry Interval runs on Redis time from the adoption.

The inbox is read, not consumed: it expires with its TTL. A client that connects here
during its session's adoption waits for it (the client's lock); one that comes back
elsewhere *before* the adoption resumes there and recovers its copies from the dead
node's inbox the same way (marking where the dead node's reader stood first).

A node that restarts under its id adopts its previous incarnation's persistent sessions
the same way before it reads its inbox (:meth:`Adoption.adopt_own`): the backlog then
finds their subscriptions and goes to their queues, as what is routed to them next.

A node that stops gracefully while it holds persistent sessions retires instead of
purging itself (:mod:`router.cluster.departure`): it is adopted the same way, at once
(its departure starts a live node's round), and is not told down.

What this does not save: copies the dead node had already taken from its inbox (or from
its own publishers) into memory and not yet got acknowledged by the client, share-group
copies addressed to the dead node, and the wills of clients that were connected to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from router.cluster.sessions.lifecycle import SessionLifecycle
from router.cluster.sessions.local_sessions import ClientSession, CountChange
from router.core.messages import Delivery
from router.state.subscriptions import Owner

log = logging.getLogger(__name__)

BATCH: Final = 100
"""Sessions claimed together (one pipelined call on a standalone server)."""
CONCURRENCY: Final = 8
"""Batches whose claims run at the same time. The steps after a claim (making the
queues, putting the sessions away) are not gated: the turn's pipeline and the spills'
group commit batch their Redis work, and a gate there held the claims back and made
the last batches wait for the first ones to finish (measured under a reconnect storm:
the put-away took 0.8-0.9 s gated, 0.4-0.5 s not)."""
PAGE: Final = 1_000
"""Session ids whose owners are read at a time."""
LISTING: Final = 4
"""Pages whose owners are read at the same time."""
SCAN_KEYS: Final = 5_000
"""Keys one SCAN call examines while listing sessions: each key of every client, queue
and message counts, so the sessions are a small share of them (about a millisecond of
Redis a call)."""


class Adoption:
    """Adopts, through the node's session ``lifecycle``, the persistent sessions of dead
    nodes (see the module docstring); counts them. ``confirm_routes()`` waits until every
    live node's mirror holds this node's routes (False when one did not within its
    bound); ``landed()`` until the copies of this node's publishes matched so far are
    stored; ``grace`` is the wait when a mirror did not confirm."""

    def __init__(
        self,
        lifecycle: SessionLifecycle,
        confirm_routes: Callable[[], Awaitable[bool]],
        landed: Callable[[], Awaitable[None]],
        grace: float,
    ) -> None:
        self._lifecycle = lifecycle
        self._recovery = lifecycle.recovery
        self._confirm_routes = confirm_routes
        self._landed = landed
        self._grace = grace
        self.sessions_adopted = 0
        self.failed = 0
        #: When the last adoption that found sessions ended (Unix time, ms; 0: none yet)
        #: and how long it took from its start (ms).
        self.last_finished_ms = 0
        self.last_took_ms = 0

    async def adopt(self, dead: str) -> None:
        """Adopt ``dead``'s persistent sessions: those it still owns (a client that came
        back elsewhere since owns its session there). Raises the first error of Redis
        (:class:`StateFailureError`) that stopped a batch, after the others went on: the
        caller tries again."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        phases: dict[str, float] = {}
        gate = asyncio.Semaphore(CONCURRENCY)
        recovered: asyncio.Future[dict[str, list[Delivery]]] = loop.create_future()
        clients: set[str] = set()
        claimed: list[asyncio.Future[list[CountChange] | None]] = []
        adoptions: list[asyncio.Task[int]] = []
        try:
            async for batch in self._batches(dead):  # (claimed while the rest is listed)
                clients.update(client_id for client_id, _ in batch)
                claimed.append(loop.create_future())
                adoptions.append(
                    asyncio.create_task(self._adopt_batch(batch, gate, claimed[-1], recovered))
                )
            if not adoptions:
                return
            phases["listed"] = loop.time() - began
            changes = await asyncio.gather(*claimed)
            phases["claimed"] = loop.time() - began
            await self._lifecycle.adopt_routes([c for made in changes if made for c in made])
            phases["routed"] = loop.time() - began
            if any(made is not None for made in changes) and dead != self._lifecycle.node_id:
                # (own sessions: its inbox reader reads them)
                if not await self._confirm_routes():
                    await asyncio.sleep(self._grace)
                await self._landed()
                phases["confirmed"] = loop.time() - began
                mark = await self._recovery.mark_node(dead)
                recovered.set_result(await self._recovery.recover_all(dead, clients, mark))
                phases["recovered"] = loop.time() - began
            else:
                recovered.set_result({})
        except BaseException:
            if not recovered.done():
                recovered.set_result({})  # (the sessions go away with what they hold)
            raise
        finally:
            results = await asyncio.gather(*adoptions, return_exceptions=True)
        await self._recovery.forget(dead)  # (purged next: no resume reads it again)
        errors = [r for r in results if isinstance(r, BaseException)]
        adopted = sum(r for r in results if isinstance(r, int))
        self.sessions_adopted += adopted
        self.failed += len(errors)
        phases["put away"] = loop.time() - began
        self.last_finished_ms = int(time.time() * 1000)
        self.last_took_ms = int(phases["put away"] * 1000)
        log.warning(
            "adopted %d persistent sessions of dead node %s (%s)",
            adopted,
            dead,
            ", ".join(f"{phase} at {at:.2f} s" for phase, at in phases.items()),
        )
        if errors:
            raise errors[0]

    async def _batches(self, dead: str) -> AsyncIterator[list[tuple[str, Owner]]]:
        """(client id, claim) of each session ``dead`` still owns, in batches of
        :data:`BATCH` at most, each as soon as it is listed."""
        batch: list[tuple[str, Owner]] = []
        async for orphans in self._owned_pages(dead):
            for orphan in orphans:
                batch.append(orphan)
                if len(batch) == BATCH:
                    yield batch
                    batch = []
        if batch:
            yield batch

    async def _owned_pages(self, dead: str) -> AsyncIterator[list[tuple[str, Owner]]]:
        """:meth:`_owned` of each page of clients with a session, :data:`LISTING` pages
        read at a time while the SCAN goes on."""
        owned: set[asyncio.Task[list[tuple[str, Owner]]]] = set()
        pages = self._lifecycle.store.client_id_pages(PAGE, SCAN_KEYS)
        try:
            async for ids in pages:
                owned.add(asyncio.create_task(self._owned(dead, ids)))
                if len(owned) >= LISTING:
                    done, owned = await asyncio.wait(owned, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        yield task.result()
            for finished in asyncio.as_completed(owned):
                yield await finished
        finally:
            for task in owned:
                task.cancel()
            await asyncio.gather(*owned, return_exceptions=True)
            await pages.aclose()

    async def _owned(self, dead: str, ids: list[str]) -> list[tuple[str, Owner]]:
        """Of clients ``ids``, (client id, claim) of those whose session ``dead`` still
        owns (whether it is persistent, the claim's script reads)."""
        owners = await self._lifecycle.subscriptions.owners(ids)
        return [
            (client_id, owner)
            for client_id, owner in zip(ids, owners, strict=True)
            if owner is not None and owner.node_id == dead
        ]

    async def adopt_own(self) -> None:
        """At start: adopt the persistent sessions this node id held in an earlier
        incarnation (the node restarted before anyone purged it)."""
        await self.adopt(self._lifecycle.node_id)

    async def _adopt_batch(
        self,
        batch: list[tuple[str, Owner]],
        gate: asyncio.Semaphore,
        claimed: asyncio.Future[list[CountChange] | None],
        recovered: asyncio.Future[dict[str, list[Delivery]]],
    ) -> int:
        """One batch of sessions, holding their clients' locks throughout: claim them
        (``claimed`` gets their route changes, None when none was claimed), wait for the
        copies ``recovered`` from the dead node's inbox, put them away. Returns how many
        were adopted."""
        lifecycle = self._lifecycle
        async with contextlib.AsyncExitStack() as locks:
            for client_id, _ in batch:
                await locks.enter_async_context(lifecycle.locks.hold(client_id))
            opened: list[tuple[ClientSession, Owner, list[CountChange]] | None] = []
            try:
                async with gate:
                    opened = await lifecycle.adopt_claims(batch)
            finally:
                made = [change for one in opened if one for change in one[2]]
                if not claimed.done():
                    claimed.set_result(made if any(opened) else None)
            adopted = [one for one in opened if one is not None]
            # (made while the recovery waits for the mirrors)
            ready = await lifecycle.adopt_queues([s for s, _, _ in adopted])
            copies: dict[str, list[Delivery]] = {}
            with contextlib.suppress(asyncio.CancelledError):
                copies = await asyncio.shield(recovered)
            failed = await lifecycle.adopt_finish_all(
                [(s, o, copies.get(s.client_id, [])) for s, o, _ in adopted], ready
            )
            self.failed += failed  # (after the await: batches finish at once)
        return len(adopted)
