"""A python-socketio client manager on a router node (``router[socketio]``): each server
gets only the messages for the rooms it holds.

Use it where ``socketio.AsyncRedisManager`` would go::

    manager = RouterManager("redis://127.0.0.1:6379/0")
    sio = socketio.AsyncServer(client_manager=manager)
    ...
    await manager.close()   # on shutdown: ends the listener, stops the node

python-socketio's Redis manager publishes every message on one channel that every server
reads and decodes (python-socketio#82), and it cannot use a Redis Cluster (#1172). This
manager starts a router node in the server's process (``router.connect``, on standalone
Redis or a Redis Cluster) and gives the server one router client. The message is the one
python-socketio builds (a dict as JSON); only its route changes: it goes to the topic of
what it addresses (:mod:`router.integrations.socketio_rooms`), and the server's client
subscribes to a room's topic while the server holds a member of the room (every sid is a
room: its connection subscribes it). The router forwards a publish only to the nodes with
an interested subscriber, so an emit to a room reaches the servers with a member of it
and no other; a broadcast reaches the servers with a client in its namespace.

What python-socketio promised with one channel, kept here:

* ``await enter_room(...)``/``connect`` of a local sid return once its room's
  subscription is in effect on every live node: an emit from any server after that
  reaches it.
* ``await enter_room``/``leave_room`` of a sid on another server return once that server
  applied it (it replies, within ``ack_timeout``): an emit to the room right after it
  follows the change, as one channel's order made it.
* An emit to several rooms reaches a sid in two of them once (the copies carry one id;
  the servers keep the last :data:`SEEN_COPIES` ids).

Loss is counted, never silent (:meth:`RouterManager.stats`): a publish that Redis did not
take within the node's ``publish_timeout`` is logged and counted (``publish_failures``),
as the Redis manager logs and gives up; copies the server's queue dropped are the node's
``queue_drops``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from socketio.async_pubsub_manager import AsyncPubSubManager

from router.api import connect, default_node_id
from router.cluster.node import RouterNode
from router.cluster.tasks import stop_task
from router.core.messages import Outgoing, PublishResult
from router.errors import ClientNotConnectedError, InvalidSettingError, RouterError
from router.integrations.socketio_rooms import ACK, RoomInterest, RoomKey, Topics

COPY: Final = "router_copy"
"""The key of the id the copies of one emit to several rooms share."""
TOKEN: Final = "router_token"
"""The key of the token an ``enter_room``/``leave_room`` of a remote sid asks a reply for."""
SEEN_COPIES: Final = 4096
ACK_TIMEOUT: Final = 5.0
RETRY_FIRST: Final = 0.1
RETRY_MOST: Final = 5.0
COUNTERS: Final = (
    "published",  # copies this server published (one per topic)
    "publish_failures",  # publishes Redis did not take: those messages may be lost
    "received",  # copies the router delivered to this server
    "handled",  # ... that addressed someone here (a member, a sid, this host)
    "stray",  # ... that found no one here (a room left meanwhile)
    "duplicates",  # ... that were a second copy of an emit to several rooms
    "undecodable",  # ... that were not a python-socketio message
    "acks_missed",  # remote enter_room/leave_room not confirmed within ack_timeout
    "reattached",  # the node ended this server's session (a kick): attached again
    "cut_offs",  # the node was cut off from Redis past its TTL: others stopped routing here
)


@dataclass
class _AckWait:
    """One ``enter_room``/``leave_room`` of a remote sid waiting for its server's reply."""

    done: asyncio.Future[bool]
    refusals: int = 0
    expected: int | None = None  # the nodes that got the request (known once published)

    def answer(self, held: bool) -> None:
        if held:
            self._finish(True)
        else:
            self.refusals += 1
            self.check()

    def check(self) -> None:
        if self.expected is not None and self.refusals >= self.expected:
            self._finish(False)

    def _finish(self, held: bool) -> None:
        if not self.done.done():
            self.done.set_result(held)


