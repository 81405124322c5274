"""Publishing and dispatching on one node: local delivery and one copy per other node.

:meth:`Dispatcher.publish` validates a message once, lets the node's policy admit it
(ACL, ``message.publish`` hooks), keeps it as retained when asked, matches the route
mirror, queues the local copies and sends exactly one copy to each other interested
node's inbox (for the share groups that node serves); :meth:`Dispatcher.publish_many`
and :meth:`Dispatcher.publish_each` do so for a batch, with one inbox write per node.
:meth:`Dispatcher.dispatch`
delivers copies that arrived in this node's inbox and sends a share group's copy on
(re-dispatch) when no member of the group is left here.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, Final, TypeVar, cast

from router.cluster.filter_traffic import FilterTraffic
from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Forward
from router.cluster.policy import Policy
from router.cluster.retainer import Retainer
from router.cluster.sessions.local_sessions import LocalSessions
from router.cluster.tracing import Tracer
from router.cluster.traffic_log import TrafficLog
from router.cluster.visibility import ArrivalOrder, ForwardsInFlight
from router.core.guid import GuidGenerator
from router.core.messages import Message, Outgoing, PublishResult
from router.core.route_mirror import RouteMirror
from router.core.topics import SYSTEM_PREFIX, TopicFilter, validate_topic
from router.errors import NotAuthorizedError, PublishTimeoutError

log = logging.getLogger(__name__)
T = TypeVar("T")

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class LatencyHistogram:
    """Counts of durations at or below each of :data:`LATENCY_BUCKETS` (seconds), their
    sum and their count: what a Prometheus histogram exposes, without the dependency."""

    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        index = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        if index < len(self.counts):  # (above the last bound: counted in +Inf alone)
            self.counts[index] += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(bucket bound, durations at or below it), smallest bound first."""
        running, out = 0, []
        for bound, count in zip(LATENCY_BUCKETS, self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class Dispatcher:
    """What a node does with a publish, and with the copies other nodes sent it."""

    def __init__(
        self,
        node_id: str,
        ids: GuidGenerator,
        mirror: RouteMirror,
        sessions: LocalSessions,
        forwarder: Forwarder,
        policy: Policy,
        retainer: Retainer,
        traffic: TrafficLog | None,
        arrivals: ArrivalOrder | None = None,
        timeout: float = 10.0,
        forwards: ForwardsInFlight | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.node_id = node_id
        self.tracer = tracer if tracer is not None else Tracer(None, node_id)
        self.timeout = timeout
        self._ids = ids
        self.mirror = mirror
        self.sessions = sessions
        self._forwarder = forwarder
        self._policy = policy
        self._retainer = retainer
        self._traffic = traffic
        self._arrivals = arrivals if arrivals is not None else ArrivalOrder()
        self.forwards = forwards if forwards is not None else ForwardsInFlight()
        self.published = 0
        self.unrouted = 0  # publishes no node subscribed to (as the mirror knew)
        self.local_deliveries = 0
        self.redispatched = 0
        self.undeliverable = 0
        self.unmatched = 0  # copies from the inbox that no local subscription matched
        self.denied_system = 0  # clients' publishes under $SYS/ refused
        self.latency = LatencyHistogram()  # seconds per publish call (a batch counts once)
        self.filter_traffic = FilterTraffic()  # publishes per matching route

    async def publish(self, outgoing: Outgoing, arrived_before: int | None = None) -> PublishResult:
        """See :meth:`RouterNode.publish <router.cluster.node.RouterNode.publish>`;
        raises :class:`PublishTimeoutError` after ``timeout`` seconds."""
        return await self._bounded(self._publish(outgoing, arrived_before))

    async def publish_many(
        self, items: Iterable[Outgoing], arrived_before: int | None = None
    ) -> list[PublishResult]:
        """See :meth:`RouterNode.publish_many <router.cluster.node.RouterNode.publish_many>`;
        raises :class:`PublishTimeoutError` after ``timeout`` seconds."""
        return await self._bounded(self._publish_many(items, arrived_before))

    async def publish_each(
        self, items: Iterable[Outgoing], arrived_before: int | None = None
    ) -> Sequence[PublishResult | NotAuthorizedError]:
        """See :meth:`RouterNode.publish_each <router.cluster.node.RouterNode.publish_each>`;
        raises :class:`PublishTimeoutError` after ``timeout`` seconds."""
        return await self._bounded(self._publish_each(items, arrived_before))

    async def _bounded(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` within ``timeout`` seconds (its duration observed in ``latency``)."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.timeout):
                return await work
        except TimeoutError:
            raise PublishTimeoutError(self.timeout) from None
        finally:
            self.latency.observe(time.monotonic() - started)

    async def _publish(self, outgoing: Outgoing, arrived_before: int | None) -> PublishResult:
        message = self.message(outgoing)
        if _in_system(message):
            self.denied_system += 1
            raise _system_topic(message)
        if self._arrivals.pending:  # (subscription changes that arrived first apply)
            await self._arrivals.settled(arrived_before, (message.topic,))
        if self._policy.guards_publish:
            [admitted] = await self._policy.admit_publish([message])
            if admitted is None:
                return PublishResult(message.id, [], 0, 0)
            message = admitted
        if message.retain:
            await self._retainer.retain([(message, outgoing.expiry_interval)])
        [result], per_node = self.route([message])
        await self._forward(per_node)
        return result

    async def _publish_many(
        self, items: Iterable[Outgoing], arrived_before: int | None
    ) -> list[PublishResult]:
        items = list(items)
        messages = self._messages(items)
        for message in messages:
            if _in_system(message):
                self.denied_system += 1
                raise _system_topic(message)
        if self._arrivals.pending:  # (subscription changes that arrived first apply)
            await self._arrivals.settled(arrived_before, [m.topic for m in messages])
        admitted: Sequence[Message | None] = messages
        if self._policy.guards_publish:
            admitted = await self._policy.admit_publish(messages)
        return await self._send(items, messages, admitted)

    async def _publish_each(
        self, items: Iterable[Outgoing], arrived_before: int | None
    ) -> Sequence[PublishResult | NotAuthorizedError]:
        items = list(items)
        messages = self._messages(items)
        if self._arrivals.pending:  # (subscription changes that arrived first apply)
            await self._arrivals.settled(arrived_before, [m.topic for m in messages])
        in_system = any(_in_system(m) for m in messages)
        if not in_system and not self._policy.guards_publish:  # (the common case: as a batch)
            return await self._send(items, messages, messages)
        judged: Sequence[Message | NotAuthorizedError | None] = messages
        if in_system:
            judged = [_system_topic(m) if _in_system(m) else m for m in messages]
            self.denied_system += sum(1 for m in judged if isinstance(m, NotAuthorizedError))
        if self._policy.guards_publish:
            asked = [m for m in judged if isinstance(m, Message)] if in_system else messages
            admitted, denied = await self._policy.admit_each(asked)
            if not in_system and not denied:  # (every one allowed: as a batch)
                return await self._send(items, messages, cast(Sequence[Message | None], admitted))
            each = iter(admitted)
            judged = [next(each) if isinstance(m, Message) else m for m in judged]
        sent = [None if isinstance(m, NotAuthorizedError) else m for m in judged]
        results = await self._send(items, messages, sent)
        return [
            m if isinstance(m, NotAuthorizedError) else r
            for m, r in zip(judged, results, strict=True)
        ]

    def _messages(self, items: list[Outgoing]) -> list[Message]:
        """The messages of a batch, validated, with their ids and clock reading taken once."""
        ids = self._ids.new_bytes_many(len(items))
        now = time.monotonic()
        return [self.message(o, i, now) for o, i in zip(items, ids, strict=True)]

    async def _send(
        self, items: list[Outgoing], messages: list[Message], admitted: Sequence[Message | None]
    ) -> list[PublishResult]:
        """Retain, route and forward the ``admitted`` messages (None: not sent, a result
        with no nodes); one result per message of the batch."""
        retains = [
            (m, o.expiry_interval) for m, o in zip(admitted, items, strict=True) if m and m.retain
        ]
        if retains:
            await self._retainer.retain(retains)
        routed = [m for m in admitted if m is not None]
        results, per_node = self.route(routed)
        if len(routed) < len(messages):  # (the policy stopped some: they went nowhere)
            done = iter(results)
            results = [
                PublishResult(o.id, [], 0, 0) if m is None else next(done)
                for o, m in zip(messages, admitted, strict=True)
            ]
        await self._forward(per_node)
        return results

    async def _forward(self, per_node: dict[str, list[Forward]]) -> None:
        """Send each node its copies; return once every node's are in its inbox. Awaited
        right after the match, so the copies are in :attr:`forwards` from the match on
        (a coroutine runs up to its first suspension at once)."""
        if not per_node:
            return
        with self.forwards.applying():
            if len(per_node) == 1:
                [(node_id, forwards)] = per_node.items()
                await self._forwarder.send(node_id, forwards)
            else:
                await asyncio.gather(
                    *(self._forwarder.send(n, forwards) for n, forwards in per_node.items())
                )

    def message(
        self, outgoing: Outgoing, message_id: bytes | None = None, now: float | None = None
    ) -> Message:
        """The message ``outgoing`` describes, validated (the one validation of its topic,
        see :mod:`router.core.topics`); raises as :meth:`publish` does. ``message_id``
        (a fresh one if None) and ``now`` (its ``sent_at``, the monotonic clock if None)
        let a batch take its ids and its clock reading once."""
        checked = validate_topic(outgoing.topic)
        payload = outgoing.payload
        if type(payload) is not bytes:
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
            payload = bytes(payload)
        qos = outgoing.qos
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
        expiry = outgoing.expiry_interval
        return Message(
            self._ids.new_bytes() if message_id is None else message_id,
            checked,
            payload,
            qos,
            bool(outgoing.retain),
            outgoing.publisher,
            time.monotonic() if now is None else now,
            outgoing.properties,
            None if expiry is None else time.time() + expiry,
        )

    def route(
        self, messages: Sequence[Message]
    ) -> tuple[list[PublishResult], dict[str, list[Forward]]]:
        """Deliver each message locally and gather, for each other interested node, the
        copies it gets (with the share groups it serves there); one result per message."""
        here = self.node_id
        match = self.mirror.match
        deliver = self.sessions.deliver
        observer = self._policy.delivery_observer
        traffic = self._traffic
        tracer = self.tracer
        count_filters = self.filter_traffic.count
        results: list[PublishResult] = []
        per_node: dict[str, list[Forward]] = {}
        for message in messages:
            routed = match(message.topic, message.publisher)
            nodes = routed.nodes
            count_filters(routed.matched)
            queued = dropped = 0
            if not nodes:
                self.unrouted += 1
                if self._policy.reports_drops:
                    self._policy.unrouted(message)
            for node_id, groups in nodes.items():
                if node_id == here:
                    queued, dropped = deliver(message, groups, observer)
                    self.local_deliveries += queued
                elif node_id in per_node:
                    per_node[node_id].append(Forward(message, tuple(groups)))
                else:
                    per_node[node_id] = [Forward(message, tuple(groups))]
            if traffic is not None:
                traffic.record(message, [n for n in nodes if n != here], queued)
            if tracer.active:
                tracer.routed(message, nodes, queued)
            results.append(PublishResult(message.id, list(nodes), queued, dropped))
        self.published += len(messages)
        return results, per_node

    async def dispatch(self, forwards: list[Forward]) -> None:
        """Deliver copies that arrived in the inbox; re-dispatch groups with no member here."""
        waiters = []
        deliver = self.sessions.deliver
        observer = self._policy.delivery_observer
        tracer = self.tracer
        for forward in forwards:
            queued, dropped = deliver(forward.message, forward.groups, observer)
            self.local_deliveries += queued
            if tracer.active:
                tracer.arrived(forward.message, queued, dropped)
            if not queued and not dropped and not forward.groups:
                self.unmatched += 1  # (its subscribers left, or the node restarted since)
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

    def stats(self) -> dict[str, int]:
        return {
            "published": self.published,
            "unrouted": self.unrouted,
            "local_deliveries": self.local_deliveries,
            "redispatched": self.redispatched,
            "undeliverable": self.undeliverable,
            "copies_unmatched": self.unmatched,
            "publishes_denied": self._policy.publishes_denied,
            "publishes_denied_sys": self.denied_system,
        }


def _in_system(message: Message) -> bool:
    """True for a client's message under ``$SYS/``."""
    return message.publisher is not None and message.topic.startswith(SYSTEM_PREFIX)


def _system_topic(message: Message) -> NotAuthorizedError:
    """The refusal of a client's message under ``$SYS/`` (of the whole batch by
    ``publish_many``, of that item by ``publish_each``): the broker's topics are the
    node's own."""
    return NotAuthorizedError(
        str(message.publisher), "publish", message.topic, "the broker's topic"
    )
