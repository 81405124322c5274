"""A router node: local clients, the cluster's route mirror, and forwarding between nodes.

Life of a node (one process, one *incarnation*):

1. ``start``: register in the node registry, claim its route set (which drops the routes
   of its own previous incarnation), heartbeat every ``heartbeat_interval`` from then on
   (the rest of a start may outlast the TTL), open its inbox, load every live node's
   routes into the mirror, announce itself. Its
   background tasks run supervised (:mod:`router.cluster.supervisor`): one that fails
   restarts with backoff, and a node whose task keeps failing stops its heartbeat
   (:mod:`router.cluster.liveness`).
2. Subscribe: the client's subscription goes to Redis (client state, atomic per client),
   then into the local trie; when the node's count for the route goes 0 -> 1 (or a share
   group's member count changes) the route change is written to the node's route set and
   ``subscribe`` returns only once it is durable there. Every other node learns it from a
   hint plus the node's change stream.
3. Publish: match the mirror; deliver locally; send exactly one copy to each other
   interested node's inbox (batched); ``publish`` returns when every copy is stored
   (:mod:`router.cluster.dispatcher`). Each share group gets exactly one member
   cluster-wide: the mirror picks the node.
4. A client that connects to another node is taken over (MQTT-3.1.4-3): the new node
   claims the session and leaves a takeover notice in the old node's inbox, which drops
   its local copy of the session (its routes with it; a session that goes on there keeps
   its routes for ``handoff_grace`` seconds more, for copies sent by mirrors that have
   not caught up yet) and reports reason ``takenover``.
   Should a notice be lost, each heartbeat also audits the claims of local sessions
   (:mod:`router.cluster.claims`). A session with a Session Expiry Interval outlives
   its connection (:meth:`RouterNode.put_away`) and resumes on any node, what was
   queued for it first (:mod:`router.cluster.session_keeper`).
5. ``stop``: remove its routes, deregister, announce; other nodes drop its routes.
   A node that dies instead is purged by the others once its heartbeat expires; its inbox
   keeps messages until the channel TTL, for a restart under the same node id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any

from redis.exceptions import RedisError

from router.cluster.adoption import Adoption, Recovery
from router.cluster.claims import Claimed, SessionClaims
from router.cluster.client_locks import ClientLocks
from router.cluster.config import NodeConfig
from router.cluster.dispatcher import Dispatcher
from router.cluster.forwarding import Forwarder, InboxReader
from router.cluster.inbox import Kick, Notice, Takeover
from router.cluster.liveness import Liveness
from router.cluster.local_sessions import ClientSession, CountChange, LocalSessions
from router.cluster.mirror_sync import MirrorSync
from router.cluster.policy import Policy
from router.cluster.restoration import restore_sessions
from router.cluster.retainer import Retainer
from router.cluster.route_writer import Reconciliation, RouteWriter
from router.cluster.session_keeper import SessionKeeper
from router.cluster.supervisor import Supervisor
from router.cluster.traffic_log import TrafficLog
from router.cluster.visibility import ArrivalOrder, RouteVisibility
from router.core.guid import GuidGenerator, node_part_for
from router.core.hooks import HookRegistry
from router.core.hot_topics import cache_counters
from router.core.messages import Delivery, MessageProperties, Outgoing, PublishResult
from router.core.options import SubscriptionOptions, make_options
from router.core.route_mirror import RouteMirror
from router.core.topics import TopicFilter, parse_shared, validate_filter
from router.errors import InvalidOptionsError, RouterError, SessionOwnershipError
from router.state.connection import check_eviction
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.retained_store import RetainedStore
from router.state.route_acks import RouteAcks
from router.state.routes import RouteChange, RouteStore
from router.state.scripts import RedisClient, redis_errors
from router.state.session_store import SessionInfo, SessionStore
from router.state.subscriptions import Owner, SubscriptionStore

log = logging.getLogger(__name__)


class RouterNode:
    """One node of the router cluster, embedded in an asyncio program."""

    def __init__(self, redis: RedisClient, config: NodeConfig) -> None:
        self.config = config
        self.node_id = check_id(config.node_id, "node id")
        self.incarnation = uuid.uuid4().hex
        self.keys = Keys(config.prefix)
        self._redis = redis
        self.routes = RouteStore(redis, self.keys, stream_length=config.stream_length)
        self.registry = NodeRegistry(redis, self.keys, ttl=config.heartbeat_ttl, routes=self.routes)
        self.subscriptions = SubscriptionStore(redis, self.keys)
        self.sessions = LocalSessions(
            config.strategy(),
            queue_limit=config.queue_limit,
            overflow=config.overflow,
            match_cache=config.match_cache,
            acl=config.acl,
        )
        self.hooks = HookRegistry()  # see router.cluster.policy for what the node runs where
        self._policy = Policy(self.hooks, config.acl, self.sessions)
        self.mirror = RouteMirror(config.strategy(), cache=config.match_cache)
        self._arrivals = ArrivalOrder()
        self._visibility = RouteVisibility(
            RouteAcks(redis, self.keys), self.node_id, self.mirror.nodes, config.heartbeat_ttl
        )
        self._adoption = Adoption(self)
        self._sync = MirrorSync(
            redis,
            self.keys,
            self.routes,
            self.registry,
            self.mirror,
            self.node_id,
            config.heartbeat_interval,
            may_purge=lambda: self.liveness.steady(),  # noqa: PLW0108 (made below)
            on_purged=self._adoption.adopt,
            on_ack=self._visibility.on_ack,
        )
        self._writer = RouteWriter(
            self.routes,
            self.node_id,
            self.incarnation,
            self.sessions.routes,
            self._on_routes_applied,
            self._on_routes_claimed,
        )
        self._forwarder = Forwarder(redis, self.keys, config.inbox_expire)
        self._claims = SessionClaims(
            self.node_id, self.subscriptions, self._forwarder, self._on_taken_over
        )
        self.client_locks = ClientLocks()  # (connect, put_away and adoption, per client)
        self.session_store = SessionStore(redis, self.keys, self.subscriptions)
        self._kickers: list[Callable[[str], bool]] = []
        self.retained = RetainedStore(redis, self.keys, config.retained)
        self._retainer = Retainer(self.retained, self.sessions)
        self._traffic = (
            TrafficLog(config.traffic_dir, self.node_id, sample=config.traffic_sample)
            if config.traffic_dir
            else None
        )
        self._dispatcher = Dispatcher(
            self.node_id,
            GuidGenerator(node_part_for(self.node_id, self.incarnation)),
            self.mirror,
            self.sessions,
            self._forwarder,
            self._policy,
            self._retainer,
            self._traffic,
            self._arrivals,
            config.publish_timeout,
        )
        self._keeper = SessionKeeper(
            redis,
            self.keys,
            self.session_store,
            max_queued=config.max_queued,
            overflow=config.overflow,
            handoff_timeout=config.handoff_timeout,
            handoff_grace=config.handoff_grace,
            adoption=self._adoption,
            publish_will=self._dispatcher.publish,
            end_session=self._end_session,
        )
        self._inbox = InboxReader(
            redis, self.keys, self.node_id, config.inbox_expire, self._dispatcher.dispatch,
            self._on_notice, poll=config.inbox_poll,
        )  # fmt: skip
        self.inbox_backlog = self._inbox.backlog  # (read by the metrics endpoint)
        self.publish_latency = self._dispatcher.latency
        self._generation: str | None = None
        self._running = False
        self._taken_over = asyncio.Event()
        self.sessions_restored = 0
        self._supervisor = Supervisor(self.node_id, grace=config.heartbeat_ttl)
        self.liveness = Liveness(
            self.node_id, self.registry, self._supervisor, config.heartbeat_interval,
            config.heartbeat_ttl, incarnation=lambda: self.incarnation, rejoin=self._rejoin,
            audit=self._claims.audit, taken_over=self._taken_over,
        )  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> RouterNode:
        """Join the cluster (see the module docstring); returns the node."""
        await check_eviction(self._redis, self.config.allow_eviction)
        await self.registry.register(self.node_id, self.incarnation)
        await self._claim()
        self._supervisor.start("heartbeat", self.liveness.run)  # (a start may outlast the TTL)
        await self._inbox.open()
        await self._sync.start(self._supervisor)
        self._writer.start()
        self._retainer.start()
        await self._adoption.adopt_own()  # (before its inbox's backlog is read)
        self._supervisor.start("inbox", self._inbox.run)
        await self._sync.announce()
        if self._traffic is not None:
            self._traffic.start()
        self._running = True
        return self

    async def _claim(self) -> None:
        claim = await self.routes.claim(self.node_id, self.incarnation, self.sessions.routes())
        self._generation = claim.generation
        self.mirror.load(self.node_id, claim.generation, 0, self.sessions.routes())
        self._visibility.written(claim.generation, 0)

    async def stop(self) -> None:
        """Leave gracefully: remove this node's routes, deregister, announce, close."""
        if not self._running:
            return
        self._running = False
        await self._supervisor.stop()
        await self._writer.stop()
        await self._retainer.stop()
        await self._forwarder.stop()
        await self._inbox.stop()
        await self._keeper.stop()
        try:
            await self.registry.purge(self.node_id, self.incarnation)
            await self._sync.announce()
        finally:
            await self._sync.stop()
            for client_id in self.sessions.clients():
                self.sessions.disconnect(client_id)
                await self._policy.detached(client_id, "node_stopped")
            if self._traffic is not None:
                await asyncio.to_thread(self._traffic.close)

    @property
    def running(self) -> bool:
        """True between a successful start and stop, unless another process took the id."""
        return self._running and not self._taken_over.is_set()

    async def wait_taken_over(self) -> None:
        """Return when another process registered this node id (this one must end)."""
        await self._taken_over.wait()

    async def __aenter__(self) -> RouterNode:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _rejoin(self) -> None:
        """The others purged this node (it missed heartbeats), or Redis lost its keys: join
        again as a new incarnation, and write back what Redis lost of the sessions here
        (:mod:`router.cluster.restoration`)."""
        log.warning("node %s was purged as dead; registering again", self.node_id)
        self.incarnation = uuid.uuid4().hex
        self._writer.incarnation = self.incarnation
        await self.registry.register(self.node_id, self.incarnation)
        await self._claim()
        await self._sync.announce()
        self.sessions_restored += await restore_sessions(
            self._claims, self.sessions, self.subscriptions, self.session_store, self._keeper
        )

    def _on_routes_applied(self, changes: list[RouteChange]) -> None:
        if changes and self._generation is not None:
            self._visibility.written(self._generation, changes[-1].version)
        if not self.mirror.apply(self.node_id, self._generation, changes):
            self.mirror.load(
                self.node_id,
                self._generation,
                changes[-1].version if changes else 0,
                self.sessions.routes(),
            )

    async def _on_routes_claimed(self, generation: str) -> None:
        self._generation = generation
        self.mirror.load(self.node_id, generation, 0, self.sessions.routes())
        self._visibility.written(generation, 0)

    # -- clients ---------------------------------------------------------------------

    async def connect(
        self,
        client_id: str,
        username: str | None = None,
        password: str | bytes | None = None,
        *,
        clean_start: bool = True,
        expiry: int = 0,
        protocol: int = 0,
        keepalive: int = 0,
        authenticate: bool = True,
    ) -> bool:
        """Attach a client to this node; returns whether a session was present.

        ``client.authenticate`` hooks judge the credentials (none registered: everyone is
        accepted); a refusal raises :class:`NotAuthorizedError` and changes nothing. An
        attached client that connects again is authenticated again and keeps its session.
        With ``clean_start`` earlier state is dropped; without it a session kept for the
        client (on this node or another) goes on here: its subscriptions, and what was
        queued for it first (:mod:`router.cluster.session_keeper`). ``expiry`` is the
        Session Expiry Interval (0: the session ends with the connection). A session that
        another node served is taken over: that node gets a notice in its inbox.
        ``authenticate=False``: the node resumes a stored session itself (see Policy.authenticate).

        One connect or put away of a client at a time on a node (:attr:`client_locks`).
        A connect that fails (Redis failed: CONNACK 0x88) leaves no client attached: one
        that failed before its claim closes what it opened here; after it, the session
        stays here, away, with what its resume had got, and the next connect goes on
        with it (:meth:`SessionKeeper.come_back
        <router.cluster.session_keeper.SessionKeeper.come_back>`).
        """
        check_id(client_id, "client id")
        async with self.client_locks.hold(client_id):
            return await self._connect(
                client_id, username, password, clean_start, expiry, protocol, keepalive,
                authenticate,
            )  # fmt: skip

    async def _connect(
        self,
        client_id: str,
        username: str | None,
        password: str | bytes | None,
        clean_start: bool,
        expiry: int,
        protocol: int,
        keepalive: int,
        authenticate: bool,
    ) -> bool:
        client = await self._policy.authenticate(client_id, username, password, authenticate)
        await self._keeper.handing_off(client_id)  # (a session that just left: it is back)
        profile = (protocol, keepalive, username)
        session = self.sessions.find(client_id)
        if session is not None and client_id in self._claims:
            if not session.away:
                session.expiry = expiry
                await self._policy.attached(client, new=False)
                return True
            if clean_start:
                await self.disconnect(client_id)
            else:
                session.profile = profile  # (the ACL judges by it)
                await self._keeper.settle(client_id, publish_will=False, wait_tail=False)
                await self._take_on(session, expiry, profile)
                await self._policy.attached(client, new=False)
                return True
        try:
            session, claimed, info, recovery = await self._claim_here(
                client_id, clean_start, profile
            )
        except BaseException:
            await self._drop_unclaimed(client_id)  # (the retry starts afresh)
            raise
        session.expiry = expiry
        await self._take_on(session, expiry, profile, claimed, info, recovery)
        await self._policy.attached(client, new=claimed is not None)
        return info is not None

    async def _claim_here(
        self, client_id: str, clean_start: bool, profile: tuple[int, int, str | None]
    ) -> tuple[ClientSession, Claimed | None, SessionInfo | None, Recovery | None]:
        """Open the client's session here and claim it (with its stored subscriptions
        and routes, unless ``clean_start``); returns the session, the new claim (None:
        held already), the stored description and the mark of its old node's inbox."""
        if clean_start:
            await self._drop_unclaimed(client_id)  # (what a handoff kept here)
            claimed = await self._claims.claim(client_id)
            return self.sessions.open(client_id), claimed, None, None
        info = await self.session_store.describe(client_id)
        if info is None:
            await self._drop_unclaimed(client_id)
        session = self.sessions.open(client_id, profile)
        if info is not None and info.node_id != self.node_id:
            session.hold()  # (until what its node sends ahead of them has come)
        if info is not None:
            stored = await self.subscriptions.subscriptions(client_id)
            await self._write_routes(
                self._restore(client_id, {validate_filter(f): o for f, o in stored.items()})
            )
        recovery = await self._adoption.mark(info)
        claimed = await self._claims.claim(client_id, keep_state=info is not None)
        return session, claimed, info, recovery

    async def _take_on(
        self,
        session: ClientSession,
        expiry: int,
        profile: tuple[int, int, str | None],
        claimed: Claimed | None = None,
        info: SessionInfo | None = None,
        recovery: Recovery | None = None,
    ) -> None:
        """Resume the session the node just claimed (from ``info``, told to the previous
        owner), or start it, or (nothing claimed) go on with the one it holds; then mark
        it open. Should Redis fail, no client is attached: the next connect goes on."""
        client_id = session.client_id
        try:
            if claimed is None and session.away:
                await self._keeper.come_back(session, None, expiry)
            elif claimed is not None:
                await self._claims.notify_previous(client_id, claimed, resume=info is not None)
                if info is not None:
                    previous = claimed.previous
                    moved = previous is not None and previous.node_id != self.node_id
                    epoch = claimed.owner.epoch if moved else None
                    await self._keeper.come_back(session, epoch, expiry, info.awaiting_release,
                                                 previous, recovery)  # fmt: skip
                elif expiry:
                    await self._keeper.reset_queue(client_id, expiry)
            await self._mark_open(client_id, expiry, *profile)
        except BaseException:
            session.away = True
            raise

    def _restore(
        self, client_id: str, stored: dict[TopicFilter, SubscriptionOptions]
    ) -> list[CountChange]:
        """Make the client's local subscriptions those ``stored`` for its session (an away
        session kept here by a handoff may hold some it has dropped since); the route
        changes."""
        changes = self.sessions.restore(client_id, stored)
        for topic_filter in [
            f for f in self.sessions.trie.subscriptions(client_id) if f not in stored
        ]:
            _existed, change = self.sessions.unsubscribe(client_id, topic_filter)
            if change is not None:
                changes.append(change)
        return changes

    async def _drop_unclaimed(self, client_id: str) -> None:
        """Close a local session of the client that this node holds no claim for: the away
        session a handoff kept for a client back here (not resuming after all), or what
        a connect that failed before its claim opened. Its route changes are written when
        Redis takes them (the route writer keeps them)."""
        session = self.sessions.find(client_id)
        if session is not None and client_id not in self._claims:
            with contextlib.suppress(RouterError, RedisError):
                await self._handed(session)

    async def _mark_open(
        self, client_id: str, expiry: int, protocol: int, keepalive: int, username: str | None
    ) -> None:
        session, owner = self.sessions.find(client_id), self._claims.held(client_id)
        if session is not None:
            session.profile = (protocol, keepalive, username)
        if owner is not None:
            await self.session_store.mark_open(
                client_id, owner, expiry=expiry, protocol=protocol, keepalive=keepalive,
                username=username,
            )  # fmt: skip

    async def put_away(
        self,
        client_id: str,
        *,
        expiry: int | None = None,
        will: Outgoing | None = None,
        will_delay: int = 0,
    ) -> None:
        """The client's connection ended without ending its session: keep the session for
        its Session Expiry Interval (``expiry`` replaces it when given) and queue QoS 1/2
        messages for it; with a ``will``, publish it after ``will_delay`` seconds unless
        the client is back by then (or when the session ends, if sooner). A session with
        an interval of 0 ends now, as :meth:`disconnect` (and its will goes at once)."""
        async with self.client_locks.hold(client_id):
            await self._put_away(client_id, expiry, will, will_delay)

    async def _put_away(
        self, client_id: str, expiry: int | None, will: Outgoing | None, will_delay: int
    ) -> None:
        session = self.sessions.find(client_id)
        owner = self._claims.held(client_id)
        if session is None or owner is None or session.away:
            return
        if expiry is not None:
            session.expiry = expiry
        if not session.expiry:
            if will is not None:
                await self._dispatcher.publish(will)
            await self.disconnect(client_id)
            return
        try:
            await self._keeper.put_away(session, owner, will, will_delay)
        except SessionOwnershipError:
            log.warning("client %s was taken over while leaving", client_id)

    async def _end_session(self, client_id: str) -> None:
        """The Session Expiry Interval of an away session passed: end it."""
        owner = self._claims.release(client_id)
        await self._keeper.settle(client_id, publish_will=True)
        try:
            await self._close_session(client_id, "expired", owner)
        except SessionOwnershipError:
            log.info("session of %s ended in Redis already", client_id)

    async def _on_taken_over(self, client_id: str, notice: Takeover | None) -> None:
        """Another node claimed the session: close the local copy; when the session goes
        on there, hand on what this node holds and gathers for it in the handoff's grace
        (:meth:`SessionKeeper.hand_off <router.cluster.session_keeper.SessionKeeper.hand_off>`)."""
        session = self.sessions.find(client_id)
        if session is not None and notice is not None and notice.resume and session.expiry:
            leaving = self.sessions.hand_on(session)
            self._keeper.hand_off(session, leaving, notice.epoch, lambda: self._handed(leaving))
        else:
            changes = self.sessions.disconnect(client_id, "takenover")
            await self._keeper.settle(client_id, publish_will=True)
            await self._write_routes(changes)
        await self._policy.detached(client_id, "takenover")

    async def _handed(self, leaving: ClientSession) -> None:
        """A session handed on (its grace over): its filters and routes go from here."""
        if self.sessions.find(leaving.client_id) is leaving:
            changes = self.sessions.disconnect(leaving.client_id, "takenover")
            if self._running:
                await self._write_routes(changes)

    async def _on_notice(self, notice: Notice) -> None:
        if isinstance(notice, Kick):
            await self.kick(notice.client_id)
        else:
            await self._claims.on_notice(notice)

    def add_kicker(self, kicker: Callable[[str], bool]) -> None:
        """Register who can end a client's connection here (the MQTT server): called by
        :meth:`kick` with the client id, True when it ended a connection."""
        self._kickers.append(kicker)

    def remove_kicker(self, kicker: Callable[[str], bool]) -> None:
        self._kickers.remove(kicker)

    async def kick(self, client_id: str) -> bool:
        """End the client's connection on this node (an operator's kick); a client of the
        embedding API is disconnected. True when the client was here."""
        if any(kicker(client_id) for kicker in list(self._kickers)):
            return True
        if client_id in self._claims:
            await self.disconnect(client_id)
            return True
        return False

    async def subscribe(
        self, client_id: str, topic_filter: str, *, confirm: bool = True, **options: Any
    ) -> bool:
        """Subscribe a client (connecting it if needed); True if the subscription is new.

        Returns once the subscription is in Redis and in this node's trie and route
        mirror: a publish this node receives after the subscribe was admitted reaches the
        client (:class:`~router.cluster.visibility.ArrivalOrder`). With ``confirm`` (the
        default) it also waits until every other live node's route mirror holds the
        route, so that from then on a publish on any node reaches the client (bounded by
        the heartbeat TTL; see :mod:`router.cluster.visibility`); a caller making several
        subscriptions passes False and calls :meth:`confirm_routes` once.
        Raises :class:`InvalidTopicError` / :class:`InvalidOptionsError` and changes
        nothing on bad input, and :class:`NotAuthorizedError` (nothing changed either) if
        a ``client.subscribe`` hook or the ACL refuses it (see :mod:`router.cluster.policy`).
        Matching retained messages are queued for the client before it returns (retain
        handling 0/1/2; none for a shared subscription; see :mod:`router.cluster.retainer`).
        """
        checked = validate_filter(topic_filter)  # the one validation (see router.core.topics)
        opts = make_options(**options)
        if self._policy.guards_subscribe:
            checked, opts = await self._policy.admit_subscribe(client_id, checked, opts)
        if opts.no_local and parse_shared(checked) is not None:
            raise InvalidOptionsError("a shared subscription cannot set no_local (MQTT-3.8.3-4)")
        with self._arrivals.applying():
            owner = self._claims.held(client_id)
            if owner is None:
                await self.connect(client_id)
                owner = self._claims.held(client_id)
            await self.subscriptions.write_subscriptions(client_id, [(checked, opts)], owner=owner)
            is_new, change = self.sessions.subscribe(client_id, checked, opts)
            if change is not None:
                await self._write_routes([change])
        if confirm:
            await self._visibility.confirm()
        await self._retainer.on_subscribe(
            client_id, checked, opts, is_new, self._policy.delivery_observer
        )
        return is_new

    async def confirm_routes(self) -> bool:
        """Wait until every other live node's route mirror holds the routes this node
        wrote so far (bounded by the heartbeat TTL); False when that bound passed first
        (counted as ``subscribe_unconfirmed``)."""
        return await self._visibility.confirm()

    async def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        """Remove one subscription; True if the client had it. A publish this node
        receives after the unsubscribe was admitted does not reach it."""
        checked = validate_filter(topic_filter)
        owner = self._claims.held(client_id)
        if owner is None:
            return False
        kept = await self._policy.admit_unsubscribe(client_id, checked)
        if kept is None:
            return False
        with self._arrivals.applying():
            await self.subscriptions.delete_subscriptions(client_id, [kept], owner=owner)
            existed, change = self.sessions.unsubscribe(client_id, kept)
            if change is not None:
                await self._write_routes([change])
        return existed

    async def disconnect(self, client_id: str) -> None:
        """End the client's session: its subscriptions end, its queue closes, its state
        (a persistent session's queue too) is removed."""
        owner = self._claims.release(client_id)
        await self._keeper.settle(client_id, publish_will=True)
        await self._close_session(client_id, "normal", owner)

    async def _close_session(self, client_id: str, reason: str, owner: Owner | None) -> None:
        """Close the local session and write the route changes; with ``owner``, also
        remove the client's state from Redis (fenced by that claim)."""
        session = self.sessions.find(client_id)
        changes = self.sessions.disconnect(client_id, reason)
        written = asyncio.ensure_future(self._write_routes(changes))
        if owner is not None:
            await self.subscriptions.remove_client(client_id, owner=owner)
            if session is not None and session.expiry:
                await self._keeper.reset_queue(client_id, 1)  # (gone with the session)
        await written
        await self._policy.detached(client_id, reason)

    async def _write_routes(self, changes: list[tuple[TopicFilter, int]]) -> None:
        if changes:
            await asyncio.gather(*(self._writer.submit(r, c) for r, c in changes))
            await self._sync.announce()

    def serves(self, client_id: str) -> bool:
        """True while this node holds the client's session (its claim in Redis)."""
        return client_id in self._claims

    def messages(self, client_id: str) -> AsyncIterator[Delivery]:
        """The client's deliveries, in order, until it disconnects."""
        return self.sessions.session(client_id).__aiter__()

    # -- publishing ------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        qos: int = 0,
        retain: bool = False,
        publisher: str | None = None,
        expiry_interval: int | None = None,
        properties: MessageProperties | None = None,
    ) -> PublishResult:
        """Route a message to every interested client in the cluster.

        Returns once every remote copy is stored in its node's inbox. Raises
        :class:`InvalidTopicError` for an invalid topic and ``TypeError``/``ValueError``
        for a payload that is not bytes or a QoS outside 0..2, and
        :class:`NotAuthorizedError` if the ACL denies the ``publisher``; nothing is sent
        then. A ``message.publish`` hook may rewrite or stop the message (stopped: a
        result with no nodes); see :mod:`router.cluster.policy`. With ``retain`` the
        message also becomes the topic's retained message (an empty payload deletes it).
        ``expiry_interval`` (seconds; None: never) is the MQTT 5 Message Expiry Interval:
        a copy not delivered by then is dropped, on any node, and a retained message
        expires. ``properties`` (MQTT 5) travel with the message to every subscriber.
        """
        outgoing = Outgoing(topic, payload, qos, retain, publisher, expiry_interval, properties)
        return await self._dispatcher.publish(outgoing)

    async def publish_many(self, items: Iterable[Outgoing]) -> list[PublishResult]:
        """Publish a batch: like :meth:`publish` per item, with one inbox write per node.

        Every item is validated (and checked by the ACL) before anything is sent. Returns
        one result per item.
        """
        return await self._dispatcher.publish_many(items)

    # -- repair ----------------------------------------------------------------------

    async def reconcile(self, repair: bool = True) -> Reconciliation:
        """Compare the node's route set in Redis with what its local clients need.

        ``missing``: routes the clients need that Redis lacks (or with another count);
        ``stale``: routes in Redis that no local client needs. With ``repair`` and any
        difference, the node claims its route set again with exactly what it needs
        (readers resync from the new generation). Returns what was found.
        """
        found = await self._writer.reconcile(repair)
        if found.repaired:
            await self._sync.announce()
        return found

    def health(self) -> dict[str, Any]:
        """``ok`` while the node claims liveness, and its tasks failing now."""
        return self.liveness.health()

    def stats(self) -> dict[str, int]:
        """Counters of this node since it started."""
        return {
            **self._dispatcher.stats(),
            **self._forwarder.stats(),
            **self._inbox.stats(),
            "queue_drops": self.sessions.dropped(),
            "acl_denied_deliveries": self.sessions.acl_denied(),
            "sessions_taken_over": self._claims.taken_over,
            "sessions_restored": self.sessions_restored,
            "mirror_resyncs": self._sync.resyncs,
            "nodes_purged": self._sync.purged,
            "sessions_adopted": self._adoption.sessions_adopted,
            "copies_recovered": self._adoption.copies_recovered,
            "routes": len(self.sessions.routes()),
            "route_batches_failed": self._writer.failed_batches,
            "redis_errors": redis_errors(self._redis),
            **self._supervisor.stats(),
            "heartbeats_withheld": self.liveness.beats_withheld,
            "route_changes_unwritten": self._writer.unwritten,
            **self._retainer.stats(),
            **self._keeper.stats(),
            **self._visibility.stats(),
            **(self._traffic.stats() if self._traffic is not None else {}),
            **cache_counters("route_cache", self.mirror.cache_stats()),
            **cache_counters("local_cache", self.sessions.cache_stats()),
        }
