"""A new publisher sees what the cluster had read before it: the route fence.

On one node a SUBSCRIBE applies to every PUBLISH the node reads after it
(:class:`~router.cluster.visibility.ArrivalOrder`), and across nodes once its SUBACK
came (:class:`~router.cluster.visibility.RouteVisibility`). Between the two is a client
that subscribes on node B and does not wait for its SUBACK, while another client
connects to node A and publishes at once (gmqtt's suite, request/response callers that
subscribe and hand the reply topic to a new connection): the route change may still be
on its way from B when A matches the publish. So before the *first* PUBLISH of a
connection is matched, A passes a fence (:meth:`RouteFence.passed`):

1. it asks every peer, over pub/sub (:mod:`router.state.route_fence_channel`), to settle;
2. each peer answers once the subscription changes it had open when it heard the ask
   (every SUBSCRIBE it had read) are applied, their route changes durable in Redis;
3. A then reads every peer's change stream (:meth:`MirrorSync.caught_up
   <router.cluster.mirror_sync.MirrorSync.caught_up>`) and matches the publish.

A live peer is waited for up to ``bound`` seconds (the heartbeat TTL: a peer that has
not answered by then is as good as dead), and asked again every ``retry`` seconds, since
pub/sub is fire-and-forget and an ask or its answer may be lost. A peer that stayed
silent through a whole round (its pub/sub broken, its loop wedged) is waited for only
``retry`` in the rounds after, until it answers again: it costs new publishers the
bound once, not at every round. Peers whose heartbeat expired are not asked at all.
Callers that come before the next ask goes share it, so a burst of new publishers costs
a few rounds, not one each. Later PUBLISHes of a connection pass no fence: what it
promises is the order of one client's arrival, and route changes keep reaching every
mirror in the background.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from router.cluster.visibility import ArrivalOrder
from router.errors import StateFailureError
from router.state.route_fence_channel import FenceAsked, FenceSettled, RouteFences, parse_fence

log = logging.getLogger(__name__)

#: Seconds between two asks of one round: a peer's answer takes a few Redis round trips
#: on a quiet machine, and an ask or an answer lost on the way is asked again after this.
FENCE_RETRY: Final = 0.25


class RouteFence:
    """One node's side of the fence: it asks and waits (:meth:`passed`), and it answers
    its peers' asks (:meth:`heard`)."""

    def __init__(
        self,
        fences: RouteFences,
        node_id: str,
        arrivals: ArrivalOrder,
        peers: Callable[[], Iterable[str]],
        caught_up: Callable[[], Awaitable[None]],
        bound: float,
        retry: float = FENCE_RETRY,
    ) -> None:
        self._fences = fences
        self._node_id = node_id
        self._arrivals = arrivals
        self._peers = peers
        self._caught_up = caught_up
        self.bound = bound
        self.retry = min(retry, bound)
        self._number = 0  # of this node's latest ask
        self._settled: dict[str, int] = {}  # peer -> the latest ask of ours it answered
        self._answered = asyncio.Event()
        self._next_round: asyncio.Future[None] | None = None  # (its callers share it)
        self._rounds: asyncio.Task[None] | None = None
        self._answers: set[asyncio.Task[None]] = set()
        self._silent: set[str] = set()  # peers silent through a whole round, till they answer
        self.unanswered = 0  # rounds that ended with a peer silent

    async def passed(self) -> None:
        """Return once every live peer settled what it had read before the call (or
        ``bound`` passed) and this node's mirror read every peer's stream after that.
        Never raises for Redis failing (the fence is then as good as the mirror is)."""
        if not any(True for _ in self._peers()):
            return
        waiter = self._next_round
        if waiter is None:
            waiter = self._next_round = asyncio.get_running_loop().create_future()
            if self._rounds is None or self._rounds.done():
                self._rounds = asyncio.ensure_future(self._run_rounds())
        await asyncio.shield(waiter)

    async def _run_rounds(self) -> None:
        while (waiter := self._next_round) is not None:
            self._next_round = None
            try:
                await self._round()
            finally:
                waiter.set_result(None)

    async def _round(self) -> None:
        self._number += 1
        number = self._number
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bound
        lagging = set(self._peers())
        while lagging:
            try:
                await self._fences.ask(self._node_id, number)
            except StateFailureError as error:
                log.warning("route fence of node %s could not ask: %r", self._node_id, error)
                break
            await self._answers_until(number, min(deadline, loop.time() + self.retry))
            lagging = {
                p for p in self._peers() if p in lagging and self._settled.get(p, 0) < number
            }
            if lagging and (lagging <= self._silent or loop.time() >= deadline):
                self.unanswered += 1
                self._silent |= lagging
                log.info("route fence: no answer from %s", sorted(lagging))
                break
        await self._caught_up()

    async def _answers_until(self, number: int, until: float) -> None:
        """Wait until every peer answered ask ``number`` or the loop's clock is ``until``."""
        try:
            async with asyncio.timeout_at(until):
                while any(self._settled.get(p, 0) < number for p in self._peers()):
                    self._answered.clear()
                    await self._answered.wait()
        except TimeoutError:
            pass

    def heard(self, data: bytes) -> None:
        """A message on the fences channel: answer a peer's ask once this node settled,
        or take a peer's answer to one of ours."""
        message = parse_fence(data)
        if isinstance(message, FenceAsked) and message.asker != self._node_id:
            task = asyncio.ensure_future(self._answer(message))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)
        elif (
            isinstance(message, FenceSettled)
            and message.asker == self._node_id
            and message.number > self._settled.get(message.peer, 0)
        ):
            self._settled[message.peer] = message.number
            self._silent.discard(message.peer)
            self._answered.set()

    async def _answer(self, asked: FenceAsked) -> None:
        if self._arrivals.pending:  # (the subscriptions read before the ask apply first)
            await self._arrivals.settled()
        try:
            await self._fences.settled(self._node_id, asked.asker, asked.number)
        except StateFailureError as error:  # (the asker's bound covers a lost answer)
            log.warning("route fence answer to node %s failed: %r", asked.asker, error)

    def stats(self) -> dict[str, int]:
        """``route_fence_rounds`` asked, and ``route_fence_unanswered`` (rounds that
        ended with a live peer silent: a publish may then miss what that peer had read)."""
        return {"route_fence_rounds": self._number, "route_fence_unanswered": self.unanswered}

    async def stop(self) -> None:
        """Stop the answers and rounds under way."""
        tasks = [*self._answers, *([self._rounds] if self._rounds is not None else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
