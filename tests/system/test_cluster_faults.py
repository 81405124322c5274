"""Redis Cluster faults under QoS 1 load, with real processes (marked ``fault``; each
bounded, each prints its figures: run with ``-s`` to read them).

Each test starts a cluster of its own (3 masters, a replica each, 1.5 s node timeout),
two ``router node run`` processes (a and b, heartbeat TTL 2 s), a persistent QoS 1
subscriber on a (paho reconnects it should a node drop it) and a publisher on b that
sends until its message is acknowledged (as ``publish_until_acked`` of
``test_faults.py``: a message not acknowledged within a few seconds goes again on a new
connection). The copies travel through a's inbox channel, ``rt:{ch:inbox:a}:*``. In
every scenario no node may be purged: both stay alive throughout.

* ``CLUSTER FAILOVER`` of every master in turn (the safe manual form: the replica takes
  over once it has every write): nothing acknowledged is lost.
* ``kill -9`` of the master that holds a's inbox, or the one that holds the registry
  (and, with the slots of this test, a's route set and the subscriber's session): its
  replica is promoted after the node timeout. Replication is asynchronous, so writes
  acknowledged just before the kill may be gone: delivery must resume, everything
  acknowledged after the promotion must arrive, and what was lost before is counted
  and printed. With the registry's master down longer than the TTL, no heartbeat lands:
  each node disconnects its clients with 0x89 (they come back), nobody is purged.
* A live migration (``CLUSTER SETSLOT ... IMPORTING / MIGRATING``, ``MIGRATE`` in small
  batches, ``SETSLOT ... NODE``) of a's inbox slot, paced so that it stays split longer
  than the TTL, then of the registry's, a's route set's and the subscriber's session's
  slots, while the load runs. Nothing is lost; the router meets ASK, TRYAGAIN and MOVED.
  Delivery through the inbox pauses while its slot is split: the inbox scripts declare
  a key that never exists, so Redis answers TRYAGAIN until the last key has moved.
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
import pytest

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
from tests.support.servers import RedisClusterServers
from tests.support.topology import (
    agreed_owner,
    fail_over,
    masters,
    migrate_slot,
    owner,
    redirects,
    replica_of,
    slot_of,
)
from tests.support.waiting import pace, wait_until

pytestmark = pytest.mark.fault

RATE: Final = 200.0  # msg/s offered by the publisher
MAX_MESSAGES: Final = 6_000  # a bound on the load, should a fault never end
SPLIT: Final = 5.0  # seconds a's inbox slot stays split by its migration (longer than the TTL)
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
def loaded_nodes(cluster: RedisClusterServers, keys: Keys) -> Iterator[Scene]:
    """Nodes a and b on ``cluster``; a persistent QoS 1 subscriber to ``load/#`` on a
    (paho reconnects it, session kept, should a node drop it) and a running Load on b."""
    env = {"ROUTER_REDIS_URL": cluster.url, "ROUTER_PREFIX": keys.prefix}
    durable = connect_properties(SessionExpiryInterval=600)
    metrics = {node_id: f"127.0.0.1:{free_port()}" for node_id in "ab"}
    with (
        mqtt_node("a", env, *BOUNDS, "--metrics", metrics["a"]) as (node_a, port_a),
        mqtt_node("b", env, *BOUNDS, "--metrics", metrics["b"]) as (node_b, port_b),
    ):
        subscriber = Paho(port_a, "reader", V5, clean=False, properties=durable)
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


def inbox_slot(keys: Keys, node_id: str = "a") -> int:
    """The slot of node ``node_id``'s inbox channel: every copy for its clients goes there."""
    return slot_of(keys.channel_clock(keys.inbox(node_id)))


