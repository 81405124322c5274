"""``router bench mqtt``: the router's MQTT front end beside mosquitto and amqtt, in one run.

The same load (:mod:`router.bench.mqtt_load`: MQTT 3.1.1 over TCP, 256-byte payloads,
fan-out 1) goes through four brokers, each started here on a free loopback port and
stopped before the next one starts:

1. ``router_two_nodes``: two ``router node run`` processes on one Redis; publishers
   connect to node 1, subscribers to node 2, so every message crosses between nodes;
2. ``router_one_node``: one node, publishers and subscribers on it;
3. ``mosquitto``: ``/usr/sbin/mosquitto`` with a generated config (no persistence, no
   queue or inflight limits, TCP_NODELAY);
4. ``amqtt``: the Python broker, from a virtualenv of its own that the bench creates on
   first use under ``~/.cache/router/`` (amqtt pins ``websockets==15.0.1``, which would
   downgrade the project's websockets, so it is not a dependency of the project).

At QoS 0 and QoS 1 in turn (:func:`run_load`, fresh load processes each time), each
broker gets the same messages and must deliver the same set of (publisher, seq); ``lost``
(never arrived within the drain wait) and ``duplicates`` are counted per broker.
Then, through the two router nodes at QoS 1, one publisher offers ``rate`` msg/s for
``seconds`` and the subscriber measures receive time - send time; then mosquitto gets the
same latency run (``mosquitto_p99_latency_ms``; ``p99_vs_mosquitto`` is ours over its), so
that on a machine whose absolute p99 swings from run to run the two still compare.

The router nodes run with ``ROUTER_OPTIONS`` (queues and inflight windows as unbounded
as mosquitto's here) and, with ``acl``, ``--acl FILE`` (what the ACL's per-delivery
receive check costs: the file's rules should let every message of the load through, or
the run reports them lost); with ``http``, ``--http 127.0.0.1:0`` (the dashboard's
listener and its sampling, with nobody looking: what the dashboard costs). With
``ROUTER_BENCH_PROFILE=DIR`` in the environment each node runs under cProfile and writes
``DIR/<node id>.prof`` when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from multiprocessing.connection import Connection, wait
from typing import Any, Final

from redis import asyncio as aioredis

from router.cluster.policy import load_acl
from router.errors import BenchSetupError
from router.ops.embedded_redis import embedded_redis
from router.state.event_log import EventLog
from router.state.keys import Keys

from .brokers import (
    AMQTT_VERSION,
    ROUTER_OPTIONS,
    Address,
    amqtt,
    fresh_prefix,
    mosquitto,
    mosquitto_binary,
    mosquitto_version,
    router_nodes,
)
from .checks import check_positive, check_redis
from .cpu_meter import cpu_seconds, cpu_us_per_message
from .mqtt_load import (
    DISCONNECT,
    IO_TIMEOUT,
    MAX_DRAIN,
    PAYLOAD_BYTES,
    PROBE_INTERVAL,
    PROBE_SEQ,
    SETUP_TIMEOUT,
    TOPICS_PER_PUBLISHER,
    LoadPlan,
    LoadResult,
    combine,
    open_session,
    payload_for,
    publish_packet,
    publisher_main,
    subscriber_main,
)

BROKERS: Final = ("router_two_nodes", "router_one_node", "mosquitto", "amqtt")
# Targets of the product (reported, never enforced).
TARGET_QOS0_VS_AMQTT: Final = 3.0
TARGET_QOS0_VS_MOSQUITTO: Final = 0.5
TARGET_QOS1_VS_AMQTT: Final = 3.0
TARGET_P99_MS: Final = 10.0
MAX_LATENCY_MESSAGES: Final = 10_000_000
"""At most this many messages in the latency phase (``--rate`` x ``--seconds``)."""


@dataclass(frozen=True)
class MqttBenchConfig:
    """The sizes of one ``router bench mqtt`` run (``messages`` per QoS and broker)."""

    messages: int = 100_000
    publishers: int = 4
    subscribers: int = 4
    fanout: int = 1
    window: int = 100
    rate: float = 2_000.0
    seconds: float = 5.0
    drain_seconds: float = 3.0
    skip_mosquitto: bool = False
    skip_amqtt: bool = False
    acl: str | None = None
    http: bool = False  # the router nodes serve --http (the dashboard's listener, unwatched)

    def router_options(self) -> tuple[str, ...]:
        options = ROUTER_OPTIONS if self.acl is None else (*ROUTER_OPTIONS, "--acl", self.acl)
        return (*options, "--http", "127.0.0.1:0") if self.http else options

    def __post_init__(self) -> None:
        check_positive(rate=self.rate, seconds=self.seconds, drain_seconds=self.drain_seconds)
        if self.rate * self.seconds > MAX_LATENCY_MESSAGES:
            raise BenchSetupError(f"--rate x --seconds must be <= {MAX_LATENCY_MESSAGES:,}")
        self.plan(0, "check")  # LoadPlan checks the sizes
        self.latency_plan("check")
        if self.acl is not None:
            load_acl(self.acl)  # (a bad file: AclRuleError before any process starts)

    def plan(self, qos: int, label: str) -> LoadPlan:
        return LoadPlan(
            self.messages,
            self.publishers,
            self.subscribers,
            qos,
            self.window,
            self.drain_seconds,
            label=label,
            fanout=self.fanout,
        )

    def latency_plan(self, label: str) -> LoadPlan:
        count = max(1, int(self.rate * self.seconds))
        return LoadPlan(count, 1, 1, 1, self.window, self.drain_seconds, self.rate, label)


# -- one run of the load -----------------------------------------------------------------------


def _await_all(
    pipes: list[Connection], word: str, what: str, each_round: Callable[[set[int]], None] | None
) -> None:
    """Wait until every process said ``word`` (``each_round(waiting)`` first, every
    ``PROBE_INTERVAL``); :class:`BenchSetupError` on another answer or after SETUP_TIMEOUT."""
    waiting = set(range(len(pipes)))
    deadline = time.monotonic() + SETUP_TIMEOUT
    while waiting:
        if each_round is not None:
            each_round(waiting)
        for pipe in wait([pipes[i] for i in waiting], timeout=PROBE_INTERVAL):
            assert isinstance(pipe, Connection)
            index, answer = pipes.index(pipe), _answer(pipe)
            if answer != word:
                raise BenchSetupError(f"{what} {index}: {answer}")
            waiting.discard(index)
        if waiting and time.monotonic() > deadline:
            raise BenchSetupError(f"{what} {sorted(waiting)} not {word} in {SETUP_TIMEOUT} s")


def _probe(address: tuple[str, int], plan: LoadPlan, pipes: list[Connection]) -> None:
    """Publish probes on every publisher's topics until every subscriber saw its own."""
    sock = open_session(address, f"{plan.label}-probe")

    def send(waiting: set[int]) -> None:
        sock.sendall(
            b"".join(
                publish_packet(f"bench/p{p:03d}/probe", payload_for(p, PROBE_SEQ))
                for s in waiting
                for p in plan.publishers_of(s)
            )
        )

    try:
        _await_all(pipes, "ready", "subscriber", send)
        sock.sendall(DISCONNECT)
    finally:
        sock.close()


