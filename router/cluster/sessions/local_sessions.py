"""Clients attached to this node: their subscriptions, delivery queues and route counts.

Each local client has a bounded delivery queue: at most ``queue_limit`` deliveries and
``queue_bytes`` payload bytes (one delivery is always let in, however large, so a big
message is never stuck). When a queue is full, the overflow policy
decides: ``drop_oldest`` (the default, as EMQX's message queue) discards the oldest queued
message to make room, ``drop_newest`` (as Mosquitto's queue limit) refuses the new one.
Either way the drop is counted on the session and reported by the node; nothing is lost
silently.

Route counting (EMQX's lesson): the node has a route for a plain filter while
at least one local client subscribes to it (count 1), and a route for a shared filter
whose count is the number of local members of that group. Only the changes of those
counts (0 -> 1, 1 -> 0, member count changes) reach Redis; they are computed here from
local state, never from a read of the global table.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Collection, Container, Iterable, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import Literal

from router.cluster.delivery_acl import DeliveryAcl, Narrowing
from router.cluster.sessions.states import SessionEvent, SessionState, check_move, shadow
from router.core.acl import Acl
from router.core.cached_trie import CachedMatcher
from router.core.hot_topics import DEFAULT_CACHE, CacheSettings, CacheStats
from router.core.messages import Delivery, Message
from router.core.options import SubscriptionOptions
from router.core.sharing import ShareStrategy
from router.core.topics import SHARE_PREFIX, TopicFilter, parse_shared
from router.core.trie import MatchedSubscription, SubscriptionTrie
from router.errors import AclRuleError, ClientNotConnectedError
from router.state.client_figures import DROP_REASONS

Overflow = Literal["drop_oldest", "drop_newest"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("drop_oldest", "drop_newest")
#: Why a session lost copies other than by its full queue in memory (``dropped``), in
#: the order of :attr:`ClientSession.losses`: expired before its client took them, larger
#: than its client's Maximum Packet Size, its Redis queue full while away, QoS 0 while
#: away (not kept).
LOSSES: tuple[str, ...] = DROP_REASONS[1:]  # ("queue_full" is dropped's)
EXPIRED, OVERSIZED, SESSION_QUEUE_FULL, OFFLINE_QOS0 = range(len(LOSSES))


class ClientSession:
    """One local client's session on this node: its delivery queue and, for MQTT, what
    is in flight.

    ``inflight`` holds the QoS 1/2 copies sent and not yet acknowledged, by packet id (a
    ``released`` one got its PUBREC); ``awaiting_release`` the inbound QoS 2 packet ids
    whose PUBREL has not come. The MQTT connection keeps them here, so that whoever ends
    the session (the connection, a takeover, the node) can hand them on with the queue
    (:meth:`take_all`). ``expiry`` is the Session Expiry Interval in seconds (0: the
    session ends with its connection); ``state`` is where it is in its lifecycle
    (:mod:`router.cluster.sessions.states`: changed with :meth:`move_to` only);
    ``profile`` is what its connection said of itself (MQTT level, keepalive, user name).

    With an ACL on the node (``acl``, :mod:`router.cluster.delivery_acl`), ``receives``
    caches its decisions for this session's user name and ``receiver`` makes them (both
    dropped when ``profile`` names another), and the copies :meth:`put_first` and
    :meth:`release` take from elsewhere are judged too; what it denies is not queued.
    """

    def __init__(
        self, client_id: str, limit: int, overflow: Overflow, limit_bytes: int = 0
    ) -> None:
        self.client_id = client_id
        self.limit = limit
        self.limit_bytes = limit_bytes  # (0: no bound on the queue's payload bytes)
        self.queued_bytes = 0  # payload bytes of the deliveries in _queue
        self.overflow = overflow
        self.delivered = 0
        self.dropped = 0  # deliveries its full queue in memory dropped
        # The client's figures (router.cluster.client_stats): PUBLISH packets and payload
        # bytes from it and to it, the wall-clock time of its last packet either way (0:
        # none yet), the connections of its id that took it over here, and the rarer
        # losses (LOSSES, a list made at the first one: nothing per message).
        self.received = self.received_bytes = self.sent = self.sent_bytes = 0
        self.active_at = 0.0
        self.takeovers = 0
        self.losses: list[int] | None = None
        self.closed = False
        self.expiry = 0
        self._state = SessionState.ATTACHING
        self.close_reason = "normal"
        self._profile: tuple[int, int, str | None] = (0, 0, None)  # protocol, keepalive, user
        self.receives: dict[str, bool] = {}
        self.receiver: Callable[[str], bool] | None = None
        self.acl: DeliveryAcl | None = None
        self.inflight: dict[int, Delivery] = {}
        self.awaiting_release: set[int] = set()
        self._queue: deque[Delivery] = deque()
        self._held: deque[Delivery] | None = None  # new copies kept aside (see hold)
        self._waiters: list[asyncio.Future[None]] | None = None  # (see wait: no Event, 1 KiB less)

    @property
    def state(self) -> SessionState:
        return self._state

    def lose(self, reason: int, count: int = 1) -> None:
        """Count ``count`` copies lost for ``reason`` (an index of :data:`LOSSES`)."""
        losses = self.losses
        if losses is None:
            losses = self.losses = [0] * len(LOSSES)
        losses[reason] += count

    @property
    def away(self) -> bool:
        """No client is attached and its copies go to its Redis queue (AWAY)."""
        return self._state is SessionState.AWAY

    def move_to(self, state: SessionState, event: SessionEvent) -> None:
        """Go to ``state``, for ``event``; :class:`SessionStateError` for a move its
        lifecycle does not allow (:data:`~router.cluster.sessions.states.TRANSITIONS`).
        The session machine checks it would make the same move (its shadow mode:
        :func:`~router.cluster.sessions.states.shadow`)."""
        check_move(self.client_id, self._state, state)
        shadow(self.client_id, self._state, event, state)
        self._state = state

    @property
    def profile(self) -> tuple[int, int, str | None]:
        """(MQTT level, keepalive, user name) as its connection gave them."""
        return self._profile

    @profile.setter
    def profile(self, profile: tuple[int, int, str | None]) -> None:
        if profile[2] != self._profile[2]:
            self.rejudge()  # (decisions for another user)
        self._profile = profile

    def rejudge(self) -> None:
        """Drop the cached receive decisions: the rules for this client changed."""
        self.receives.clear()
        self.receiver = None

    def put(self, delivery: Delivery) -> bool:
        """Queue one delivery; False when the overflow policy dropped a message."""
        return self.offer(delivery) is None

    def offer(self, delivery: Delivery) -> Delivery | None:
        """Queue one delivery; returns what the overflow policy dropped (the oldest queued
        delivery, or ``delivery`` itself with drop_newest), None when nothing was."""
        lost = None
        held = self._held is not None
        queue = self._held if self._held is not None else self._queue
        size = len(delivery.payload)
        limit_bytes = 0 if held else self.limit_bytes  # (held copies are bounded by count)
        while queue and (
            len(queue) >= self.limit or (limit_bytes and self.queued_bytes + size > limit_bytes)
        ):
            self.dropped += 1
            if self.overflow == "drop_newest":
                return delivery
            lost = queue.popleft()  # (with several dropped, the last one is told)
            if not held:
                self.queued_bytes -= len(lost.payload)
        queue.append(delivery)
        self.delivered += 1
        if not held:
            self.queued_bytes += size
            self._wake()
        return lost

    @property
    def holding(self) -> bool:
        """True between :meth:`hold` and :meth:`release`."""
        return self._held is not None

    def hold(self) -> None:
        """Keep new copies aside (bounded as the queue) until :meth:`release`: a resumed
        session whose older copies are still on their way from its previous node."""
        if self._held is None:
            self._held = deque()

    def release(self, tail: list[Delivery], seen: Collection[bytes] = ()) -> None:
        """Queue ``tail`` (the older copies that came last), then the copies held since
        :meth:`hold`, except those of a message in ``tail`` or ``seen`` (ids of messages
        queued before): a copy that came both ways during a move goes once."""
        held, self._held = self._held, None
        if self.acl is not None:
            tail = self.acl.screen(self, tail)
        self._queue.extend(tail)
        self.queued_bytes += sum(len(d.payload) for d in tail)
        if held:
            skip = {d.message_id for d in tail}.union(seen)
            kept = [d for d in held if d.message_id not in skip]
            self._queue.extend(kept)
            self.queued_bytes += sum(len(d.payload) for d in kept)
        if self._queue:
            self._wake()

    def put_first(self, deliveries: list[Delivery]) -> None:
        """Queue ``deliveries`` ahead of everything queued, in their order (what a
        session held before its client came back goes first); not bounded."""
        if self.acl is not None:
            deliveries = self.acl.screen(self, deliveries)
        self._queue.extendleft(reversed(deliveries))
        self.queued_bytes += sum(len(d.payload) for d in deliveries)
        if deliveries:
            self._wake()

    def pending(self) -> int:
        return len(self._queue)

    async def get(self) -> Delivery | None:
        """The next delivery, waiting for one; None once the session is closed and empty."""
        if not await self.wait():
            return None
        delivery = self._queue.popleft()
        self.queued_bytes -= len(delivery.payload)
        return delivery

    async def wait(self) -> bool:
        """Wait until a delivery is queued (True; it stays queued), or the session is
        closed with none queued (False)."""
        while not self._queue:
            if self.closed:
                return False
            waiter = asyncio.get_running_loop().create_future()
            waiters = self._waiters
            if waiters is None:
                waiters = self._waiters = []
            waiters.append(waiter)
            try:
                await waiter
            finally:
                waiters.remove(waiter)
        return True

    def _wake(self) -> None:
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def queue_view(self) -> Sequence[Delivery]:
        """The queued deliveries in the order :meth:`take` gives them, left queued (the
        queue itself: read it, never change it)."""
        return self._queue

    def take(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` queued deliveries, oldest first, without waiting (maybe none)."""
        queue = self._queue
        if len(queue) <= limit:
            taken = list(queue)
            queue.clear()
            self.queued_bytes = 0
            return taken
        taken = [queue.popleft() for _ in range(limit)]
        self.queued_bytes -= sum(len(d.payload) for d in taken)
        return taken

    def take_all(self) -> list[Delivery]:
        """Everything the session holds for its client, in the order it is due: the copies
        in flight (by packet id, each keeping it), then the queue; both are emptied."""
        held = [
            replace(self.inflight[packet_id], packet_id=packet_id)
            for packet_id in sorted(self.inflight)
        ]
        held += self._queue
        if self._held is not None:
            held += self._held
            self._held.clear()
        self.inflight.clear()
        self._queue.clear()
        self.queued_bytes = 0
        return held

    def close(self, reason: str = "normal", event: SessionEvent = SessionEvent.ENDED) -> None:
        self.move_to(SessionState.CLOSED, event)
        self.closed = True
        self.close_reason = reason
        self._wake()

    async def __aiter__(self) -> AsyncIterator[Delivery]:
        while True:
            delivery = await self.get()
            if delivery is None:
                return
            yield delivery


