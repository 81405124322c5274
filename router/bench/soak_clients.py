"""The MQTT clients of ``router bench soak``: paho-mqtt (MQTT 5.0), kept connected through
node kills and Redis restarts.

A :class:`Link` is one client id with a home node. Its keeper thread connects it to the
home node when that node is up, else to the next one that is; a persistent link
(session expiry one hour) resumes its session there, so the broker must hand the
session over, or recover it from a dead node. A link away from home goes back once its
home node is up again, so the clients do not pile up on one node as the faults go round.

Payloads are ``b"publisher:seq:time_ns"``. A :class:`QosOnePublisher` sends each sequence
number until it is acknowledged (a PUBACK within ``ACK_TIMEOUT``), on a new connection if
need be; a :class:`TrackedSubscriber` keeps every (publisher, seq) it receives, so the run
counts what was acknowledged and never arrived (lost) and what arrived twice.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from router.bench.soak_processes import NodeProcess

CONNECT_TIMEOUT: Final = 15.0
"""Seconds for a CONNACK: a resume on another node may wait for the old node's handoff."""
ACK_TIMEOUT: Final = 5.0
HOME_AFTER: Final = 3.0
"""Seconds a restarted home node is up before its links move back."""
KEEP_INTERVAL: Final = 0.1
SUBSCRIBE_BATCH: Final = 50
SESSION_EXPIRY: Final = 3600
Q1_TOPIC: Final = "soak/q1"
Q0_TOPICS: Final = 200


