"""Hostile clients against a real node process (``router node run --mqtt``), speaking raw
MQTT bytes where a well-behaved library would not misbehave (marked ``fault``; each
bounded, each prints its figures: run with ``-s`` to read them).

* A connection flood, part under ``--mqtt-max-connections`` and silent, part above it:
  the excess is closed at accept, the silent ones at the connect timeout, a paho client
  gets in beside the flood and after it; refusals and timeouts are counted.
* Slow CONNECTs (slowloris, one byte at a time): closed at the connect timeout.
* Giant remaining lengths (256 MB announced, a 5-byte length): refused from the fixed
  header (0x95 / 0x81 in 5.0, a plain close before CONNECT and in 3.1.1), nothing of
  the announced size buffered.
* Unbounded in-flight: QoS 2 flows never released beyond our Receive Maximum get 0x93;
  a subscriber that never acknowledges gets ``--mqtt-max-inflight`` (or its own Receive
  Maximum) and no more, the rest is queued to ``--queue-limit`` or dropped, counted.
* Topic alias abuse: alias 0 or above the maximum (0x94), an alias never bound (0x82),
  a wildcard bound to an alias (0x90); re-mapping aliases to huge topics holds no more.

Every test measures the node's resident memory before and after (``/proc/PID/status``)
and reads the counts from its ``/metrics``.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    Publish,
    PubRec,
    Subscribe,
    Subscription,
)
from router.mqtt.properties import Properties
from router.ops.processes import free_port
from router.state.keys import Keys
from tests.support.cli import Process
from tests.support.metrics import scrape
from tests.support.mqtt import V5, Paho, mqtt_node
from tests.support.waiting import wait_until

pytestmark = pytest.mark.fault

CONNECT_TIMEOUT = 1.0
WAIT = 10.0
MiB = 2**20


# -- measuring the node ----------------------------------------------------------------------


def rss(process: Process) -> float:
    """The node's resident set size, MiB."""
    for line in Path(f"/proc/{process.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@contextlib.contextmanager
def hostile_node(keys: Keys, url: str, *args: str) -> Iterator[tuple[Process, int, str]]:
    """A node with a 1 s connect timeout and ``/metrics``: (process, MQTT port, metrics)."""
    env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    timeout = ("--mqtt-connect-timeout", str(CONNECT_TIMEOUT), "--mqtt-sys-interval", "0")
    with mqtt_node("hostile", env, *timeout, "--metrics", metrics, *args) as (process, port):
        yield process, port, metrics
        ended = lambda: scrape(metrics, WAIT)["router_mqtt_connections"] == 0  # noqa: E731
        wait_until(ended, WAIT, "every connection ended")  # (and logged whatever it did)
        while not process.stderr.empty():
            process.stderr_lines.append(process.stderr.get_nowait())
    unhandled = [line for line in process.stderr_lines if " ERROR " in line or "Traceback" in line]
    assert unhandled == [], "\n".join(process.stderr_lines[-40:])


# -- raw clients -----------------------------------------------------------------------------


def raw(port: int, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(WAIT)
    sock.connect(("127.0.0.1", port))
    return sock


def closings(
    socks: list[socket.socket], deadline: float, received: list[bytes] | None = None
) -> dict[socket.socket, float]:
    """When (monotonic) the node closed each of ``socks``, watching until ``deadline``
    seconds from now; what they received meanwhile goes to ``received``."""
    closed: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        end = time.monotonic() + deadline
        while len(closed) < len(socks) and time.monotonic() < end:
            for key, _ in selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except (ConnectionResetError, BlockingIOError) as error:
                    data = b"" if isinstance(error, ConnectionResetError) else b"more"
                if not data:
                    closed[sock] = time.monotonic()
                    selector.unregister(sock)
                elif received is not None and data != b"more":
                    received.append(data)
    return closed


def answer(sock: socket.socket, level: int = MQTT_5) -> list[Packet]:
    """The packets the node sends on ``sock`` until it closes it (WAIT at most)."""
    reader = PacketReader()
    reader.level = level
    packets: list[Packet] = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            packets += reader.feed(chunk)
    sock.close()
    return packets


def connected(port: int, client_id: str, level: int = MQTT_5, **properties: int) -> socket.socket:
    """A raw client past its CONNACK (0 asserted)."""
    sock = raw(port)
    sock.sendall(encode(Connect(client_id, level, properties=Properties(**properties)), level))
    reader = PacketReader()
    reader.level = level
    packets: list[Packet] = []
    while not packets:
        packets = reader.feed(sock.recv(64))
    assert type(packets[0]) is ConnAck and packets[0].reason_code == 0, packets
    return sock


def publish(topic: str, qos: int = 0, packet_id: int | None = None, **properties: int) -> bytes:
    return encode(Publish(topic, b"x", qos, False, False, packet_id, Properties(**properties)))


def codes(packets: list[Packet]) -> list[str]:
    """Packets as ``NAME`` or ``NAME 0xRC`` (for the figures)."""
    shown = []
    for packet in packets:
        code = getattr(packet, "reason_code", None)
        shown.append(type(packet).__name__ + (f" {code:#04x}" if code else ""))
    return shown


def works(port: int, name: str) -> float:
    """A paho client connects, subscribes and gets its own QoS 1 publish: seconds taken."""
    started = time.monotonic()
    client = Paho(port, name, V5)
    try:
        assert client.connected()[0] == 0
        assert client.subscribe(f"ok/{name}", 1) == [1]
        client.publish(f"ok/{name}", b"fine", 1)
        assert client.take(1)[0].payload == b"fine"
    finally:
        client.close()
    return time.monotonic() - started


# -- a. a connection flood -------------------------------------------------------------------

MAX_CONNECTIONS = 50
SILENT = 40  # connections that never send CONNECT, under the limit
FLOOD = 1000  # then this many more at once


def test_a_connection_flood_is_refused_at_accept_and_silent_ones_time_out(
    redis_standalone_url: str, keys: Keys
) -> None:
    limit = ("--mqtt-max-connections", str(MAX_CONNECTIONS))
    with hostile_node(keys, redis_standalone_url, *limit) as (node, port, metrics):
        works(port, "warm")
        before = rss(node)
        opened: dict[socket.socket, float] = {}
        try:
            for _ in range(SILENT):
                opened[raw(port)] = time.monotonic()
            beside = works(port, "beside")  # the silent ones leave room for it
            paho = Paho(port, "stays", V5)  # (holds one connection through the flood)
            assert paho.connected()[0] == 0
            flood_started = time.monotonic()
            for _ in range(FLOOD):
                opened[raw(port)] = time.monotonic()
            flood_opened = time.monotonic() - flood_started
            probe = raw(port)  # a well-behaved CONNECT while the node is full
            probe.sendall(encode(Connect("while-full", MQTT_5)))
            assert answer(probe) == []  # closed without a CONNACK
            got: list[bytes] = []
            closed = closings(list(opened), CONNECT_TIMEOUT + WAIT, got)
            peak = rss(node)
            paho.close()
        finally:
            for sock in opened:
                sock.close()
        after_flood = works(port, "after")
        figures = scrape(metrics, WAIT)
        after = rss(node)
    lived = [closed[sock] - at for sock, at in opened.items() if sock in closed]
    at_once = sum(1 for seconds in lived if seconds < CONNECT_TIMEOUT / 2)
    timed_out = [seconds for seconds in lived if seconds >= CONNECT_TIMEOUT / 2]
    refused = figures["router_mqtt_refused_total"]
    timeouts = figures["router_mqtt_closed_connect_timeout_total"]
    print(
        f"\nconnection flood: {SILENT} silent + {FLOOD} more ({flood_opened:.2f} s to open) "
        f"against --mqtt-max-connections {MAX_CONNECTIONS}: {at_once} closed at once, "
        f"{len(timed_out)} at the connect timeout ({min(timed_out):.2f}..{max(timed_out):.2f} s "
        f"after they opened), {len(opened) - len(closed)} never; metrics: refused "
        f"{refused:.0f}, connect timeouts {timeouts:.0f}; paho beside the silent ones "
        f"{beside:.2f} s, after the flood {after_flood:.2f} s; node RSS {before:.1f} -> "
        f"{peak:.1f} MiB at the peak ({peak - before:+.1f}), {after:.1f} after "
        f"({after - before:+.1f})"
    )
    assert len(closed) == len(opened) and got == []  # none is left open, none answered
    assert at_once >= FLOOD - MAX_CONNECTIONS  # the excess: closed at accept
    assert len(timed_out) >= SILENT  # the rest, in the slots: closed at the timeout
    assert all(seconds < CONNECT_TIMEOUT + 1.0 for seconds in timed_out)
    assert refused == at_once + 1  # (+ the probe) every excess connection counted
    assert timeouts == len(timed_out)  # and every silent one
    assert peak - before < 32  # MiB: the excess cost no buffer


# -- b. slow CONNECTs ------------------------------------------------------------------------

SLOW_CLIENTS = 100
DRIP = 0.1  # seconds between two bytes of a CONNECT: the whole one would take ~2.5 s


def drip(socks: list[socket.socket], data: bytes, stop: threading.Event) -> None:
    """Send ``data`` one byte at a time to each of ``socks``, a byte every DRIP seconds."""
    for at in range(len(data)):
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.send(data[at : at + 1])
        if stop.wait(DRIP):
            return


def test_slow_connects_are_closed_at_the_connect_timeout(
    redis_standalone_url: str, keys: Keys
) -> None:
    limit = ("--mqtt-max-connections", str(2 * SLOW_CLIENTS))
    connect = encode(Connect("slowloris", MQTT_5, keepalive=60))
    with hostile_node(keys, redis_standalone_url, *limit) as (node, port, metrics):
        works(port, "warm")
        before = rss(node)
        opened = {raw(port): time.monotonic() for _ in range(SLOW_CLIENTS)}
        stop = threading.Event()
        dripping = threading.Thread(target=drip, args=(list(opened), connect, stop))
        dripping.start()
        try:
            beside = works(port, "beside")  # while they drip (they leave room for it)
            got: list[bytes] = []
            closed = closings(list(opened), CONNECT_TIMEOUT + WAIT, got)
            peak = rss(node)
        finally:
            stop.set()
            dripping.join()
            for sock in opened:
                sock.close()
        after_them = works(port, "after")
        timeouts = scrape(metrics, WAIT)["router_mqtt_closed_connect_timeout_total"]
        after = rss(node)
    lived = [closed[sock] - at for sock, at in opened.items() if sock in closed]
    print(
        f"\nslowloris: {SLOW_CLIENTS} CONNECTs of {len(connect)} bytes, a byte every {DRIP} s "
        f"(connect timeout {CONNECT_TIMEOUT} s): {len(closed)} closed "
        f"{min(lived):.2f}..{max(lived):.2f} s after they opened, {len(got)} answers; "
        f"metrics: connect timeouts {timeouts:.0f}; paho beside them {beside:.2f} s, after "
        f"{after_them:.2f} s; node RSS {before:.1f} -> {peak:.1f} MiB ({peak - before:+.1f}), "
        f"{after:.1f} after ({after - before:+.1f})"
    )
    assert len(closed) == SLOW_CLIENTS and got == []  # all closed, no CONNACK
    assert all(CONNECT_TIMEOUT <= seconds < CONNECT_TIMEOUT + 1.0 for seconds in lived)
    assert timeouts == SLOW_CLIENTS
    assert peak - before < 16


# -- c. giant remaining lengths --------------------------------------------------------------

GIANT = b"\xff\xff\xff\x7f"  # 268,435,455: the largest remaining length there is
TOO_LONG = b"\xff\xff\xff\xff\x01"  # a fifth length byte: malformed
PUSHERS = 50


def push(sock: socket.socket, header: bytes) -> int:
    """Send ``header``, then body bytes until the node's close makes a send fail (they
    fill the kernel's buffers meanwhile); how many body bytes went. AssertionError if
    the announced size went whole."""
    sock.sendall(header)
    pushed, block = 0, bytes(65536)
    try:
        while pushed < 268_435_455:
            pushed += sock.send(block)
    except OSError:
        return pushed
    finally:
        sock.close()
    raise AssertionError("the node took the whole announced packet")


def test_giant_remaining_lengths_are_refused_from_the_fixed_header(
    redis_standalone_url: str, keys: Keys
) -> None:
    with hostile_node(keys, redis_standalone_url) as (node, port, metrics):
        works(port, "warm")
        before = rss(node)
        started = time.monotonic()
        first = raw(port)  # before CONNECT: a CONNECT of 256 MB, then a malformed length
        first.sendall(b"\x10" + GIANT)
        malformed_first = raw(port)
        malformed_first.sendall(b"\x10" + TOO_LONG)
        v5 = connected(port, "v5")
        v311 = connected(port, "v311", MQTT_3_1_1)
        malformed = connected(port, "m5")
        v5.sendall(b"\x30" + GIANT)  # a PUBLISH of 256 MB
        v311.sendall(b"\x30" + GIANT)
        malformed.sendall(b"\x30" + TOO_LONG)
        answers = {
            "CONNECT 256 MB": answer(first),
            "CONNECT 5-byte length": answer(malformed_first),
            "5.0 PUBLISH 256 MB": answer(v5),
            "3.1.1 PUBLISH 256 MB": answer(v311, MQTT_3_1_1),
            "5.0 PUBLISH 5-byte length": answer(malformed),
        }
        answered = time.monotonic() - started
        pushers = [connected(port, f"pusher-{n}") for n in range(PUSHERS)]
        pushed = [push(sock, b"\x30" + GIANT) for sock in pushers]
        peak = rss(node)
        figures = scrape(metrics, WAIT)
        after = rss(node)
    too_large = figures["router_mqtt_closed_packet_too_large_total"]
    malformed_count = figures["router_mqtt_closed_malformed_packet_total"]
    shown = "; ".join(f"{case}: {codes(packets) or 'closed'}" for case, packets in answers.items())
    print(
        f"\ngiant remaining lengths: {shown} (all within {answered:.2f} s); {PUSHERS} more "
        f"announced 256 MB each and pushed {sum(pushed) / MiB:.1f} MiB of body (at most "
        f"{max(pushed) / MiB:.1f} each, into kernel buffers) before a send failed; metrics: "
        f"packet too large {too_large:.0f}, malformed {malformed_count:.0f}; "
        f"node RSS {before:.1f} -> {peak:.1f} MiB ({peak - before:+.1f}), {after:.1f} after"
    )
    assert answers == {
        "CONNECT 256 MB": [],
        "CONNECT 5-byte length": [],
        "5.0 PUBLISH 256 MB": [Disconnect(0x95)],
        "3.1.1 PUBLISH 256 MB": [],
        "5.0 PUBLISH 5-byte length": [Disconnect(0x81)],
    }
    assert too_large == 3 + PUSHERS and malformed_count == 2
    assert peak - before < 32  # MiB, against 256 MB announced 53 times


# -- d. unbounded in-flight ------------------------------------------------------------------

RECEIVE_MAXIMUM = 20
QOS1_FLOOD = 20_000


def acks_of_a_qos1_flood(port: int) -> tuple[int, float]:
    """A client that pipelines QOS1_FLOOD QoS 1 PUBLISHes without waiting for PUBACKs:
    (PUBACKs received, seconds)."""
    sock = connected(port, "pipeliner")
    data = b"".join(publish("flood/qos1", 1, seq % 0xFFFF + 1) for seq in range(QOS1_FLOOD))
    sender = threading.Thread(target=sock.sendall, args=(data,))
    started = time.monotonic()
    sender.start()
    reader, acks = PacketReader(), 0
    reader.level = MQTT_5
    while acks < QOS1_FLOOD:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {acks} PUBACKs"
        acks += sum(1 for packet in reader.feed(chunk) if type(packet) is PubAck)
    seconds = time.monotonic() - started
    sender.join()
    sock.close()
    return acks, seconds


def test_unreleased_qos2_flows_beyond_the_receive_maximum_get_0x93(
    redis_standalone_url: str, keys: Keys
) -> None:
    limit = ("--mqtt-receive-maximum", str(RECEIVE_MAXIMUM))
    with hostile_node(keys, redis_standalone_url, *limit) as (node, port, metrics):
        works(port, "warm")
        before = rss(node)
        greedy = connected(port, "greedy")  # QoS 2 flows it never releases (no PUBREL)
        greedy.sendall(b"".join(publish("q/two", 2, n) for n in range(1, 10 * RECEIVE_MAXIMUM)))
        mixed = connected(port, "mixed")  # the quota spent on QoS 2, then a QoS 1
        flows = [publish("q/two", 2, n) for n in range(1, RECEIVE_MAXIMUM + 1)]
        mixed.sendall(b"".join([*flows, publish("q/one", 1, 999)]))
        greedy_got, mixed_got = answer(greedy), answer(mixed)
        acks, seconds = acks_of_a_qos1_flood(port)
        figures = scrape(metrics, WAIT)
        after = rss(node)
    exceeded = figures["router_mqtt_closed_receive_maximum_exceeded_total"]
    print(
        f"\nreceive maximum {RECEIVE_MAXIMUM}: {10 * RECEIVE_MAXIMUM - 1} QoS 2 never released "
        f"-> {sum(1 for p in greedy_got if type(p) is PubRec)} PUBREC then "
        f"{codes(greedy_got[-1:])}; {RECEIVE_MAXIMUM} QoS 2 + a QoS 1 -> "
        f"{codes(mixed_got[-1:])}, no PUBACK; a pipelined QoS 1 flood of {QOS1_FLOOD}: "
        f"{acks} PUBACKs in {seconds:.2f} s (each answered as handled: no quota held); "
        f"metrics: receive maximum exceeded {exceeded:.0f}; node RSS {before:.1f} -> "
        f"{after:.1f} MiB ({after - before:+.1f})"
    )
    assert greedy_got == [PubRec(n, 0x10) for n in range(1, RECEIVE_MAXIMUM + 1)] + [
        Disconnect(0x93)
    ]
    assert mixed_got == [PubRec(n, 0x10) for n in range(1, RECEIVE_MAXIMUM + 1)] + [
        Disconnect(0x93)
    ]
    assert acks == QOS1_FLOOD and exceeded == 2
    assert after - before < 32


MAX_INFLIGHT = 16
QUEUE_LIMIT = 100
DELIVERIES = 1000
PAYLOAD = 10_000


def deaf_subscriber(port: int, client_id: str, receive_maximum: int) -> socket.socket:
    """A 5.0 client subscribed to ``inflight/#`` at QoS 1 that will never PUBACK."""
    sock = connected(port, client_id, receive_maximum=receive_maximum)
    sock.sendall(encode(Subscribe(1, (Subscription("inflight/#", 1),))))
    assert sock.recv(64)[0] == 0x90  # SUBACK
    return sock


def until_quiet(sock: socket.socket, quiet: float = 0.5) -> list[Publish]:
    """The PUBLISH packets that come on ``sock`` until it is quiet for ``quiet`` s."""
    reader, got = PacketReader(), []
    reader.level = MQTT_5
    sock.settimeout(quiet)
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(1 << 20):
            got += [packet for packet in reader.feed(chunk) if type(packet) is Publish]
    sock.settimeout(WAIT)
    return got


def test_a_subscriber_that_never_acknowledges_gets_the_window_and_the_rest_queues_or_drops(
    redis_standalone_url: str, keys: Keys
) -> None:
    limits = ("--mqtt-max-inflight", str(MAX_INFLIGHT), "--queue-limit", str(QUEUE_LIMIT))
    with hostile_node(keys, redis_standalone_url, *limits) as (node, port, metrics):
        works(port, "warm")
        big = deaf_subscriber(port, "deaf-big", receive_maximum=1000)
        small = deaf_subscriber(port, "deaf-small", receive_maximum=5)
        publisher = Paho(port, "talker", V5)
        try:
            before = rss(node)
            started = time.monotonic()
            for seq in range(DELIVERIES):
                publisher.publish("inflight/x", b"%06d" % seq + bytes(PAYLOAD), 1)
            published = time.monotonic() - started
            big_got, small_got = until_quiet(big), until_quiet(small)
            expected = 2 * DELIVERIES - MAX_INFLIGHT - 5 - 2 * QUEUE_LIMIT
            dropped = lambda: scrape(metrics, WAIT)["router_queue_drops_total"]  # noqa: E731
            with contextlib.suppress(TimeoutError):  # (read while they are connected)
                wait_until(lambda: dropped() >= expected, WAIT, "the drops counted")
            drops = dropped()
            peak = rss(node)
            big.sendall(b"".join(encode(PubAck(p.packet_id or 0)) for p in big_got))
            next_got = until_quiet(big)
        finally:
            publisher.close()
            big.close()
            small.close()
        after = rss(node)
    flood = DELIVERIES * PAYLOAD * 2 / MiB
    first_next = int(next_got[0].payload[:6]) if next_got else None
    print(
        f"\nnever acknowledged: {DELIVERIES} QoS 1 of {PAYLOAD} B ({published:.2f} s) to two "
        f"deaf subscribers; --mqtt-max-inflight {MAX_INFLIGHT}: the one with Receive Maximum "
        f"1000 got {len(big_got)}, the one with 5 got {len(small_got)}; --queue-limit "
        f"{QUEUE_LIMIT}: drops counted {drops:.0f}; after 16 PUBACKs: {len(next_got)} more, "
        f"from #{first_next}; node RSS {before:.1f} -> {peak:.1f} MiB ({peak - before:+.1f}) "
        f"for {flood:.0f} MiB of deliveries, {after:.1f} after"
    )
    assert (len(big_got), len(small_got)) == (MAX_INFLIGHT, 5)
    assert drops == expected
    assert len(next_got) == MAX_INFLIGHT and first_next == DELIVERIES - QUEUE_LIMIT
    assert peak - before < flood / 4


# -- e. topic alias abuse --------------------------------------------------------------------

ALIAS_MAXIMUM = 8
HUGE = 60_000  # bytes of a topic
TOPICS = 64
REMAPS = 2000


def test_topic_alias_abuse_is_refused_and_remapping_holds_no_more(
    redis_standalone_url: str, keys: Keys
) -> None:
    limit = ("--mqtt-topic-alias-maximum", str(ALIAS_MAXIMUM))
    limit += ("--mqtt-max-topic-length", "65535")  # (the longest topics MQTT allows)
    with hostile_node(keys, redis_standalone_url, *limit) as (node, port, metrics):
        works(port, "warm")
        abuses = {
            "alias 0": publish("a/b", topic_alias=0),
            f"alias {ALIAS_MAXIMUM + 1}": publish("a/b", topic_alias=ALIAS_MAXIMUM + 1),
            "alias never bound": publish("", topic_alias=3),
            "alias bound to a/+": publish("a/+", topic_alias=1),
        }
        answers = {}
        for case, data in abuses.items():
            with connected(port, "abuser") as sock:
                sock.sendall(data)
                answers[case] = answer(sock)
        before = rss(node)
        packets = [
            publish(f"huge/{n:02d}/" + "t" * HUGE, topic_alias=n % ALIAS_MAXIMUM + 1)
            for n in range(TOPICS)
        ]
        with connected(port, "remapper") as remapper:
            started = time.monotonic()
            for n in range(REMAPS):
                remapper.sendall(packets[n % TOPICS])
            remapper.sendall(publish("", 1, 1, topic_alias=1))  # the last binding of alias 1
            last = answer_one(remapper)
            remapped = time.monotonic() - started
        figures = scrape(metrics, WAIT)
        after = rss(node)
    sent = REMAPS * HUGE / MiB
    counted = {
        name: figures[f"router_mqtt_closed_{name}_total"]
        for name in ("topic_alias_invalid", "protocol_error", "topic_name_invalid")
    }
    shown = "; ".join(f"{case}: {codes(packets)}" for case, packets in answers.items())
    print(
        f"\ntopic alias abuse (maximum {ALIAS_MAXIMUM}): {shown}; {REMAPS} re-maps over "
        f"{TOPICS} topics of {HUGE} B ({sent:.0f} MiB) in {remapped:.2f} s, then the alias "
        f"alone: {codes([last])}; metrics: {counted}; node RSS {before:.1f} -> {after:.1f} MiB "
        f"({after - before:+.1f})"
    )
    assert answers == {
        "alias 0": [Disconnect(0x94)],
        f"alias {ALIAS_MAXIMUM + 1}": [Disconnect(0x94)],
        "alias never bound": [Disconnect(0x82)],
        "alias bound to a/+": [Disconnect(0x90)],
    }
    assert last == PubAck(1, 0x10)  # (published: no subscriber)
    assert counted == {"topic_alias_invalid": 2, "protocol_error": 1, "topic_name_invalid": 1}
    assert after - before < sent / 4


def answer_one(sock: socket.socket) -> Packet:
    """The next packet the node sends on ``sock``."""
    reader, packets = PacketReader(), []
    reader.level = MQTT_5
    while not packets:
        chunk = sock.recv(65536)
        assert chunk, "closed"
        packets = reader.feed(chunk)
    return packets[0]


# -- f. floods of subscriptions, user properties and publishes from one client --------------

FILTERS = 5_000  # subscribed by one client, against the default --mqtt-max-subscriptions
PAIRS = 140_000  # user properties in one PUBLISH (the 1 MB case)
FLOODED = 10_000  # QoS 0 publishes sent at once, against --mqtt-max-publish-rate
RATE = 2_000


def test_floods_from_one_client_are_bounded_and_others_stay_served(
    redis_standalone_url: str, keys: Keys
) -> None:
    """One client subscribes 5,000 filters (1,000 granted, the rest 0x97), sends a PUBLISH
    with 140,000 user properties (DISCONNECT 0x97 before decoding them all) and 10,000
    QoS 0 publishes at once (read at its rate); a paho client beside is served
    throughout. Before: every filter was kept, the properties took 0.3-0.4 s of the
    event loop, and the publishes as fast as the node could take them."""
    rate = ("--mqtt-max-publish-rate", str(RATE))
    with hostile_node(keys, redis_standalone_url, *rate) as (node, port, metrics):
        quiet = max(works(port, f"quiet-{n}") for n in range(3))
        before = rss(node)
        hoarder = connected(port, "hoarder")
        for start in range(0, FILTERS, 500):
            batch = tuple(Subscription(f"f/{n}", 0) for n in range(start, start + 500))
            hoarder.sendall(encode(Subscribe(start // 500 + 1, batch)))
        reader = PacketReader()
        reader.level = MQTT_5
        subacks: list[Packet] = []
        while len(subacks) < FILTERS // 500:
            subacks += reader.feed(hoarder.recv(65536))
        granted = sum(code < 0x80 for ack in subacks for code in ack.reason_codes)  # type: ignore[attr-defined]
        hoarder.close()
        pairs = (("k", ""),) * PAIRS  # (6 bytes each: the packet stays under 1 MiB)
        heavy = connected(port, "heavy", maximum_packet_size=2 * MiB)
        started = time.monotonic()
        heavy.sendall(
            encode(Publish("p/x", b"", 0, False, False, None, Properties(user_properties=pairs)))
        )
        refused_pairs = answer(heavy)
        pairs_took = time.monotonic() - started
        flooder = connected(port, "flooder")
        received = scrape(metrics, WAIT)["router_mqtt_messages_received_total"]
        sender = threading.Thread(
            target=lambda: flooder.sendall(b"".join(publish("flood/x") for _ in range(FLOODED)))
        )
        started = time.monotonic()
        sender.start()
        during = [works(port, f"during-{n}") for n in range(3)]
        taken = lambda: scrape(metrics, WAIT)["router_mqtt_messages_received_total"]  # noqa: E731
        wait_until(lambda: taken() >= received + FLOODED, 2 * FLOODED / RATE, "the flood read")
        flood_took = time.monotonic() - started
        sender.join(WAIT)
        flooder.close()
        figures = scrape(metrics, WAIT)
        after = rss(node)
    refused = figures["router_mqtt_subscriptions_refused_total"]
    throttled = figures["router_mqtt_publish_throttled_total"]
    print(
        f"\nfloods from one client: {FILTERS} filters -> {granted} granted, {refused:.0f} "
        f"refused (0x97); a PUBLISH with {PAIRS} user properties -> {codes(refused_pairs)} "
        f"in {pairs_took:.3f} s; {FLOODED} QoS 0 publishes at once -> read in "
        f"{flood_took:.2f} s at --mqtt-max-publish-rate {RATE}, throttled {throttled:.0f} "
        f"times; a paho client's connect + subscribe + QoS 1 round trip: quiet "
        f"{quiet:.3f} s (worst of 3), during the flood {max(during):.3f} s (worst of 3); "
        f"node RSS {before:.1f} -> {after:.1f} MiB ({after - before:+.1f})"
    )
    assert granted == 1_000 and refused == FILTERS - 1_000
    assert refused_pairs == [Disconnect(0x97)]
    assert not sender.is_alive() and throttled > 1
    assert flood_took > (FLOODED - RATE) / RATE * 0.9  # (read at about its rate)
    assert after - before < 64  # MiB