def _answer(pipe: Connection) -> Any:
    try:
        return pipe.recv()
    except EOFError:
        raise BenchSetupError("a load process exited without an answer") from None


def _result(pipe: Connection, timeout: float) -> dict[str, Any]:
    if not pipe.poll(timeout):
        raise BenchSetupError(f"a load process gave no result in {timeout} s")
    answer: dict[str, Any] = _answer(pipe)
    return answer


def run_load(
    publish_to: tuple[str, int], subscribe_to: tuple[str, int], plan: LoadPlan
) -> LoadResult:
    """One run (see :mod:`router.bench.mqtt_load`); every process it starts is gone when it
    returns.

    Raises :class:`BenchSetupError` when a connection, subscription or probe fails; what
    goes wrong once messages flow is counted (lost) and listed in ``errors``.
    """
    # fork is quick; with other threads alive it is unsafe (3.12 warns), so a fork server
    # (which stays until this process exits) makes the processes then.
    context = (
        multiprocessing.get_context("fork")
        if threading.active_count() == 1
        else multiprocessing.get_context("forkserver")
    )
    start, done, close = context.Event(), context.Event(), context.Event()
    processes: list[multiprocessing.process.BaseProcess] = []

    def spawn(target: Callable[..., None], *args: object) -> Connection:
        ours, theirs = context.Pipe()
        processes.append(context.Process(target=target, args=(*args, theirs), daemon=True))
        processes[-1].start()
        return ours

    try:
        subs = [
            spawn(subscriber_main, subscribe_to, plan, i, done) for i in range(plan.subscribers)
        ]
        _await_all(subs, "subscribed", "subscriber", None)
        _probe(publish_to, plan, subs)
        pubs = [
            spawn(publisher_main, publish_to, plan, i, start, close) for i in range(plan.publishers)
        ]
        _await_all(pubs, "connected", "publisher", None)
        start.set()
        longest = IO_TIMEOUT + plan.messages / (plan.rate or 100.0)
        published = [_result(pipe, longest) for pipe in pubs]
        done.set()
        received = [_result(pipe, MAX_DRAIN + 10) for pipe in subs]
        close.set()
        for process in processes:
            process.join(timeout=5)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return combine(plan, published, received)