CountChange = tuple[TopicFilter, int]  # (route, new count); count 0 removes the route
#: Told of each local copy: (client id, the copy, what its queue dropped for it or None).
DeliveryObserver = Callable[[str, Delivery, Delivery | None], None]


class LocalSessions:
    """The clients of one node, their subscriptions and the node's route counts."""

    def __init__(
        self,
        strategy: ShareStrategy | None = None,
        queue_limit: int = 10_000,
        overflow: Overflow = "drop_oldest",
        queue_bytes: int = 0,
        *,
        match_cache: CacheSettings | None = DEFAULT_CACHE,
        acl: Acl | None = None,
    ) -> None:
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {OVERFLOW_POLICIES}")
        #: The local subscriptions; unless ``match_cache`` is None, hot topics are
        #: answered from the trie's caches (:class:`CachedMatcher`) with those settings.
        self.trie = (
            CachedMatcher(strategy, **match_cache.as_kwargs())
            if match_cache is not None
            else SubscriptionTrie(strategy)
        )
        self._sessions: dict[str, ClientSession] = {}
        self._counts: dict[TopicFilter, int] = {}
        self._dropped_closed = 0  # drops of sessions closed since
        self._queue_limit = queue_limit
        self._queue_bytes = queue_bytes
        self._overflow: Overflow = overflow
        #: The node's ACL on delivery (None: every copy goes); see :meth:`deliver`.
        self.acl = DeliveryAcl(acl) if acl is not None else None

    # -- sessions --------------------------------------------------------------------

    def open(
        self, client_id: str, profile: tuple[int, int, str | None] | None = None
    ) -> ClientSession:
        """The client's session, created on first use; with ``profile`` (what its
        connection says of itself, see :class:`ClientSession`) that is set before any
        copy comes, so the ACL judges them for that user."""
        session = self._sessions.get(client_id)
        if session is None:
            session = self._sessions[client_id] = ClientSession(
                client_id, self._queue_limit, self._overflow, self._queue_bytes
            )
            session.acl = self.acl
        if profile is not None:
            session.profile = profile
        return session

    def session(self, client_id: str) -> ClientSession:
        """The client's session; raises :class:`ClientNotConnectedError`."""
        session = self._sessions.get(client_id)
        if session is None:
            raise ClientNotConnectedError(f"client {client_id!r} is not connected to this node")
        return session

    def find(self, client_id: str) -> ClientSession | None:
        """The client's session here, None if it has none."""
        return self._sessions.get(client_id)

    def clients(self) -> list[str]:
        return sorted(self._sessions)

    def held(self) -> Collection[ClientSession]:
        """Every session held here (a view: read it, never change it)."""
        return self._sessions.values()

    def replace_acl(self, acl: Acl) -> None:
        """Judge every copy with ``acl`` from now on (the node started with an ACL:
        :class:`AclRuleError` otherwise)."""
        if self.acl is None:
            raise AclRuleError("the node started without an ACL: there is none to replace")
        self.acl.replace(acl, self._sessions.values())

    def narrow(self, narrowing: Narrowing) -> DeliveryAcl:
        """Judge every copy also by the client's own rules (``narrowing``, see
        :mod:`router.cluster.delivery_acl`), with or without a node ACL; returns the
        receive check, made now if the node has no ACL."""
        if self.acl is None:
            self.acl = DeliveryAcl(None)
            for session in self._sessions.values():
                session.acl = self.acl
        self.acl.narrowing = narrowing
        for session in self._sessions.values():
            session.rejudge()
        return self.acl

    def acl_denied(self) -> int:
        """Copies the ACL kept from local clients since the start (0 without an ACL)."""
        return 0 if self.acl is None else self.acl.denied

    def dropped(self) -> int:
        """Deliveries dropped by full queues since the start, over every session (those
        closed since too: a counter never goes down)."""
        return self._dropped_closed + sum(s.dropped for s in self._sessions.values())

    def most_dropped(self, count: int) -> list[tuple[str, int]]:
        """The ``count`` sessions held here that dropped most: (client id, dropped)."""
        dropping = ((s.client_id, s.dropped) for s in self._sessions.values() if s.dropped)
        return heapq.nlargest(count, dropping, key=itemgetter(1))

    # -- subscriptions and route counts ----------------------------------------------

    def subscribe(
        self, client_id: str, topic_filter: TopicFilter, options: SubscriptionOptions
    ) -> tuple[bool, CountChange | None]:
        """Subscribe locally; returns (new subscription?, route change or None)."""
        self.open(client_id)
        is_new = self.trie.add(client_id, topic_filter, options)
        return is_new, (self._count(topic_filter, +1) if is_new else None)

    def unsubscribe(
        self, client_id: str, topic_filter: TopicFilter
    ) -> tuple[bool, CountChange | None]:
        """Unsubscribe locally; returns (was subscribed?, route change or None)."""
        if not self.trie.discard(client_id, topic_filter):
            return False, None
        return True, self._count(topic_filter, -1)

    def disconnect(
        self, client_id: str, reason: str = "normal", event: SessionEvent = SessionEvent.ENDED
    ) -> list[CountChange]:
        """Remove the client's subscriptions and close its session (``reason`` tells its
        reader why; ``event`` is what ended it); returns the route changes."""
        subscriptions = list(self.trie.subscriptions(client_id))
        self.trie.remove_client(client_id)
        changes = [c for f in subscriptions if (c := self._count(f, -1)) is not None]
        session = self._sessions.pop(client_id, None)
        if session is not None:
            self._dropped_closed += session.dropped
            session.close(reason, event)
        return changes

    def hand_on(self, session: ClientSession) -> ClientSession:
        """The local ``session`` moves to another node: close it (its reader is told
        ``takenover``) and put an away session in its place that keeps its subscriptions
        and route counts, to gather the copies still routed here; returns that one
        (:meth:`disconnect` ends it)."""
        client_id = session.client_id
        del self._sessions[client_id]
        self._dropped_closed += session.dropped
        session.close("takenover", SessionEvent.MOVED_AWAY)
        leaving = self.open(client_id)
        leaving.expiry = session.expiry
        leaving.profile = session.profile  # (its copies are judged for the same user)
        leaving.move_to(SessionState.LEAVING, SessionEvent.HANDOFF_OPENED)
        return leaving

    def restore(
        self, client_id: str, subscriptions: dict[TopicFilter, SubscriptionOptions]
    ) -> list[CountChange]:
        """Subscribe a resumed session's stored subscriptions here; the route changes."""
        changes = []
        for topic_filter, options in subscriptions.items():
            _new, change = self.subscribe(client_id, topic_filter, options)
            if change is not None:
                changes.append(change)
        return changes

    def routes(self) -> dict[TopicFilter, int]:
        """The node's routes as counted now: route -> count."""
        return {
            route: (count if parse_shared(route) is not None else 1)
            for route, count in self._counts.items()
        }

    def routes_of(self, client_ids: Iterable[str]) -> dict[TopicFilter, int]:
        """The routes the subscriptions of ``client_ids`` alone would count: route ->
        count (a node that stops keeps those of its persistent sessions only)."""
        counts = Counter(f for client_id in client_ids for f in self.trie.subscriptions(client_id))
        return {f: (n if parse_shared(f) is not None else 1) for f, n in counts.items()}

    def _count(self, topic_filter: TopicFilter, delta: int) -> CountChange | None:
        before = self._counts.get(topic_filter, 0)
        after = before + delta
        if after:
            self._counts[topic_filter] = after
        else:
            del self._counts[topic_filter]
        if parse_shared(topic_filter) is not None:
            return topic_filter, after
        if (before == 0) != (after == 0):
            return topic_filter, 1 if after else 0
        return None

    # -- delivery --------------------------------------------------------------------

    def copies_for(
        self, message: Message, client_id: str, only_groups: Collection[str] = ()
    ) -> list[Delivery]:
        """The copies of ``message`` that ``client_id``'s subscriptions here ask for, as
        :meth:`deliver` with ``only_groups`` would make them (not queued, not judged by
        the ACL: the session judges what it takes, see :meth:`ClientSession.put_first`):
        none when none of them matches; by default only its plain subscriptions count."""
        found = self.trie.subscriptions_for(message.topic, message.publisher, only_groups).get(
            client_id
        )
        if found and client_id == message.publisher:
            found = [s for s in found if not s.options.no_local]
        if not found:
            return []
        return [make_copy(message, part) for part in copy_parts(found)]

    def copies_for_clients(
        self, message: Message, clients: Collection[str]
    ) -> dict[str, list[Delivery]]:
        """:meth:`copies_for` for each of ``clients`` that the message matches (the
        message matched once): client id -> its copies."""
        copies: dict[str, list[Delivery]] = {}
        matched = self.trie.subscriptions_for(message.topic, message.publisher, ())
        for client_id, found in matched.items():
            if client_id not in clients:
                continue
            wanted = found
            if client_id == message.publisher:
                wanted = [s for s in found if not s.options.no_local]
            if wanted:
                copies[client_id] = [make_copy(message, part) for part in copy_parts(wanted)]
        return copies

    def deliver(
        self,
        message: Message,
        only_groups: Collection[str] | None,
        observer: DeliveryObserver | None = None,
        clients: Container[str] | None = None,
    ) -> tuple[int, int]:
        """Queue the message for every matching local client (of ``clients``, when given);
        returns (queued, dropped) copies.

        ``only_groups`` limits the share groups this node serves for this message (the
        publisher's route match chose the node for them). ``no_local`` subscriptions of
        the publisher itself are skipped. A client gets one copy for all its matching
        plain subscriptions and, apart from it, one for each shared subscription it was
        chosen for (:func:`copy_parts`). With an ACL (``acl``), a client that may not
        receive the topic gets none of them: they are counted and reported
        (:class:`~router.cluster.delivery_acl.DeliveryAcl`), not queued, not returned;
        a share group's member chosen and denied leaves that group without the message.
        ``observer`` (the node's hooks) is told of every queued copy and of what the
        overflow policy dropped for it. Copies made for a single
        subscription of the same shape (QoS, retain flag, subscription identifier) are
        one :class:`Delivery`, built once, whichever clients they go to.
        """
        matched = self.trie.subscriptions_for(message.topic, message.publisher, only_groups)
        acl = self.acl
        queued = dropped = 0
        shared: dict[tuple[int, bool, int | None], Delivery] | None = (
            {} if len(matched) > 1 else None
        )
        for client_id, found in matched.items():
            if clients is not None and client_id not in clients:
                continue
            subscriptions = found
            if client_id == message.publisher:
                subscriptions = [s for s in found if not s.options.no_local]
                if not subscriptions:
                    continue
            session = self._sessions.get(client_id)
            if session is None:
                continue
            parts = (subscriptions,) if len(subscriptions) == 1 else copy_parts(subscriptions)
            if acl is not None:
                allowed = session.receives.get(message.topic)
                if allowed is None:
                    allowed = acl.judge(session, message.topic)
                if not allowed:
                    acl.refuse(client_id, message, len(parts))
                    continue
            for part in parts:
                if shared is not None and len(part) == 1:
                    options = part[0].options
                    shape = (
                        min(options.qos, message.qos),
                        message.retain and options.retain_as_published,
                        options.subscription_identifier,
                    )
                    delivery = shared.get(shape)
                    if delivery is None:
                        delivery = shared[shape] = make_copy(message, part)
                else:
                    delivery = make_copy(message, part)
                lost = session.offer(delivery)
                if lost is None:
                    queued += 1
                else:
                    dropped += 1
                if observer is not None:
                    observer(client_id, delivery, lost)
        return queued, dropped

    def cache_stats(self) -> CacheStats | None:
        """The local match cache's counters (the cache that delivery asks), or None."""
        if isinstance(self.trie, CachedMatcher):
            return self.trie.subscriptions_cache.stats()
        return None

    def group_members(self, share_filter: TopicFilter) -> int:
        """How many local members the share group has."""
        return self._counts.get(share_filter, 0)