class Tally:
    """What every client saw, for the sampler (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.window_deliveries = 0
        self.window_q1: list[int] = []
        self.window_q0: list[int] = []
        self.q1_latencies: list[int] = []
        self.q0_delivered = 0
        self.reconnects = 0
        self.disconnect_reasons: dict[int, int] = {}
        self.sessions_lost = 0

    def delivered(self, qos: int, sent_ns: int) -> None:
        latency = time.time_ns() - sent_ns
        with self.lock:
            self.window_deliveries += 1
            if qos:
                self.window_q1.append(latency)
                self.q1_latencies.append(latency)
            else:
                self.window_q0.append(latency)
                self.q0_delivered += 1

    def take_window(self) -> tuple[int, list[int], list[int]]:
        with self.lock:
            taken = (self.window_deliveries, self.window_q1, self.window_q0)
            self.window_deliveries, self.window_q1, self.window_q0 = 0, [], []
        return taken

    def disconnected(self, reason: int) -> None:
        with self.lock:
            self.disconnect_reasons[reason] = self.disconnect_reasons.get(reason, 0) + 1


def payload_of(publisher: int, seq: int) -> bytes:
    return b"%d:%d:%d" % (publisher, seq, time.time_ns())


def parse(payload: bytes) -> tuple[int, int, int]:
    publisher, seq, sent_ns = payload.split(b":")
    return int(publisher), int(seq), int(sent_ns)


class Link:
    """One MQTT 5.0 client id kept connected by its keeper thread (see the module)."""

    def __init__(
        self,
        client_id: str,
        nodes: Sequence[NodeProcess],
        home: int,
        tally: Tally,
        *,
        persistent: bool = False,
    ) -> None:
        self.client_id = client_id
        self.nodes = nodes
        self.home = home
        self.tally = tally
        self.persistent = persistent
        self.client: Any = None
        self.node: int | None = None
        self.connected = threading.Event()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.connects = 0
        self.moves: list[tuple[float, int]] = []  # (time.monotonic(), node index) per connect
        self.on_message: Callable[[Any], None] = lambda message: None
        self.on_session: Callable[[bool, bool], None] = lambda present, first: None
        self.pending_subacks = 0
        self._connack: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._keep, name=f"soak-{client_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def reset(self) -> None:
        """Drop this connection: the keeper makes a new one."""
        self.connected.clear()
        self.wake.set()

    def close(self) -> None:
        self.stopping.set()
        self.wake.set()
        self._thread.join(timeout=CONNECT_TIMEOUT + 5)
        self._drop(graceful=True)

    def _keep(self) -> None:
        while not self.stopping.is_set():
            if not self.connected.is_set() or self._should_go_home():
                self._drop(graceful=self.connected.is_set())
                self._connect_somewhere()
            self.wake.wait(KEEP_INTERVAL)
            self.wake.clear()

    def _should_go_home(self) -> bool:
        node = self.nodes[self.home]
        return self.node != self.home and node.up and node.up_for() >= HOME_AFTER

    def _connect_somewhere(self) -> None:
        count = len(self.nodes)
        for step in range(count):
            index = (self.home + step) % count
            if self.stopping.is_set() or not self.nodes[index].up:
                continue
            if self._connect(index):
                return

    def _connect(self, index: int) -> bool:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5
        )
        client.connect_timeout = 5.0
        client.reconnect_delay_set(120, 120)  # reconnecting is the keeper's job
        client.max_inflight_messages_set(1000)
        answered = threading.Event()
        connack: dict[str, Any] = {}

        def on_connect(_c: Any, _u: Any, flags: Any, code: Any, _p: Any) -> None:
            connack.update(code=code.value, present=flags.session_present)
            answered.set()

        def on_disconnect(_c: Any, _u: Any, _f: Any, code: Any, _p: Any) -> None:
            self.tally.disconnected(code.value)
            answered.set()
            if self.client is client:
                self.connected.clear()
                self.wake.set()

        def on_subscribe(_c: Any, _u: Any, _mid: int, _codes: Any, _p: Any) -> None:
            if self.client is client:
                self.pending_subacks -= 1

        client.on_connect = on_connect
        client.on_disconnect = on_disconnect
        client.on_subscribe = on_subscribe
        client.on_message = lambda _c, _u, message: self.on_message(message)
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        if self.persistent:
            properties.SessionExpiryInterval = SESSION_EXPIRY
        node = self.nodes[index]
        try:
            client.connect(
                "127.0.0.1",
                node.port,
                30,
                clean_start=not self.persistent or not self.connects,
                properties=properties,
            )
        except OSError:
            return False
        client.loop_start()
        if not answered.wait(CONNECT_TIMEOUT) or connack.get("code") != 0:
            client.loop_stop()
            with contextlib.suppress(Exception):
                client.disconnect()
            return False
        self.client, self.node = client, index
        self.moves.append((time.monotonic(), index))
        first = not self.connects
        if not first:
            with self.tally.lock:
                self.tally.reconnects += 1
        self.connects += 1
        self.pending_subacks = 0
        self.on_session(bool(connack["present"]), first)
        self.connected.set()
        return True

    def _drop(self, *, graceful: bool) -> None:
        client, self.client, self.node = self.client, None, None
        self.connected.clear()
        if client is None:
            return
        with contextlib.suppress(Exception):
            if graceful:
                client.disconnect()
        client.loop_stop()
        with contextlib.suppress(Exception):
            sock = client.socket()
            if sock is not None:
                sock.close()

    def subscribe(self, filters: Sequence[str], qos: int) -> None:
        """SUBSCRIBE in batches (fire and forget: a lost connection resubscribes)."""
        client = self.client
        if client is None:
            return
        options = SubscribeOptions(qos=qos)
        for first in range(0, len(filters), SUBSCRIBE_BATCH):
            self.pending_subacks += 1
            client.subscribe([(name, options) for name in filters[first : first + SUBSCRIBE_BATCH]])

    def unsubscribe(self, filters: Sequence[str]) -> None:
        client = self.client
        if client is not None and filters:
            client.unsubscribe(list(filters))


class TrackedSubscriber:
    """A persistent QoS 1 subscriber of every publisher's topic: keeps what it received."""

    def __init__(self, link: Link, tally: Tally) -> None:
        self.link = link
        self.tally = tally
        self.received: dict[int, list[int]] = {}
        self.probed: set[int] = set()
        self.lock = threading.Lock()
        link.persistent = True
        link.on_message = self._message
        link.on_session = self._session

    def _session(self, present: bool, first: bool) -> None:
        if not present:
            if not first:
                with self.tally.lock:
                    self.tally.sessions_lost += 1
            self.link.subscribe([f"{Q1_TOPIC}/#"], 1)

    def _message(self, message: Any) -> None:
        publisher, seq, sent_ns = parse(message.payload)
        with self.lock:
            if seq < 0:
                self.probed.add(publisher)
                return
            self.received.setdefault(publisher, []).append(seq)
        self.tally.delivered(1, sent_ns)

    def has(self, publisher: int, seqs: Sequence[int]) -> bool:
        with self.lock:
            return set(seqs) <= set(self.received.get(publisher, ()))

    def seen_probe(self, publisher: int) -> bool:
        with self.lock:
            return publisher in self.probed


