"""The processes of ``router bench backends``: workers holding members, and senders.

Each process is started once (``multiprocessing``, spawn) and serves every backend in
turn, each in an event loop of its own (``asyncio.run``), driven by commands on its pipe:

a worker (:func:`worker_main`)::

    ("open", spec)  -> the backend's layer or manager, and one member for each group the
                       worker holds (:meth:`BackendsConfig.groups_of`); "ready"
    "status"        -> Receipts.status() (every member probed? fenced? deliveries so
                       far) and "processed": messages its backend handled so far
    "report"        -> Receipts.report() and "processed"
    "close"         -> closes the backend, leaves its loop; "closed"

a sender (:func:`sender_main`; the sender ``lane`` of ``lanes`` sends the messages
``first + lane``, ``first + lane + lanes``, ...)::

    ("open", spec)                        -> a layer, or a write-only manager; "ready"
    "probe"                               -> one probe to every group; "probed"
    ("fence", lane)                       -> its fence to every group; "fenced"
    ("burst", first, count, lane, lanes)  -> its share as fast as it can, WINDOW sends in
                                             flight; {"start", "end"} (time.monotonic())
    ("paced", first, count, lane, lanes)  -> its share at rate / lanes a second; the same
    "close"                               -> as a worker

An answer ``("error", text)`` stands for any of them when the backend failed. The four
backends (``spec``, a :class:`BackendSpec`, names one), each on the same Redis:

* ``router_channels``: :class:`RouterChannelLayer`; a member is a channel of
  ``new_channel()`` added to the group, read by a ``receive()`` loop; *processed* is the
  layer's ``received`` (copies its node took from other processes);
* ``channels_redis``: ``RedisPubSubChannelLayer``, the same members; *processed* counts the
  pub/sub messages its connection handed to the layer;
* ``router_socketio`` / ``socketio_redis``: ``socketio.AsyncServer`` with
  :class:`RouterManager` / ``AsyncRedisManager`` and no real client: a member is a sid
  connected through the manager (``connect(eio_sid, "/")``) and put in the room
  (``enter_room``); the server's ``_send_eio_packet``, where a packet would leave for the
  client's socket, records the delivery; *processed* counts the messages the manager's
  ``_listen`` yielded to python-socketio's listener task (each then decoded and handled).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final, Protocol

import socketio
from channels_redis.pubsub import RedisPubSubChannelLayer

from router.bench.backend_plan import PROBE, BackendsConfig, Receipts, fence_of
from router.integrations.channels_layer import RouterChannelLayer
from router.integrations.socketio_manager import RouterManager

WINDOW: Final = 64
"""Sends each sender keeps in flight in the throughput phase."""
QUEUE_LIMIT: Final = 10_000_000
"""The router backends' queues (node queue, mailboxes): as unbounded as the peers'
(channels_redis and python-socketio queue without limit), so that a backlog is measured
as time, not as drops."""
NAMESPACE: Final = "/"
EVENT: Final = "m"
MESSAGE_TYPE: Final = "bench.message"

Record = Callable[[int, int, float], None]
"""``record(member, seq, sent_at)``: :meth:`Receipts.record`."""


@dataclass(frozen=True)
class BackendSpec:
    """One backend of one run: which, on which Redis, under which names (a prefix of its
    own, so a run never meets another's keys or channels)."""

    backend: str
    url: str
    prefix: str


class Side(Protocol):
    """One backend in one process: members (a worker) or sends (a sender)."""

    async def hold(self, groups: list[int], record: Record) -> None: ...

    async def open_sender(self) -> None: ...

    async def send(self, group: int, seq: int) -> None: ...

    def processed(self) -> int: ...

    async def close(self) -> None: ...


def group_name(prefix: str, group: int) -> str:
    return f"{prefix}-g{group}"


# -- Django Channels layers ----------------------------------------------------------------


class _LayerSide:
    """A channel layer: a member is a channel of this process in the group."""

    def __init__(self, spec: BackendSpec, pad: str) -> None:
        self.spec = spec
        self.pad = pad
        self.layer: Any = None
        self.tasks: list[asyncio.Task[None]] = []

    def make(self) -> Any:
        raise NotImplementedError

    async def hold(self, groups: list[int], record: Record) -> None:
        self.layer = self.make()
        for member, group in enumerate(groups):
            channel = await self.layer.new_channel()
            await self.layer.group_add(group_name(self.spec.prefix, group), channel)
            self.tasks.append(asyncio.create_task(self._receive(channel, member, record)))

    async def _receive(self, channel: str, member: int, record: Record) -> None:
        while True:
            message = await self.layer.receive(channel)
            record(member, message["s"], message["t"])

    async def open_sender(self) -> None:
        self.layer = self.make()

    async def send(self, group: int, seq: int) -> None:
        message = {"type": MESSAGE_TYPE, "s": seq, "t": time.monotonic(), "p": self.pad}
        await self.layer.group_send(group_name(self.spec.prefix, group), message)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class _RouterLayerSide(_LayerSide):
    def make(self) -> Any:
        return RouterChannelLayer(
            self.spec.url,
            prefix=self.spec.prefix,
            capacity=QUEUE_LIMIT,
            queue_limit=QUEUE_LIMIT,
        )

    def processed(self) -> int:
        return int(self.layer.stats()["received"]) if self.layer is not None else 0

    async def close(self) -> None:
        await super().close()
        if self.layer is not None:
            await self.layer.close()


class _ChannelsRedisSide(_LayerSide):
    def __init__(self, spec: BackendSpec, pad: str) -> None:
        super().__init__(spec, pad)
        self.count = 0

    def make(self) -> Any:
        layer = RedisPubSubChannelLayer(hosts=[self.spec.url], prefix=self.spec.prefix)
        # What its connection hands to the layer: every message of a subscribed channel
        # (RedisSingleShardConnection._receive_message, channels_redis 4.3).
        for shard in layer._get_layer()._shards:
            shard._receive_message = self._counting(shard._receive_message)
        return layer

    def _counting(self, receive: Callable[[Any], None]) -> Callable[[Any], None]:
        def counted(message: Any) -> None:
            if message is not None:
                self.count += 1
            receive(message)

        return counted

    def processed(self) -> int:
        return self.count

    async def close(self) -> None:
        await super().close()
        if self.layer is not None:
            await self.layer.flush()


# -- python-socketio managers -------------------------------------------------------------


class _RecordingServer(socketio.AsyncServer):  # type: ignore[misc]  # (socketio is untyped)
    """A socket.io server without clients: a packet for a client is recorded instead of
    sent (an emit's packet is ``2["m", {...}]``: EVENT, the event and its data)."""

    def __init__(self, manager: Any, members: dict[str, int], record: Record) -> None:
        super().__init__(client_manager=manager, async_mode="asgi")
        self.bench_members = members
        self.bench_record = record

    async def _send_eio_packet(self, eio_sid: str, eio_pkt: Any) -> None:
        text: str = eio_pkt.data
        _, data = json.loads(text[text.index("[") :])
        self.bench_record(self.bench_members[eio_sid], data["s"], data["t"])


class _ManagerSide:
    """A python-socketio client manager: a member is a sid connected here, in the room."""

    def __init__(self, spec: BackendSpec, pad: str) -> None:
        self.spec = spec
        self.pad = pad
        self.manager: Any = None
        self.count = 0

    def make(self, write_only: bool) -> Any:
        raise NotImplementedError

    async def hold(self, groups: list[int], record: Record) -> None:
        manager = self.manager = self.make(write_only=False)
        members: dict[str, int] = {}
        server = _RecordingServer(manager, members, record)
        listen = manager._listen

        async def counted() -> AsyncIterator[Any]:
            async for message in listen():
                self.count += 1
                yield message

        manager._listen = counted
        server.manager_initialized = True  # (the server's first connection would do it)
        manager.initialize()  # (starts python-socketio's listener task)
        for member, group in enumerate(groups):
            eio_sid = f"eio{member}"
            members[eio_sid] = member
            sid = await manager.connect(eio_sid, NAMESPACE)
            await manager.enter_room(sid, NAMESPACE, group_name(self.spec.prefix, group))

    async def open_sender(self) -> None:
        self.manager = self.make(write_only=True)

    async def send(self, group: int, seq: int) -> None:
        data = {"s": seq, "t": time.monotonic(), "p": self.pad}
        room = group_name(self.spec.prefix, group)
        await self.manager.emit(EVENT, data, namespace=NAMESPACE, room=room)

    def processed(self) -> int:
        return self.count


class _RouterManagerSide(_ManagerSide):
    def make(self, write_only: bool) -> Any:
        options = {"prefix": self.spec.prefix, "queue_limit": QUEUE_LIMIT}
        return RouterManager(
            self.spec.url, channel=self.spec.prefix, write_only=write_only, node_options=options
        )

    async def close(self) -> None:
        if self.manager is not None:
            await self.manager.close()


class _RedisManagerSide(_ManagerSide):
    def make(self, write_only: bool) -> Any:
        return socketio.AsyncRedisManager(
            self.spec.url, channel=self.spec.prefix, write_only=write_only
        )

    async def close(self) -> None:
        manager = self.manager
        if manager is None:
            return
        listener = getattr(manager, "thread", None)
        if isinstance(listener, asyncio.Task):
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
        if manager.pubsub is not None:
            await manager.pubsub.aclose()
        if manager.redis is not None:
            await manager.redis.aclose()


SIDES: Final[dict[str, Callable[[BackendSpec, str], Side]]] = {
    "router_channels": _RouterLayerSide,
    "channels_redis": _ChannelsRedisSide,
    "router_socketio": _RouterManagerSide,
    "socketio_redis": _RedisManagerSide,
}


# -- the processes -----------------------------------------------------------------------------


def worker_main(pipe: Connection, worker: int, config: BackendsConfig) -> None:
    """Worker ``worker``: serve one backend after another until told ``None`` (or the
    bench's end of the pipe closes)."""
    _quiet()
    while (spec := _next_backend(pipe)) is not None:
        asyncio.run(_serve(pipe, spec, config, _worker_session(pipe, worker, config)))


def sender_main(pipe: Connection, config: BackendsConfig) -> None:
    """The sender: serve one backend after another until told ``None``."""
    _quiet()
    while (spec := _next_backend(pipe)) is not None:
        asyncio.run(_serve(pipe, spec, config, _sender_session(pipe, config)))


def _next_backend(pipe: Connection) -> BackendSpec | None:
    """The next ``("open", spec)``'s spec; None when told ``None`` or the pipe closed."""
    try:
        command = pipe.recv()
    except EOFError:
        return None
    if command is None:
        return None
    spec: BackendSpec = command[1]
    return spec


def _quiet() -> None:
    """Only errors in the log: python-socketio's info lines would go to the bench's output."""
    logging.basicConfig(level=logging.ERROR)


Session = Callable[[Side], Awaitable[None]]


async def _serve(
    pipe: Connection, spec: BackendSpec, config: BackendsConfig, session: Session
) -> None:
    """Run ``session`` on the backend of ``spec``, then close the backend however the
    session ended; a failure is answered ``("error", traceback)`` (the bench raises it),
    and ``"closed"`` ends every session."""
    side = SIDES[spec.backend](spec, "x" * config.payload_bytes)
    try:
        await session(side)
    except Exception:
        pipe.send(("error", traceback.format_exc()))
    try:
        await side.close()
    except Exception:
        pipe.send(("error", traceback.format_exc()))
    pipe.send("closed")


def _worker_session(pipe: Connection, worker: int, config: BackendsConfig) -> Session:
    async def session(side: Side) -> None:
        receipts = Receipts(config, worker)
        await side.hold(receipts.groups, receipts.record)
        pipe.send("ready")
        while (command := await asyncio.to_thread(pipe.recv)) != "close":
            if command == "status":
                pipe.send({**receipts.status(), "processed": side.processed()})
            elif command == "report":
                pipe.send({**receipts.report(), "processed": side.processed()})

    return session


def _sender_session(pipe: Connection, config: BackendsConfig) -> Session:
    async def session(side: Side) -> None:
        await side.open_sender()
        pipe.send("ready")
        while (command := await asyncio.to_thread(pipe.recv)) != "close":
            if command == "probe":
                await asyncio.gather(*(side.send(g, PROBE) for g in range(config.groups)))
                pipe.send("probed")
            elif command[0] == "fence":
                fence = fence_of(command[1])
                await asyncio.gather(*(side.send(g, fence) for g in range(config.groups)))
                pipe.send("fenced")
            elif command[0] == "burst":
                pipe.send(await burst(side, config, *command[1:]))
            elif command[0] == "paced":
                pipe.send(await paced(side, config, *command[1:]))

    return session


async def burst(
    side: Side, config: BackendsConfig, first: int, count: int, lane: int, lanes: int
) -> dict[str, float]:
    """Send this sender's share of messages ``first .. first+count-1`` (those at
    ``first + lane``, every ``lanes``-th) as fast as the backend takes them, :data:`WINDOW`
    sends in flight; when the first started and the last returned."""
    seqs = iter(range(first + lane, first + count, lanes))

    async def window_slot() -> None:
        for seq in seqs:  # (one iterator shared by the slots: each message once)
            await side.send(config.group_of(seq), seq)

    start = time.monotonic()
    await asyncio.gather(*(window_slot() for _ in range(WINDOW)))
    return {"start": start, "end": time.monotonic()}


async def paced(
    side: Side, config: BackendsConfig, first: int, count: int, lane: int, lanes: int
) -> dict[str, float]:
    """This sender's share (as :func:`burst`) at ``config.rate / lanes`` a second: every
    millisecond, those that fell due, each in a task of its own (a send that waits does
    not hold back the next ones; each message is stamped when its send starts)."""
    seqs = range(first + lane, first + count, lanes)
    rate = config.rate / lanes
    start = time.monotonic()
    tasks = []
    sent = 0
    while sent < len(seqs):
        due = min(len(seqs), int((time.monotonic() - start) * rate) + 1)
        for seq in seqs[sent:due]:
            tasks.append(asyncio.create_task(side.send(config.group_of(seq), seq)))
        sent = due
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    return {"start": start, "end": time.monotonic()}