# -- the run and its report ------------------------------------------------------------------


def cut(value: float, digits: int = 2) -> float:
    """``value`` truncated (never rounded up) to ``digits`` decimals, exactly (no float
    product that could round up first): how every ratio of the benches is printed."""
    scale: int = 10**digits
    return math.floor(Fraction(value) * scale) / scale


def percentile(values: list[int], fraction: float) -> float:
    """The ``fraction`` quantile of nanosecond ``values``, in milliseconds (0.0 if none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1e6


@contextlib.contextmanager
def _interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile, so every broker and process is stopped
    on the way out (in the main thread; elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(url: str | None = None, config: MqttBenchConfig | None = None) -> dict[str, Any]:
    """Every broker at QoS 0 and 1, then latency through two router nodes, on ``url``
    (or a redis-server started for the run); the object ``--json`` prints."""
    config = config if config is not None else MqttBenchConfig()
    if url is not None:
        check_redis(url)
    if not config.skip_mosquitto:
        mosquitto_binary()  # before any process starts
    nonce = uuid.uuid4().hex[:6]
    results: dict[str, dict[int, LoadResult]] = {}
    cpu: dict[str, dict[int, list[float | None]]] = {}
    slowed: dict[str, list[str]] = {}

    def each_qos(name: str, publish_to: Address, subscribe_to: Address, pids: list[int]) -> None:
        results[name], cpu[name] = {}, {}
        for qos in (0, 1):
            before = [cpu_seconds(pid) for pid in pids]
            done = run_load(publish_to, subscribe_to, config.plan(qos, f"{name}-{qos}-{nonce}"))
            after = [cpu_seconds(pid) for pid in pids]
            results[name][qos] = done
            spent = zip(before, after, strict=True)
            cpu[name][qos] = [cpu_us_per_message(b, a, done.received) for b, a in spent]

    with contextlib.ExitStack() as stack:
        stack.enter_context(_interrupted_by_sigterm())
        if url is None:
            url = stack.enter_context(embedded_redis())
        pids: dict[str, list[int]] = {name: [] for name in BROKERS}
        options = config.router_options()
        prefix = fresh_prefix()
        with router_nodes(url, 2, pids["router_two_nodes"], options, prefix) as (first, second):
            each_qos("router_two_nodes", first, second, pids["router_two_nodes"])
            latency = run_load(first, second, config.latency_plan(f"latency-{nonce}"))
            slowed["router_two_nodes"] = slowing_told(url, prefix)
        prefix = fresh_prefix()
        with router_nodes(url, 1, pids["router_one_node"], options, prefix) as (only,):
            each_qos("router_one_node", only, only, pids["router_one_node"])
            slowed["router_one_node"] = slowing_told(url, prefix)
        mosquitto_latency = None
        if not config.skip_mosquitto:
            with mosquitto(pids["mosquitto"]) as address:
                each_qos("mosquitto", address, address, pids["mosquitto"])
                plan = config.latency_plan(f"latency-mosquitto-{nonce}")
                mosquitto_latency = run_load(address, address, plan)
        if not config.skip_amqtt:
            with amqtt(pids["amqtt"]) as address:
                each_qos("amqtt", address, address, pids["amqtt"])
    return report(config, results, latency, cpu, mosquitto_latency) | {
        "overload_slowing_told": slowed
    }


def slowing_told(url: str, prefix: str) -> list[str]:
    """The ``clients_slowed`` events the nodes under ``prefix`` told (overload
    protection slowed a client: the run did not go through untouched), their texts."""

    async def read() -> list[str]:
        client = aioredis.Redis.from_url(url)
        try:
            found = await EventLog(client, Keys(prefix)).recent(100, kinds=["clients_slowed"])
        finally:
            await client.aclose()
        return [event.text for event in found]

    return asyncio.run(read())


def _qos_report(
    qos: int, results: dict[str, dict[int, LoadResult]], cpu: dict[str, dict[int, Any]]
) -> dict[str, Any]:
    rates = {name: results[name][qos].msgs_per_s for name in results}
    two = rates["router_two_nodes"]
    row: dict[str, Any] = {
        f"{name}_msgs_per_s": round(rates[name]) if name in rates else None for name in BROKERS
    }
    for peer in ("mosquitto", "amqtt"):
        row[f"vs_{peer}"] = cut(two / rates[peer]) if rates.get(peer) else None
    ours = results["router_two_nodes"][qos]
    row["lost"], row["duplicates"] = ours.lost, ours.duplicates
    row["lost_by_broker"] = {name: results[name][qos].lost for name in results}
    row["duplicates_by_broker"] = {name: results[name][qos].duplicates for name in results}
    row["loadgen_cores_by_broker"] = {  # CPU seconds of the load / elapsed seconds
        name: cut(results[name][qos].cpu_seconds / (results[name][qos].elapsed or 1))
        for name in results
    }
    # CPU of each broker process per message delivered (two nodes: publishers', subscribers').
    row["cpu_us_per_msg_by_broker"] = {name: cpu[name][qos] for name in results}
    row["answers_agree"] = len({results[name][qos].digest() for name in results}) == 1
    row["errors"] = [e for name in results for e in results[name][qos].errors]
    return row


LATENCY_FIGURES: Final = (
    "p50_latency_ms",
    "p99_latency_ms",
    "max_latency_ms",
    "p99_latency_from_schedule_ms",
    "latency_messages",
    "latency_lost",
    "latency_duplicates",
)


def latency_figures(latency: LoadResult | None, name: str = "") -> dict[str, Any]:
    """The :data:`LATENCY_FIGURES` of a latency run (ms to the microsecond, over the
    messages received), each named with the prefix ``name``; all None for a broker left
    out (``latency`` None)."""
    if latency is None:
        return {f"{name}{figure}": None for figure in LATENCY_FIGURES}
    values = (
        *(round(percentile(latency.latencies_ns, q), 3) for q in (0.5, 0.99, 1.0)),
        round(percentile(latency.scheduled_latencies_ns, 0.99), 3),
        latency.received,
        latency.lost,
        latency.duplicates,
    )
    return {f"{name}{figure}": v for figure, v in zip(LATENCY_FIGURES, values, strict=True)}


def report(
    config: MqttBenchConfig,
    results: dict[str, dict[int, LoadResult]],
    latency: LoadResult,
    cpu: dict[str, dict[int, Any]],
    mosquitto_latency: LoadResult | None = None,
) -> dict[str, Any]:
    """The JSON object of a run: a row per QoS, the latency figures (ours, then
    mosquitto's: ``p99_vs_mosquitto`` is ours over its, None without both), the workload."""
    qos0, qos1 = _qos_report(0, results, cpu), _qos_report(1, results, cpu)
    p99 = percentile(latency.latencies_ns, 0.99)
    ours, theirs = latency_figures(latency), latency_figures(mosquitto_latency, "mosquitto_")
    theirs_p99 = theirs["mosquitto_p99_latency_ms"]  # None: left out; 0.0: nothing arrived
    ratio = cut(ours["p99_latency_ms"] / theirs_p99) if latency.received and theirs_p99 else None
    met = {
        "qos0_vs_amqtt": qos0["vs_amqtt"] is not None and qos0["vs_amqtt"] >= TARGET_QOS0_VS_AMQTT,
        "qos0_vs_mosquitto": qos0["vs_mosquitto"] is not None
        and qos0["vs_mosquitto"] >= TARGET_QOS0_VS_MOSQUITTO,
        "qos1_vs_amqtt": qos1["vs_amqtt"] is not None and qos1["vs_amqtt"] >= TARGET_QOS1_VS_AMQTT,
        "p99_latency": latency.received > 0 and p99 <= TARGET_P99_MS,
        "qos1_lost_zero": qos1["lost"] == 0 and qos1["lost_by_broker"]["router_one_node"] == 0,
    }
    return {
        "qos0": qos0,
        "qos1": qos1,
        **ours,
        **theirs,
        "p99_vs_mosquitto": ratio,
        "messages": config.messages,
        "publishers": config.publishers,
        "subscribers": config.subscribers,
        "fan_out": config.fanout,
        "payload_bytes": PAYLOAD_BYTES,
        "topics_per_publisher": TOPICS_PER_PUBLISHER,
        "inflight_window": config.window,
        "rate": config.rate,
        "seconds": config.seconds,
        "drain_seconds": config.drain_seconds,
        "router_options": " ".join(config.router_options()),
        "mosquitto_version": None if config.skip_mosquitto else mosquitto_version(),
        "amqtt_version": None if config.skip_amqtt else AMQTT_VERSION,
        "cpus": os.cpu_count(),
        "targets_met": met,
    }
