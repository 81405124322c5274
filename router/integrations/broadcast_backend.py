"""A broadcaster backend on a router node: ``Broadcast(backend=RouterBackend(url))``.

`broadcaster <https://pypi.org/project/broadcaster/>`_ gives an ASGI app publish/subscribe
over channels through a backend of six methods (:class:`broadcaster.BroadcastBackend`).
:class:`RouterBackend` is one: it embeds a router node in the process (one node per
backend, one client of that node) and makes each broadcaster channel an MQTT topic:

* ``subscribe(channel)``: ``channel`` is a topic filter, wildcards allowed
  (``sensors/+/temp``, ``chat/#``; ``$share/GROUP/FILTER`` makes the workers a share
  group, one of them gets each message). The subscription carries a subscription
  identifier of its own, and it returns once every live node of the cluster routes the
  filter here, so a message published anywhere after it returns reaches it.
* ``publish(channel, message)``: ``channel`` is a topic (no wildcards); ``message`` is
  ``str`` (sent as UTF-8), ``bytes`` or a number (sent as its text, as broadcaster's
  Redis backend does). It returns once every node with a subscriber stored its copy;
  :class:`~router.errors.PublishTimeoutError` after ``publish_timeout`` otherwise (the
  message may still arrive: at least once), counted as ``publish_failures``.
* ``next_published()``: :class:`broadcaster.Broadcast` hands an event to the subscribers
  registered under ``event.channel`` *exactly*, so a message is one event per subscribed
  channel it matches, whose ``channel`` is that channel as subscribed (the filter) and
  whose ``topic`` is where it was published (:class:`TopicEvent`). A message for
  ``sensors/1/temp`` reaches both ``sensors/+/temp`` and ``sensors/#`` subscribers.

Nothing is silently lost: the node queues at most ``queue_limit`` messages for the
backend (overflow ``drop_oldest`` by default) and counts what it drops (``queue_drops``);
a delivery for a channel unsubscribed meanwhile is counted as ``unmatched``.

Reconnecting: the node reconnects to Redis by itself and its subscriptions stay, so the
subscribers' streams go on. What other workers publish while the node cannot reach Redis
waits in its inbox, unless the cut outlasts the heartbeat TTL: the others then purge the
node and stop routing to it until it registers again (with its routes) once Redis is
back; such a cut is counted (``cut_offs``), as what it may have missed. Should
the node end the backend's session (an operator's kick, a takeover), the backend attaches
again and subscribes every channel again (``resubscribes``). A ``subscribe`` or
``unsubscribe`` that Redis cannot take now does not fail (broadcaster's ``Broadcast``
does not recover from a backend that raises there): the backend keeps the change, counts
it (``deferred``) and applies it once Redis answers again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import MISSING, fields
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from broadcaster import BroadcastBackend, Event

import router
from router.api import default_node_id
from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.messages import Delivery
from router.core.options import MAX_SUBSCRIPTION_IDENTIFIER
from router.core.topics import validate_filter
from router.errors import (
    BadRedisURLError,
    BroadcastMessageError,
    ClientNotConnectedError,
    InvalidSettingError,
    RouterError,
    RouteWriteError,
    StateError,
)

log = logging.getLogger(__name__)

#: URL schemes -> the Redis scheme the node connects with.
SCHEMES: Final = {
    "router+redis": "redis",
    "router+rediss": "rediss",
    "redis": "redis",
    "rediss": "rediss",
}
#: ``router.connect`` options besides NodeConfig's fields, with how a URL's text becomes one.
CONNECT_OPTIONS: Final = {"redis_timeout": float, "redis_pool_size": int, "acl_default": str}
#: What the keyword arguments of a backend may set besides its own (those of router.connect).
KEYWORD_OPTIONS: Final = {f.name for f in fields(NodeConfig)} - {"node_id"} | {
    "acl",
    *CONNECT_OPTIONS,
}
RETRY_FIRST: Final = 0.05  # seconds before the first retry of a change Redis did not take
RETRY_MAX: Final = 2.0  # ... and the longest wait between two

_backends = itertools.count(1)  # (node ids of the backends of one process)


class TopicEvent(Event):
    """One message for one subscribed channel.

    ``channel`` is the channel as subscribed (the filter, for a wildcard subscription: the
    key :class:`broadcaster.Broadcast` dispatches on), ``message`` the payload decoded as
    UTF-8 (bytes that are not UTF-8 replaced by U+FFFD), ``topic`` the topic it was
    published to, ``payload`` its bytes, and ``delivery`` the node's
    :class:`~router.core.messages.Delivery` (message id, publisher, QoS...). Events
    compare as broadcaster's do: by channel and message.
    """

    def __init__(self, channel: str, delivery: Delivery) -> None:
        super().__init__(channel, delivery.payload.decode(errors="replace"))
        self.topic = delivery.topic
        self.payload = delivery.payload
        self.delivery = delivery

    def __repr__(self) -> str:
        shown = f"channel={self.channel!r}, topic={self.topic!r}, message={self.message!r}"
        return f"TopicEvent({shown})"


class RouterBackend(BroadcastBackend):
    """A broadcaster backend on a node of its own (see the module docstring).

    ``url``: ``router+redis://HOST:PORT/DB?prefix=rt&node_id=web-1`` (or ``router+rediss``,
    or a plain ``redis://`` URL; None: ``$ROUTER_REDIS_URL``), a standalone Redis or any
    node of a Redis Cluster. Its query may set ``node_id``, ``qos`` and
    the options of :func:`router.connect` that are text or numbers (``prefix``,
    ``queue_limit``, ``overflow``, ``publish_timeout``, ``heartbeat_ttl``,
    ``redis_timeout``...); other query parameters stay in the Redis URL (redis-py's). The
    keyword arguments set the same, and win over the URL. ``node_id`` defaults to
    ``HOST-PID-bN`` (N counts the backends of the process); ``qos`` (1) is that of every
    subscription and publish. Raises :class:`~router.errors.InvalidSettingError` for an
    unknown option or a value that is not of its kind, and
    :class:`~router.errors.BadRedisURLError` for a scheme it does not know; nothing
    connects before :meth:`connect`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        node_id: str | None = None,
        qos: int | None = None,
        **options: Any,
    ) -> None:
        redis_url, taken = (None, {}) if url is None else parse_url(url)
        taken.update(options)
        for name, value in (("node_id", node_id), ("qos", qos)):
            if value is not None:
                taken[name] = value
        self.node_id: str = taken.pop("node_id", None) or f"{default_node_id()}-b{next(_backends)}"
        self.client_id = f"broadcast-{self.node_id}"  # (unique as the node id: never taken over)
        self.qos: int = taken.pop("qos", 1)
        if self.qos not in (0, 1, 2):
            raise InvalidSettingError(f"qos must be 0, 1 or 2, not {self.qos!r}")
        unknown = sorted(set(taken) - KEYWORD_OPTIONS)
        if unknown:
            raise InvalidSettingError(f"unknown option(s) of RouterBackend: {', '.join(unknown)}")
        self._redis_url = redis_url
        self._options = taken
        self._node: RouterNode | None = None
        self._stack: AsyncExitStack | None = None
        self._stream: AsyncIterator[Delivery] | None = None  # (the client's deliveries)
        self._pending: deque[TopicEvent] = deque()
        self._ids: dict[str, int] = {}  # subscribed channel -> its subscription identifier
        self._channels: dict[int, str] = {}  # ... and back
        self._last_id = 0
        self._unsynced: set[str] = set()  # changes Redis did not take yet: channels to redo
        self._redo = asyncio.Event()
        self._repairer: asyncio.Task[None] | None = None
        self._syncing = asyncio.Lock()  # (a resubscribe and a repair run one at a time)
        self._counts = dict.fromkeys(
            (
                *("events", "unmatched", "publishes", "publish_failures", "deferred"),
                *("resubscribes", "cut_offs"),
            ),
            0,
        )

    # -- lifecycle -------------------------------------------------------------------

    async def connect(self) -> None:
        """Start the node, attach the backend's client; raises what :func:`router.connect`
        raises (Redis not reached: :class:`~router.errors.StateUnavailableError`)."""
        stack = AsyncExitStack()
        try:
            node = await stack.enter_async_context(
                router.connect(self._redis_url, node_id=self.node_id, **self._options)
            )
            node.liveness.on_cut_off(self._on_cut_off)
            await node.connect(self.client_id)
        except BaseException:
            await stack.aclose()
            raise
        self._node, self._stack = node, stack
        self._stream = node.messages(self.client_id)
        self._repairer = asyncio.create_task(self._repair(), name=f"broadcast:{self.node_id}")

    async def disconnect(self) -> None:
        """End the client's session and stop the node (gracefully: other nodes drop its
        routes at once)."""
        node, stack = self._node, self._stack
        self._node = self._stack = None
        if self._repairer is not None:
            self._repairer.cancel()
            await asyncio.gather(self._repairer, return_exceptions=True)
        if node is None or stack is None:
            return
        try:
            await node.disconnect(self.client_id)
        except StateError:
            log.warning("broadcast client %s not ended in Redis", self.client_id, exc_info=True)
        await stack.aclose()

    @property
    def node(self) -> RouterNode:
        """The backend's node; :class:`~router.errors.ClientNotConnectedError` outside
        :meth:`connect` ... :meth:`disconnect`."""
        if self._node is None:
            raise ClientNotConnectedError("the broadcast backend is not connected")
        return self._node

    def stats(self) -> dict[str, int]:
        """Counts since :meth:`connect` (see the module docstring), with the node's
        ``queue_drops``."""
        drops = self._node.stats()["queue_drops"] if self._node is not None else 0
        return {**self._counts, "queue_drops": drops}

    # -- subscriptions ---------------------------------------------------------------

    async def subscribe(self, channel: str) -> None:
        """Subscribe to ``channel``, a topic filter; nothing for a channel subscribed
        already. Raises :class:`~router.errors.InvalidTopicError` for a channel that is no
        filter, :class:`~router.errors.NotAuthorizedError` when the node's ACL or a hook
        refuses it (nothing changes then); a Redis that cannot take it now defers it."""
        node = self.node
        validate_filter(channel)
        if channel in self._ids:
            return
        ident = self._new_id()
        self._ids[channel], self._channels[ident] = ident, channel
        try:
            await self._subscribe_node(node, channel, ident)
        except StateError:
            self._defer(channel, "subscribe")
        except BaseException:
            self._forget(channel)
            raise

    async def unsubscribe(self, channel: str) -> None:
        """Unsubscribe from ``channel``; nothing for a channel not subscribed. A Redis that
        cannot take it now defers it (no event of the channel is handed on meanwhile)."""
        node = self.node
        if channel not in self._ids:
            return
        self._forget(channel)
        try:
            await node.unsubscribe(self.client_id, channel)
        except StateError:
            self._defer(channel, "unsubscribe")

    async def _subscribe_node(
        self, node: RouterNode, channel: str, ident: int, *, confirm: bool = True
    ) -> None:
        try:
            await node.subscribe(
                self.client_id,
                channel,
                confirm=confirm,
                qos=self.qos,
                retain_handling=2,  # (no retained messages: a channel is a live stream)
                subscription_identifier=ident,
            )
        except RouteWriteError:  # (subscribed here; the node writes the route when it can)
            self._counts["deferred"] += 1
            log.warning("route of %r not in Redis yet; the node retries it", channel)

    def _new_id(self) -> int:
        while True:
            self._last_id = self._last_id % MAX_SUBSCRIPTION_IDENTIFIER + 1
            if self._last_id not in self._channels:
                return self._last_id

    def _forget(self, channel: str) -> None:
        ident = self._ids.pop(channel, None)
        if ident is not None:
            self._channels.pop(ident, None)

    def _defer(self, channel: str, what: str) -> None:
        self._counts["deferred"] += 1
        log.warning("%s %r deferred: Redis did not take it", what, channel, exc_info=True)
        self._unsynced.add(channel)
        self._redo.set()

    async def _repair(self) -> None:
        """Apply the deferred changes, retrying with backoff until Redis takes them."""
        delay = RETRY_FIRST
        while True:
            await self._redo.wait()
            self._redo.clear()
            async with self._syncing:
                for channel in sorted(self._unsynced):
                    try:
                        await self._apply(channel)
                    except StateError:
                        self._redo.set()
                        break
                    except RouterError:  # (refused now: an ACL or a hook changed meanwhile)
                        log.error("deferred change of %r refused", channel, exc_info=True)
                    self._unsynced.discard(channel)
            if self._redo.is_set():
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
            else:
                delay = RETRY_FIRST

    async def _apply(self, channel: str) -> None:
        """Make the node hold ``channel`` as wanted now (subscribed or not)."""
        ident = self._ids.get(channel)
        if ident is None:
            await self.node.unsubscribe(self.client_id, channel)
        else:
            await self._subscribe_node(self.node, channel, ident)

    def _on_cut_off(self) -> None:
        self._counts["cut_offs"] += 1
        log.warning(
            "node %s cut off from Redis for longer than its TTL: the other workers stop "
            "routing to it until it is back, and what they publish meanwhile may not reach "
            "this worker",
            self.node_id,
        )

    async def _resubscribe(self) -> None:
        """Attach the client again and subscribe every channel again (its session ended
        while the backend runs), retrying with backoff until Redis takes it. The node
        finishes ending the old session first (a connect waits for the client's steps
        under way)."""
        delay = RETRY_FIRST
        while True:
            node = self.node
            try:
                async with self._syncing:
                    await node.connect(self.client_id)
                    self._stream = node.messages(self.client_id)
                    for channel, ident in list(self._ids.items()):
                        try:
                            await self._subscribe_node(node, channel, ident, confirm=False)
                        except StateError:
                            raise
                        except RouterError:  # (refused now: an ACL or a hook changed)
                            log.error("%r refused on attaching again", channel, exc_info=True)
                    await node.confirm_routes()
                    self._unsynced.clear()
                self._counts["resubscribes"] += 1
                log.warning("broadcast client %s attached again", self.client_id)
                return
            except StateError:
                log.warning("broadcast client %s not attached yet", self.client_id, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    # -- messages --------------------------------------------------------------------

    async def publish(self, channel: str, message: Any) -> None:
        """Publish ``message`` to the topic ``channel`` (see the module docstring). Raises
        :class:`~router.errors.InvalidTopicError` for a channel that is no topic,
        :class:`~router.errors.BroadcastMessageError` for a message of another type, and
        :class:`~router.errors.PublishTimeoutError` (or another
        :class:`~router.errors.StateError`) when Redis did not take it in time."""
        node = self.node
        payload = encode(message)
        try:
            await node.publish(channel, payload, qos=self.qos, publisher=self.client_id)
        except StateError:
            self._counts["publish_failures"] += 1
            raise
        self._counts["publishes"] += 1

    async def next_published(self) -> Event:
        """The next event (see the module docstring), waiting for one. A Redis that cannot
        be reached makes it wait, never fail (``Broadcast`` ends its listener for good on
        an error here): it raises :class:`~router.errors.ClientNotConnectedError` once the
        backend is disconnected, and what the node's ``client.authenticate`` hooks raise
        when the client must attach again and they refuse it."""
        while not self._pending:
            delivery = await self._next_delivery()
            events = [
                TopicEvent(channel, delivery)
                for ident in delivery.subscription_ids
                if (channel := self._channels.get(ident)) is not None
            ]
            if not events:
                self._counts["unmatched"] += 1
            self._pending.extend(events)
        self._counts["events"] += 1
        return self._pending.popleft()

    async def _next_delivery(self) -> Delivery:
        while True:
            if self._stream is None or self._node is None:
                raise ClientNotConnectedError("the broadcast backend is not connected")
            try:
                return await anext(self._stream)
            except StopAsyncIteration:
                if self._node is None:
                    raise ClientNotConnectedError("the broadcast backend disconnected") from None
                log.warning("broadcast client %s was closed; attaching again", self.client_id)
                await self._resubscribe()


def encode(message: object) -> bytes:
    """A message's payload: UTF-8 of a ``str``, ``bytes`` as they are, a number's text;
    :class:`~router.errors.BroadcastMessageError` for anything else."""
    if isinstance(message, str):
        return message.encode()
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message)
    if isinstance(message, int | float) and not isinstance(message, bool):
        return str(message).encode()
    raise BroadcastMessageError(message)


