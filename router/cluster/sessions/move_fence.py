"""When a session that moved away from this node has every late copy here.

A client's session moves from this node (the old one) to a new node, which wrote the
session's routes before it claimed the session. Until every publishing node's route
mirror holds those routes, a publisher may still route the client's filters here only;
the old node keeps the session's routes for a grace and hands on what reaches it
meanwhile (:mod:`router.cluster.sessions.keeper`). A fixed grace misses a copy from a
mirror that lags by more than it.

The fence ends the grace when nothing more can come: every live node (this one too) acked
the new owner's routes as they stood once the session was claimed (an ack is sent only
once the copies its node matched before the change are stored: :mod:`router.cluster.
visibility`), and this node's inbox reader handled everything stored in its inbox up to
then. From then on every mirror routes the client's filters to the new owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from router.core.route_mirror import RouteMirror
from router.errors import ResyncRequiredError, StateFailureError
from router.state.route_acks import RouteAcks
from router.state.routes import RouteStore
from router.state.subscriptions import SubscriptionStore

log = logging.getLogger(__name__)

POLL: Final = 0.02
"""Seconds between two reads of the new owner's route acks."""


class MoveFence:
    """Whether a session that moved away from this node has every late copy here (see the
    module docstring). ``peers()`` are the live nodes this node knows, once
    ``know_peers()`` returned (it lists the registry again when a join may have gone
    unheard); ``read_through`` waits (at most the seconds it is given) until this node's
    inbox reader handled what its inbox holds now."""

    def __init__(
        self,
        subscriptions: SubscriptionStore,
        routes: RouteStore,
        acks: RouteAcks,
        mirror: RouteMirror,
        peers: Callable[[], Iterable[str]],
        read_through: Callable[[float], Awaitable[bool]],
        know_peers: Callable[[], Awaitable[None]],
        poll: float = POLL,
    ) -> None:
        self._subscriptions = subscriptions
        self._routes = routes
        self._acks = acks
        self._mirror = mirror
        self._peers = peers
        self._read_through = read_through
        self._know_peers = know_peers
        self._poll = poll
        # writer -> when its acks were last read, and that read (shared by the moves)
        self._reads: dict[str, tuple[float, asyncio.Future[dict[str, tuple[str, int]]]]] = {}

    async def passed(self, client_id: str, epoch: int, timeout: float) -> bool:
        """True once the session of ``client_id``, claimed elsewhere with ``epoch``, has
        every late copy here, within ``timeout`` seconds; False when that time passed
        first, or when it cannot be told (the claim changed again, the new owner's route
        set is not followed here, Redis failed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            [owner] = await self._subscriptions.owners([client_id])
            if owner is None or owner.epoch != epoch:
                return False
            writer = owner.node_id
            position = self._mirror.position(writer)
            if position is None:
                return False
            generation, known = position
            if generation is None:
                return False
            version = (await self._routes.changes(writer, generation, known, limit=1)).version
            await self._know_peers()
            while not self._all_hold(await self._acks_of(writer), writer, generation, version):
                if loop.time() >= deadline:
                    return False
                await asyncio.sleep(self._poll)
        except (ResyncRequiredError, StateFailureError) as exc:
            log.info("move of %s: no fence (%r); the grace applies", client_id, exc)
            return False
        return await self._read_through(max(deadline - loop.time(), 0.0))

    async def _acks_of(self, writer: str) -> dict[str, tuple[str, int]]:
        """``writer``'s route acks, read at most once every ``poll`` seconds whatever the
        number of moves waiting for them (a reconnect storm moves thousands at once)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        last = self._reads.get(writer)
        if last is None or (last[1].done() and last[0] <= now - self._poll):
            read = asyncio.ensure_future(self._acks.read(writer))
            read.add_done_callback(_retrieved)
            last = self._reads[writer] = (now, read)
        return await asyncio.shield(last[1])

    def _all_hold(
        self, acks: dict[str, tuple[str, int]], writer: str, generation: str, version: int
    ) -> bool:
        for peer in self._peers():
            if peer == writer:
                continue
            seen = acks.get(peer)
            if seen is None or seen[0] != generation or seen[1] < version:
                return False
        return True


def _retrieved(read: asyncio.Future[dict[str, tuple[str, int]]]) -> None:
    """A read of acks whose waiters all left failed: the next move reads again."""
    if not read.cancelled():
        read.exception()
