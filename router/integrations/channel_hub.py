"""The node side of the Django Channels layer: one router node per process, and what it
does for the layer on its own thread (:mod:`router.integrations.node_thread`).

Channel-layer names become MQTT topics under a root (``$asgi`` by default: a ``$`` topic,
so MQTT clients' ``#`` never sees them, while one that asks for them by name may)::

    process-specific channel  specific.<process>!<rest>  ->  $asgi/s/<process>/<channel>
    group                     <group>                    ->  $asgi/g/<group>
    normal channel            <channel>                  ->  $asgi/n/<channel>

Channels' name rules (``require_valid_channel_name`` / ``require_valid_group_name``)
allow ASCII letters, digits, ``-``, ``_``, ``.`` and one ``!`` (then word characters),
never ``/``, ``+``, ``#`` or NUL, so a name is always one topic level, taken verbatim. The
payload is the message as msgpack; its MQTT Message Expiry Interval is the layer's expiry.

What the process subscribes to (its one client of the node, ``channels-<process>``):

* ``$asgi/s/<process>/+`` from start to stop: a send to one of its channels from another
  process reaches this node and no other;
* ``$asgi/g/<group>`` while it holds a member of the group (reference counted: the first
  ``group_add`` subscribes, the last ``group_discard`` unsubscribes). A group message is
  one publish; each process with members receives one copy and fans it out: into the
  mailboxes of its own channels, and on to any other channel a ``group_add`` here named
  (a normal channel, another process's channel);
* ``$share/asgi/$asgi/n/<channel>`` from its first ``receive`` on a normal channel until
  stop: the processes receiving on a normal channel form an MQTT share group, and each
  message reaches one of them.

Nothing is dropped silently. A copy for a channel whose mailbox is full is dropped and
counted (``full``; a sender cannot see another process's mailbox without a round trip,
so it raises ``ChannelFull`` only for a channel of its own process, or for a message it
had to keep); a message whose expiry passed is dropped and counted (``expired``). A
message for a normal channel that no process receives on yet waits in the sending
process (``parked``, at most ``capacity`` of them: ``ChannelFull`` past that) until one
does, or until it expires. A send to a process-specific channel that no live process
serves (its process ended) is counted as ``unrouted``. A node cut off from Redis for
longer than its heartbeat TTL is purged by the others, which stop routing to it until it
registers again: what they send meanwhile may miss it, and such a cut is counted
(``cut_offs``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from channels.exceptions import ChannelFull

import router
from router.api import default_node_id
from router.cluster.node import RouterNode
from router.core.messages import Delivery, PublishResult
from router.core.topics import TopicName, validate_topic
from router.errors import InvalidSettingError, InvalidTopicError, RouterError
from router.integrations.channel_mailboxes import Mailboxes

log = logging.getLogger(__name__)

TOPIC_ROOT: Final = "$asgi"
SHARE_GROUP: Final = "asgi"
"""The MQTT share group of the processes receiving on one normal channel."""
SWEEP_PERIOD: Final = 1.0
"""Seconds between two sweeps of expired messages and group memberships (at most; a
quarter of the shorter expiry when that is less)."""
PARK_POLL: Final = 0.02
"""Seconds between two looks for a receiver of a normal channel with parked messages."""
QOS: Final = 1


def process_of(channel: str) -> str | None:
    """The process part of a process-specific channel name (the last ``.`` part before
    the ``!``; the whole part before it when it has no ``.``); None for a normal one."""
    head, bang, _ = channel.partition("!")
    if not bang:
        return None
    return head.rpartition(".")[2]


@dataclass(frozen=True)
class ChannelTopics:
    """Channel-layer names <-> MQTT topics, under ``root`` (see the module docstring)."""

    root: str = TOPIC_ROOT

    def __post_init__(self) -> None:
        try:
            validate_topic(self.root)
        except InvalidTopicError as error:
            raise InvalidSettingError(f"topic_root {self.root!r}: {error}") from None
        if self.root.startswith("$share/") or self.root.endswith("/"):
            raise InvalidSettingError(f"topic_root {self.root!r} is not a plain topic prefix")

    def specific(self, process: str, channel: str) -> TopicName:
        return TopicName(f"{self.root}/s/{process}/{channel}")

    def specific_filter(self, process: str) -> str:
        return f"{self.root}/s/{process}/+"

    def group(self, group: str) -> TopicName:
        return TopicName(f"{self.root}/g/{group}")

    def normal(self, channel: str) -> TopicName:
        return TopicName(f"{self.root}/n/{channel}")

    def normal_filter(self, channel: str) -> str:
        return f"$share/{SHARE_GROUP}/{self.root}/n/{channel}"

    def parse(self, topic: str) -> tuple[str, str] | None:
        """``("s" | "g" | "n", channel or group name)`` of a topic made here; None else."""
        if not topic.startswith(self.root) or topic[len(self.root) : len(self.root) + 1] != "/":
            return None
        kind, _, rest = topic[len(self.root) + 1 :].partition("/")
        if kind == "s":
            rest = rest.partition("/")[2]
        if kind not in ("s", "g", "n") or not rest or "/" in rest:
            return None
        return kind, rest


@dataclass(frozen=True)
class HubSettings:
    """What the layer's node is made of: ``router.connect``'s arguments and the layer's
    expiries (whole seconds: the MQTT Message Expiry Interval)."""

    url: str | None
    topics: ChannelTopics
    expiry: int
    group_expiry: float
    connect_options: Mapping[str, Any] = field(default_factory=dict)


class _Interests:
    """The topic filters the process's client holds, each subscribed once while something
    here needs it; changes to one filter run one at a time (concurrent ``group_add`` of a
    group wait for the same subscribe)."""

    def __init__(self, node: RouterNode, client_id: str) -> None:
        self._node = node
        self._client = client_id
        self._held: set[str] = set()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def hold(self, topic_filter: str) -> None:
        """Subscribe ``topic_filter`` unless held; returns once every live node routes it."""
        if topic_filter in self._held:
            return
        async with self._turn(topic_filter):
            if topic_filter not in self._held:
                await self._node.subscribe(self._client, topic_filter, qos=QOS)
                self._held.add(topic_filter)

    async def release(self, topic_filter: str, unused: Callable[[], bool]) -> None:
        """Unsubscribe ``topic_filter`` if held and ``unused()`` still says so then."""
        async with self._turn(topic_filter):
            if topic_filter in self._held and unused():
                self._held.discard(topic_filter)
                await self._node.unsubscribe(self._client, topic_filter)

    async def restore(self) -> None:
        """Subscribe every held filter again (the client's session was ended)."""
        for topic_filter in list(self._held):
            async with self._turn(topic_filter):
                if topic_filter in self._held:
                    await self._node.subscribe(self._client, topic_filter, qos=QOS)

    def __len__(self) -> int:
        return len(self._held)

    def _turn(self, topic_filter: str) -> _Turn:
        return _Turn(self._locks, topic_filter)


class _Turn:
    """One filter's lock, forgotten when nobody holds or waits for it."""

    def __init__(self, locks: dict[str, tuple[asyncio.Lock, int]], key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        lock, users = self._locks.get(self._key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[self._key] = (lock, users + 1)
        await lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        lock, users = self._locks[self._key]
        lock.release()
        if users == 1:
            del self._locks[self._key]
        else:
            self._locks[self._key] = (lock, users - 1)


class ChannelHub:
    """A layer's node and its state on the node's thread (see the module docstring).

    Every method runs on the node's loop, but :meth:`listens` and :attr:`node_id` (one
    read each, safe from any thread); the mailboxes are shared with the receivers (they
    lock)."""

    def __init__(self, settings: HubSettings, process: str, mailboxes: Mailboxes) -> None:
        self.settings = settings
        self.topics = settings.topics
        self.process = process
        self.client_id = f"channels-{process}"
        self._mailboxes = mailboxes
        self._capacity = mailboxes.capacity
        self._node: RouterNode | None = None
        self._interests: _Interests | None = None
        self._groups: dict[str, dict[str, float]] = {}  # group -> channel -> joined at
        self._listening: set[str] = set()  # normal channels received on here
        self._parked: dict[str, deque[tuple[float, bytes]]] = {}  # normal channel -> kept
        self._parking: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._starts = 0
        self.counts = dict.fromkeys(
            (
                *("full", "expired", "unrouted", "forwarded", "forward_failures"),
                *("unknown", "reattached", "cut_offs"),
            ),
            0,
        )

    # -- the node's life -----------------------------------------------------------------

    async def serve(self, ready: Callable[[], None], stop: asyncio.Event) -> None:
        """Run the node: connect, subscribe this process's channels, fan out deliveries;
        ``ready()`` once sends and receives work; leave the cluster once ``stop`` is set."""
        self._starts += 1
        node_id = f"{default_node_id()}-{self.process}-{self._starts}"
        async with router.connect(
            self.settings.url, node_id=node_id, **self.settings.connect_options
        ) as node:
            node.liveness.on_cut_off(self._on_cut_off)
            await node.connect(self.client_id)
            interests = _Interests(node, self.client_id)
            await interests.hold(self.topics.specific_filter(self.process))
            self._node, self._interests = node, interests
            try:
                async with asyncio.TaskGroup() as tasks:
                    fanning = tasks.create_task(self._fan_out(node, interests))
                    sweeping = tasks.create_task(self._sweep())
                    ready()
                    await stop.wait()
                    fanning.cancel()
                    sweeping.cancel()
                    if self._parking is not None:
                        self._parking.cancel()
                    for task in list(self._tasks):
                        task.cancel()
            finally:
                self._node = self._interests = self._parking = None
                self._groups.clear()
                self._parked.clear()
                self._listening.clear()

    def stats(self) -> dict[str, int]:
        """The hub's counters, and the node's own (on the node's thread: it reads state
        that only that thread changes)."""
        node = self._node
        figures = node.stats() if node is not None else {}
        return {
            **self.counts,
            "parked": sum(len(kept) for kept in self._parked.values()),
            "groups": len(self._groups),
            "received": figures.get("received", 0),
            "queue_drops": figures.get("queue_drops", 0),
        }

    def listens(self, channel: str) -> bool:
        """True once this process receives on the normal channel (until the node stops)."""
        return channel in self._listening

    @property
    def node_id(self) -> str | None:
        """The running node's id (a new one at each start); None while stopped."""
        node = self._node
        return None if node is None else node.node_id

    def _on_cut_off(self) -> None:
        self.counts["cut_offs"] += 1
        log.warning(
            "node of %s cut off from Redis for longer than its TTL: the other processes "
            "stop routing to it until it is back, and what they send meanwhile may not "
            "reach this process",
            self.client_id,
        )

    # -- what the layer asks ---------------------------------------------------------------

    async def send(self, channel: str, payload: bytes, deadline: float) -> None:
        """A message for a channel of another process, or a normal channel (the layer puts
        a message for one of this process's channels into its mailbox itself)."""
        process = process_of(channel)
        if process is not None:
            result = await self._publish(self.topics.specific(process, channel), payload, deadline)
            if not result.nodes:
                self.counts["unrouted"] += 1
            return
        if channel not in self._parked and self._receivers(channel):
            if self._only_here(channel) and self._mailboxes.pending(channel) >= self._capacity(
                channel
            ):
                raise ChannelFull(channel)
            result = await self._publish(self.topics.normal(channel), payload, deadline)
            if result.nodes:
                return
        self._park(channel, payload, deadline)

    async def receive_normal(self, channel: str) -> None:
        """Receive on a normal channel here from now on (subscribes once, until stop)."""
        await self._live_interests().hold(self.topics.normal_filter(channel))
        self._listening.add(channel)

    async def group_add(self, group: str, channel: str) -> None:
        """Make ``channel`` a member of ``group`` here; returns once a group message sent
        from any node reaches it."""
        members = self._groups.setdefault(group, {})
        new = channel not in members
        members[channel] = time.time()
        try:
            await self._live_interests().hold(self.topics.group(group))
        except BaseException:
            if new and self._groups.get(group) is members:
                members.pop(channel, None)
                if not members:
                    del self._groups[group]
            raise

    async def group_discard(self, group: str, channel: str) -> None:
        """End the membership (nothing when there is none); the last one unsubscribes."""
        members = self._groups.get(group)
        if members is None or members.pop(channel, None) is None:
            return
        if not members:
            del self._groups[group]
            await self._release_group(group)

    async def group_send(self, group: str, payload: bytes, deadline: float) -> None:
        """One publish; every process with members of the group gets one copy."""
        await self._publish(self.topics.group(group), payload, deadline)

    # -- deliveries ----------------------------------------------------------------------

    async def _fan_out(self, node: RouterNode, interests: _Interests) -> None:
        """Hand on every delivery; should the node end the client's session (an
        operator's kick), attach again and subscribe again what it held."""
        while True:
            async for delivery in node.messages(self.client_id):
                self._deliver(delivery)
            log.warning("the session of %s ended; attaching again", self.client_id)
            self.counts["reattached"] += 1
            await node.connect(self.client_id)
            await interests.restore()

    def _deliver(self, delivery: Delivery) -> None:
        parsed = self.topics.parse(delivery.topic)
        if parsed is None:
            self.counts["unknown"] += 1
            return
        now = time.time()
        deadline = delivery.expires_at or now + self.settings.expiry
        if deadline <= now:
            self.counts["expired"] += 1
            return
        kind, name = parsed
        if kind == "s" and process_of(name) != self.process:
            self.counts["unknown"] += 1  # (not a channel of this process: nobody reads it)
            return
        if kind != "g":
            if not self._mailboxes.put(name, delivery.payload, deadline):
                self.counts["full"] += 1
            return
        members = self._members(name, now)
        here = [c for c in members if process_of(c) == self.process]
        full = self._mailboxes.put_many(here, delivery.payload, deadline)
        if full:
            self.counts["full"] += len(full)
            log.info("%s of %s channels over capacity in group %s", len(full), len(members), name)
        for channel in members:
            if process_of(channel) != self.process:
                self._spawn(self._forward(channel, delivery.payload, deadline))

    async def _forward(self, channel: str, payload: bytes, deadline: float) -> None:
        try:
            await self.send(channel, payload, deadline)
            self.counts["forwarded"] += 1
        except ChannelFull:
            self.counts["full"] += 1
        except RouterError as error:
            self.counts["forward_failures"] += 1
            log.warning("a group message for %s was not forwarded: %s", channel, error)

    def _members(self, group: str, now: float) -> list[str]:
        """The group's members here, without those older than the group expiry."""
        members = self._groups.get(group)
        if not members:
            return []
        oldest = now - self.settings.group_expiry
        for channel in [c for c, joined in members.items() if joined < oldest]:
            del members[channel]
        if not members:
            del self._groups[group]
            self._spawn(self._release_group(group))
        return list(members)

    async def _release_group(self, group: str) -> None:
        if self._interests is not None:
            await self._interests.release(
                self.topics.group(group), lambda: group not in self._groups
            )

    async def _sweep(self) -> None:
        period = min(SWEEP_PERIOD, self.settings.expiry / 4, self.settings.group_expiry / 4)
        while True:
            await asyncio.sleep(period)
            now = time.time()
            self._mailboxes.sweep(now)
            for group in list(self._groups):
                self._members(group, now)

    # -- normal channels nobody receives on yet ------------------------------------------

    def _park(self, channel: str, payload: bytes, deadline: float) -> None:
        kept = self._parked.setdefault(channel, deque())
        self._drop_expired(kept, time.time())
        if len(kept) >= self._capacity(channel):
            if not kept:
                del self._parked[channel]
            raise ChannelFull(channel)
        kept.append((deadline, payload))
        if self._parking is None or self._parking.done():
            self._parking = asyncio.create_task(self._unpark())

    async def _unpark(self) -> None:
        """Send parked messages, in order, as soon as their channel has a receiver."""
        while self._parked:
            await asyncio.sleep(PARK_POLL)
            now = time.time()
            for channel, kept in list(self._parked.items()):
                self._drop_expired(kept, now)
                while kept and self._receivers(channel):
                    deadline, payload = kept.popleft()
                    try:
                        result = await self._publish(self.topics.normal(channel), payload, deadline)
                    except RouterError as error:
                        log.warning("parked messages for %s wait on: %s", channel, error)
                        kept.appendleft((deadline, payload))
                        break
                    if not result.nodes:  # (its receivers left meanwhile)
                        kept.appendleft((deadline, payload))
                        break
                if not kept and self._parked.get(channel) is kept:
                    del self._parked[channel]

    def _drop_expired(self, kept: deque[tuple[float, bytes]], now: float) -> None:
        while kept and kept[0][0] <= now:
            kept.popleft()
            self.counts["expired"] += 1

    def _receivers(self, channel: str) -> bool:
        return bool(self._live_node().mirror.match(self.topics.normal(channel)).nodes)

    def _only_here(self, channel: str) -> bool:
        node = self._live_node()
        return node.mirror.match(self.topics.normal(channel)).nodes.keys() == {node.node_id}

    # -- plumbing ------------------------------------------------------------------------

    async def _publish(self, topic: TopicName, payload: bytes, deadline: float) -> PublishResult:
        left = max(1, math.ceil(deadline - time.time()))
        return await self._live_node().publish(topic, payload, qos=QOS, expiry_interval=left)

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _live_node(self) -> RouterNode:
        if self._node is None:
            raise RuntimeError("the channel layer's node is not running")
        return self._node

    def _live_interests(self) -> _Interests:
        if self._interests is None:
            raise RuntimeError("the channel layer's node is not running")
        return self._interests
