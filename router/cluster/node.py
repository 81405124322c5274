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
   its routes until every mirror routes it to the new node, within the heartbeat TTL,
   for copies sent by mirrors that had not caught up: :mod:`router.cluster.sessions.move_fence`)
   and reports reason ``takenover``.
   Should a notice be lost, each heartbeat also audits the claims of local sessions
   (:mod:`router.cluster.sessions.claims`). A session with a Session Expiry Interval outlives
   its connection (:meth:`RouterNode.put_away`) and resumes on any node, what was
   queued for it first (:mod:`router.cluster.sessions`).
5. ``stop``: a node that holds no persistent session removes its routes, deregisters
   and announces; other nodes drop its routes. One that holds persistent sessions
   (connected or away) *retires* instead (:mod:`router.cluster.departure`): it is not
   alive from then on, the routes of those sessions stay (copies for them go to its
   inbox), and it tells the others, one of which adopts its sessions at once and purges
   it, as a dead node's (:mod:`router.cluster.sessions.adoption`), not told down. Before
   it stops, a node may let the moves of sessions under way finish
   (:meth:`RouterNode.moves_done`).
   A node that dies instead is purged by the others once its heartbeat expires; its inbox
   keeps messages until the channel TTL, for a restart under the same node id.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any

from router.cluster.alarms import Alarms
from router.cluster.config import NodeConfig
from router.cluster.delivery_acl import Narrowing
from router.cluster.departure import leave
from router.cluster.dispatcher import Dispatcher
from router.cluster.events import EventReporter
from router.cluster.forwarding import Forwarder, InboxReader
from router.cluster.inbox import Drain, Kick, Notice, Reload
from router.cluster.liveness import Liveness
from router.cluster.membership import Membership
from router.cluster.mirror_sync import MirrorSync
from router.cluster.policy import Policy
from router.cluster.reloads import Reloads
from router.cluster.retainer import Retainer
from router.cluster.route_fence import RouteFence
from router.cluster.route_writer import Reconciliation, RouteWriter
from router.cluster.sessions.adoption import Adoption
from router.cluster.sessions.lifecycle import SessionLifecycle
from router.cluster.sessions.local_sessions import LocalSessions
from router.cluster.sessions.move_fence import MoveFence
from router.cluster.sessions.states import SessionEvent, disagreements
from router.cluster.supervisor import Supervisor
from router.cluster.tracing import Tracer
from router.cluster.traffic_log import TrafficLog
from router.cluster.visibility import ArrivalOrder, ForwardsInFlight, RouteVisibility
from router.core.acl import Acl
from router.core.guid import GuidGenerator, node_part_for
from router.core.hooks import Decision, HookRegistry
from router.core.hot_topics import cache_counters
from router.core.messages import Delivery, MessageProperties, Outgoing, PublishResult
from router.core.options import make_options
from router.core.route_mirror import RouteMirror
from router.core.topics import TopicFilter, parse_shared, validate_filter
from router.errors import InvalidOptionsError, NotAuthorizedError, StateError
from router.state.connection import (
    check_eviction,
    failovers_followed,
    replicas_behind,
    urgent_client,
)
from router.state.event_log import EventLog
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.reads import command
from router.state.retained_store import RetainedStore
from router.state.route_acks import RouteAcks
from router.state.route_fence_channel import RouteFences
from router.state.routes import RouteChange, RouteStore
from router.state.scripts import RedisClient, redis_errors
from router.state.subscriptions import Owner, SubscriptionStore
from router.state.trace_store import TraceStore

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
            queue_bytes=config.queue_bytes,
            match_cache=config.match_cache,
            acl=config.acl,
        )
        self.hooks = HookRegistry()  # see router.cluster.policy for what the node runs where
        self._policy = Policy(self.hooks, config.acl, self.sessions)
        self.mirror = RouteMirror(config.strategy(), cache=config.match_cache)
        self.arrivals = ArrivalOrder()  # (see router.cluster.visibility)
        self.forwards = ForwardsInFlight()
        acks = RouteAcks(redis, self.keys)
        self._visibility = RouteVisibility(
            acks,
            self.node_id,
            self._live_peers,
            config.heartbeat_ttl,
            know_peers=lambda: self._sync.ensure_current(),  # noqa: PLW0108 (made below)
        )
        self.events = EventReporter(EventLog(redis, self.keys), self.node_id)
        self.reloads = Reloads(self.events, self.node_id)  # (router.ops.node_process installs)
        #: Set when ``router node drain`` asked this node to drain (who: ``drain_asked_by``);
        #: the process that runs the node drains it (router.ops.draining) and stops it.
        self.drain_asked = asyncio.Event()
        self.drain_asked_by = ""
        self._sync = MirrorSync(
            redis,
            self.keys,
            self.routes,
            self.registry,
            self.mirror,
            self.node_id,
            config.heartbeat_interval,
            self.internal_error,
            may_purge=lambda: self.liveness.steady(),  # noqa: PLW0108 (made below)
            on_ack=self._visibility.on_ack,
            forwards=self.forwards,
            on_fence=lambda data: self._fence.heard(data),  # noqa: PLW0108 (made below)
        )
        self._membership = Membership(
            self.registry,
            self._sync,
            self.node_id,
            config.heartbeat_interval,
            may_purge=lambda: self.liveness.steady(),  # noqa: PLW0108 (made below)
            may_adopt_retired=lambda: self._running,
            adopt_sessions=lambda dead: self._adoption.adopt(dead),  # noqa: PLW0108 (made below)
            events=self.events if config.events else None,
        )
        self._fence = RouteFence(
            RouteFences(redis, self.keys),
            self.node_id,
            self.arrivals,
            self._fenced_peers,
            self._sync.caught_up,
            config.heartbeat_ttl,
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
        self._kickers: list[Callable[[str], bool]] = []
        self.retained = RetainedStore(redis, self.keys, config.retained)
        self._retainer = Retainer(self.retained, self.sessions)
        self._traffic = (
            TrafficLog(config.traffic_dir, self.node_id, sample=config.traffic_sample)
            if config.traffic_dir
            else None
        )
        self.tracer = Tracer(TraceStore(redis, self.keys), self.node_id)
        self._dispatcher = Dispatcher(
            self.node_id,
            GuidGenerator(node_part_for(self.node_id, self.incarnation)),
            self.mirror,
            self.sessions,
            self._forwarder,
            self._policy,
            self._retainer,
            self._traffic,
            self.arrivals,
            config.publish_timeout,
            self.forwards,
            self.tracer,
        )
        self._lifecycle = SessionLifecycle(
            redis,
            self.keys,
            config,
            self.sessions,
            self.subscriptions,
            self._policy,
            self._forwarder,
            write_routes=self._write_routes,
            publish_will=self._dispatcher.publish,
            running=lambda: self._running,
            is_dead=lambda node_id: node_id in self._membership.dead,
            fence=MoveFence(
                self.subscriptions,
                self.routes,
                acks,
                self.mirror,
                self._live_peers,
                lambda seconds: self._inbox.read_through(seconds),  # noqa: PLW0108 (made below)
                lambda: self._sync.ensure_current(),  # noqa: PLW0108 (made below)
            ).passed,
        )
        self._claims, self._keeper = self._lifecycle.claims, self._lifecycle.keeper
        self.session_store = self._lifecycle.store
        self._adoption = Adoption(
            self._lifecycle, self.confirm_routes, self.forwards.settled, config.handoff_grace
        )
        self._inbox = InboxReader(
            redis,
            self.keys,
            self.node_id,
            config.inbox_expire,
            self._dispatcher.dispatch,
            self._on_notice,
            poll=config.inbox_poll,
        )
        self.inbox_backlog = self._inbox.backlog  # (read by the metrics endpoint)
        self._claims.notices_heard = lambda: self._inbox.listening
        self.publish_latency = self._dispatcher.latency
        self.filter_traffic = self._dispatcher.filter_traffic  # (read by the telemetry)
        self._generation: str | None = None
        self._running = False
        self._taken_over = asyncio.Event()
        self._supervisor = Supervisor(self.node_id, grace=config.heartbeat_ttl)
        self._urgent = urgent_client(redis)  # (beats never wait behind a busy pool)
        self.liveness = Liveness(
            self.node_id,
            NodeRegistry(self._urgent, self.keys, ttl=config.heartbeat_ttl, routes=self.routes),
            self._supervisor,
            config.heartbeat_interval,
            config.heartbeat_ttl,
            incarnation=lambda: self.incarnation,
            rejoin=self._rejoin,
            audit=self._claims.audit,
            taken_over=self._taken_over,
        )
        self._alarms = Alarms(
            self.events,
            self.node_id,
            self.stats,
            lambda: command(redis, "PING"),
            self.sessions.most_dropped,
        )

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> RouterNode:
        """Join the cluster (see the module docstring); returns the node."""
        await check_eviction(self._redis, self.config.allow_eviction)
        registered = await self.registry.register(self.node_id, self.incarnation)
        await self._claim()
        self._supervisor.start("heartbeat", self.liveness.run)  # (a start may outlast the TTL)
        await self._inbox.open()
        await self._sync.start(self._supervisor)
        self._membership.start(self._supervisor)
        self._writer.start()
        self._retainer.start(self._supervisor)
        await self._adoption.adopt_own()  # (before its inbox's backlog is read)
        self._supervisor.start("inbox", self._inbox.run)
        self._supervisor.start("traces", self.tracer.run)
        await self._sync.announce()
        if self._traffic is not None:
            self._traffic.start()
        if self.config.events:
            self._tell_started(registered.previous_incarnation)
        self._running = True
        return self

    def _tell_started(self, previous: str | None) -> None:
        self._supervisor.start("events", self.events.run)
        self._supervisor.start("alarms", self._alarms.run)
        again = "" if previous is None else ", before its previous incarnation was purged"
        self.events.tell("node_up", self.node_id, f"node {self.node_id} started{again}")

    async def _claim(self) -> None:
        claim = await self.routes.claim(self.node_id, self.incarnation, self.sessions.routes())
        self._generation = claim.generation
        self.mirror.load(self.node_id, claim.generation, 0, self.sessions.routes())
        self._visibility.written(claim.generation, 0)

    async def stop(self) -> None:
        """Leave gracefully: remove this node's clean sessions; then remove its routes,
        deregister and announce, or, holding persistent sessions, retire and tell the
        others, one of which adopts them (see the module docstring); close."""
        if not self._running:
            return
        self._running = False
        if self.config.events:
            count = len(self._lifecycle.persistent())
            left = f": {count} persistent sessions left for a live node to adopt" if count else ""
            self.events.tell("node_stopped", self.node_id, f"node {self.node_id} stopped{left}")
            await self.events.flush()
        await self._supervisor.stop()
        await self._membership.stop_adopting()  # (before what an adoption uses stops)
        await self._writer.stop()
        await self._retainer.stop()
        await self._forwarder.stop()
        await self._inbox.stop()
        await self._fence.stop()
        await self._lifecycle.locks.stop()
        await self._keeper.stop()
        try:
            try:
                await self._lifecycle.remove_clean()
            except StateError as error:  # (the registry's purge below may still go)
                log.warning("clean sessions of node %s not removed: %s", self.node_id, error)
            except Exception as error:  # (a bug: told as one; leaving goes on)
                self.internal_error("removing the clean sessions on stop", error)
            held = self._lifecycle.persistent()  # (their routes stay, for their adoption)
            kept = self.sessions.routes_of(held) if held else None
            await leave(self.registry, self._sync, self.node_id, self.incarnation, kept)
        finally:
            await self._sync.stop()
            for client_id in self.sessions.clients():
                self.sessions.disconnect(client_id, event=SessionEvent.NODE_STOPPED)
                await self._policy.detached(client_id, "node_stopped")
            if self._traffic is not None:
                await asyncio.to_thread(self._traffic.close)
            await self.close_urgent()

    async def moves_done(self, timeout: float) -> bool:
        """Wait until the moves of sessions under way on this node have finished, with
        their grace (a handoff to the node a client reconnected to, the tail of a session
        moving here), at most ``timeout`` seconds; True when none is left. A drain calls
        it before :meth:`stop`, which cuts the graces short."""
        return await self._keeper.moves_done(timeout)

    async def close_urgent(self) -> None:
        """Close the heartbeat's own Redis client (when it is not the node's)."""
        if self._urgent is not self.registry.redis:
            await self._urgent.aclose()

    @property
    def running(self) -> bool:
        """True between a successful start and stop, unless another process took the id."""
        return self._running and not self._taken_over.is_set()

    @property
    def policy(self) -> Policy:
        """How the node runs its hooks and the ACL (the gate of every publish)."""
        return self._policy

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
        (:mod:`router.cluster.sessions.restoration`)."""
        log.warning("node %s was purged as dead; registering again", self.node_id)
        self.incarnation = uuid.uuid4().hex
        self._writer.incarnation = self.incarnation
        await self.registry.register(self.node_id, self.incarnation)
        await self._claim()
        await self._sync.announce()
        await self._lifecycle.restore()

    def _live_peers(self) -> list[str]:
        """The nodes this node's mirror follows that it does not take for dead (itself too)."""
        return [n for n in self.mirror.nodes() if n not in self._membership.dead]

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
        queued for it first. ``expiry`` is the Session Expiry Interval (0: the session
        ends with the connection). A session that another node served is taken over:
        that node gets a notice in its inbox. ``authenticate=False``: the credentials
        were judged already (:meth:`admit_connect`), or the node resumes a stored session
        itself (see Policy.authenticate). A session that belongs to another user is
        refused (:class:`SessionUserError`) unless the node shares sessions between users
        (``NodeConfig.shared_sessions``). A connect that fails (Redis
        failed: CONNACK 0x88) leaves no client attached, and the next connect goes on
        from where it stopped (:mod:`router.cluster.sessions.lifecycle`).
        """
        return await self._lifecycle.connect(
            client_id,
            username,
            password,
            clean_start=clean_start,
            expiry=expiry,
            protocol=protocol,
            keepalive=keepalive,
            authenticate=authenticate,
        )

    async def admit_connect(
        self,
        client_id: str,
        username: str | None = None,
        password: str | bytes | None = None,
        *,
        will_topic: str | None = None,
    ) -> Decision:
        """Judge a connecting client before it changes anything (a listener calls it
        first, then :meth:`connect` with ``authenticate=False``): its credentials
        (``client.authenticate`` hooks), that a session this node holds under its id is
        its user's (the claim checks the same in Redis for one held elsewhere), and that
        its will may be published (not under ``$SYS/``, allowed by the ACL). Returns the
        accepting decision: its ``expires_at`` (None: never) is when the credentials stop
        being valid, and the listener ends the connection then. Raises
        :class:`NotAuthorizedError` (:class:`SessionUserError` for another user's
        session); changes nothing."""
        check_id(client_id, "client id")
        client, decision = await self._policy.credentials(client_id, username, password)
        self._lifecycle.check_user(client_id, username)
        if will_topic is not None:
            await self._policy.admit_sender(client, will_topic)
        return decision

    def narrow_receiving(self, narrowing: Narrowing) -> None:
        """Judge every copy for a local client also by that client's own rules
        (``narrowing``: a JWT's ``acl`` claim), which only narrow what the node's ACL
        allows (:mod:`router.cluster.delivery_acl`)."""
        self._policy.screen_deliveries(self.sessions.narrow(narrowing))

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
        await self._lifecycle.put_away(client_id, expiry=expiry, will=will, will_delay=will_delay)

    async def disconnect(self, client_id: str) -> None:
        """End the client's session: its subscriptions end, its queue closes, its state
        (a persistent session's queue too) is removed."""
        await self._lifecycle.disconnect(client_id)

    def serves(self, client_id: str) -> bool:
        """True while this node holds the client's session (its claim in Redis)."""
        return self._lifecycle.serves(client_id)

    def claim_of(self, client_id: str) -> Owner | None:
        """The claim this node holds on the client's session now (None: none); what a
        write of the client's state here is fenced with."""
        return self._claims.held(client_id)

    def settling(self, client_id: str) -> bool:
        """Whether a step of the client's session (a connect, a put away, an adoption)
        runs or waits here now; :meth:`settled` waits for it."""
        return client_id in self._lifecycle.locks

    async def settled(self, client_id: str) -> None:
        """Wait until the steps of the client's session under way here have run."""
        await self._lifecycle.locks.released(client_id)

    def admitting(self, client_id: str) -> AbstractAsyncContextManager[None]:
        """Held by a listener from its takeover of the client's connection here to the
        attach of the new one: CONNECTs of one client id on this node are answered one at
        a time (a second one waits, then takes the first over: MQTT-3.1.4-3), never both
        attached to the one session."""
        return self._lifecycle.admissions.hold(client_id)

    async def _on_notice(self, notice: Notice) -> None:
        if isinstance(notice, Kick):
            await self.kick(notice.client_id)
        elif isinstance(notice, Reload):
            self.reloads.reload(f"asked by {notice.asked_by}")
        elif isinstance(notice, Drain):
            self.drain_asked_by = notice.asked_by
            self.drain_asked.set()
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
        with self.arrivals.applying():
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

    def replace_acl(self, acl: Acl) -> None:
        """Judge publishes, subscribes and every copy on its way to a client with ``acl``
        from now on, in place of the ACL the node started with (``NodeConfig.acl``;
        :class:`AclRuleError` when it started without one). Subscriptions held stay;
        what they bring is judged by the new ACL (:mod:`router.cluster.delivery_acl`)."""
        self._policy.replace_acl(acl)
        self.sessions.replace_acl(acl)

    def _fenced_peers(self) -> list[str]:
        """The peers a route fence asks: every mirrored node alive but this one."""
        dead = self._membership.dead
        return [n for n in self.mirror.nodes() if n != self.node_id and n not in dead]

    async def catch_up_routes(self) -> None:
        """Return once every subscription any live peer had read before the call is in
        this node's route mirror (bounded: :mod:`router.cluster.route_fence`), so that it
        applies to a publish this node handles after it. Never raises."""
        await self._fence.passed()

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
        with self.arrivals.applying():
            await self.subscriptions.delete_subscriptions(client_id, [kept], owner=owner)
            existed, change = self.sessions.unsubscribe(client_id, kept)
            if change is not None:
                await self._write_routes([change])
        return existed

    async def _write_routes(self, changes: list[tuple[TopicFilter, int]]) -> None:
        if not changes:
            return
        if len(changes) == 1:  # (a subscribe's one change: nothing to gather)
            await self._writer.submit(*changes[0])
        else:
            await asyncio.gather(*(self._writer.submit(r, c) for r, c in changes))
        self._sync.announce_soon()  # (the hint is a hint: the change is durable already)

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
        arrived_before: int | None = None,
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
        The subscription changes admitted before it (:attr:`arrivals`) apply to it first;
        ``arrived_before`` limits that to those numbered below it (a listener's connection
        passes its own oldest change still open: see
        :class:`~router.cluster.visibility.ArrivalOrder`).
        """
        outgoing = Outgoing(topic, payload, qos, retain, publisher, expiry_interval, properties)
        return await self._dispatcher.publish(outgoing, arrived_before)

    async def publish_many(
        self, items: Iterable[Outgoing], arrived_before: int | None = None
    ) -> list[PublishResult]:
        """Publish a batch: like :meth:`publish` per item, with one inbox write per node.

        Every item is validated, and checked by the ACL up to the first it denies, before
        anything is sent: an invalid or denied item refuses the whole batch (raised as by
        :meth:`publish`). Returns one result per item.
        """
        return await self._dispatcher.publish_many(items, arrived_before)

    async def publish_each(
        self, items: Iterable[Outgoing], arrived_before: int | None = None
    ) -> Sequence[PublishResult | NotAuthorizedError]:
        """Publish a batch whose items the ACL judges one by one, as :meth:`publish` would
        each alone, with one inbox write per node for those it allows (what an MQTT
        listener does with the PUBLISH packets of one read).

        Returns per item its result, or the :class:`NotAuthorizedError` :meth:`publish`
        would have raised for it (denied by the ACL, reported once to ``message.dropped``;
        or under ``$SYS/``): that item is not sent, the others are. The ACL is asked once
        per item. An invalid item refuses the whole batch as in :meth:`publish_many`
        (raised before any hook runs); nothing is sent then.
        """
        return await self._dispatcher.publish_each(items, arrived_before)

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

    def internal_error(self, where: str, error: BaseException) -> None:
        """Count and log a bug caught by a loop that goes on (see
        :meth:`Supervisor.caught <router.cluster.supervisor.Supervisor.caught>`)."""
        self._supervisor.caught(where, error)

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
            "sessions_restored": self._lifecycle.sessions_restored,
            "session_machine_disagreements": disagreements(),
            "mirror_resyncs": self._sync.resyncs,
            "nodes_purged": self._membership.purged,
            "sessions_adopted": self._adoption.sessions_adopted,
            "dead_clean_sessions_removed": self._lifecycle.clean_sessions_removed,
            "adoption_last_finished_ms": self._adoption.last_finished_ms,
            "adoption_last_took_ms": self._adoption.last_took_ms,
            "copies_recovered": self._lifecycle.copies_recovered,
            "routes": len(self.sessions.routes()),
            "route_batches_failed": self._writer.failed_batches,
            "redis_errors": redis_errors(self._redis),
            "redis_failovers_followed": failovers_followed(self._redis),
            "redis_replicas_behind": replicas_behind(self._redis),
            **self._supervisor.stats(),
            "heartbeats_withheld": self.liveness.beats_withheld,
            "route_changes_unwritten": self._writer.unwritten,
            **self._retainer.stats(),
            **self._keeper.stats(),
            **self._visibility.stats(),
            **self._fence.stats(),
            **self.events.stats(),
            **self.reloads.stats(),
            **self.tracer.stats(),
            **(self._traffic.stats() if self._traffic is not None else {}),
            **cache_counters("route_cache", self.mirror.cache_stats()),
            **cache_counters("local_cache", self.sessions.cache_stats()),
        }
