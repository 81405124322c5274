"""A router node: local clients, the cluster's route mirror, and forwarding between nodes.

Life of a node (one process, one *incarnation*):

1. ``start``: register in the node registry, claim its route set (which drops the routes
   of its own previous incarnation), open its inbox, load every live node's routes into
   the mirror, announce itself, then heartbeat every ``heartbeat_interval``.
2. Subscribe: the client's subscription goes to Redis (client state, atomic per client),
   then into the local trie; when the node's count for the route goes 0 -> 1 (or a share
   group's member count changes) the route change is written to the node's route set and
   ``subscribe`` returns only once it is durable there. Every other node learns it from a
   hint plus the node's change stream.
3. Publish: match the mirror; deliver locally; send exactly one copy to each other
   interested node's inbox (batched); ``publish`` returns when every copy is stored.
   Each share group gets exactly one member cluster-wide: the mirror picks the node.
4. A client that connects to another node is taken over (MQTT-3.1.4-3): the new node
   claims the session and leaves a takeover notice in the old node's inbox, which drops
   its local copy of the session (its routes with it) and reports reason ``takenover``.
   Should a notice be lost, each heartbeat also audits the claims of local sessions
   (:mod:`router.cluster.claims`).
5. ``stop``: remove its routes, deregister, announce; other nodes drop its routes.
   A node that dies instead is purged by the others once its heartbeat expires; its inbox
   keeps messages until the channel TTL, for a restart under the same node id.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from router.cluster.claims import SessionClaims
from router.cluster.config import NodeConfig
from router.cluster.forwarding import Forwarder, InboxReader
from router.cluster.inbox import Forward
from router.cluster.local_sessions import LocalSessions
from router.cluster.mirror_sync import MirrorSync
from router.cluster.policy import Policy
from router.cluster.retainer import Retainer
from router.cluster.route_writer import RouteWriter
from router.cluster.tasks import stop_task
from router.cluster.traffic_log import TrafficLog
from router.core.guid import GuidGenerator, node_part_for
from router.core.hooks import HookRegistry
from router.core.hot_topics import cache_counters
from router.core.messages import (
    Delivery,
    Message,
    MessageProperties,
    Outgoing,
    PublishResult,
)
from router.core.options import make_options
from router.core.route_mirror import RouteMirror
from router.core.sharing import LocalFirstStrategy, ShareStrategy, strategy_by_name
from router.core.topics import TopicFilter, parse_shared, validate_filter, validate_topic
from router.errors import (
    InvalidOptionsError,
    NodeNotRegisteredError,
    StaleIncarnationError,
)
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.retained_store import RetainedStore
from router.state.routes import RouteChange, RouteStore
from router.state.scripts import RedisClient
from router.state.subscriptions import Owner, SubscriptionStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reconciliation:
    """What :meth:`RouterNode.reconcile` found (and whether it repaired it)."""

    node_id: str
    missing: dict[TopicFilter, int]
    stale: list[TopicFilter]
    repaired: bool


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
            self._strategy(),
            queue_limit=config.queue_limit,
            overflow=config.overflow,
            match_cache=config.match_cache,
        )
        self.hooks = HookRegistry()  # see router.cluster.policy for what the node runs where
        self._policy = Policy(self.hooks, config.acl)
        self.mirror = RouteMirror(self._strategy(), cache=config.match_cache)
        self._sync = MirrorSync(
            redis,
            self.keys,
            self.routes,
            self.registry,
            self.mirror,
            self.node_id,
            config.heartbeat_interval,
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
            self.node_id,
            self.subscriptions,
            self._forwarder,
            lambda client_id: self._close_session(client_id, "takenover", None),
        )
        self._inbox = InboxReader(
            redis,
            self.keys,
            self.node_id,
            config.inbox_expire,
            self._dispatch,
            self._claims.on_notice,
            poll=config.inbox_poll,
        )
        self._ids = GuidGenerator(node_part_for(self.node_id, self.incarnation))
        self.retained = RetainedStore(redis, self.keys, config.retained)
        self._retainer = Retainer(self.retained, self.sessions)
        self._generation: str | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._running = False
        self._taken_over = asyncio.Event()
        self.published = 0
        self.local_deliveries = 0
        self.redispatched = 0
        self.undeliverable = 0
        self._traffic = (
            TrafficLog(config.traffic_dir, self.node_id, sample=config.traffic_sample)
            if config.traffic_dir
            else None
        )

    def _strategy(self) -> ShareStrategy:
        if self.config.share_strategy == "local":
            return LocalFirstStrategy(lambda member: member == self.node_id)
        return strategy_by_name(self.config.share_strategy)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> RouterNode:
        """Join the cluster (see the module docstring); returns the node."""
        await self.registry.register(self.node_id, self.incarnation)
        await self._claim()
        await self._inbox.start()
        await self._sync.start()
        self._writer.start()
        self._retainer.start()
        await self._sync.announce()
        self._heartbeat = asyncio.create_task(self._beat(), name=f"heartbeat:{self.node_id}")
        if self._traffic is not None:
            self._traffic.start()
        self._running = True
        return self

    async def _claim(self) -> None:
        claim = await self.routes.claim(self.node_id, self.incarnation, self.sessions.routes())
        self._generation = claim.generation
        self.mirror.load(self.node_id, claim.generation, 0, self.sessions.routes())

    async def stop(self) -> None:
        """Leave gracefully: remove this node's routes, deregister, announce, close."""
        if not self._running:
            return
        self._running = False
        await stop_task(self._heartbeat)
        await self._writer.stop()
        await self._retainer.stop()
        await self._forwarder.stop()
        await self._inbox.stop()
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

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            try:
                await self.registry.heartbeat(self.node_id, self.incarnation)
            except NodeNotRegisteredError:
                await self._rejoin()
            except StaleIncarnationError:
                log.error("node %s was taken over by another process; stopping", self.node_id)
                self._taken_over.set()
                return
            except Exception:
                log.warning("heartbeat of node %s failed", self.node_id, exc_info=True)
            try:
                await self._claims.audit()
            except Exception:
                log.warning("session claims of node %s unchecked", self.node_id, exc_info=True)

    async def _rejoin(self) -> None:
        """The others purged this node (it missed heartbeats): join again as a new incarnation."""
        log.warning("node %s was purged as dead; registering again", self.node_id)
        self.incarnation = uuid.uuid4().hex
        self._writer.incarnation = self.incarnation
        await self.registry.register(self.node_id, self.incarnation)
        await self._claim()
        await self._sync.announce()

    def _on_routes_applied(self, changes: list[RouteChange]) -> None:
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

    # -- clients ---------------------------------------------------------------------

    async def connect(
        self, client_id: str, username: str | None = None, password: str | bytes | None = None
    ) -> None:
        """Attach a client to this node with a clean session (earlier state is dropped).

        ``client.authenticate`` hooks judge the credentials (none registered: everyone is
        accepted); a refusal raises :class:`NotAuthorizedError` and changes nothing. An
        attached client that connects again is authenticated again and keeps its session.
        A session that another node served is taken over: that node gets a notice in its
        inbox and closes its copy (see :meth:`_on_takeover`).
        """
        check_id(client_id, "client id")
        client = await self._policy.authenticate(client_id, username, password)
        claimed = await self._claims.claim(client_id)
        if claimed is None:
            await self._policy.attached(client, new=False)
            return
        self.sessions.open(client_id)
        await self._policy.attached(client, new=True)
        await self._claims.notify_previous(client_id, claimed)

    async def subscribe(self, client_id: str, topic_filter: str, **options: Any) -> bool:
        """Subscribe a client (connecting it if needed); True if the subscription is new.

        Returns once the subscription is in Redis and, if the node's routes changed, the
        route is durable: from then on a publish on any caught-up node reaches the client.
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
        owner = self._claims.held(client_id)
        if owner is None:
            await self.connect(client_id)
            owner = self._claims.held(client_id)
        await self.subscriptions.write_subscriptions(client_id, [(checked, opts)], owner=owner)
        is_new, change = self.sessions.subscribe(client_id, checked, opts)
        if change is not None:
            await self._write_route(*change)
        await self._retainer.on_subscribe(
            client_id, checked, opts, is_new, self._policy.delivery_observer
        )
        return is_new

    async def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        """Remove one subscription; True if the client had it."""
        checked = validate_filter(topic_filter)
        owner = self._claims.held(client_id)
        if owner is None:
            return False
        kept = await self._policy.admit_unsubscribe(client_id, checked)
        if kept is None:
            return False
        await self.subscriptions.delete_subscriptions(client_id, [kept], owner=owner)
        existed, change = self.sessions.unsubscribe(client_id, kept)
        if change is not None:
            await self._write_route(*change)
        return existed

    async def disconnect(self, client_id: str) -> None:
        """Detach the client: its subscriptions end, its queue closes, its state is removed."""
        owner = self._claims.release(client_id)
        await self._close_session(client_id, "normal", owner)

    async def _close_session(self, client_id: str, reason: str, owner: Owner | None) -> None:
        """Close the local session and write the route changes; with ``owner``, also
        remove the client's state from Redis (fenced by that claim)."""
        changes = self.sessions.disconnect(client_id)
        waiters = [self._writer.submit(route, count) for route, count in changes]
        if owner is not None:
            await self.subscriptions.remove_client(client_id, owner=owner)
        if waiters:
            await asyncio.gather(*waiters)
            await self._sync.announce()
        await self._policy.detached(client_id, reason)

    async def _write_route(self, route: TopicFilter, count: int) -> None:
        await self._writer.submit(route, count)
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
        result with no nodes); see :mod:`router.cluster.policy`. With ``retain`` the message also
        becomes the topic's retained message (an empty payload deletes it), kept for
        ``expiry_interval`` seconds (None: no expiry); see :mod:`router.cluster.retainer`.
        ``properties`` (MQTT 5) travel with the message to every subscriber, unaltered.
        """
        message = self._message(topic, payload, qos, retain, publisher, properties)
        if self._policy.guards_publish:
            [admitted] = await self._policy.admit_publish([message])
            if admitted is None:
                return PublishResult(message.id, [], 0, 0)
            message = admitted
        if message.retain:
            await self._retainer.retain([(message, expiry_interval)])
        result, sends = self._route(message)
        if len(sends) == 1:
            [(node_id, forward)] = sends.items()
            await self._forwarder.send(node_id, [forward])
        elif sends:
            await asyncio.gather(
                *(self._forwarder.send(node_id, [f]) for node_id, f in sends.items())
            )
        return result

    async def publish_many(self, items: Iterable[Outgoing]) -> list[PublishResult]:
        """Publish a batch: like :meth:`publish` per item, with one inbox write per node.

        Every item is validated (and checked by the ACL) before anything is sent. Returns
        one result per item.
        """
        items = list(items)
        messages = [self._message(o.topic, o.payload, o.qos, o.retain, o.publisher) for o in items]
        admitted: Sequence[Message | None] = messages
        if self._policy.guards_publish:
            admitted = await self._policy.admit_publish(messages)
        retains = [
            (m, o.expiry_interval) for m, o in zip(admitted, items, strict=True) if m and m.retain
        ]
        if retains:
            await self._retainer.retain(retains)
        results = []
        per_node: dict[str, list[Forward]] = {}
        for original, message in zip(messages, admitted, strict=True):
            if message is None:
                results.append(PublishResult(original.id, [], 0, 0))
                continue
            result, sends = self._route(message)
            results.append(result)
            for node_id, forward in sends.items():
                per_node.setdefault(node_id, []).append(forward)
        if per_node:
            await asyncio.gather(
                *(self._forwarder.send(node_id, forwards) for node_id, forwards in per_node.items())
            )
        return results

    def _message(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        publisher: str | None,
        properties: MessageProperties | None = None,
    ) -> Message:
        checked = validate_topic(topic)  # the one validation (see router.core.topics)
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
        return Message(
            self._ids.new_bytes(),
            checked,
            bytes(payload),
            qos,
            bool(retain),
            publisher,
            time.monotonic(),
            properties,
        )

    def _route(self, message: Message) -> tuple[PublishResult, dict[str, Forward]]:
        """Deliver locally and say which nodes get a copy (and for which share groups)."""
        self.published += 1
        route = self.mirror.match(message.topic, message.publisher)
        if not route.nodes and self._policy.reports_drops:
            self._policy.unrouted(message)
        sends: dict[str, Forward] = {}
        queued = dropped = 0
        for node_id, groups in route.nodes.items():
            if node_id == self.node_id:
                queued, dropped = self.sessions.deliver(
                    message, groups, self._policy.delivery_observer
                )
                self.local_deliveries += queued
            else:
                sends[node_id] = Forward(message, tuple(groups))
        if self._traffic is not None:
            self._traffic.record(message, sends, queued)
        return PublishResult(message.id, list(route.nodes), queued, dropped), sends

    async def _dispatch(self, forwards: list[Forward]) -> None:
        """Deliver copies that arrived in the inbox; re-dispatch groups with no member here."""
        waiters = []
        for forward in forwards:
            queued, _ = self.sessions.deliver(
                forward.message, forward.groups, self._policy.delivery_observer
            )
            self.local_deliveries += queued
            for share_filter in forward.groups:
                if self.sessions.group_members(share_filter):
                    continue
                waiter = self._redispatch(forward, share_filter)
                if waiter is not None:
                    waiters.append(waiter)
        if waiters:
            await asyncio.gather(*waiters)

    def _redispatch(
        self, forward: Forward, share_filter: TopicFilter
    ) -> asyncio.Future[None] | None:
        tried = (*forward.tried, self.node_id)
        candidates = {
            node_id: count
            for node_id, count in self.mirror.group_nodes(share_filter).items()
            if node_id not in tried
        }
        if not candidates:
            self.undeliverable += 1
            log.warning(
                "no member of %s left for message %s", share_filter, forward.message.id.hex()
            )
            return None
        self.redispatched += 1
        nodes = sorted(candidates)
        chosen = random.choices(nodes, weights=[candidates[n] for n in nodes])[0]
        return self._forwarder.send(chosen, [Forward(forward.message, (share_filter,), tried)])

    # -- repair ----------------------------------------------------------------------

    async def reconcile(self, repair: bool = True) -> Reconciliation:
        """Compare the node's route set in Redis with what its local clients need.

        ``missing``: routes the clients need that Redis lacks (or with another count);
        ``stale``: routes in Redis that no local client needs. With ``repair`` and any
        difference, the node claims its route set again with exactly what it needs
        (readers resync from the new generation). Returns what was found.
        """
        wanted = self.sessions.routes()
        stored = (await self.routes.snapshot(self.node_id)).routes
        missing = {r: c for r, c in wanted.items() if stored.get(r) != c}
        stale = sorted(r for r in stored if r not in wanted)
        repaired = False
        if repair and (missing or stale):
            await self._writer.republish()
            await self._sync.announce()
            repaired = True
        return Reconciliation(self.node_id, missing, stale, repaired)

    # -- reading ---------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Counters of this node since it started."""
        return {
            "published": self.published,
            "forwarded": self._forwarder.forwarded,
            "forward_batches": self._forwarder.batches,
            "received": self._inbox.received,
            "duplicates_dropped": self._inbox.duplicates,
            "inbox_restarts": self._inbox.restarts,
            "local_deliveries": self.local_deliveries,
            "queue_drops": self.sessions.dropped(),
            "redispatched": self.redispatched,
            "undeliverable": self.undeliverable,
            "sessions_taken_over": self._claims.taken_over,
            "mirror_resyncs": self._sync.resyncs,
            "nodes_purged": self._sync.purged,
            "routes": len(self.sessions.routes()),
            **self._retainer.stats(),
            **(self._traffic.stats() if self._traffic is not None else {}),
            **cache_counters("route_cache", self.mirror.cache_stats()),
            **cache_counters("local_cache", self.sessions.cache_stats()),
        }
