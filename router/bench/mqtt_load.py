"""The load generator of ``router bench mqtt``: MQTT 3.1.1 over raw sockets, in processes.

This module holds the processes; :func:`router.bench.broker_runs.run_load` drives one
measured run of them against one broker (publish side and subscribe side may be two nodes
of one cluster)::

    parent ──fork──> S subscriber processes: CONNECT, SUBSCRIBE bench/pPPP/+ (theirs), parse
       │                 every PUBLISH by hand, PUBACK each one at QoS 1
       ├── probe: a QoS 0 PUBLISH to bench/pPPP/probe for every publisher, again every
       │   PROBE_INTERVAL, until each subscriber saw its publishers' probes (on a cluster:
       │   the subscriptions reached the publishing node's route table)
       └──fork──> P publisher processes: CONNECT, then on one start signal send their
                       pre-encoded PUBLISH packets (QoS 1: at most ``window`` unacknowledged),
                       report, and stay connected until the subscribers are done

Workload: publisher ``p`` sends its messages on ``TOPICS_PER_PUBLISHER`` topics
``bench/pPPP/tTTT`` (message ``seq`` on topic ``seq % TOPICS_PER_PUBLISHER``); subscriber
``s`` subscribes ``bench/pPPP/+`` for every ``p`` with ``(p - s) % S < F``, so each message
has ``F`` receivers (the fan-out, 1 by default: ``p % S == s``). Every payload is
``PAYLOAD_BYTES`` long and starts with :data:`HEAD`: publisher, seq, the send time and the
intended send time (``time.time_ns()``, one clock for every process of the machine); seq
``PROBE_SEQ`` marks a probe.

Throughput is unique deliveries (a message to each of its receivers) over (last receive -
first send). Each subscriber returns one bitmap per publisher (which seqs arrived), so the
parent counts ``lost`` and ``duplicates`` and compares the delivered sets of brokers. A
subscriber stops when it has everything, or ``drain_seconds`` after its last new message
once the publishers are done.
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import signal
import socket
import struct
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any, Final

from router.errors import BenchSetupError

PAYLOAD_BYTES: Final = 256
HEAD: Final = struct.Struct("!IIQQ")
"""Payload head: publisher, seq, sent_ns (when written), due_ns (when scheduled)."""
PROBE_SEQ: Final = 0xFFFFFFFF
TOPICS_PER_PUBLISHER: Final = 100
PROBE_INTERVAL: Final = 0.05
SETUP_TIMEOUT: Final = 30.0
"""Seconds for connections, subscriptions and probes to come through."""
IO_TIMEOUT: Final = 60.0
"""Seconds a QoS 1 publisher waits for a PUBACK before giving up on the rest."""
MAX_DRAIN: Final = 300.0
"""Seconds a subscriber keeps reading after the publishers finished, at most."""
SEND_BATCH: Final = 64
"""PUBLISH packets a publisher writes per send call (QoS 1: up to half the window)."""
RECV_SIZE: Final = 1 << 18
COALESCE: Final = 0.0005
"""Seconds of a nap after a short read (throughput runs), to read more at once next time."""
COALESCE_BELOW: Final = 1 << 14
CONNACK_OK: Final = b"\x20\x02\x00\x00"
DISCONNECT: Final = b"\xe0\x00"


# -- packets ---------------------------------------------------------------------------------


def remaining_length(size: int) -> bytes:
    """The variable byte integer of MQTT's fixed header."""
    out = bytearray()
    while True:
        byte, size = size & 0x7F, size >> 7
        out.append(byte | (0x80 if size else 0))
        if not size:
            return bytes(out)


def _text(value: str) -> bytes:
    data = value.encode()
    return len(data).to_bytes(2, "big") + data


def connect_packet(client_id: str) -> bytes:
    """CONNECT 3.1.1, clean session, no keepalive (the broker never times us out)."""
    body = _text("MQTT") + b"\x04\x02\x00\x00" + _text(client_id)
    return b"\x10" + remaining_length(len(body)) + body


def subscribe_packet(packet_id: int, filters: list[str], qos: int) -> bytes:
    body = packet_id.to_bytes(2, "big") + b"".join(_text(f) + bytes([qos]) for f in filters)
    return b"\x82" + remaining_length(len(body)) + body


