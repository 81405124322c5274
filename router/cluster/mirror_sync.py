"""Keeps a node's route mirror equal to the route sets of the live nodes in Redis.

How the mirror learns about changes:

* every node publishes a *hint* (its node id) on the route-hints pub/sub channel after it
  changed its route set; a hint makes the other nodes read that node's change stream
  from the version they hold (pub/sub is fire-and-forget, so a hint is never the data);
* every ``interval`` seconds each node also reads every known node's stream, lists the
  registry (loading new nodes, dropping nodes that are not alive anymore, once it may
  judge them: see :meth:`MirrorSync.refresh`) and purges nodes whose heartbeat expired;
  a lost hint costs at most one interval; a peer whose heartbeat would expire within
  the interval is looked at right when it does (a dead node's sessions are adopted
  without waiting for the next round), and a peer that retired (left gracefully with
  persistent sessions: :meth:`NodeRegistry.retire
  <router.state.node_registry.NodeRegistry.retire>`) says so on the departures channel
  (:meth:`MirrorSync.depart`), which starts a round at once: its sessions are adopted
  and it is purged within moments, not after its heartbeat TTL;
* the node's view of who is in the cluster is *current* while the hints connection it
  had when it last listed the registry is still up (a join is announced by a hint); once
  that connection failed, a hint and so a join may have been missed, and
  :meth:`MirrorSync.ensure_current` lists the registry again before a subscribe relies
  on whom the node knows (:mod:`router.cluster.visibility`);
* when a stream cannot be followed (trimmed past the reader, Redis flushed or restarted,
  the route set claimed again, or a version gap) the node is reloaded from a snapshot,
  which carries its generation and version together.

The node's own routes enter its mirror directly from its route writer, not from Redis.

After it applied a node's changes (or loaded its snapshot) the mirror *acks* how far it
holds that node's route set (:mod:`router.state.route_acks`): a node acknowledges a
subscription only once every other live node acked its route change
(:mod:`router.cluster.visibility`). The ack goes once the publishes this node matched
before the change have their copies stored (``forwards``): an ack is a fence. It is sent
in the background, so the mirror goes on applying changes meanwhile. This node's own acks
channel is heard on the hints connection and handed to ``on_ack``, and the route fences
channel to ``on_fence`` (:mod:`router.cluster.route_fence`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from functools import partial
from typing import Final

from router.cluster.events import EventReporter
from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
from router.cluster.visibility import ForwardsInFlight
from router.core.route_mirror import RouteMirror
from router.errors import ResyncRequiredError, RouterError, StateFailureError
from router.state.keys import Keys
from router.state.node_registry import NodeInfo, NodeRegistry
from router.state.route_acks import RouteAck, RouteAcks, parse_ack
from router.state.route_hints import RouteHints
from router.state.routes import PurgeResult, RouteStore
from router.state.scripts import RedisClient

log = logging.getLogger(__name__)

#: Refresh intervals an adoption lease lasts unless renewed (each interval).
LEASE_INTERVALS: Final = 10
#: Seconds after a peer's heartbeat would expire that the refresh looks at it (Redis's
#: clock and this node's may tick a little apart).
EXPIRY_MARGIN: Final = 0.01


class MirrorSync:
    """The background work that keeps one node's :class:`RouteMirror` current."""

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys,
        routes: RouteStore,
        registry: NodeRegistry,
        mirror: RouteMirror,
        node_id: str,
        interval: float,
        on_dropped: Callable[[str], None] | None = None,
        may_purge: Callable[[], bool] = lambda: True,
        may_adopt_retired: Callable[[], bool] = lambda: True,
        adopt_sessions: Callable[[str], Awaitable[None]] | None = None,
        on_ack: Callable[[RouteAck], None] | None = None,
        forwards: ForwardsInFlight | None = None,
        on_fence: Callable[[bytes], None] | None = None,
        events: EventReporter | None = None,
    ) -> None:
        self._routes = routes
        self._events = events
        self._told_dead: set[tuple[str, str]] = set()  # (node, incarnation) told down
        self._registry = registry
        self._mirror = mirror
        self._node_id = node_id
        self._interval = interval
        self._on_dropped = on_dropped
        self._may_purge = may_purge
        self._may_adopt_retired = may_adopt_retired
        self._adopt_sessions = adopt_sessions
        self._on_ack = on_ack
        self._acks = RouteAcks(redis, keys)
        self._acked: dict[str, tuple[str, int]] = {}  # node -> the position last acked
        self._forwards = forwards if forwards is not None else ForwardsInFlight()
        # node -> the position to ack next, once these forwards (open when it was
        # applied) landed; and the task sending a node's acks in order
        self._to_ack: dict[str, tuple[tuple[str, int], list[asyncio.Future[None]]]] = {}
        self._acking: dict[str, asyncio.Task[None]] = {}
        self._on_fence = on_fence
        self._fence_channel = keys.route_fences()
        self._hints = RouteHints(
            redis, keys, also=(self._acks.channel(node_id), self._fence_channel)
        )
        self._adopting: dict[str, asyncio.Task[None]] = {}  # dead node -> its adoption
        self._lease = LEASE_INTERVALS * interval
        self.dead: frozenset[str] = frozenset()
        self.next_expiry: float | None = None  # seconds until a peer's heartbeat expires
        self._next_hint: asyncio.Future[None] | None = None  # (its callers share it)
        self._hinting: asyncio.Task[None] | None = None  # registered nodes whose heartbeat expired
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._current_since: int | None = None  # the hints subscription the view is current for
        self._refreshing: asyncio.Task[None] | None = None  # (its callers share it)
        self._woken = asyncio.Event()  # (a peer retired: the next round starts now)
        self.resyncs = 0
        self.purged = 0

    async def start(self, supervisor: Supervisor) -> None:
        """Listen for hints first (no hint is lost), then load every live node; the
        listener and the periodic refresh run under ``supervisor``."""
        await self._hints.subscribe()
        supervisor.start("route-hints", self._listen)
        # Start returns with every live node loaded: a publish right after start is routed.
        await self._list_and_load()
        supervisor.start("route-refresh", self._periodic)

    async def stop(self) -> None:
        """Release the hint connection (the supervisor stopped the tasks)."""
        tasks = [*self._running.values(), *self._adopting.values(), *self._acking.values()]
        for task in [*tasks, self._hinting, self._refreshing]:
            await stop_task(task)
        self._running.clear()
        await self._hints.close()

    async def stop_adopting(self) -> None:
        """End the adoptions under way (the node stops; the supervisor stopped the rounds
        that start them): the sessions one claimed are this node's, left with it for a
        live node to adopt, and the rest stay the other node's."""
        for task in list(self._adopting.values()):
            await stop_task(task)

    async def announce(self) -> None:
        """Tell every node that this node's route set changed; returns once a hint sent
        after the call reached Redis (raises what the hint's PUBLISH raised). Callers
        that come before the next hint goes share it: a burst of route writes (a
        reconnect storm) sends a few hints, not one per write."""
        await asyncio.shield(self.announce_soon())

    def announce_soon(self) -> asyncio.Future[None]:
        """:meth:`announce` without waiting for it: the future of the hint that will
        carry the news (a hint that fails is logged; every node also reads every
        stream once per interval)."""
        waiter = self._next_hint
        if waiter is None:
            waiter = self._next_hint = asyncio.get_running_loop().create_future()
            if self._hinting is None or self._hinting.done():
                self._hinting = asyncio.ensure_future(self._send_hints())
        return waiter

    async def _send_hints(self) -> None:
        while (waiter := self._next_hint) is not None:
            self._next_hint = None
            try:
                await self._hints.announce(self._node_id)
            except Exception as error:
                log.warning("the route hint of node %s failed: %r", self._node_id, error)
                waiter.set_exception(error)
                waiter.exception()  # (retrieved: its callers may be gone)
                continue
            except BaseException:
                waiter.cancel()
                raise
            waiter.set_result(None)

    async def depart(self) -> None:
        """Tell every node that this node retired (its registry entry says so already):
        each starts a round of :meth:`purge_dead` at once, and one adopts this node's
        sessions. Raises what the PUBLISH raised."""
        await self._hints.depart(self._node_id)

    # -- catching up -----------------------------------------------------------------

    def request(self, node_id: str) -> None:
        """Read ``node_id``'s new changes soon (one reader per node at a time)."""
        if node_id == self._node_id:
            return
        if node_id in self._running:
            self._again.add(node_id)
            return
        self._running[node_id] = asyncio.create_task(self._catch_up_loop(node_id))

    async def _catch_up_loop(self, node_id: str) -> None:
        try:
            while True:
                self._again.discard(node_id)
                try:
                    await self.catch_up(node_id)
                except RouterError:
                    log.warning("reading routes of node %s failed", node_id, exc_info=True)
                if node_id not in self._again:
                    return
        finally:
            self._running.pop(node_id, None)

    async def caught_up(self) -> None:
        """Return once every node this mirror follows had its change stream read by a
        catch-up that began after the call (concurrent callers share the readers: one
        per node, and at most one more read queued behind it). A read that fails is
        logged, as any catch-up's, and counts as done (the periodic refresh retries)."""
        peers = [node_id for node_id in self._mirror.nodes() if node_id != self._node_id]
        for node_id in peers:
            self.request(node_id)
        readers = [self._running[node_id] for node_id in peers if node_id in self._running]
        if readers:
            await asyncio.wait(readers)

    async def catch_up(self, node_id: str) -> None:
        """Apply the node's changes after the mirrored version, or reload it; then ack
        the position the mirror holds, if it moved since the last ack, once the forwards
        open now landed (:meth:`_ack_soon`)."""
        await self._follow(node_id)
        self._ack_soon(node_id)

    def _ack_soon(self, node_id: str) -> None:
        """Ack the position the mirror holds for ``node_id`` once the forwards open now
        landed; a later position replaces one not sent yet (its forwards are among the
        later one's, or landed)."""
        position = self._mirror.position(node_id)
        if position is None:
            return
        generation, version = position
        if generation is None or self._acked.get(node_id) == (generation, version):
            return
        self._to_ack[node_id] = ((generation, version), self._forwards.snapshot())
        if node_id not in self._acking:
            self._acking[node_id] = asyncio.create_task(self._send_acks(node_id))

    async def _send_acks(self, node_id: str) -> None:
        try:
            while (wanted := self._to_ack.pop(node_id, None)) is not None:
                (generation, version), forwards = wanted
                if forwards:
                    await asyncio.wait(forwards)
                if self._acked.get(node_id) == (generation, version):
                    continue
                try:
                    await self._acks.ack(node_id, self._node_id, generation, version)
                except RouterError as exc:  # (the writer's wait re-reads, then times out)
                    log.warning("route ack to node %s failed: %r", node_id, exc)
                    continue
                self._acked[node_id] = (generation, version)
        finally:
            self._acking.pop(node_id, None)

    async def _follow(self, node_id: str) -> None:
        position = self._mirror.position(node_id)
        if position is None:
            await self.reload(node_id)
            return
        generation, version = position
        while True:
            try:
                found = await self._routes.changes(node_id, generation, version)
            except ResyncRequiredError as exc:
                log.info("route mirror of node %s resyncs: %s", node_id, exc.reason)
                await self.reload(node_id)
                return
            if not found.changes:
                return
            if not self._mirror.apply(node_id, generation, found.changes):
                await self.reload(node_id)
                return
            version = found.changes[-1].version

    async def reload(self, node_id: str) -> None:
        """Replace the node's mirrored routes with a fresh snapshot (or drop them)."""
        self.resyncs += 1
        snapshot = await self._routes.snapshot(node_id)
        if snapshot.generation is None:
            self._drop(node_id)
            return
        self._mirror.load(node_id, snapshot.generation, snapshot.version, snapshot.routes)

    def _drop(self, node_id: str) -> None:
        self._acked.pop(node_id, None)
        self._to_ack.pop(node_id, None)
        if self._mirror.drop(node_id) and self._on_dropped is not None:
            self._on_dropped(node_id)

    # -- membership ------------------------------------------------------------------

    async def refresh(self) -> None:
        """Load registered nodes that are new, drop nodes no longer registered, catch up
        the rest.

        A node whose heartbeat expired stays routed until it is purged, and one that
        starts loads it too: its sessions have no route anywhere else until the node
        that purges it adopts them, so copies for them go to its inbox meanwhile, from
        which a resume or the adoption recovers them (:mod:`router.cluster.sessions.
        recovery`). A purged node is dropped only while this node is steady (after an
        outage of Redis a node must not judge the others from a registry it cannot read
        yet)."""
        registered = {node.node_id for node in await self._registry.nodes()}
        if self._may_purge():
            for node_id in self._mirror.nodes():
                if node_id != self._node_id and node_id not in registered:
                    self._drop(node_id)
        for node_id in sorted(registered - {self._node_id}):
            self.request(node_id)

    async def ensure_current(self) -> None:
        """Return once this node knows every node registered now, when it cannot be sure
        it does (its hints connection failed since it last listed the registry: a join
        may have gone unheard): list the registry again and load the nodes it finds.
        Costs nothing while the view is current. Raises :class:`StateFailureError` when
        Redis fails the listing (the view stays as it was)."""
        if not self.current:
            await asyncio.shield(self._listing())

    def _listing(self) -> asyncio.Task[None]:
        """The listing of the registry under way, or a new one (its callers share it)."""
        listing = self._refreshing
        if listing is None or listing.done():
            listing = self._refreshing = asyncio.create_task(self._list_and_load())
            listing.add_done_callback(_retrieved)
        return listing

    @property
    def current(self) -> bool:
        """True while the registry was listed on the hints subscription that is up now."""
        listening = self._hints.listening
        return listening is not None and listening == self._current_since

    async def _list_and_load(self) -> None:
        """:meth:`refresh`, then wait for the nodes it asked to load; the view is current
        if the hints subscription it began on is still up."""
        listening = self._hints.listening
        await self.refresh()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
        if listening is not None and listening == self._hints.listening:
            self._current_since = listening

    async def purge_dead(self) -> None:
        """Purge nodes whose heartbeat expired (any live node may; purges are idempotent),
        unless this node is not steady when the answer comes (a stall just ended).

        With ``adopt_sessions`` (the node adopts sessions) a dead node is purged only after its
        persistent sessions were adopted: until then its routes stay, so copies for its
        sessions go to its inbox, from which the adoption recovers them. One live node
        adopts it at a time, under a lease (:meth:`NodeRegistry.lease_adoption
        <router.state.node_registry.NodeRegistry.lease_adoption>`) renewed while it works;
        should it die, another takes the lease over once it ran out. A node that retired
        is no judgement of this node's (it said it left, under its incarnation): it is
        adopted and purged whenever ``may_adopt_retired()`` says so (the node runs), steady
        or not (a node restarted a moment ago in a rolling upgrade adopts the next one).

        Notes when the first other live node's heartbeat expires unless renewed
        (:attr:`next_expiry`): the refresh looks again then, not an interval later."""
        nodes = await self._registry.nodes()
        dead_nodes = [node for node in nodes if not node.alive]
        self.next_expiry = min(
            (
                (node.expires_ms - node.now_ms) / 1000
                for node in nodes
                if node.alive and node.node_id != self._node_id
            ),
            default=None,
        )
        self.dead = frozenset(node.node_id for node in dead_nodes)
        self._tell_down(dead_nodes)
        results = []
        retired = {node.node_id for node in dead_nodes if node.retired}
        for node in dead_nodes:
            if not self._may_take(node):
                continue
            if self._adopt_sessions is None:
                results.append(await self._registry.purge(node.node_id, node.incarnation))
            elif node.node_id not in self._adopting and await self._registry.lease_adoption(
                node.node_id, self._node_id, self._lease
            ):
                task = asyncio.create_task(self._adopt_then_purge(node))
                self._adopting[node.node_id] = task
                task.add_done_callback(partial(self._adopted, node.node_id))
        await self._settle(results, retired)

    def _may_take(self, node: NodeInfo) -> bool:
        """Whether this node may adopt and purge ``node``, found not alive now."""
        return self._may_adopt_retired() if node.retired else self._may_purge()

    def _tell_down(self, dead_nodes: list[NodeInfo]) -> None:
        """Tell each peer found dead for the first time (once in the cluster); a peer
        that retired is not down (it told ``node_stopped`` itself)."""
        if self._events is None:
            return
        for node in dead_nodes:
            seen = (node.node_id, node.incarnation)
            if node.node_id == self._node_id or node.retired or seen in self._told_dead:
                continue
            if len(self._told_dead) > 1_000:
                self._told_dead.clear()  # (bounded; the cluster-wide token still holds)
            self._told_dead.add(seen)
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

    async def _settle(self, results: list[PurgeResult], retired: Collection[str] = ()) -> None:
        """Drop the purged nodes from the mirror, count them, tell each purge (``retired``:
        the nodes among them that left gracefully) and announce."""
        for result in results:
            self._drop(result.node_id)
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
            await self._hints.announce(self._node_id)

    def _purged_text(self, result: PurgeResult, left: bool) -> str:
        routes = f"{result.routes} routes removed"
        if left:
            return (
                f"node {result.node_id} left gracefully; its sessions were adopted by node "
                f"{self._node_id}, which purged it: {routes}"
            )
        adopted = ", its sessions adopted" if self._adopt_sessions else ""
        return f"dead node {result.node_id} purged by node {self._node_id}: {routes}{adopted}"

    async def _adopt_then_purge(self, node: NodeInfo) -> None:
        """Adopt the sessions of the ``node`` found not alive under the lease (renewed
        each interval), then purge it and drop the lease. A failed adoption leaves the
        node routed: the next round tries again (the lease runs out)."""
        assert self._adopt_sessions is not None
        dead, incarnation = node.node_id, node.incarnation
        renewal = asyncio.create_task(self._renew_lease(dead))
        try:
            await self._adopt_sessions(dead)
        except Exception:  # (its sessions stay in Redis, expiring; logged loudly)
            log.exception("sessions of dead node %s not adopted yet; trying again", dead)
            return
        finally:
            await stop_task(renewal)
        if not self._may_take(node):
            return
        result = await self._registry.purge(dead, incarnation)
        await self._registry.end_adoption(dead)
        await self._settle([result], {dead} if node.retired else ())

    async def _renew_lease(self, dead: str) -> None:
        while True:
            await asyncio.sleep(self._interval)
            with contextlib.suppress(StateFailureError):
                if not await self._registry.lease_adoption(dead, self._node_id, self._lease):
                    log.error("lost the lease on adopting the sessions of node %s", dead)

    async def _periodic(self) -> None:
        while True:
            expiry = self.next_expiry
            if expiry is not None and expiry < self._interval:
                pause = max(expiry, 0) + EXPIRY_MARGIN
            else:
                pause = self._interval
            with contextlib.suppress(TimeoutError):  # (a departure ends the pause early)
                await asyncio.wait_for(self._woken.wait(), pause)
            self._woken.clear()
            try:
                await self.purge_dead()
                if self.current:
                    await self.refresh()
                else:
                    await self.ensure_current()
            except StateFailureError:  # (unreachable: the next round tries again; others raise)
                log.warning("route refresh failed", exc_info=True)

    async def _listen(self) -> None:
        while True:
            try:
                heard = await self._hints.message(self._interval)
            except StateFailureError as exc:
                # The next call subscribes again on a new connection, where the slot map
                # says then (see router.state.route_hints).
                log.warning("route hints connection failed (%s); subscribing again", exc)
                await asyncio.sleep(self._interval)
                with contextlib.suppress(StateFailureError):  # (the next round says)
                    await self._hints.subscribe()
                    self._listing()  # (what the hints missed: read now, not next round)
                continue
            if heard is None:
                continue
            if heard.channel == self._hints.departures:
                self._woken.set()  # (a peer retired: adopt its sessions now)
                continue
            if heard.channel == self._fence_channel:
                if self._on_fence is not None:
                    self._on_fence(heard.data)
                continue
            if heard.channel != self._hints.channel:
                ack = parse_ack(heard.data)
                if ack is not None and self._on_ack is not None:
                    self._on_ack(ack)
                continue
            self.request(heard.data.decode("utf-8", "replace"))


def _retrieved(listing: asyncio.Task[None]) -> None:
    """A listing nobody waited for failed: the next round lists again (logged there)."""
    if not listing.cancelled():
        listing.exception()