def copy_parts(
    subscriptions: Sequence[MatchedSubscription],
) -> list[Sequence[MatchedSubscription]]:
    """How one client's matching ``subscriptions`` split into copies (MQTT 5.0 4.8.2 and
    3.3.4): its plain subscriptions together make one copy, and each shared one makes a
    copy of its own (the client was chosen for that group apart from anything else).
    Returns the parts, the plain one first, in the order of ``subscriptions``; none for
    no subscriptions."""
    plain = [s for s in subscriptions if not s.filter.startswith(SHARE_PREFIX)]
    if len(plain) == len(subscriptions):
        return [subscriptions] if subscriptions else []
    parts: list[Sequence[MatchedSubscription]] = [plain] if plain else []
    parts += [(s,) for s in subscriptions if s.filter.startswith(SHARE_PREFIX)]
    return parts


def make_copy(message: Message, subscriptions: Sequence[MatchedSubscription]) -> Delivery:
    """The copy of ``message`` for ``subscriptions`` (at least one) of one client that
    make one copy together (see :func:`copy_parts`): the best QoS they grant (at most the
    message's), retain as published if one asks, every subscription identifier."""
    if len(subscriptions) == 1:  # the usual case, without the loops below
        options = subscriptions[0].options
        best = options.qos
        keep_retain = message.retain and options.retain_as_published
        sid = options.subscription_identifier
        ids: tuple[int, ...] = () if sid is None else (sid,)
    else:
        best = max(s.options.qos for s in subscriptions)
        keep_retain = message.retain and any(s.options.retain_as_published for s in subscriptions)
        ids = tuple(
            s.options.subscription_identifier
            for s in subscriptions
            if s.options.subscription_identifier is not None
        )
    return Delivery(
        message.topic,
        message.payload,
        best if best < message.qos else message.qos,
        keep_retain,
        message.id,
        message.publisher,
        ids,
        message.sent_at,
        None,
        message.properties,
        message.expires_at,
    )