def publish_packet(topic: str, payload: bytes, qos: int = 0, packet_id: int = 0) -> bytes:
    body = _text(topic) + (packet_id.to_bytes(2, "big") if qos else b"") + payload
    return bytes([0x30 | qos << 1]) + remaining_length(len(body)) + body


def topic_of(publisher: int, seq: int) -> str:
    return f"bench/p{publisher:03d}/t{seq % TOPICS_PER_PUBLISHER:03d}"


def filter_of(publisher: int) -> str:
    return f"bench/p{publisher:03d}/+"


def payload_for(publisher: int, seq: int) -> bytes:
    head = HEAD.pack(publisher, seq, 0, 0)
    return head + b"x" * (PAYLOAD_BYTES - len(head))


def split_packets(data: bytes) -> tuple[list[tuple[int, int, int]], int]:
    """The whole packets at the start of ``data`` as (first byte, body start, body end),
    and how many bytes they take (the rest is an incomplete packet)."""
    packets, pos, size = [], 0, len(data)
    while pos + 2 <= size:
        length, start = read_length(data, pos + 1)
        if length < 0 or start + length > size:
            break
        packets.append((data[pos], start, start + length))
        pos = start + length
    return packets, pos


def read_length(data: bytes, at: int) -> tuple[int, int]:
    """The remaining length that starts at ``data[at]`` and where the body starts;
    (-1, -1) if ``data`` ends inside it."""
    length, shift = 0, 0
    for index in range(at, min(at + 4, len(data))):
        byte = data[index]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return length, index + 1
    return -1, -1


