"""The load generator of ``router bench fleet``: thousands of raw MQTT 3.1.1 clients per
process, each process one asyncio event loop.

A worker process (:func:`worker_main`) raises its soft open-file limit to the hard one
and answers the parent's commands over a pipe, one at a time, in order
(:class:`FleetWorker`). Its clients are :class:`Member` objects, one per fleet index
``i`` (client id ``<ids>-<i>``, topic ``fleet/<i>``), each with at most one TCP
connection (:class:`MemberLink`) at a time; what a member received survives its
reconnects. Every packet a client sends is encoded before the timed part starts
(CONNECT and SUBSCRIBE per client; PINGREQ, DISCONNECT and PUBACK heads are constants),
and at most ``in_flight`` connects are outstanding in a process at once (a reconnect
storm gives its whole group at once).

A client binds to a loopback source address of its group first (``127.0.0.1``,
``127.0.0.2``, ...: :data:`PER_SOURCE` clients each, with ``IP_BIND_ADDRESS_NO_PORT``),
so that the 28,000 ephemeral ports of one source address never run out, whatever the
fleet's size.

Every payload is :data:`HEAD` (fleet index, seq) and :data:`FILLER`: a member counts a
payload that is not its own (another index, another topic, other bytes) in
``mismatches``; seq :data:`PROBE_SEQ` marks a probe (it proves a route, it is not
counted). The one publisher of a run (:class:`Publisher`, see
:mod:`router.bench.fleet_publisher`) lives in a worker process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Final

from router.mqtt.codec import MQTT_3_1_1, PacketReader, encode
from router.mqtt.packets import (
    ConnAck,
    Connect,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)

from .fleet_publisher import Publisher

HEAD: Final = struct.Struct("!II")
"""Payload head: the fleet index the message is for, and its seq."""
FILLER: Final = b"router-bench-fleet-0123456"
PAYLOAD_BYTES: Final = HEAD.size + len(FILLER)
PROBE_SEQ: Final = 0xFFFFFFFF
PINGREQ: Final = b"\xc0\x00"
DISCONNECT: Final = b"\xe0\x00"
PUBACK_HEAD: Final = b"\x40\x02"
PER_SOURCE: Final = 10_000
"""Clients per loopback source address (127.0.0.1 takes indices 0..9999, and so on)."""
CLOSE_TIMEOUT: Final = 15.0
"""Seconds the broker has to close connections after the clients closed theirs."""


def payload(index: int, seq: int) -> bytes:
    """The payload of message ``seq`` to fleet member ``index``."""
    return HEAD.pack(index, seq) + FILLER


def topic(index: int) -> str:
    return f"fleet/{index}"


def source_address(index: int) -> str:
    """The loopback address member ``index`` connects from (see :data:`PER_SOURCE`)."""
    group = index // PER_SOURCE
    return f"127.0.{group // 254}.{group % 254 + 1}"


CONNACK_3_1_1: Final = {
    0x84: (1, "unacceptable protocol version"),
    0x85: (2, "identifier rejected"),
    0x88: (3, "server unavailable"),
    0x86: (4, "bad user name or password"),
    0x87: (5, "not authorized"),
}
"""The 3.1.1 return code (and its name) that the reader gave as each 5.0 reason code."""


def connack_refusal(reason_code: int) -> str:
    """How a refused 3.1.1 CONNACK is counted: ``connack 3 (server unavailable)``."""
    code, name = CONNACK_3_1_1.get(reason_code, (reason_code, "unknown"))
    return f"connack {code} ({name})"


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; return the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard not in (resource.RLIM_INFINITY, soft):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


# -- commands and their answers ----------------------------------------------------------------


@dataclass(frozen=True)
class ConnectSpec:
    """Connect members ``indices`` of a worker to ``address``: client ids ``<ids>-<i>``,
    ``clean`` session or not, and with ``subscribe`` one QoS 1 SUBSCRIBE of
    ``fleet/<i>`` each (a client counts once its SUBACK granted it). Each client has
    ``timeout`` seconds from its CONNECT to its SUBACK (or CONNACK); at most ``in_flight``
    are connecting at once (0: all of them). A refused client tries again ``retries``
    times, after ``retry_delay`` seconds, then twice as long each time (times a random
    0.5-1.5, so that a storm does not come back all at once)."""

    address: tuple[str, int]
    indices: tuple[int, ...]
    ids: str
    clean: bool = True
    subscribe: bool = True
    keepalive: int = 60
    in_flight: int = 500
    timeout: float = 30.0
    retries: int = 0
    retry_delay: float = 1.0


@dataclass
class ConnectReport:
    """What one :class:`ConnectSpec` did: ``ok`` clients connected (and subscribed), the
    refusals by reason (every attempt refused), the clients that ``gave_up`` (refused at
    every attempt), the first CONNECT and the last completion (monotonic ns, one clock
    for every process of the machine), each ok client's CONNECT -> CONNACK time (of the
    attempt that got in), and how many CONNACKs said a session was present."""

    ok: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    first_ns: int = 0
    last_ns: int = 0
    connack_ns: list[int] = field(default_factory=list)
    present: int = 0
    gave_up: int = 0

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


@dataclass
class FleetTally:
    """A worker's members at one moment: ``delivered`` members with at least one message,
    ``messages`` received in all (duplicates too), ``probed`` members that saw a probe,
    ``mismatches`` (payloads that were not theirs), ``drops`` (connections the broker
    closed or lost), ``connected`` members now, and ``accepted`` those of them whose
    connection got its CONNACK 0 (and SUBACK); ``returned`` members accepted at least
    once by the broker of the rejoin spec, ``rejoined`` clients connected again after it
    closed them, ``rejoin_refused`` refusals then (see :meth:`FleetWorker.do_connect`)."""

    members: int = 0
    delivered: int = 0
    messages: int = 0
    probed: int = 0
    mismatches: int = 0
    drops: int = 0
    connected: int = 0
    accepted: int = 0
    returned: int = 0
    rejoined: int = 0
    rejoin_refused: int = 0


# -- one client ---------------------------------------------------------------------------------


class Member:
    """One client of the fleet across its connections."""

    __slots__ = (
        "drops",
        "expected",
        "index",
        "link",
        "mismatches",
        "probed",
        "returned",
        "seqs",
        "topic",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.topic = topic(index)
        self.link: MemberLink | None = None
        self.seqs: list[int] = []
        self.probed = False
        self.mismatches = 0
        self.drops = 0
        self.expected: frozenset[int] = frozenset()
        self.returned = False  # (accepted once at least by the address of a rejoin spec)

    def receive(self, packet: Publish) -> None:
        data = packet.payload
        if len(data) != PAYLOAD_BYTES or data[HEAD.size :] != FILLER or packet.topic != self.topic:
            self.mismatches += 1
            return
        index, seq = HEAD.unpack_from(data)
        if index != self.index:
            self.mismatches += 1
        elif seq == PROBE_SEQ:
            self.probed = True
        else:
            self.seqs.append(seq)

    def missing(self) -> int:
        """Expected seqs not received (see :meth:`FleetWorker.do_expect`)."""
        return len(self.expected.difference(self.seqs)) if self.expected else 0


class MemberLink(asyncio.Protocol):
    """One TCP connection of a member: futures for CONNACK, SUBACK and PINGRESP, every
    PUBLISH handed to the member (at QoS 1 acknowledged at once)."""

    def __init__(
        self,
        member: Member,
        loop: asyncio.AbstractEventLoop,
        address: tuple[str, int],
        on_lost: Callable[[MemberLink], None],
    ) -> None:
        self.member = member
        self.address = address
        self.on_lost = on_lost
        self.reader = PacketReader()
        self.reader.level = MQTT_3_1_1  # (a client reads a server's packets: no CONNECT)
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[ConnAck] = loop.create_future()
        self.suback: asyncio.Future[SubAck] = loop.create_future()
        self.pingresp: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] = loop.create_future()
        self.leaving = False
        self.accepted = False  # (CONNACK 0, and SUBACK if it subscribed)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            packets = self.reader.feed(data)
        except Exception as exc:  # (a malformed packet from the broker: count it, hang up)
            self.member.mismatches += 1
            self._fail(exc)
            if self.transport is not None:
                self.transport.close()
            return
        for packet in packets:
            kind = type(packet)
            if kind is Publish:
                assert isinstance(packet, Publish)
                if packet.qos and packet.packet_id is not None and self.transport is not None:
                    self.transport.write(PUBACK_HEAD + packet.packet_id.to_bytes(2, "big"))
                self.member.receive(packet)
            elif kind is ConnAck and not self.connack.done():
                assert isinstance(packet, ConnAck)
                self.connack.set_result(packet)
            elif kind is SubAck and not self.suback.done():
                assert isinstance(packet, SubAck)
                self.suback.set_result(packet)
            elif kind is PingResp and self.pingresp is not None and not self.pingresp.done():
                self.pingresp.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.member.link is self:
            self.member.link = None
            if not self.leaving:
                self.member.drops += 1
                self.on_lost(self)
        self._fail(exc or ConnectionResetError("the broker closed the connection"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        for future in (self.connack, self.suback, self.pingresp):
            if future is not None and not future.done():
                future.set_exception(exc)
                future.exception()  # (retrieved: no "never retrieved" warning)

    def close(self, disconnect: bool) -> None:
        self.leaving = True
        if self.transport is not None and not self.transport.is_closing():
            if disconnect:
                self.transport.write(DISCONNECT)
            self.transport.close()


async def open_socket(address: tuple[str, int], source: str) -> socket.socket:
    """A non-blocking TCP socket from ``source`` (port chosen at connect), connected."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if source != "127.0.0.1":
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((source, 0))
        await asyncio.get_running_loop().sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