def router_options() -> dict[str, type]:
    """The options a URL's query may set -> their type (NodeConfig's text and number
    fields, a few of :func:`router.connect`'s, and the backend's own)."""
    found: dict[str, type] = {"node_id": str, "qos": int, **CONNECT_OPTIONS}
    for field in fields(NodeConfig):
        kind = type(field.default)
        if field.default is not MISSING and kind in (str, int, float, bool):
            found[field.name] = kind
    return found


def parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """(the Redis URL, the router options its query sets) of a backend URL (see
    :class:`RouterBackend`). Raises :class:`~router.errors.BadRedisURLError` for another
    scheme and :class:`~router.errors.InvalidSettingError` for a value not of its kind."""
    parts = urlsplit(url)
    scheme = SCHEMES.get(parts.scheme)
    if scheme is None:
        raise BadRedisURLError(
            f"a broadcast backend URL starts with router+redis:// or router+rediss://, "
            f"not {parts.scheme + '://' if parts.scheme else url!r}"
        )
    known = router_options()
    taken: dict[str, Any] = {}
    kept = []
    for name, text in parse_qsl(parts.query, keep_blank_values=True):
        kind = known.get(name)
        if kind is None:
            kept.append((name, text))
        else:
            taken[name] = _convert(name, text, kind)
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(kept), parts.fragment)), taken


def _convert(name: str, text: str, kind: type) -> Any:
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise InvalidSettingError(f"{name} must be true or false, not {text!r}")
        return text.lower() in ("true", "1", "yes")
    try:
        return kind(text)
    except ValueError:
        raise InvalidSettingError(f"{name} must be {kind.__name__}, not {text!r}") from None
