"""Keeps a node's route mirror equal to the route sets of the live nodes in Redis.

How the mirror learns about changes:

* every node publishes a *hint* (its node id) on the route-hints pub/sub channel after it
  changed its route set; a hint makes the other nodes read that node's change stream
  from the version they hold (pub/sub is fire-and-forget, so a hint is never the data);
* each round of the node's membership (:mod:`router.cluster.membership`: every
  ``interval`` seconds, after it purged the nodes whose heartbeat expired) the mirror
  also reads every known node's stream and lists the registry (loading new nodes,
  dropping nodes that are not alive anymore, once it may judge them: see
  :meth:`MirrorSync.refresh`); a lost hint costs at most one interval. A peer that
  retired (left gracefully with persistent sessions: :meth:`NodeRegistry.retire
  <router.state.node_registry.NodeRegistry.retire>`) says so on the departures channel
  (:meth:`MirrorSync.depart`), heard here: :attr:`MirrorSync.departed` starts the next
  round at once;
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
from collections.abc import Callable

from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
from router.cluster.visibility import ForwardsInFlight
from router.core.route_mirror import RouteMirror
from router.errors import ResyncRequiredError, StateError, StateFailureError
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.route_acks import RouteAck, RouteAcks, parse_ack
from router.state.route_hints import RouteHints
from router.state.routes import RouteStore
from router.state.scripts import RedisClient

log = logging.getLogger(__name__)


class MirrorSync:
    """The background work that keeps one node's :class:`RouteMirror` current.

    A read of a node's changes, or an ack, that Redis fails is logged and left to the
    next read (the periodic refresh); any other failure is a bug, handed to ``caught``
    (the node's :meth:`~router.cluster.node.RouterNode.internal_error`: counted)."""

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys,
        routes: RouteStore,
        registry: NodeRegistry,
        mirror: RouteMirror,
        node_id: str,
        interval: float,
        caught: Callable[[str, BaseException], None],
        on_dropped: Callable[[str], None] | None = None,
        may_purge: Callable[[], bool] = lambda: True,
        on_ack: Callable[[RouteAck], None] | None = None,
        forwards: ForwardsInFlight | None = None,
        on_fence: Callable[[bytes], None] | None = None,
    ) -> None:
        self._routes = routes
        self._registry = registry
        self._mirror = mirror
        self._node_id = node_id
        self._interval = interval
        self._caught = caught
        self._on_dropped = on_dropped
        self._may_purge = may_purge
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
        self._next_hint: asyncio.Future[None] | None = None  # (its callers share it)
        self._hinting: asyncio.Task[None] | None = None  # registered nodes whose heartbeat expired
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._current_since: int | None = None  # the hints subscription the view is current for
        self._refreshing: asyncio.Task[None] | None = None  # (its callers share it)
        #: Set when a peer retired (heard on the departures channel): the membership
        #: round that waits on it starts at once and clears it.
        self.departed = asyncio.Event()
        self.resyncs = 0

    async def start(self, supervisor: Supervisor) -> None:
        """Listen for hints first (no hint is lost), then load every live node; the
        listener runs under ``supervisor`` (the periodic refresh is the membership
        round's: :meth:`refresh_view`)."""
        await self._hints.subscribe()
        supervisor.start("route-hints", self._listen)
        # Start returns with every live node loaded: a publish right after start is routed.
        await self._list_and_load()

    async def stop(self) -> None:
        """Release the hint connection (the supervisor stopped the tasks)."""
        tasks = [*self._running.values(), *self._acking.values()]
        for task in [*tasks, self._hinting, self._refreshing]:
            await stop_task(task)
        self._running.clear()
        await self._hints.close()

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
        each starts a membership round at once (:mod:`router.cluster.membership`), and
        one adopts this node's sessions. Raises what the PUBLISH raised."""
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
                except StateError:
                    log.warning("reading routes of node %s failed", node_id, exc_info=True)
                except Exception as error:  # (a bug: told as one, the next read goes on)
                    self._caught(f"reading the routes of node {node_id}", error)
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
                except StateError as exc:  # (the writer's wait re-reads, then times out)
                    log.warning("route ack to node %s failed: %r", node_id, exc)
                    continue
                except Exception as error:  # (a bug: told as one; the next ack goes on)
                    self._caught(f"acking the routes of node {node_id}", error)
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
            self.drop(node_id)
            return
        self._mirror.load(node_id, snapshot.generation, snapshot.version, snapshot.routes)

    def drop(self, node_id: str) -> None:
        """Forget ``node_id``'s routes (purged, or no longer registered); tell ``on_dropped``."""
        self._acked.pop(node_id, None)
        self._to_ack.pop(node_id, None)
        if self._mirror.drop(node_id) and self._on_dropped is not None:
            self._on_dropped(node_id)

    # -- the registry's view ---------------------------------------------------------

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
                    self.drop(node_id)
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

    async def refresh_view(self) -> None:
        """The periodic look at the registry (each membership round's, after its purges):
        :meth:`refresh` while the view is current, else :meth:`ensure_current`. Raises
        :class:`StateFailureError` when Redis fails the listing."""
        if self.current:
            await self.refresh()
        else:
            await self.ensure_current()

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
                self.departed.set()  # (a peer retired: adopt its sessions now)
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
