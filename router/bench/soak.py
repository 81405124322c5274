"""``router bench soak``: three nodes under mixed MQTT traffic, subscription churn and a
fault every few seconds; what was lost, what came twice, and memory over time.

The run::

    redis-server (append-only, appendfsync always; or --redis URL: no Redis restarts)
    three `router node run` processes with MQTT listeners
    per node: one persistent QoS 1 subscriber of soak/q1/#, one QoS 1 publisher,
              one QoS 0 publisher, and a third of the churn clients, which hold the
              --subscriptions (one in ten takes QoS 0 traffic) and change some every second
    every --fault-every seconds, in turn: kill -9 of node 2 (started again after
              RESTART_DELAY), kill -9 and restart of Redis, kill -9 of node 3 (likewise);
              the cadence is kept from the start, so a fault that outlasts the interval
              is followed at once by the next one.
              Node 1 is never killed: its memory is measured over the whole run.

A client whose node dies connects to the next node that is up and resumes its session
there; it goes back to its home node once that node is up again (soak_clients.Link).

Figures: ``lost`` counts, for each tracked subscriber, the QoS 1 messages acknowledged
to their publisher that never reached it (the target is 0); ``duplicates`` the QoS 1
copies it received more than once (QoS 1 allows them). Every ``--sample-seconds`` the
series records deliveries per second, QoS 0 and QoS 1 latency p99 (send to receive, one
machine clock), and each node's RSS. ``rss_growth_mib_per_min`` is the least-squares
slope of node 1's RSS after the warm-up (target <= 1.0).
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from router.bench.broker_runs import cut, percentile
from router.bench.brokers import delete_prefix
from router.bench.checks import check_directory, check_positive, check_redis
from router.bench.soak_clients import (
    ChurnClient,
    Link,
    QosOnePublisher,
    QosZeroPublisher,
    Tally,
    TrackedSubscriber,
)
from router.bench.soak_processes import NodeProcess, RedisProcess
from router.errors import BenchSetupError

NODES: Final = 3
CHURN_CLIENTS_PER_NODE: Final = 10
RESTART_DELAY: Final = 2.0
"""Seconds a killed node stays down before it is started again."""
SETUP_TIMEOUT: Final = 60.0
DRAIN_TIMEOUT: Final = 60.0
"""Seconds after the load for every acknowledged message to arrive."""
PROBE_INTERVAL: Final = 0.2
TARGET_RSS_GROWTH: Final = 1.0
WARMUP_CAP: Final = 60.0


@dataclass(frozen=True)
class SoakConfig:
    """The sizes of one ``router bench soak`` run."""

    minutes: float = 10.0
    fault_every: float = 30.0
    subscriptions: int = 10_000
    qos1_rate: float = 150.0
    qos0_rate: float = 300.0
    churn: int = 50
    sample_seconds: float = 5.0
    seed: int = 7

    def __post_init__(self) -> None:
        check_positive(
            minutes=self.minutes,
            fault_every=self.fault_every,
            qos1_rate=self.qos1_rate,
            qos0_rate=self.qos0_rate,
            sample_seconds=self.sample_seconds,
        )
        if self.subscriptions < NODES * CHURN_CLIENTS_PER_NODE:
            raise BenchSetupError(
                f"--subscriptions must be >= {NODES * CHURN_CLIENTS_PER_NODE} (one per client)"
            )
        if self.churn < 0:
            raise BenchSetupError("--churn must be >= 0")

    @property
    def seconds(self) -> float:
        return self.minutes * 60


class Soak:
    """One run: the processes, the clients, the fault schedule and the samples."""

    def __init__(self, config: SoakConfig, directory: Path, redis: RedisProcess | None) -> None:
        self.config = config
        self.redis = redis
        self.rng = random.Random(config.seed)
        self.tally = Tally()
        self.stop = threading.Event()
        self.nodes: list[NodeProcess] = []
        self.directory = directory
        self.links: list[Link] = []
        self.subscribers: list[TrackedSubscriber] = []
        self.churners: list[ChurnClient] = []
        self.q1: list[QosOnePublisher] = []
        self.q0: list[QosZeroPublisher] = []
        self.faults: list[dict[str, Any]] = []
        self.series: list[dict[str, Any]] = []
        self.started = 0.0
        self.sampled = 0.0
        self.prefix = f"soak{uuid.uuid4().hex[:8]}"

    def start_nodes(self, url: str) -> None:
        for number in range(1, NODES + 1):
            node = NodeProcess(f"{self.prefix}-{number}", url, self.prefix, self.directory)
            self.nodes.append(node)
            node.start()

    def _link(self, name: str, home: int, *, persistent: bool = False) -> Link:
        link = Link(name, self.nodes, home, self.tally, persistent=persistent)
        self.links.append(link)
        return link

    def start_clients(self) -> None:
        size, extra = divmod(self.config.subscriptions, NODES * CHURN_CLIENTS_PER_NODE)
        rates = (self.config.qos1_rate / NODES, self.config.qos0_rate / NODES)
        for home in range(NODES):
            self.subscribers.append(
                TrackedSubscriber(self._link(f"tracked-{home}", home), self.tally)
            )
            self.q1.append(
                QosOnePublisher(home, self._link(f"q1-{home}", home), rates[0], self.stop)
            )
            self.q0.append(
                QosZeroPublisher(
                    home, self._link(f"q0-{home}", home), rates[1], self.stop, self.rng
                )
            )
            for _ in range(CHURN_CLIENTS_PER_NODE):
                number = len(self.churners)
                link = self._link(f"churn-{number}", home)
                self.churners.append(
                    ChurnClient(number, link, self.tally, size + (number < extra), self.rng)
                )
        for link in self.links:
            link.start()
        self._until(lambda: all(link.connected.is_set() for link in self.links), "connections")
        self._until(lambda: all(not link.pending_subacks for link in self.links), "SUBACKs")
        self._until(self._probed, "the QoS 1 routes on every node", self._probe)

    def _probe(self) -> None:
        for publisher in self.q1:
            publisher.probe()

    def _probed(self) -> bool:
        return all(s.seen_probe(p.number) for s in self.subscribers for p in self.q1)

    def _until(self, done: Any, what: str, step: Any = None) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT
        while not done():
            if time.monotonic() > deadline:
                raise BenchSetupError(f"router bench soak: no {what} within {SETUP_TIMEOUT:.0f} s")
            if step is not None:
                step()
            time.sleep(PROBE_INTERVAL)

    def load(self) -> None:
        """Publishers, churn, faults and samples for ``minutes``."""
        self.started = self.sampled = time.monotonic()
        for thread in self._publisher_threads():
            thread.start()
        churn = threading.Thread(target=self._churn, name="soak-churn", daemon=True)
        churn.start()
        next_fault = self.started + self.config.fault_every
        next_sample = self.started + self.config.sample_seconds
        turn = 0
        end = self.started + self.config.seconds
        while (now := time.monotonic()) < end:
            if now >= next_sample:
                self._sample(now)
                next_sample += self.config.sample_seconds
            if now >= next_fault:
                turn = self._fault(turn)
                next_fault = self.started + (turn + 1) * self.config.fault_every
            time.sleep(min(0.1, max(0.0, min(next_sample, next_fault, end) - time.monotonic())))
        self.stop.set()
        churn.join()
        for thread in self._publisher_threads():
            thread.join(timeout=30)

    def _publisher_threads(self) -> list[threading.Thread]:
        return [publisher.thread for publisher in self.q1] + [p.thread for p in self.q0]

    def _churn(self) -> None:
        if not self.config.churn:
            return
        turn = 0
        while not self.stop.wait(1.0):
            per_client = max(1, self.config.churn // len(self.churners))
            for _ in range(max(1, self.config.churn // per_client)):
                self.churners[turn % len(self.churners)].churn(per_client)
                turn += 1

    def _fault(self, turn: int) -> int:
        """The next fault of the cycle (no Redis restart on a Redis not ours)."""
        cycle: list[tuple[str, int]] = [
            ("kill -9 node", 1),
            ("restart redis", 0),
            ("kill -9 node", 2),
        ]
        if self.redis is None:
            cycle = [entry for entry in cycle if entry[0] != "restart redis"]
        kind, target = cycle[turn % len(cycle)]
        at = time.monotonic() - self.started
        if kind == "restart redis":
            assert self.redis is not None
            back = self.redis.restart()
            name = "redis"
        else:
            node = self.nodes[target]
            began = time.monotonic()
            node.kill()
            self.stop.wait(RESTART_DELAY)
            node.start()
            back = time.monotonic() - began
            name = node.node_id
        self.faults.append({"at_s": cut(at), "kind": kind, "target": name, "back_s": cut(back)})
        return turn + 1

    def _sample(self, now: float) -> None:
        deliveries, q1, q0 = self.tally.take_window()
        seconds, self.sampled = now - self.sampled, now
        self.series.append(
            {
                "t_s": cut(now - self.started),
                "deliveries_per_s": cut(deliveries / seconds),
                "qos1_p99_ms": cut(percentile(q1, 0.99)),
                "qos0_p99_ms": cut(percentile(q0, 0.99)),
                "rss_mib": {node.node_id: _cut_or_none(node.rss_mib()) for node in self.nodes},
                "acked": sum(len(p.acked) for p in self.q1),
            }
        )

    def drain(self) -> float:
        """Wait until every tracked subscriber has every acknowledged message (or the
        deadline); the seconds it took."""
        began = time.monotonic()
        deadline = began + DRAIN_TIMEOUT
        while time.monotonic() < deadline:
            if all(s.has(p.number, p.acked) for s in self.subscribers for p in self.q1):
                break
            time.sleep(PROBE_INTERVAL)
        return time.monotonic() - began

    def close(self) -> None:
        self.stop.set()
        for link in self.links:
            with contextlib.suppress(Exception):
                link.close()
        for node in self.nodes:
            node.stop()

    def report(self, drained: float) -> dict[str, Any]:
        lost = duplicates = delivered = 0
        where: dict[str, list[str]] = {}
        for subscriber in self.subscribers:
            with subscriber.lock:
                for publisher in self.q1:
                    got = subscriber.received.get(publisher.number, [])
                    unique = set(got)
                    acked_seqs = set(publisher.acked)
                    missing = sorted(acked_seqs - unique)
                    if missing:
                        name = f"{subscriber.link.client_id} from q1-{publisher.number}"
                        where[name] = [
                            f"{first}-{last} acked at "
                            f"{cut(publisher.acked_at[first] - self.started)} s"
                            for first, last in _ranges(missing)
                        ]
                    lost += len(missing)
                    duplicates += len(got) - len(unique)
                    delivered += len(unique & acked_seqs)  # (not one whose PUBACK never came)
        acked = sum(len(p.acked) for p in self.q1)
        tally = self.tally
        return {
            "minutes": self.config.minutes,
            "nodes": NODES,
            "subscriptions": self.config.subscriptions,
            "redis": "ours, restarted (append-only)" if self.redis else "given, not restarted",
            "lost": lost,
            "lost_where": where,
            "duplicates": duplicates,
            "qos1": {
                "acked": acked,
                "expected_deliveries": acked * len(self.subscribers),
                "delivered": delivered,
                "resends": sum(p.resends for p in self.q1),
                "p99_ms": cut(percentile(tally.q1_latencies, 0.99)),
                "p50_ms": cut(percentile(tally.q1_latencies, 0.50)),
            },
            "qos0": {
                "sent": sum(p.sent for p in self.q0),
                "delivered": tally.q0_delivered,
                "skipped_while_disconnected": sum(p.skipped for p in self.q0),
            },
            "churn": {
                "subscribes": sum(c.subscribes for c in self.churners),
                "unsubscribes": sum(c.unsubscribes for c in self.churners),
            },
            "tracked_moves": {
                s.link.client_id: [(cut(t - self.started), node + 1) for t, node in s.link.moves]
                for s in self.subscribers
            },
            "reconnects": tally.reconnects,
            "sessions_lost": tally.sessions_lost,
            "disconnect_reasons": {
                hex(code): count for code, count in sorted(tally.disconnect_reasons.items())
            },
            "drain_s": cut(drained),
            "faults": self.faults,
            "rss_growth_mib_per_min": _rss_growth(self.series, self.nodes[0].node_id, self.config),
            "target_rss_growth_mib_per_min": TARGET_RSS_GROWTH,
            "series": self.series,
        }


def _ranges(seqs: list[int], limit: int = 10) -> list[tuple[int, int]]:
    """Sorted ``seqs`` as at most ``limit`` runs (first, last)."""
    out: list[tuple[int, int]] = []
    first = last = seqs[0]
    for seq in [*seqs[1:], None]:
        if seq is not None and seq == last + 1:
            last = seq
            continue
        out.append((first, last))
        if seq is None or len(out) == limit:
            break
        first = last = seq
    return out


def _cut_or_none(value: float | None) -> float | None:
    return None if value is None else cut(value)


def _rss_growth(series: list[dict[str, Any]], node_id: str, config: SoakConfig) -> float | None:
    """Least-squares slope (MiB per minute) of ``node_id``'s RSS after the warm-up
    (a quarter of the run, at most WARMUP_CAP seconds); None with fewer than 3 samples."""
    warmup = min(WARMUP_CAP, config.seconds / 4)
    points = [
        (sample["t_s"] / 60, sample["rss_mib"][node_id])
        for sample in series
        if sample["t_s"] >= warmup and sample["rss_mib"].get(node_id) is not None
    ]
    if len(points) < 3:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (r - mean_r) for t, r in points) / spread
    return cut(slope) if slope >= 0 else -cut(-slope)


def run(url: str | None, config: SoakConfig, logs: str | None = None) -> dict[str, Any]:
    """One soak on ``url`` (or a redis-server the run starts and restarts); the object
    ``--json`` prints. The processes' logs are kept in the directory ``logs`` (None: a
    temporary one, removed after the run)."""
    if logs is not None:
        check_directory(Path(logs), "--logs", empty=True)
    if url is not None:
        check_redis(url)
    with contextlib.ExitStack() as stack:
        if logs is None:
            directory = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="router-soak-"))
            )
        else:
            directory = Path(logs)
            directory.mkdir(parents=True, exist_ok=True)
        redis = None if url is not None else RedisProcess(directory)
        soak = Soak(config, directory, redis)
        try:
            if redis is not None:
                redis.start()
                url = redis.url
            assert url is not None
            soak.start_nodes(url)
            soak.start_clients()
            soak.load()
            drained = soak.drain()
            return soak.report(drained)
        finally:
            soak.close()
            if redis is not None:
                redis.stop()
            elif url is not None:
                delete_prefix(url, soak.prefix)