# -- the worker ---------------------------------------------------------------------------------


class FleetWorker:
    """A worker process's members and its commands (``do_<name>``), each answered in
    order: ``("ok", result)`` or ``("error", text)``."""

    def __init__(self, pipe: Connection) -> None:
        self.pipe = pipe
        self.members: dict[int, Member] = {}
        self.rejoin: ConnectSpec | None = None
        #: A client whose connection to an address here the broker closes connects again
        #: as the spec says (a load balancer's choice of another node: do_redirect).
        self.redirects: dict[tuple[str, int], ConnectSpec] = {}
        self.rejoined = ConnectReport()
        self.rejoins: set[asyncio.Task[None]] = set()
        self.pending: list[asyncio.Task[ConnectReport]] = []
        self.publisher: Publisher | None = None

    async def serve(self) -> None:
        while True:
            name, args = await self._next_command()
            if name == "exit":
                await self.do_close(False)
                return
            try:
                result = await getattr(self, f"do_{name}")(*args)
            except Exception as exc:
                self.pipe.send(("error", f"{name}: {exc!r}"))
            else:
                self.pipe.send(("ok", result))

    async def _next_command(self) -> tuple[str, tuple[Any, ...]]:
        if not self.pipe.poll():
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(self.pipe.fileno(), readable)
            try:
                await ready
            finally:
                loop.remove_reader(self.pipe.fileno())
        try:
            command: tuple[str, tuple[Any, ...]] = self.pipe.recv()
        except EOFError:
            return "exit", ()  # (the parent went away)
        return command

    # -- connecting -----------------------------------------------------------------------

    async def do_connect(
        self, spec: ConnectSpec, background: bool = False, rejoin: bool = False
    ) -> Any:
        """Connect (see :class:`ConnectSpec`); with ``background`` answer at once and
        leave the report to :meth:`do_join`. With ``rejoin``, from now on a client whose
        accepted connection to ``spec.address`` the broker closes connects again as
        ``spec`` says, ``spec.retry_delay`` seconds later (counted in ``rejoined``)."""
        if rejoin:
            self.rejoin = spec
        task = asyncio.create_task(self._connect(spec))
        if background:
            self.pending.append(task)
            return None
        return await task

    async def do_join(self) -> list[ConnectReport]:
        """The reports of the background connects, once all finished."""
        pending, self.pending = self.pending, []
        return list(await asyncio.gather(*pending))

    async def _connect(self, spec: ConnectSpec) -> ConnectReport:
        level = MQTT_3_1_1
        packets = [
            (
                encode(Connect(f"{spec.ids}-{i}", level, spec.clean, spec.keepalive), level),
                encode(Subscribe(1, (Subscription(topic(i), 1),)), level),
            )
            for i in spec.indices
        ]  # (encoded before the first CONNECT goes out)
        report = ConnectReport()
        todo: Iterator[int] = iter(range(len(spec.indices)))
        report.first_ns = time.monotonic_ns()

        async def runner() -> None:
            for position in todo:
                connect, subscribe = packets[position]
                await self._connect_one(spec, spec.indices[position], connect, subscribe, report)

        count = spec.in_flight or len(spec.indices)
        await asyncio.gather(*(runner() for _ in range(min(count, len(spec.indices)))))
        report.last_ns = report.last_ns or time.monotonic_ns()
        return report

    async def _connect_one(
        self, spec: ConnectSpec, index: int, connect: bytes, subscribe: bytes, report: ConnectReport
    ) -> None:
        """One client: its attempts (1 + ``spec.retries``, ``spec.retry_delay`` apart),
        every refusal counted; the CONNECT -> CONNACK time of the one that got in."""
        member = self.members.get(index)
        if member is None:
            member = self.members[index] = Member(index)
        for attempt in range(spec.retries + 1):
            if attempt:  # (exponential backoff with jitter, as clients do)
                await asyncio.sleep(
                    spec.retry_delay * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
                )
            refused, connack, took = await self._attempt(spec, member, connect, subscribe)
            if refused is None:
                assert connack is not None
                report.ok += 1
                report.present += connack.session_present
                report.connack_ns.append(took)
                report.last_ns = max(report.last_ns, time.monotonic_ns())
                return
            report.refuse(refused)
        report.gave_up += 1

    async def do_redirect(self, closed: tuple[str, int], spec: ConnectSpec) -> None:
        """From now on a client whose accepted connection to ``closed`` the broker
        closes connects again as ``spec`` says (to another node), ``spec.retry_delay``
        seconds later (counted in ``rejoined``), as a load balancer sends a client whose
        node left to another."""
        self.redirects[(closed[0], closed[1])] = spec  # (a list, through the pipe)

    def _lost(self, link: MemberLink) -> None:
        spec = self.redirects.get(link.address)
        if spec is None and self.rejoin is not None and link.address == self.rejoin.address:
            spec = self.rejoin
        if spec is not None and link.accepted:
            task = asyncio.get_running_loop().create_task(self._rejoin(spec, link.member))
            self.rejoins.add(task)
            task.add_done_callback(self.rejoins.discard)

    async def _rejoin(self, spec: ConnectSpec, member: Member) -> None:
        await asyncio.sleep(spec.retry_delay)
        current = spec is self.rejoin or any(spec is s for s in self.redirects.values())
        if current and member.link is None:
            level = MQTT_3_1_1
            connect = encode(
                Connect(f"{spec.ids}-{member.index}", level, spec.clean, spec.keepalive), level
            )
            subscribe = encode(Subscribe(1, (Subscription(member.topic, 1),)), level)
            await self._connect_one(spec, member.index, connect, subscribe, self.rejoined)

    async def _attempt(
        self, spec: ConnectSpec, member: Member, connect: bytes, subscribe: bytes
    ) -> tuple[str | None, ConnAck | None, int]:
        """(why it was refused or None, the CONNACK, ns from CONNECT to CONNACK)."""
        if member.link is not None:
            member.link.close(False)
        loop = asyncio.get_running_loop()
        link = MemberLink(member, loop, spec.address, self._lost)
        refused: str | None = None
        connack: ConnAck | None = None
        began = answered = time.monotonic_ns()
        try:
            async with asyncio.timeout(spec.timeout):
                sock = await open_socket(spec.address, source_address(member.index))
                await loop.create_connection(lambda: link, sock=sock)
                assert link.transport is not None
                member.link = link
                began = time.monotonic_ns()
                link.transport.write(connect)
                connack = await link.connack
                answered = time.monotonic_ns()
                if connack.reason_code:
                    refused = connack_refusal(connack.reason_code)
                elif spec.subscribe:
                    link.transport.write(subscribe)
                    suback = await link.suback
                    if suback.reason_codes[0] >= 0x80:
                        refused = f"suback {suback.reason_codes[0]:#04x}"
        except (TimeoutError, OSError) as exc:
            refused = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        if refused is not None:
            if member.link is link:
                member.link = None
            link.close(False)
            return refused, connack, 0
        link.accepted = True
        if self.rejoin is not None and spec.address == self.rejoin.address:
            member.returned = True
        return None, connack, answered - began

    # -- the connected fleet --------------------------------------------------------------

    async def do_ping(self, timeout: float) -> int:
        """One PINGREQ on every connection; how many PINGRESPs came within ``timeout``."""
        loop = asyncio.get_running_loop()
        waiting: list[asyncio.Future[None]] = []
        for member in self.members.values():
            link = member.link
            if link is not None and link.transport is not None:
                link.pingresp = loop.create_future()
                waiting.append(link.pingresp)
                link.transport.write(PINGREQ)
        if not waiting:
            return 0
        done, _ = await asyncio.wait(waiting, timeout=timeout)
        return sum(1 for future in done if future.exception() is None)

    async def do_tally(self) -> FleetTally:
        tally = FleetTally(members=len(self.members), rejoined=self.rejoined.ok)
        tally.rejoin_refused = sum(self.rejoined.refused.values())
        for member in self.members.values():
            tally.delivered += bool(member.seqs)
            tally.messages += len(member.seqs)
            tally.probed += member.probed
            tally.mismatches += member.mismatches
            tally.drops += member.drops
            tally.connected += member.link is not None
            tally.accepted += member.link is not None and member.link.accepted
            tally.returned += member.returned
        return tally

    async def do_unprobed(self) -> list[int]:
        """The members that saw no probe yet."""
        return [index for index, member in self.members.items() if not member.probed]

    async def do_expect(self, acknowledged: dict[int, list[int]]) -> None:
        """What each member must receive in the end (the seqs the publisher got
        acknowledged for its topic)."""
        for index, seqs in acknowledged.items():
            self.members[index].expected = frozenset(seqs)

    async def do_missing(self) -> int:
        """Expected messages not received yet, over the worker's members."""
        return sum(member.missing() for member in self.members.values())

    async def do_absent(self) -> list[int]:
        """The members not connected now (or whose connection was not accepted)."""
        return [i for i, m in self.members.items() if m.link is None or not m.link.accepted]

    async def do_received(self) -> dict[int, list[int]]:
        """Every member's seqs, in the order they arrived (duplicates kept)."""
        return {index: list(member.seqs) for index, member in self.members.items()}

    async def do_close(self, disconnect: bool) -> int:
        """Close every connection (with ``disconnect``, DISCONNECT first) and forget the
        members; wait (bounded) until the broker closed its side. Returns how many did
        not close within :data:`CLOSE_TIMEOUT`."""
        self.rejoin = None
        self.redirects.clear()
        for task in list(self.rejoins):
            task.cancel()
        links = [m.link for m in self.members.values() if m.link is not None]
        for link in links:
            link.close(disconnect)
        self.members.clear()
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None
        if not links:
            return 0
        _, late = await asyncio.wait([link.closed for link in links], timeout=CLOSE_TIMEOUT)
        return len(late)

    # -- the publisher ----------------------------------------------------------------------

    async def do_publisher_connect(self, address: tuple[str, int], client_id: str) -> None:
        self.publisher = await Publisher.connect(address, client_id)

    async def do_burst(self, indices: list[int], seq: int) -> None:
        """One QoS 0 PUBLISH of ``seq`` to each member's topic, written at once."""
        assert self.publisher is not None
        await self.publisher.burst([(topic(i), payload(i, seq)) for i in indices])

    async def do_publisher_move(self, address: tuple[str, int]) -> None:
        """Once the broker closes the publisher's connection, it connects to ``address``."""
        assert self.publisher is not None
        self.publisher.address = (address[0], address[1])

    async def do_rejoined(self) -> ConnectReport:
        """What the clients' connects since the broker closed them did (see rejoin)."""
        return self.rejoined

    async def do_stream(self, count: int, rate: float, window: int) -> None:
        """Start the QoS 1 stream over fleet indices ``0..count-1`` (see :class:`Publisher`)."""
        assert self.publisher is not None
        self.publisher.start([(topic(i), i) for i in range(count)], payload, rate, window)

    async def do_stream_progress(self) -> dict[str, Any]:
        assert self.publisher is not None
        return self.publisher.progress()

    async def do_stream_stop(self) -> dict[str, Any]:
        """Stop the stream, wait (bounded) for its last acknowledgements; the result."""
        assert self.publisher is not None
        return await self.publisher.stop()


def worker_main(pipe: Connection) -> None:
    """A worker process: raise the open-file limit, answer commands until ``exit``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C: the parent stops us)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise_fd_limit()
    with contextlib.suppress(BrokenPipeError, EOFError):
        asyncio.run(FleetWorker(pipe).serve())