class ChurnClient:
    """A clean-session QoS 0 client holding its share of the subscriptions, changing some
    of them on every :meth:`churn`; ``soak/q0/K/+`` filters take the QoS 0 traffic."""

    def __init__(
        self, number: int, link: Link, tally: Tally, size: int, rng: random.Random
    ) -> None:
        self.number = number
        self.link = link
        self.tally = tally
        self.rng = rng
        self.made = 0
        self.filters: list[str] = []
        for _ in range(size):
            self.filters.append(self._new_filter())
        link.on_session = lambda present, first: link.subscribe(list(self.filters), 0)
        link.on_message = self._message
        self.subscribes = 0
        self.unsubscribes = 0

    def _new_filter(self) -> str:
        """A filter this client does not hold: every tenth takes QoS 0 traffic."""
        self.made += 1
        if self.made % 10:
            return f"soak/bg/c{self.number}/n{self.made}"
        held = set(self.filters)
        for _ in range(20):
            name = f"soak/q0/{self.rng.randrange(Q0_TOPICS)}/+"
            if name not in held:
                return name
        return f"soak/bg/c{self.number}/n{self.made}"  # it holds most of soak/q0 already

    def _message(self, message: Any) -> None:
        _publisher, _seq, sent_ns = parse(message.payload)
        self.tally.delivered(0, sent_ns)

    def churn(self, count: int) -> None:
        """Unsubscribe ``count`` of its filters and subscribe ``count`` new ones."""
        if not self.link.connected.is_set():
            return
        gone = self.rng.sample(self.filters, min(count, len(self.filters)))
        for name in gone:
            self.filters.remove(name)
        fresh = [self._new_filter() for _ in gone]
        self.filters.extend(fresh)
        self.link.unsubscribe(gone)
        self.link.subscribe(fresh, 0)
        self.unsubscribes += len(gone)
        self.subscribes += len(fresh)


class Pacer:
    """Paces a loop at ``rate`` per second; after an outage it catches up at most one
    second of backlog, not the whole outage in one burst."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate
        self.due = time.monotonic()

    def wait(self, stop: threading.Event) -> None:
        now = time.monotonic()
        self.due = max(self.due + self.interval, now - 1.0)
        if self.due > now:
            stop.wait(self.due - now)


def _acknowledged(info: Any) -> bool:
    """Whether the broker acknowledged a QoS 1 publish within ``ACK_TIMEOUT``. paho
    raises from ``wait_for_publish`` and ``is_published`` when the publish could not go
    out (the client was not connected): not acknowledged either."""
    try:
        info.wait_for_publish(ACK_TIMEOUT)
        return bool(info.is_published())
    except (RuntimeError, ValueError):
        return False


class QosOnePublisher:
    """Publishes sequence numbers at ``rate`` on its own topic at QoS 1; a message counts
    once acknowledged, and one without a PUBACK in ``ACK_TIMEOUT`` is sent again on a
    new connection until it is (so the broker may deliver it twice)."""

    def __init__(self, number: int, link: Link, rate: float, stop: threading.Event) -> None:
        self.number = number
        self.link = link
        self.rate = rate
        self.stop = stop
        self.acked: list[int] = []
        self.acked_at: dict[int, float] = {}  # seq -> time.monotonic() of its PUBACK
        self.resends = 0
        self.thread = threading.Thread(target=self._run, name=f"soak-q1-{number}", daemon=True)

    def _run(self) -> None:
        pacer = Pacer(self.rate)
        topic = f"{Q1_TOPIC}/p{self.number}"
        seq = 0
        while not self.stop.is_set():
            pacer.wait(self.stop)
            while not self.stop.is_set():
                client = self.link.client
                if not self.link.connected.wait(1.0) or client is None:
                    continue
                info = client.publish(topic, payload_of(self.number, seq), 1)
                if _acknowledged(info):
                    self.acked.append(seq)
                    self.acked_at[seq] = time.monotonic()
                    break
                self.resends += 1
                if self.link.client is client:
                    self.link.reset()
            seq += 1

    def probe(self) -> None:
        """A QoS 0 message with seq -1, which tells the subscribers the route is there."""
        client = self.link.client
        if client is not None:
            client.publish(f"{Q1_TOPIC}/p{self.number}", payload_of(self.number, -1), 0)


class QosZeroPublisher:
    """Publishes at ``rate`` on random ``soak/q0/K/x`` topics at QoS 0 (what the churn
    clients' ``soak/q0/K/+`` filters take); while its link is down it skips its turns."""

    def __init__(
        self, number: int, link: Link, rate: float, stop: threading.Event, rng: random.Random
    ) -> None:
        self.number = number
        self.link = link
        self.rate = rate
        self.stop = stop
        self.rng = rng
        self.sent = 0
        self.skipped = 0
        self.thread = threading.Thread(target=self._run, name=f"soak-q0-{number}", daemon=True)

    def _run(self) -> None:
        pacer = Pacer(self.rate)
        while not self.stop.is_set():
            pacer.wait(self.stop)
            client = self.link.client
            if client is None or not self.link.connected.is_set():
                self.skipped += 1
                continue
            topic = f"soak/q0/{self.rng.randrange(Q0_TOPICS)}/x"
            client.publish(topic, payload_of(self.number, self.sent), 0)
            self.sent += 1
