"""QoS 1 load on two ``router node run`` processes, for the fault suites that break
Redis under it (``tests/system/test_cluster_faults.py``, ``test_sentinel_faults.py``).

:func:`loaded_nodes` starts nodes a and b (heartbeat TTL 2 s, Redis timeout 1 s), a
persistent QoS 1 subscriber on a (paho reconnects it should a node drop it) and a
:class:`Load` on b: a publisher that sends until its message is acknowledged (a message
not acknowledged within ``ACK_WAIT`` seconds goes again on a new connection). The copies
travel through a's inbox channel. :func:`collect` then waits, bounded, for every
acknowledged message, and :class:`Figures` says what was lost and duplicated.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import paho.mqtt.client as mqtt

from router.ops.processes import free_port
from router.state.keys import Keys
from tests.support.cli import Process
from tests.support.metrics import scrape
from tests.support.mqtt import (
    V5,
    Paho,
    connect_properties,
    connected_publisher,
    mqtt_node,
    routed_to,
)
from tests.support.waiting import pace, wait_until

RATE: Final = 200.0  # msg/s offered by the publisher
MAX_MESSAGES: Final = 6_000  # a bound on the load, should a fault never end
ACK_WAIT: Final = 3.0  # seconds a publisher waits for PUBACK before it sends again
DEADLINE: Final = 30.0  # seconds for every acknowledged message to arrive
AFTER: Final = 300  # messages acknowledged after the fault before the load stops
BOUNDS: Final = ("--redis-timeout", "1", "--publish-timeout", "3")
TOPIC: Final = "load/x"
T = TypeVar("T")
LOG_DIR: Final = os.environ.get("ROUTER_FAULT_LOGS", "")  # set: the nodes' logs are kept there


@dataclass
class Load:
    """A QoS 1 publisher thread on one node: message ``seq`` (its payload) is sent at
    RATE until acknowledged, again on a new connection after ACK_WAIT seconds."""

    port: int
    acked: list[tuple[int, float]] = field(default_factory=list)  # (seq, when acked)
    resent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="publisher", daemon=True).start()

    def _run(self) -> None:
        publisher = connected_publisher(self.port, DEADLINE)
        start = time.monotonic()
        try:
            for seq in range(MAX_MESSAGES):
                if self.stop.is_set():
                    break
                pace(start, seq, RATE)
                while True:
                    info = publisher.client.publish(TOPIC, str(seq).encode(), 1)
                    if acknowledged(info):
                        self.acked.append((seq, time.monotonic()))
                        break
                    self.resent += 1
                    publisher.close()
                    publisher = connected_publisher(self.port, DEADLINE)
        finally:
            publisher.close()
            self.done.set()

    def acked_since(self, moment: float) -> int:
        return sum(1 for _, at in self.acked if at >= moment)

    def run_on_until(self, moment: float, count: int = AFTER) -> None:
        """Let ``count`` more messages be acknowledged after ``moment``, then stop."""
        wait_until(lambda: self.acked_since(moment) >= count, DEADLINE, f"{count} acked after")
        self.stop.set()
        wait_until(self.done.is_set, DEADLINE, "the publisher stopped")


def acknowledged(info: mqtt.MQTTMessageInfo) -> bool:
    """True once the PUBACK came, within ACK_WAIT; False when it did not or cannot (the
    connection is gone: paho raises then)."""
    try:
        info.wait_for_publish(ACK_WAIT)
        return info.is_published()
    except (RuntimeError, ValueError):
        return False


@dataclass
class Figures:
    """What a scenario measured."""

    acked: list[int]
    received: list[tuple[int, float]]  # (seq, when received), duplicates included

    @property
    def lost(self) -> list[int]:
        return sorted(set(self.acked) - {seq for seq, _ in self.received})

    @property
    def duplicates(self) -> int:
        return len(self.received) - len({seq for seq, _ in self.received})

    def line(self) -> str:
        return (
            f"acked {len(self.acked)}, received {len({seq for seq, _ in self.received})}, "
            f"lost {len(self.lost)}, duplicates {self.duplicates}"
        )


def take(subscriber: Paho, into: list[tuple[int, float]]) -> None:
    """Move what ``subscriber`` received on TOPIC into ``into`` (with paho's arrival time)."""
    while not subscriber.messages.empty():
        message = subscriber.messages.get()
        if message.topic == TOPIC:
            into.append((int(message.payload), message.timestamp))


def collect(subscriber: Paho, load: Load) -> Figures:
    """Wait (bounded) until every acknowledged message arrived; the figures either way."""
    received: list[tuple[int, float]] = []

    def complete() -> bool:
        take(subscriber, received)
        return {seq for seq, _ in load.acked} <= {seq for seq, _ in received}

    with contextlib.suppress(TimeoutError):
        wait_until(complete, DEADLINE, "every acknowledged message")
    return Figures([seq for seq, _ in load.acked], received)


def longest_gap(received: list[tuple[int, float]], start: float, end: float) -> float:
    """The longest wait between two deliveries from ``start`` to ``end``."""
    times = sorted(at for _, at in received if start <= at <= end)
    return max((b - a for a, b in zip([start, *times], [*times, end], strict=True)), default=0.0)


@dataclass
class Scene:
    """The two nodes, the subscriber on a and the load on b."""

    subscriber: Paho
    load: Load
    nodes: dict[str, tuple[Process, str]]  # node id -> (process, metrics address)

    def purged(self) -> int:
        """The nodes the two nodes purged as dead."""
        return round(
            sum(scrape(m).get("router_nodes_purged_total", 0) for _, m in self.nodes.values())
        )

    def counted(self) -> str:
        """The Redis errors and task restarts each node counted, its error log lines, and
        the subscriber's connections (CONNACK codes) and disconnections (reason codes)."""
        connacks = drained(self.subscriber.connack)
        disconnects = drained(self.subscriber.disconnects)
        parts = [
            f"subscriber connected {len(connacks)} times {[code for code, _ in connacks]}, "
            f"dropped with {disconnects}"
        ]
        for node_id, (process, metrics) in self.nodes.items():
            figures = scrape(metrics)
            while not process.stderr.empty():
                process.stderr_lines.append(process.stderr.get())
            errors = sum(1 for line in process.stderr_lines if " ERROR " in line)
            counts = {
                name: round(figures.get(f"router_{name}_total", 0))
                for name in ("redis_errors", "forward_retries", "inbox_waits", "task_restarts")
            }
            parts.append(
                f"{node_id}: {', '.join(f'{name} {n}' for name, n in counts.items())}, "
                f"{errors} error lines"
            )
        return "; ".join(parts)


def drained(events: queue.Queue[T]) -> list[T]:
    """Everything in ``events`` now."""
    found = []
    while not events.empty():
        found.append(events.get())
    return found


@contextlib.contextmanager
def loaded_nodes(url: str, keys: Keys, *options: str) -> Iterator[Scene]:
    """Nodes a and b on the Redis at ``url`` (run with ``options`` too); a persistent QoS
    1 subscriber to ``load/#`` on a (paho reconnects it, session kept, should a node drop
    it) and a running Load on b, a second of it acknowledged."""
    env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
    durable = connect_properties(SessionExpiryInterval=600)
    metrics = {node_id: f"127.0.0.1:{free_port()}" for node_id in "ab"}
    with (
        mqtt_node("a", env, *BOUNDS, *options, "--metrics", metrics["a"]) as (node_a, port_a),
        mqtt_node("b", env, *BOUNDS, *options, "--metrics", metrics["b"]) as (node_b, port_b),
    ):
        try:
            subscriber = Paho(port_a, "reader", V5, clean=False, properties=durable)
        except OSError as error:  # (say why: the node's last words)
            for process in (node_a, node_b):
                while not process.stderr.empty():
                    process.stderr_lines.append(process.stderr.get())
            said = [*node_a.stderr_lines[-30:], "--- b:", *node_b.stderr_lines[-30:]]
            raise AssertionError(
                f"node a refused the subscriber ({error}):\n" + "\n".join(said)
            ) from error
        load = Load(port_b)
        scene = Scene(subscriber, load, {"a": (node_a, metrics["a"]), "b": (node_b, metrics["b"])})
        try:
            assert subscriber.subscribe("load/#", 1) == [1]
            probe = Paho(port_b, "probe", V5)
            try:
                routed_to(probe, "load/probe", subscriber)
            finally:
                probe.close()
            load.start()
            wait_until(lambda: len(load.acked) >= RATE, DEADLINE, "a second of load acked")
            yield scene
        finally:
            load.stop.set()
            load.done.wait(DEADLINE)
            subscriber.close()
            if LOG_DIR:
                for node_id, (process, _) in scene.nodes.items():
                    while not process.stderr.empty():
                        process.stderr_lines.append(process.stderr.get())
                    name = f"{os.environ.get('PYTEST_CURRENT_TEST', 'test').split(' ')[0]}"
                    path = Path(LOG_DIR) / f"{name.rsplit('::', 1)[-1]}-{node_id}.log"
                    path.write_text("\n".join(process.stderr_lines))