def open_session(address: tuple[str, int], client_id: str) -> socket.socket:
    """A connected MQTT session; raises :class:`BenchSetupError` if CONNACK is not 0."""
    sock = socket.create_connection(address, timeout=SETUP_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(connect_packet(client_id))
    answer = _read_exactly(sock, 4)
    if answer != CONNACK_OK:
        raise BenchSetupError(f"{address}: CONNACK {answer.hex()} for {client_id}")
    return sock


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise BenchSetupError("the broker closed the connection")
        data += chunk
    return data


# -- the plan of one run ---------------------------------------------------------------------


@dataclass(frozen=True)
class LoadPlan:
    """One run: ``messages`` split over ``publishers`` (the first ones take the remainder),
    ``subscribers`` <= ``publishers``, each message to ``fanout`` of them; with ``rate``
    (msg/s) one paced publisher (latency)."""

    messages: int
    publishers: int
    subscribers: int
    qos: int
    window: int = 100
    drain_seconds: float = 3.0
    rate: float | None = None
    label: str = "bench"
    fanout: int = 1

    def __post_init__(self) -> None:
        if self.qos not in (0, 1):
            raise BenchSetupError(f"qos is 0 or 1, not {self.qos!r}")
        if min(self.messages, self.publishers, self.subscribers, self.window) < 1:
            raise BenchSetupError("messages, publishers, subscribers and window must be >= 1")
        if self.subscribers > self.publishers or self.publishers > 999:
            raise BenchSetupError("subscribers <= publishers <= 999")
        if not 1 <= self.fanout <= self.subscribers:
            raise BenchSetupError("fanout is 1..subscribers")
        if self.messages < self.publishers:
            raise BenchSetupError("at least one message per publisher")
        if not 1 <= self.window < 0x8000:
            raise BenchSetupError("window is 1..32767")
        if self.rate is not None and self.rate <= 0:
            raise BenchSetupError("rate must be > 0")

    def count(self, publisher: int) -> int:
        share, rest = divmod(self.messages, self.publishers)
        return share + (1 if publisher < rest else 0)

    def publishers_of(self, subscriber: int) -> list[int]:
        return [
            p for p in range(self.publishers) if (p - subscriber) % self.subscribers < self.fanout
        ]


@dataclass
class LoadResult:
    """What one run measured; ``bitmaps`` holds, subscriber after subscriber, one bitmap
    per publisher it subscribed (byte ``seq`` is 1 if that message arrived there)."""

    plan: LoadPlan
    first_send_ns: int
    last_receive_ns: int
    received: int
    duplicates: int
    bitmaps: list[bytes]
    stray: int = 0
    cpu_seconds: float = 0.0
    """CPU time of the load processes once started: beside the elapsed time it shows how
    much of the machine the generator took from the broker."""
    latencies_ns: list[int] = field(default_factory=list)
    scheduled_latencies_ns: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.plan.messages * self.plan.fanout - self.received

    @property
    def elapsed(self) -> float:
        """Seconds from the first send to the last new message received."""
        return max(0.0, (self.last_receive_ns - self.first_send_ns) / 1e9)

    @property
    def msgs_per_s(self) -> float:
        return self.received / self.elapsed if self.received and self.elapsed else 0.0

    def digest(self) -> str:
        """A fingerprint of the set of (subscriber, publisher, seq) delivered."""
        return hashlib.sha256(b"|".join(self.bitmaps)).hexdigest()[:16]


def _leave_signals_to_the_parent() -> None:
    """Ctrl-C reaches the whole process group: the parent stops its load processes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- publishers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Encoded:
    """Every PUBLISH of one publisher back to back, each ``size`` bytes, the payload head at
    ``head`` inside each; encoded before the start signal. QoS 1 ids are seq % 65535 + 1."""

    data: bytearray
    size: int
    head: int
    count: int

    @classmethod
    def build(cls, plan: LoadPlan, publisher: int) -> _Encoded:
        count = plan.count(publisher)
        packets = [
            publish_packet(topic_of(publisher, seq), payload_for(publisher, seq), plan.qos, id_)
            for seq, id_ in ((seq, seq % 0xFFFF + 1) for seq in range(count))
        ]
        size = len(packets[0])
        return cls(bytearray(b"".join(packets)), size, size - PAYLOAD_BYTES, count)

    def send(self, sock: socket.socket, first: int, last: int, due: list[int] | None) -> None:
        """Stamp messages ``first..last-1`` with the time now (and ``due`` times, else now
        again) and send them in one call."""
        now, data, size, head = time.time_ns(), self.data, self.size, self.head + 8
        stamp = struct.pack_into
        for seq in range(first, last):
            stamp("!QQ", data, seq * size + head, now, due[seq - first] if due else now)
        sock.sendall(memoryview(data)[first * size : last * size])


class _Acks:
    """The PUBACKs a QoS 1 publisher waits for: ``outstanding[id]`` is 1 until acknowledged.
    At QoS 0 nothing is outstanding and nothing is read."""

    def __init__(self, sock: socket.socket, plan: LoadPlan) -> None:
        self.sock = sock
        self.window = plan.window if plan.qos else 1 << 62
        self.qos = plan.qos
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.outstanding = bytearray(0x10000)
        self.inflight = 0
        self.pending = b""

    def take(self, first: int, last: int) -> int:
        """Put seqs ``first..`` in flight, up to ``last``, the window, or an id that is still
        unacknowledged; returns the seq after the last one taken."""
        if not self.qos:
            return last
        last = min(last, first + self.window - self.inflight)
        outstanding = self.outstanding
        for seq in range(first, last):
            packet_id = seq % 0xFFFF + 1
            if outstanding[packet_id]:
                last = seq
                break
            outstanding[packet_id] = 1
        self.inflight += max(0, last - first)
        return max(first, last)

    def read(self, block: bool) -> None:
        """Take in the PUBACKs that arrived (with ``block``, wait for some bytes). A socket
        with a timeout polls before it reads even with MSG_DONTWAIT, hence the poller."""
        if not self.qos or (not block and not self.poller.poll(0)):
            return
        chunk = self.sock.recv(RECV_SIZE)
        if not chunk:
            raise BenchSetupError("the broker closed a publisher's connection")
        data = self.pending + chunk if self.pending else chunk
        packets, used = split_packets(data)
        for first, start, _ in packets:
            if first == 0x40:
                packet_id = data[start] << 8 | data[start + 1]
                if self.outstanding[packet_id]:
                    self.outstanding[packet_id] = 0
                    self.inflight -= 1
        self.pending = data[used:]

    def drain(self) -> None:
        while self.inflight:
            self.read(block=True)


def _publish_all(sock: socket.socket, plan: LoadPlan, packets: _Encoded) -> int:
    """Send every message as fast as the broker takes them; returns the first send time."""
    acks = _Acks(sock, plan)
    first_send, sent, count = time.time_ns(), 0, packets.count
    while sent < count:
        want = min(count - sent, SEND_BATCH, max(1, acks.window // 2))
        if acks.window - acks.inflight < want:  # wait for acks to pile up, not trickle in
            time.sleep(COALESCE)
            acks.read(block=True)
            continue
        last = acks.take(sent, sent + want)
        if last == sent:
            acks.read(block=True)
            continue
        packets.send(sock, sent, last, None)
        sent = last
        acks.read(block=False)
    acks.drain()
    return first_send


def _publish_paced(sock: socket.socket, plan: LoadPlan, packets: _Encoded) -> int:
    """Offer ``plan.rate`` msg/s: what fell due is sent together, each message stamped
    with its send time and its scheduled time (no coordinated omission)."""
    assert plan.rate is not None
    acks = _Acks(sock, plan)
    interval = 1e9 / plan.rate
    start, sent, count = time.time_ns(), 0, packets.count
    while sent < count:
        due = acks.take(sent, min(count, int((time.time_ns() - start) / interval) + 1))
        if due > sent:
            times = [start + int(seq * interval) for seq in range(sent, due)]
            packets.send(sock, sent, due, times)
            sent = due
        acks.read(block=acks.inflight >= acks.window)
        ahead = (start + sent * interval - time.time_ns()) / 1e9
        if ahead > 0:
            time.sleep(min(ahead, 0.0005))
    acks.drain()
    return start


def publisher_main(
    address: tuple[str, int],
    plan: LoadPlan,
    publisher: int,
    start: Event,
    close: Event,
    pipe: Connection,
) -> None:
    """Connect, send on ``start``, report, and stay connected until ``close``: a broker
    may drop what it still holds of a client that disconnects (amqtt 0.12 does)."""
    _leave_signals_to_the_parent()
    result: dict[str, Any] = {"first_send_ns": 0, "error": None}
    sock = None
    try:
        packets = _Encoded.build(plan, publisher)
        sock = open_session(address, f"{plan.label}-pub-{publisher}")
        pipe.send("connected")
        if not start.wait(SETUP_TIMEOUT):
            raise BenchSetupError("no start signal")
        sock.settimeout(IO_TIMEOUT)
        result["cpu_s"] = -time.process_time()  # encoding and connecting are not counted
        run = _publish_paced if plan.rate is not None else _publish_all
        result["first_send_ns"] = run(sock, plan, packets)
    except (OSError, BenchSetupError) as error:
        result["error"] = f"publisher {publisher}: {error!r}"
    result["cpu_s"] = result.get("cpu_s", 0.0) + time.process_time()
    pipe.send(result)
    close.wait(MAX_DRAIN + 60)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.sendall(DISCONNECT)
        sock.close()


# -- subscribers -----------------------------------------------------------------------------


class _Receiver:
    """One subscriber's parser and books: the PUBLISH stream in, bitmaps and PUBACKs out."""

    def __init__(self, plan: LoadPlan, subscriber: int, latency: bool) -> None:
        self.mine = plan.publishers_of(subscriber)
        self.expected = sum(plan.count(p) for p in self.mine)
        self.bitmaps = {p: bytearray(plan.count(p)) for p in self.mine}
        self.probed: set[int] = set()
        self.received = self.duplicates = self.stray = 0
        self.last_receive_ns = 0
        self.latency = latency
        self.latencies = array("q")
        self.scheduled = array("q")
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        """Parse ``chunk``; returns the PUBACKs to send (QoS 1), else b""."""
        now = time.time_ns()
        data = self.pending + chunk if self.pending else chunk
        size, pos, fresh, acks = len(data), 0, 0, []
        bitmaps, unpack = self.bitmaps, HEAD.unpack_from
        while pos + 2 <= size:
            first, length, index = data[pos], data[pos + 1], pos + 2
            if length & 0x80:  # a multi-byte length (a 256-byte payload needs two)
                length, index = read_length(data, pos + 1)
                if length < 0:
                    break
            end = index + length
            if end > size:
                break
            if first & 0xF0 == 0x30:
                head = index + 2 + (data[index] << 8 | data[index + 1])
                if first & 0x06:
                    acks.append(b"\x40\x02" + data[head : head + 2])
                    head += 2
                publisher, seq, sent_ns, due_ns = unpack(data, head)
                if seq == PROBE_SEQ:
                    self.probed.add(publisher)
                else:
                    seen = bitmaps.get(publisher)
                    if seen is None or seq >= len(seen):
                        self.stray += 1
                    elif seen[seq]:
                        self.duplicates += 1
                    else:
                        seen[seq] = 1
                        fresh += 1
                        if self.latency:
                            self.latencies.append(now - sent_ns)
                            self.scheduled.append(now - due_ns)
            pos = end
        self.pending = data[pos:]
        if fresh:
            self.received += fresh
            self.last_receive_ns = now
        return b"".join(acks)

    def ready(self) -> bool:
        return len(self.probed) == len(self.mine)


def subscriber_main(
    address: tuple[str, int], plan: LoadPlan, subscriber: int, done: Event, pipe: Connection
) -> None:
    _leave_signals_to_the_parent()
    receiver = _Receiver(plan, subscriber, plan.rate is not None)
    error = None
    try:
        sock = open_session(address, f"{plan.label}-sub-{subscriber}")
        filters = [filter_of(p) for p in receiver.mine]
        sock.sendall(subscribe_packet(1, filters, plan.qos))
        body = 2 + len(filters)
        suback = _read_exactly(sock, 1 + len(remaining_length(body)) + body)
        if suback[0] != 0x90 or any(code > plan.qos for code in suback[-len(filters) :]):
            raise BenchSetupError(f"SUBACK {suback.hex()}")
        pipe.send("subscribed")
        _receive(sock, receiver, plan, done, pipe)
        sock.close()
    except (OSError, BenchSetupError) as failure:
        error = f"subscriber {subscriber}: {failure!r}"
    pipe.send(
        {
            "received": receiver.received,
            "duplicates": receiver.duplicates,
            "stray": receiver.stray,
            "last_receive_ns": receiver.last_receive_ns,
            "bitmaps": {p: bytes(b) for p, b in receiver.bitmaps.items()},
            "latencies": receiver.latencies.tobytes(),
            "scheduled": receiver.scheduled.tobytes(),
            "error": error,
            "cpu_s": time.process_time(),
        }
    )


def _receive(
    sock: socket.socket, receiver: _Receiver, plan: LoadPlan, done: Event, pipe: Connection
) -> None:
    """Read until everything arrived, or until ``drain_seconds`` passed without a new
    message after the publishers finished (``MAX_DRAIN`` at most). Measuring throughput,
    a short read is followed by a nap of ``COALESCE`` so the next read takes more: the
    machine's cores go to the broker rather than to per-read costs here."""
    sock.settimeout(0.05)
    nap = 0.0 if receiver.latency else COALESCE
    announced = False
    done_ns, checked = 0, time.monotonic()
    while True:
        try:
            chunk = sock.recv(RECV_SIZE)
            if not chunk:
                raise BenchSetupError("the broker closed a subscriber's connection")
            acks = receiver.feed(chunk)
            if acks:
                sock.sendall(acks)
            if nap and len(chunk) < COALESCE_BELOW and announced:
                time.sleep(nap)
        except TimeoutError:
            pass
        if not announced and receiver.ready():
            pipe.send("ready")
            announced = True
        if announced and receiver.received >= receiver.expected:
            return
        now = time.monotonic()
        if now - checked > 0.05:
            checked = now
            if not done.is_set():
                continue
            wall = time.time_ns()
            done_ns = done_ns or wall
            idle = wall - max(done_ns, receiver.last_receive_ns)
            if idle > plan.drain_seconds * 1e9 or wall - done_ns > MAX_DRAIN * 1e9:
                return


def combine(
    plan: LoadPlan, published: list[dict[str, Any]], received: list[dict[str, Any]]
) -> LoadResult:
    """One run's result from what its publisher and subscriber processes answered."""
    bitmaps: list[bytes] = []
    latencies, scheduled = array("q"), array("q")
    for subscriber, answer in enumerate(received):
        bitmaps += [answer["bitmaps"][p] for p in plan.publishers_of(subscriber)]
        latencies.frombytes(answer["latencies"])
        scheduled.frombytes(answer["scheduled"])
    errors = [a["error"] for a in (*published, *received) if a["error"]]
    stray = sum(a["stray"] for a in received)
    if stray:
        errors.append(f"{stray} messages reached a subscriber that had not subscribed them")
    return LoadResult(
        plan=plan,
        first_send_ns=min(a["first_send_ns"] or 2**63 for a in published),
        last_receive_ns=max(a["last_receive_ns"] for a in received),
        received=sum(a["received"] for a in received),
        duplicates=sum(a["duplicates"] for a in received),
        stray=stray,
        cpu_seconds=sum(a["cpu_s"] for a in (*published, *received)),
        bitmaps=bitmaps,
        latencies_ns=list(latencies),
        scheduled_latencies_ns=list(scheduled),
        errors=errors,
    )
