"""Node death, the driver: each round lists the registry, acts on the verdicts, and refreshes
the route mirror's view of the cluster.

The verdicts are pure (:mod:`router.core.peer_verdicts`: who is alive, who is dead and told
down, whom to purge, whom to adopt first, judged on Redis time); this module does their
I/O, one round at a time (the ``membership`` task):

1. wait :meth:`PeerVerdicts.pause <router.core.peer_verdicts.PeerVerdicts.pause>` (an
   interval, or until a live peer's heartbeat would expire), or less: a peer that retired
   says so on the departures channel (:meth:`MirrorSync.depart
   <router.cluster.mirror_sync.MirrorSync.depart>`), which ends the wait at once, so its
   sessions are adopted and it is purged within moments, not after its heartbeat TTL;
2. :meth:`Membership.purge_dead`: list the registry, tell each peer newly found dead
   (``node_down``, once per incarnation in the cluster), purge the dead this node may
   take, or, when the node adopts sessions, take the lease on adopting each (one live
   node adopts a dead one at a time: :meth:`NodeRegistry.lease_adoption
   <router.state.node_registry.NodeRegistry.lease_adoption>`), adopt its sessions with
   the lease renewed each interval, then purge it and drop the lease;
3. refresh the mirror's view (:meth:`MirrorSync.refresh_view
   <router.cluster.mirror_sync.MirrorSync.refresh_view>`): new nodes loaded, nodes no
   longer registered dropped.

A purged node is dropped from the mirror, counted (:attr:`Membership.purged`), told
(``node_purged``) and announced with a route hint. The heartbeats themselves are
:mod:`router.cluster.liveness`'s, which also says when this node may judge others
(``may_purge``: it is steady).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from functools import partial

from router.cluster.events import EventReporter
from router.cluster.mirror_sync import MirrorSync
from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
from router.core.peer_verdicts import Beat, PeerVerdicts
from router.errors import StateError, StateFailureError
from router.state.node_registry import NodeRegistry
from router.state.routes import PurgeResult

log = logging.getLogger(__name__)


class Membership:
    """The rounds of one node's verdicts on its peers (see the module docstring).

    ``may_purge``: this node may judge a peer dead now (it is steady);
    ``may_adopt_retired``: it may adopt a peer that retired (it runs);
    ``adopt_sessions``: adopts a dead node's persistent sessions (None: the node adopts
    none, it purges the dead at once); ``events``: where node events are told (None:
    not told)."""

    def __init__(
        self,
        registry: NodeRegistry,
        sync: MirrorSync,
        node_id: str,
        interval: float,
        *,
        may_purge: Callable[[], bool] = lambda: True,
        may_adopt_retired: Callable[[], bool] = lambda: True,
        adopt_sessions: Callable[[str], Awaitable[None]] | None = None,
        events: EventReporter | None = None,
    ) -> None:
        self._registry = registry
        self._sync = sync
        self._node_id = node_id
        self._interval = interval
        self._may_purge = may_purge
        self._may_adopt_retired = may_adopt_retired
        self._adopt_sessions = adopt_sessions
        self._events = events
        self._verdicts = PeerVerdicts(node_id, interval, adopts=adopt_sessions is not None)
        self._adopting: dict[str, asyncio.Task[None]] = {}  # dead node -> its adoption
        self._supervisor: Supervisor | None = None  # (from start(): tells bugs)
        #: The registered nodes found not alive by the last round (retired ones too).
        self.dead: frozenset[str] = frozenset()
        self.purged = 0

    def start(self, supervisor: Supervisor) -> None:
        """Run the rounds under ``supervisor`` (after the mirror started: the first round
        comes an interval later)."""
        self._supervisor = supervisor
        supervisor.start("membership", self._periodic)

    async def stop_adopting(self) -> None:
        """End the adoptions under way (the node stops; the supervisor stopped the rounds
        that start them): the sessions one claimed are this node's, left with it for a
        live node to adopt, and the rest stay the other node's."""
        for task in list(self._adopting.values()):
            await stop_task(task)

    async def purge_dead(self) -> None:
        """Act on one round's verdicts (:meth:`PeerVerdicts.judge
        <router.core.peer_verdicts.PeerVerdicts.judge>`, judged once the registry answered:
        a node whose stall just ended is not steady then): tell the peers newly down,
        purge the dead to purge (purges are idempotent: any live node may), and start the
        adoption of each dead node whose lease this node wins. Until its sessions are
        adopted a dead node stays routed, so copies for its sessions go to its inbox,
        from which the adoption recovers them. Raises what Redis raised."""
        verdict = self._verdicts.judge(
            await self._registry.nodes(),
            may_purge=self._may_purge(),
            may_adopt_retired=self._may_adopt_retired(),
        )
        self.dead = verdict.dead
        self._tell_down(verdict.told_down)
        results = [await self._registry.purge(n.node_id, n.incarnation) for n in verdict.purge]
        for node in verdict.adopt:
            if await self._registry.lease_adoption(
                node.node_id, self._node_id, self._verdicts.lease
            ):
                self._verdicts.lease_won(node.node_id)
                task = asyncio.create_task(self._adopt_then_purge(node))
                self._adopting[node.node_id] = task
                task.add_done_callback(partial(self._adopted, node.node_id))
        await self._settle(results, verdict.retired)

    def _tell_down(self, down: Collection[Beat]) -> None:
        """Tell each peer found dead for the first time (its time on Redis's clock)."""
        if self._events is None:
            return
        for node in down:
            ago = (node.now_ms - node.expires_ms) / 1000
            since = time.strftime("%H:%M:%S UTC", time.gmtime(node.expires_ms / 1000))
            self._events.tell(
                "node_down",
                node.node_id,
                f"node {node.node_id} is down since {since}: its heartbeat expired "
                f"{ago:.1f} s ago (seen by node {self._node_id})",
                "critical",
                once=f"node_down:{node.node_id}:{node.incarnation}",
            )

    def _adopted(self, dead: str, _task: asyncio.Task[None]) -> None:
        self._adopting.pop(dead, None)
        self._verdicts.adoption_ended(dead)

    async def _settle(self, results: list[PurgeResult], retired: Collection[str] = ()) -> None:
        """Drop the purged nodes from the mirror, count them, tell each purge (``retired``:
        the nodes among them that left gracefully) and announce."""
        for result in results:
            self._sync.drop(result.node_id)
            if result.status == "purged":
                self.purged += 1
                left = result.node_id in retired
                log.log(
                    logging.INFO if left else logging.WARNING,
                    "purged %s node %s (%d routes)",
                    "retired" if left else "dead",
                    result.node_id,
                    result.routes,
                )
                if self._events is not None:
                    self._events.tell(
                        "node_purged", result.node_id, self._purged_text(result, left)
                    )
        if results:
            await self._sync.announce()

    def _purged_text(self, result: PurgeResult, left: bool) -> str:
        routes = f"{result.routes} routes removed"
        if left:
            return (
                f"node {result.node_id} left gracefully; its sessions were adopted by node "
                f"{self._node_id}, which purged it: {routes}"
            )
        adopted = ", its sessions adopted" if self._adopt_sessions else ""
        return f"dead node {result.node_id} purged by node {self._node_id}: {routes}{adopted}"

    async def _adopt_then_purge(self, node: Beat) -> None:
        """Adopt the sessions of the ``node`` found not alive under the lease (renewed
        each interval), then purge it and drop the lease, if this node may still take it.
        A failed adoption leaves the node routed: the next round tries again (the lease
        runs out)."""
        assert self._adopt_sessions is not None
        dead, incarnation = node.node_id, node.incarnation
        renewal = asyncio.create_task(self._renew_lease(dead))
        try:
            await self._adopt_sessions(dead)
        except StateError:  # (its sessions stay in Redis, expiring)
            log.warning(
                "sessions of dead node %s not adopted yet; trying again", dead, exc_info=True
            )
            return
        except Exception as error:  # (a bug: told as one, and the next round tries again)
            if self._supervisor is None:
                raise
            self._supervisor.caught(f"the adoption of the sessions of {dead}", error)
            return
        finally:
            await stop_task(renewal)
        if not self._verdicts.may_take(
            node, may_purge=self._may_purge(), may_adopt_retired=self._may_adopt_retired()
        ):
            return
        result = await self._registry.purge(dead, incarnation)
        await self._registry.end_adoption(dead)
        await self._settle([result], {dead} if node.retired else ())

    async def _renew_lease(self, dead: str) -> None:
        while True:
            await asyncio.sleep(self._interval)
            with contextlib.suppress(StateFailureError):
                if not await self._registry.lease_adoption(
                    dead, self._node_id, self._verdicts.lease
                ):
                    log.error("lost the lease on adopting the sessions of node %s", dead)

    async def _periodic(self) -> None:
        departed = self._sync.departed
        while True:
            with contextlib.suppress(TimeoutError):  # (a departure ends the pause early)
                await asyncio.wait_for(departed.wait(), self._verdicts.pause())
            departed.clear()
            try:
                await self.purge_dead()
                await self._sync.refresh_view()
            except StateFailureError:  # (unreachable: the next round tries again; others raise)
                log.warning("route refresh failed", exc_info=True)