def test_a_manual_failover_of_every_master_under_qos1_load_loses_nothing(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys
) -> None:
    cluster = redis_cluster_with_replicas
    with loaded_nodes(cluster, keys) as scene:
        took = []
        started = time.monotonic()
        for master in masters(cluster):
            _, seconds = fail_over(cluster, master)
            took.append(seconds)
        finished = time.monotonic()
        scene.load.run_on_until(finished)
        figures = collect(scene.subscriber, scene.load)
        counted, purged = scene.counted(), scene.purged()
    print(
        f"\nCLUSTER FAILOVER of each of 3 masters under QoS 1 load: {figures.line()}, "
        f"resent {scene.load.resent}; failovers took {', '.join(f'{s:.2f}' for s in took)} s "
        f"(until every node agreed); longest delivery gap meanwhile "
        f"{longest_gap(figures.received, started, finished):.2f} s; {counted}"
    )
    assert figures.lost == []
    assert purged == 0


@pytest.mark.parametrize("holding", ["a's inbox", "the registry"])
def test_kill_9_of_a_master_under_qos1_load_resumes_and_reports_losses(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys, holding: str
) -> None:
    cluster = redis_cluster_with_replicas
    slot = inbox_slot(keys) if holding == "a's inbox" else slot_of(keys.registry())
    victim = owner(cluster, slot)
    heir = replica_of(cluster, victim)
    with loaded_nodes(cluster, keys) as scene:
        assert victim.process is not None
        killed_at = time.monotonic()
        victim.process.kill()  # SIGKILL: what its replica has not got is gone
        victim.process.wait()
        wait_until(lambda: agreed_owner(cluster, slot) is heir, DEADLINE, "the replica promoted")
        promoted_at = time.monotonic()
        scene.load.run_on_until(promoted_at)
        figures = collect(scene.subscriber, scene.load)
        counted, purged = scene.counted(), scene.purged()
    after = [seq for seq, at in scene.load.acked if at >= promoted_at]
    lost_after = sorted(set(after) & set(figures.lost))
    last = max((at for _, at in figures.received), default=killed_at)
    resumed = min((at for _, at in figures.received if at > promoted_at), default=float("nan"))
    print(
        f"\nkill -9 of the master of {holding} under QoS 1 load: {figures.line()} (acked "
        f"before the promotion {len(figures.lost) - len(lost_after)}, after {len(lost_after)}), "
        f"resent {scene.load.resent}; replica promoted (every node agreeing) "
        f"{promoted_at - killed_at:.2f} s after the kill; longest delivery gap "
        f"{longest_gap(figures.received, killed_at, last):.2f} s; first delivery after the "
        f"promotion {resumed - promoted_at:.2f} s later; {counted}"
    )
    assert after, "nothing acknowledged after the promotion"
    assert lost_after == []
    assert purged == 0


def test_a_live_slot_migration_under_qos1_load_loses_nothing(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys
) -> None:
    cluster = redis_cluster_with_replicas
    slots = {
        "a's inbox": inbox_slot(keys),
        "the registry": slot_of(keys.registry()),
        "a's route set": slot_of(keys.node_routes("a")),
        "the subscriber's session": slot_of(keys.client_session("reader")),
    }
    with loaded_nodes(cluster, keys) as scene:
        redirected = redirects(cluster)
        started = time.monotonic()
        moves = []
        for what, slot in slots.items():
            source = owner(cluster, slot)
            target = next(m for m in masters(cluster) if m is not source)
            begun = time.monotonic()
            split = SPLIT if what == "a's inbox" else 0.0
            moved = migrate_slot(cluster, slot, target, batch=5, split_for=split)
            moves.append(f"{what} (slot {slot}, {moved} keys, {time.monotonic() - begun:.2f} s)")
        finished = time.monotonic()
        redirected = redirects(cluster) - redirected
        scene.load.run_on_until(finished)
        figures = collect(scene.subscriber, scene.load)
        counted, purged = scene.counted(), scene.purged()
    print(
        f"\nlive slot migration under QoS 1 load: {figures.line()}, resent {scene.load.resent}; "
        f"moved {'; '.join(moves)}; all in {finished - started:.2f} s; the servers answered "
        f"{', '.join(f'{name} {count}' for name, count in sorted(redirected.items()))}; "
        f"longest delivery gap {longest_gap(figures.received, started, finished):.2f} s; "
        f"{counted}"
    )
    assert figures.lost == []
    assert purged == 0
    assert redirected["TRYAGAIN"] > 0 and redirected["MOVED"] > 0  # the router met them
