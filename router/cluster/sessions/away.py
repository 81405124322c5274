"""An away session on its node: its record, and the spiller that moves its copies to Redis.

While a persistent session's client is away, the node keeps the session's routes and
its copies keep coming. The *spiller* (:func:`spill_forever`, one task per away session)
takes them from the session as they arrive and appends them to the session's Redis
queue in batches, so no copy stays in the node's memory only for longer than a batch's
write (:class:`router.cluster.sessions.keeper.SessionKeeper` starts and stops it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.cluster.sessions.local_sessions import ClientSession
from router.cluster.sessions.spills import Spills
from router.cluster.sessions.states import SessionState
from router.core.messages import Delivery, Outgoing
from router.errors import RouterError, StateFailureError
from router.state.session_queue import SessionQueue

log = logging.getLogger(__name__)

#: Deliveries the spiller moves to Redis in one call, at most.
SPILL_BATCH = 500
#: Seconds before the spiller tries again a batch Redis did not take.
SPILL_RETRY = 0.5


@dataclass
class AwaySession:
    """The queue, timers and spiller of one away session."""

    queue: SessionQueue
    spiller: asyncio.Task[None] | None = None
    spilling: asyncio.Future[bool] | None = None  # the batch on its way to Redis (taken?)
    batch: tuple[Delivery, ...] = ()  # that batch (in this node's memory until taken)
    end: asyncio.TimerHandle | None = None
    will: asyncio.TimerHandle | None = None
    pending_will: Outgoing | None = None


async def spill_forever(
    spills: Spills,
    session: ClientSession,
    away: AwaySession,
    tail: asyncio.Task[None] | None,
    make_away: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Move the session's copies to Redis as they come; with a ``tail`` under way,
    everything the session holds once it is in, first. A batch taken from the session
    is shielded from cancellation: the keeper's ``settle`` waits for it instead. A batch
    that Redis does not take goes back into the session, tried again after
    :data:`SPILL_RETRY` seconds. It spills only while the session is AWAY: a batch taken
    as the session stopped being away goes back into it, and the spiller ends. With
    ``make_away`` (the Redis part of putting the session away, which Redis refused),
    that first, every :data:`SPILL_RETRY` seconds until Redis takes it (the spiller ends
    if another node took the session over meanwhile)."""
    if make_away is not None and not await _retry_make_away(session, make_away):
        return
    batch: list[Delivery] = []
    if tail is not None:
        await asyncio.wait([tail])
        batch = session.take_all()
    while True:
        if batch and session.state is not SessionState.AWAY:
            session.put_first(batch)
            return
        if batch:
            away.batch = tuple(batch)
            away.spilling = asyncio.ensure_future(spills.write_together(away.queue, batch, session))
            taken = await asyncio.shield(away.spilling)
            away.batch = ()
            if not taken:
                await asyncio.sleep(SPILL_RETRY)
        delivery = await session.get()
        if delivery is None:
            return
        batch = [delivery]
        while session.pending() and len(batch) < SPILL_BATCH:
            next_one = await session.get()
            if next_one is not None:
                batch.append(next_one)


async def _retry_make_away(
    session: ClientSession, make_away: Callable[[], Awaitable[None]]
) -> bool:
    """Run ``make_away`` until Redis takes it (True), or until it is refused for another
    reason or the session stopped being away (False)."""
    while session.state is SessionState.AWAY:
        await asyncio.sleep(SPILL_RETRY)
        try:
            await make_away()
        except StateFailureError as exc:
            log.debug("session of %s not marked away yet: %r", session.client_id, exc)
            continue
        except RouterError:
            log.warning("session of %s not marked away", session.client_id, exc_info=True)
            return False
        log.info("session of %s marked away at last", session.client_id)
        return True
    return False