class RouterManager(AsyncPubSubManager):  # type: ignore[misc]  # (socketio is untyped)
    """A python-socketio ``AsyncPubSubManager`` whose servers get only their own messages.

    ``url`` is the Redis (standalone or cluster; default ``$ROUTER_REDIS_URL``) of the
    node the manager starts on first use, with ``node_id`` (default: the host name, the
    process id and the manager's ``host_id``) and ``node_options`` (the other arguments of
    :func:`router.connect`: ``prefix``, ``redis_timeout``, ``publish_timeout``,
    ``queue_limit``, ...); or ``node``, a running node of the caller's (it is not
    stopped by :meth:`close`). ``channel``, ``write_only``, ``logger`` and ``json`` are
    python-socketio's; servers talk to each other when they use the same channel and
    prefix. ``ack_timeout`` bounds how long an ``enter_room``/``leave_room`` of a sid on
    another server waits for that server. Raises :class:`InvalidSettingError` for both a
    ``url`` and a ``node``, an empty channel or a timeout that is not positive.
    """

    name = "router"

    def __init__(
        self,
        url: str | None = None,
        channel: str = "socketio",
        write_only: bool = False,
        logger: logging.Logger | None = None,
        json: Any = None,
        *,
        node: RouterNode | None = None,
        node_id: str | None = None,
        node_options: Mapping[str, Any] | None = None,
        ack_timeout: float = ACK_TIMEOUT,
    ) -> None:
        if not isinstance(channel, str) or not channel:
            raise InvalidSettingError(f"channel must be a non-empty str, not {channel!r}")
        if node is not None and (url is not None or node_options or node_id is not None):
            raise InvalidSettingError("give a running node, or url/node_id/node_options: not both")
        if not ack_timeout > 0:
            raise InvalidSettingError(f"ack_timeout must be > 0, not {ack_timeout!r}")
        super().__init__(channel=channel, write_only=write_only, logger=logger, json=json)
        self.url = url
        self.ack_timeout = ack_timeout
        self.topics = Topics(channel)
        self._given = node
        self._node_id = node_id
        self._options = dict(node_options or {})
        self._node: RouterNode | None = None
        self._client_id = ""
        self._starting = asyncio.Lock()
        self._exit = contextlib.AsyncExitStack()
        self._interest = RoomInterest(self.topics, self._holds, self._get_logger)
        self._worker: asyncio.Task[None] | None = None
        self._replies: set[asyncio.Task[None]] = set()
        self._waits: dict[str, _AckWait] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._counts = dict.fromkeys(COUNTERS, 0)

    # -- the node --------------------------------------------------------------------

    @property
    def node(self) -> RouterNode | None:
        """The node this manager publishes on (None until first used)."""
        return self._node

    @property
    def client_id(self) -> str:
        """The router client of this server ("" until the node started)."""
        return self._client_id

    async def start(self) -> RouterNode:
        """Start the node (unless given) and, unless write-only, subscribe this server's
        client to its host's topic, to ``{channel}/all`` and to the rooms it holds.
        Idempotent: every use calls it. Raises what :func:`router.connect` and
        ``node.subscribe`` raise (a :class:`RouterError`)."""
        if self._node is not None:
            return self._node
        async with self._starting:
            if self._node is None:
                self._node = await self._open()
        return self._node

    async def _open(self) -> RouterNode:
        node = self._given
        if node is None:
            node_id = self._node_id or f"{default_node_id()}-{self.host_id[:8]}"
            opened = connect(self.url, node_id=node_id, **self._options)
            node = await self._exit.enter_async_context(opened)
        self._client_id = f"sio-{self.host_id}"
        if self.write_only:
            return node
        try:
            await self._attach(node)
            node.liveness.on_cut_off(self._on_cut_off)
        except BaseException:
            await self._exit.aclose()
            raise
        self._interest.forget(self._held_rooms())  # (a new client: none subscribed yet)
        self._worker = asyncio.create_task(self._interest.run(node, self._client_id))
        return node

    async def _attach(self, node: RouterNode) -> None:
        """Attach this server's client and subscribe it to its host's topic and to
        ``{channel}/all`` (the rooms are the interest task's)."""
        await node.connect(self._client_id)
        for topic in (self.topics.host(self.host_id), self.topics.everyone()):
            await node.subscribe(self._client_id, topic, qos=1, no_local=True, confirm=False)
        await node.confirm_routes()

    async def close(self) -> None:
        """Stop listening, end this server's router client and stop the node the manager
        started (a given node goes on). The server's rooms are forgotten by the router."""
        tasks = [self._worker, *self._replies]
        thread = getattr(self, "thread", None)  # (AsyncPubSubManager.initialize's listener)
        if isinstance(thread, asyncio.Task):
            tasks.append(thread)
        for task in tasks:  # (re-cancelled: on Python 3.11 a Redis call may swallow one)
            await stop_task(task)
        self._worker = None
        node, self._node = self._node, None
        try:
            if node is not None and not self.write_only:
                node.liveness.forget_cut_off(self._on_cut_off)
                with contextlib.suppress(RouterError):
                    await node.disconnect(self._client_id)
        finally:
            await self._exit.aclose()

    def stats(self) -> dict[str, int]:
        """This server's counts since it started (see :data:`COUNTERS`), the room topics
        it subscribes to now (``rooms_subscribed``), its failed subscription passes
        (``subscribe_failures``) and its node's ``queue_drops``."""
        counts = dict(self._counts)
        counts["rooms_subscribed"] = len(self._interest.subscribed)
        counts["subscribe_failures"] = self._interest.failures
        counts["queue_drops"] = self._node.stats()["queue_drops"] if self._node else 0
        return counts

    # -- rooms: python-socketio changes them here ------------------------------------

    def basic_enter_room(
        self, sid: str, namespace: str, room: Any, eio_sid: str | None = None
    ) -> None:
        super().basic_enter_room(sid, namespace, room, eio_sid=eio_sid)
        if not self.write_only:
            self._interest.mark((namespace, room))

    def basic_leave_room(self, sid: str, namespace: str, room: Any) -> None:
        super().basic_leave_room(sid, namespace, room)
        if not self.write_only:
            self._interest.mark((namespace, room))

    def _holds(self, key: RoomKey) -> bool:
        namespace, room = key
        return bool(room in self.rooms.get(namespace, {}))

    async def settled(self) -> None:
        """Wait until the rooms this server entered so far are subscribed everywhere."""
        if not self.write_only:
            await self.start()
            await self._interest.settled()

    async def pre_connect(self, eio_sid: str, namespace: str) -> str | None:
        sid: str | None = await super().pre_connect(eio_sid, namespace)
        if sid is not None:
            await self.settled()
        return sid

    async def enter_room(
        self, sid: str, namespace: str, room: Any, eio_sid: str | None = None
    ) -> None:
        await super().enter_room(sid, namespace, room, eio_sid=eio_sid)
        await self.settled()

    # -- publishing ------------------------------------------------------------------

    async def _publish(self, data: dict[str, Any]) -> None:
        """Publish one python-socketio message to the topics of what it addresses; an
        ``enter_room``/``leave_room`` of a remote sid then waits for its server's reply.
        A failure is logged and counted (``publish_failures``), not raised, as
        python-socketio's managers do."""
        topics = self.topics.of(data)
        message = data
        if len(topics) > 1:
            message = {**message, COPY: uuid.uuid4().hex}
        token = None
        if data.get("method") in ("enter_room", "leave_room") and self._listening():
            token = uuid.uuid4().hex
            message = {**message, TOKEN: token}
            self._waits[token] = _AckWait(asyncio.get_running_loop().create_future())
        try:
            results = await self._send(topics, message)
            if token is not None and results is not None:
                await self._wait_ack(token, results[0])
        finally:
            if token is not None:
                self._waits.pop(token, None)

    async def _send(self, topics: list[str], message: dict[str, Any]) -> list[PublishResult] | None:
        encoded = self.json.dumps(message)
        payload = encoded.encode() if isinstance(encoded, str) else bytes(encoded)
        try:
            node = await self.start()
            if len(topics) == 1:
                result = await node.publish(topics[0], payload, qos=1, publisher=self._client_id)
                results = [result]
            else:
                publisher = self._client_id
                copies = [Outgoing(t, payload, qos=1, publisher=publisher) for t in topics]
                results = await node.publish_many(copies)
        except RouterError as error:
            self._counts["publish_failures"] += 1
            self._get_logger().error("cannot publish %s: %s", message.get("method"), error)
            return None
        self._counts["published"] += len(topics)
        return results

    async def _wait_ack(self, token: str, result: PublishResult) -> None:
        wait = self._waits[token]
        wait.expected = len(result.nodes)
        wait.check()
        try:
            await asyncio.wait_for(asyncio.shield(wait.done), self.ack_timeout)
        except TimeoutError:
            self._counts["acks_missed"] += 1
            self._get_logger().warning(
                "no server confirmed a room change within %s s", self.ack_timeout
            )

    async def _handle_enter_room(self, message: dict[str, Any]) -> None:
        await super()._handle_enter_room(message)
        self._reply(message)

    async def _handle_leave_room(self, message: dict[str, Any]) -> None:
        await super()._handle_leave_room(message)
        self._reply(message)

    def _reply(self, message: dict[str, Any]) -> None:
        """Tell the server that changed a room of a sid here that the change is in effect
        (once this server's subscriptions are)."""
        token = message.get(TOKEN)
        if token is None:
            return
        sid, namespace = message.get("sid"), message.get("namespace")
        held = bool(self.is_connected(sid, namespace) or self.is_pre_connected(sid, namespace))
        reply = {"method": ACK, "host_id": message.get("host_id"), "token": token, "held": held}

        async def send() -> None:
            await self._interest.settled()
            await self._publish(reply)

        task = asyncio.create_task(send())
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    # -- listening -------------------------------------------------------------------

    def _listening(self) -> bool:
        """Whether python-socketio's listener task runs (it starts with the server's first
        connection): only then can a reply reach this server."""
        thread = getattr(self, "thread", None)
        return isinstance(thread, asyncio.Task) and not thread.done()

    async def _listen(self) -> AsyncIterator[dict[str, Any]]:
        """This server's messages, decoded, each once (python-socketio's listener task
        dispatches them); the router's own replies are taken here."""
        node = await self._start_listening()
        while True:
            try:
                stream = node.messages(self._client_id)
            except ClientNotConnectedError:  # (ended before the stream was asked for)
                stream = None
            if stream is not None:
                async for delivery in stream:
                    message = self._receive(delivery.payload)
                    if message is not None:
                        yield message
            await self._reattach(node)  # (the node ended the session: a kick, a takeover)

    async def _start_listening(self) -> RouterNode:
        """Start the node, trying again (backing off) while Redis cannot be reached."""
        delay = RETRY_FIRST
        while True:
            try:
                return await self.start()
            except RouterError as error:
                self._get_logger().error("cannot start the router node: %s", error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)

    async def _reattach(self, node: RouterNode) -> None:
        """Attach this server's client again and subscribe it again to everything it held,
        retrying while Redis refuses (the node finishes ending the old session first: a
        connect waits for the client's steps under way)."""
        delay = RETRY_FIRST
        while True:
            try:
                await self._attach(node)
                self._interest.forget(list(self._held_rooms()))
                await self._interest.settled()
                break
            except RouterError as error:
                self._get_logger().error("cannot attach to the router node again: %s", error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)
        self._counts["reattached"] += 1
        self._get_logger().warning("router client %s attached again", self._client_id)

    def _held_rooms(self) -> list[RoomKey]:
        return [(ns, room) for ns, rooms in self.rooms.items() for room in rooms]

    def _on_cut_off(self) -> None:
        self._counts["cut_offs"] += 1
        self._get_logger().warning(
            "node cut off from Redis past its TTL: what other servers emitted meanwhile "
            "may not have reached this one"
        )

    def _receive(self, payload: bytes) -> dict[str, Any] | None:
        counts = self._counts
        counts["received"] += 1
        try:
            message = self.json.loads(payload)
        except ValueError:
            message = None
        if not isinstance(message, dict) or "method" not in message:
            counts["undecodable"] += 1
            return None
        copy = message.get(COPY)
        if copy is not None:
            if copy in self._seen:
                counts["duplicates"] += 1
                return None
            self._seen[copy] = None
            if len(self._seen) > SEEN_COPIES:
                self._seen.popitem(last=False)
        if message["method"] == ACK:
            wait = self._waits.get(message.get("token", ""))
            if wait is not None:
                wait.answer(bool(message.get("held")))
            counts["handled" if wait is not None else "stray"] += 1
            return None
        counts["handled" if self._addresses_us(message) else "stray"] += 1
        return message

    def _addresses_us(self, message: dict[str, Any]) -> bool:
        """Whether the message finds someone here (counted, not filtered: python-socketio
        decides what to do with it)."""
        method = message["method"]
        namespace = message.get("namespace") or "/"
        try:
            if method == "emit":
                return any(True for _ in self.get_participants(namespace, message.get("room")))
            if method in ("disconnect", "enter_room", "leave_room"):
                sid = message.get("sid")
                return bool(
                    self.is_connected(sid, namespace) or self.is_pre_connected(sid, namespace)
                )
            if method == "close_room":
                return message.get("room") in self.rooms.get(namespace, {})
            if method == "callback":
                return bool(message.get("host_id") == self.host_id)
        except TypeError:  # (an unhashable room)
            return False
        return True
