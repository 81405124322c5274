"""A node's side of retained messages: store on retain publishes, deliver on subscribes.

MQTT rules (MQTT 5.0 3.3.1.3 and 3.8.3.1):

* A publish with retain=1 replaces the topic's retained message; with an empty payload it
  deletes it. Either way it is still routed. A payload above the store's ``max_payload``,
  or a new topic in a full store, is routed but not retained (counted in ``stats``).
* A subscribe sends the client the retained messages its filter matches: with retain
  handling 0 always, with 1 only when the subscription is new, with 2 never; a shared
  subscription gets none. Each copy carries retain=1, QoS min(subscription, message),
  the subscription's identifier and the expiry interval left.
* Live copies keep retain=1 only with retain-as-published
  (:mod:`router.cluster.sessions.local_sessions`).
* With an ACL on the node, a retained message goes only to a client that may receive its
  topic (a subscription to ``#`` is granted where ``secrets/#`` is denied).

Expired messages are invisible at once; a background task also removes them from Redis
every ``clear_interval`` seconds, a bounded batch at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Final

from router.cluster.sessions.local_sessions import DeliveryObserver, LocalSessions
from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
from router.core.messages import Delivery, Message
from router.core.options import SubscriptionOptions
from router.core.topics import TopicFilter, parse_shared
from router.errors import RetainedPayloadTooLargeError, RetainedStoreFullError, StateError
from router.state.retained_store import RetainedStore, check_retained_input

log = logging.getLogger(__name__)

DELIVERY_BATCH: Final = 100  # retained messages read at once for one subscribe
CLEAR_BATCH: Final = 1000  # expired messages removed by one clearing call, at most

Retain = tuple[Message, int | None]  # a retain publish and its expiry interval (seconds)


class Retainer:
    """Connects one node's publishes and subscribes to the cluster's :class:`RetainedStore`."""

    def __init__(self, store: RetainedStore, sessions: LocalSessions) -> None:
        self.store = store
        self._sessions = sessions
        self._clearing: asyncio.Task[None] | None = None
        self._supervisor: Supervisor | None = None  # (from start(): tells bugs)
        self.stored = 0
        self.deleted = 0
        self.refused = 0
        self.delivered = 0
        self.cleared = 0

    def start(self, supervisor: Supervisor) -> None:
        """Start clearing expired messages (unless the store's ``clear_interval`` is 0);
        ``supervisor`` is told of a bug in a clearing run."""
        self._supervisor = supervisor
        if self.store.config.clear_interval > 0 and self._clearing is None:
            self._clearing = asyncio.create_task(self._clear(), name="retained-clearing")

    async def stop(self) -> None:
        await stop_task(self._clearing)
        self._clearing = None

    async def retain(self, publishes: Iterable[Retain]) -> None:
        """Store or delete the retained message of each retain publish, in order.

        Every expiry interval is checked first (:class:`RetainedArgumentError`, nothing
        stored); a payload too large or a full store only skips that message.
        """
        batch = [(m, expiry) for m, expiry in publishes if m.retain]
        for message, expiry in batch:
            check_retained_input(message.payload, message.qos, expiry)
        for message, expiry in batch:
            try:
                await self.store.put(
                    message.topic,
                    message.payload,
                    message.qos,
                    message.id,
                    message.publisher,
                    expiry,
                    message.properties,
                )
            except (RetainedPayloadTooLargeError, RetainedStoreFullError) as exc:
                self.refused += 1
                log.info("not retained: %s", exc)
                continue
            if message.payload:
                self.stored += 1
            else:
                self.deleted += 1

    async def on_subscribe(
        self,
        client_id: str,
        topic_filter: TopicFilter,
        options: SubscriptionOptions,
        is_new: bool,
        observer: DeliveryObserver | None = None,
    ) -> int:
        """Queue the retained messages a new subscription gets; returns how many.

        ``observer`` (the node's hooks) is told of every copy and of what the client's
        overflow policy dropped for it, as for live deliveries. With an ACL on the node,
        a message whose topic the client may not receive is not queued (counted and
        reported as for live deliveries: :mod:`router.cluster.delivery_acl`).
        """
        if (
            options.retain_handling == 2
            or (options.retain_handling == 1 and not is_new)
            or parse_shared(topic_filter) is not None
        ):
            return 0
        session = self._sessions.session(client_id)
        acl = self._sessions.acl
        ids = () if options.subscription_identifier is None else (options.subscription_identifier,)
        queued = 0
        async for retained in self.store.matching(topic_filter, batch_size=DELIVERY_BATCH):
            delivery = Delivery(
                retained.topic,
                retained.payload,
                min(options.qos, retained.qos),
                True,
                retained.message_id,
                retained.publisher,
                ids,
                expiry_interval=retained.expiry_interval,
                properties=retained.properties,
            )
            if acl is not None and not acl.judge(session, delivery.topic):
                acl.refuse(client_id, delivery)
                continue
            lost = session.offer(delivery)
            queued += lost is None
            if observer is not None:
                observer(client_id, delivery, lost)
        self.delivered += queued
        return queued

    def stats(self) -> dict[str, int]:
        """Counters since the node started, named ``retained_*`` for :meth:`RouterNode.stats`."""
        return {
            "retained_stored": self.stored,
            "retained_deleted": self.deleted,
            "retained_refused": self.refused,
            "retained_delivered": self.delivered,
            "retained_cleared": self.cleared,
        }

    async def _clear(self) -> None:
        cursor = None
        while True:
            await asyncio.sleep(self.store.config.clear_interval)
            try:
                run = await self.store.clear_expired(cursor, limit=CLEAR_BATCH)
            except StateError:
                log.warning("clearing expired retained messages failed", exc_info=True)
                continue
            except Exception as error:
                assert self._supervisor is not None
                self._supervisor.caught("clearing expired retained messages", error)
                continue
            self.cleared += run.removed
            cursor = run.cursor
