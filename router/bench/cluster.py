"""``router bench cluster``: nodes in separate processes, beside raw pipelined PUBLISH.

Layout of one run (all on loopback, one Redis):

* node ``bench-a`` in this process publishes;
* node ``bench-b`` (a child process) has one client subscribed to ``#`` below the bench
  topics, so every publish must cross from A to B;
* node ``bench-c`` (a child process) subscribes nothing: it must receive nothing (until
  the convergence phase, which subscribes on it);
* the raw hop's subscriber (a child process, :mod:`router.bench.raw_hop`) subscribes to a
  Redis pub/sub channel of its own.

Every payload carries its intended send time and a sequence number, so B counts what
arrived, what never did (``lost``) and what came twice (``duplicates``). B is waited for
until everything sent arrived, or until nothing new arrived for :data:`DRAIN_QUIET`
seconds.

Phases:

1. *yardstick*: redis-py pipelined PUBLISH of the same 256-byte payloads, same batch size;
2. *throughput*: A publishes as fast as it can with many publishes in flight; the rate is
   distinct messages arrived over the time from the first publish to B's last arrival;
3. *latency*: A offers 5,000 messages/s for a few seconds (what fell due in each
   millisecond is published together); B measures the time from the publish call to the
   client (``p50/p99_latency_ms``) and, stricter, from the send time the generator
   intended (``..._from_schedule_ms``: adds the generator's own scheduling lag, about a
   millisecond of asyncio timer granularity). Percentiles are over every message *sent*:
   one that never arrived counts as infinitely late, so a percentile that falls on one
   is ``null`` (and ``lost`` says how many);
4. *raw hop*: the latency phase again without the router, its peer in the same run: this
   process PUBLISHes the same messages at the same rate, in the same batches, to the raw
   hop's channel, and that process measures the time from the PUBLISH call to arrival
   (``raw_p50/p99_latency_ms``, over every message sent as above; ``raw_latency_lost``
   counts what never arrived). ``p99_vs_raw`` is the router's p99 over the raw hop's,
   target at most :data:`P99_VS_RAW_TARGET`: on a machine whose absolute p99 swings from
   run to run, the ratio says what the router adds to the hop it cannot avoid;
5. *convergence*: a subscribe on node C (its own process) returns, then the time until
   A's route mirror (this process) routes the topic to C; 0 if A could route it before
   the subscribe returned (``convergence_p50/p99_ms``), and how long each subscribe took
   (``subscribe_p50/p99_ms``: what a SUBACK waits for, every other live node's mirror
   holding the route included). ``time.monotonic()`` is one clock for every process of a
   Linux machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis

from router.bench.broker_runs import cut
from router.bench.checks import check_directory, check_positive, check_redis
from router.bench.cluster_node import STAMP
from router.bench.cpu_meter import cpu_seconds, cpu_us_per_message
from router.bench.raw_hop import RAW_PREFIX, SENT
from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.messages import Outgoing
from router.core.topics import validate_topic
from router.errors import BenchSetupError
from router.ops.embedded_redis import embedded_redis
from router.ops.node_process import settle_collector

PAYLOAD = b"x" * 256
BATCH = 256  # commands per pipeline round trip, and messages per publish_many call
DRAIN_QUIET: Final = 5.0
"""Seconds without a new arrival after which the messages still missing count as lost."""
MAX_LATENCY_MESSAGES: Final = 10_000_000
"""At most this many messages in the latency phase (``rate`` x ``seconds``)."""
P99_VS_RAW_TARGET: Final = 3.0
"""Target of the product (reported, never enforced): p99 within 3x of the raw hop's."""

Publish = Callable[[Sequence[int], float], Coroutine[Any, Any, object]]
"""Sends messages ``seqs`` of a paced load that started at ``start`` (see
:func:`offered_load`): ``publish(seqs, start)`` builds the batch and returns what sends it."""


@dataclass(frozen=True)
class ClusterBenchConfig:
    """The sizes of one ``router bench cluster`` run; checks itself on creation
    (:class:`BenchSetupError` names the option)."""

    messages: int = 20_000
    rate: float = 5_000.0
    seconds: float = 3.0
    convergence_rounds: int = 200
    traffic_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("messages", "convergence_rounds"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise BenchSetupError(f"--{name.replace('_', '-')} must be an int >= 1")
        check_positive(rate=self.rate, seconds=self.seconds)
        if not 1 <= self.rate * self.seconds <= MAX_LATENCY_MESSAGES:
            raise BenchSetupError(
                f"--rate x --seconds must be 1 to {MAX_LATENCY_MESSAGES:,} messages"
            )
        if self.traffic_dir is not None:
            check_directory(Path(self.traffic_dir), "--traffic-dir")

    @property
    def latency_messages(self) -> int:
        return int(self.rate * self.seconds)


class Worker:
    """A child process ``python -m MODULE OPTIONS`` driven by lines on its stdin and
    answering each with a JSON line (:mod:`router.bench.cluster_node`,
    :mod:`router.bench.raw_hop`)."""

    def __init__(self, module: str, *options: str) -> None:
        args = [sys.executable, "-m", module, *options]
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    @classmethod
    def node(cls, redis_url: str, prefix: str, node_id: str, subscribe: str | None) -> Worker:
        """A bench node (:mod:`router.bench.cluster_node`), with a client subscribed to
        ``subscribe`` if given."""
        options = ["--redis", redis_url, "--prefix", prefix, "--node-id", node_id]
        if subscribe:
            options += ["--subscribe", subscribe]
        return cls("router.bench.cluster_node", *options)

    @classmethod
    def raw_hop(cls, redis_url: str, channel: str) -> Worker:
        """The raw hop's subscriber (:mod:`router.bench.raw_hop`) on ``channel``."""
        return cls("router.bench.raw_hop", "--redis", redis_url, "--channel", channel)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"bench node exited ({self.process.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
            self.process.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


async def raw_publish_rate(url: str, count: int, batch: int) -> float:
    """Pipelined PUBLISH of 256-byte payloads, ``batch`` commands per round trip."""
    redis = Redis.from_url(url)
    try:
        start = time.perf_counter()
        for offset in range(0, count, batch):
            pipe = redis.pipeline(transaction=False)
            for _ in range(min(batch, count - offset)):
                pipe.publish("bench-raw", PAYLOAD)
            await pipe.execute()
        return count / (time.perf_counter() - start)
    finally:
        await redis.aclose()


async def drain(worker: Worker, prefix: str, sent: int) -> None:
    """Wait until ``sent`` distinct messages under ``prefix`` arrived at ``worker``, or
    nothing new arrived for :data:`DRAIN_QUIET` seconds."""
    last_count, last_change = -1, time.monotonic()
    while True:
        answer = await asyncio.to_thread(worker.ask, "count")
        count = answer["counts"].get(prefix, 0)
        if count >= sent:
            return
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > DRAIN_QUIET:
            return
        await asyncio.sleep(0.05)


async def throughput(node: RouterNode, count: int, batch: int, in_flight: int) -> float:
    """Publish ``count`` messages in ``publish_many`` batches of ``batch``, with up to
    ``in_flight`` batches awaiting at once; returns the start time."""
    limit = asyncio.Semaphore(in_flight)

    async def one(offset: int) -> None:
        try:
            await node.publish_many(
                [
                    Outgoing(f"tp/{i % 100}", stamped(time.monotonic(), i))
                    for i in range(offset, min(offset + batch, count))
                ]
            )
        finally:
            limit.release()

    start = time.monotonic()
    tasks = []
    for offset in range(0, count, batch):
        await limit.acquire()
        tasks.append(asyncio.create_task(one(offset)))
    await asyncio.gather(*tasks)
    return start


def stamped(due: float, seq: int) -> bytes:
    """A payload that carries its intended send time (``time.monotonic()``) and its
    sequence number (:data:`~router.bench.cluster_node.STAMP`), padded."""
    return STAMP.pack(due, seq) + PAYLOAD[STAMP.size :]


def raw_stamped(due: float, sent: float, seq: int) -> bytes:
    """A raw hop payload: :func:`stamped`'s head, then when the PUBLISH was called
    (:data:`~router.bench.raw_hop.SENT`), padded to the same size."""
    head = STAMP.pack(due, seq) + SENT.pack(sent)
    return head + PAYLOAD[len(head) :]


def node_publish(node: RouterNode, rate: float) -> Publish:
    """The latency phase's batches: messages ``lat/N`` through ``node`` (``publish_many``)."""

    def publish(seqs: Sequence[int], start: float) -> Coroutine[Any, Any, object]:
        batch = [Outgoing(f"lat/{i % 100}", stamped(start + i / rate, i)) for i in seqs]
        return node.publish_many(batch)

    return publish


def raw_publish(redis: Redis, channel: str, rate: float) -> Publish:
    """The raw hop's batches: the same messages PUBLISHed to ``channel``, a batch in one
    pipeline (one round trip, as ``publish_many`` makes one call)."""

    def publish(seqs: Sequence[int], start: float) -> Coroutine[Any, Any, object]:
        sent = time.monotonic()
        pipe = redis.pipeline(transaction=False)
        for i in seqs:
            pipe.publish(channel, raw_stamped(start + i / rate, sent, i))
        return pipe.execute()

    return publish


async def offered_load(publish: Publish, rate: float, seconds: float) -> int:
    """Offer ``rate`` messages/s for ``seconds``; returns how many were published.

    Every millisecond, the messages that fell due are published together:
    ``publish(seqs, start)`` (message ``i`` is due at ``start + i / rate``), each batch in
    a task of its own. Each payload carries its *intended* send time and latency is also
    measured from it, so a publisher that falls behind shows up in the figures (no
    coordinated omission).
    """
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    total = int(rate * seconds)
    tasks = []
    sent = 0
    while sent < total:
        now = time.monotonic()
        due_count = min(total, int((now - start) * rate) + 1)
        if due_count > sent:
            tasks.append(loop.create_task(publish(range(sent, due_count), start)))
            sent = due_count
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    return total


async def convergence(
    node: RouterNode, worker: Worker, worker_id: str, rounds: int
) -> tuple[list[float], list[float]]:
    """Milliseconds from ``subscribe`` returning on ``worker``'s node (another process)
    to ``node``'s route mirror routing the topic to it (0 when it routed it before), and
    milliseconds each ``subscribe`` took (what a SUBACK waits for)."""
    samples, took = [], []
    for index in range(rounds):
        topic = validate_topic(f"conv/{index}")
        answer = asyncio.ensure_future(asyncio.to_thread(worker.ask, f"subscribe {topic}"))
        while worker_id not in node.mirror.match(topic).nodes:
            if answer.done() and answer.exception() is not None:
                break  # the worker failed: await raises it below
            await asyncio.sleep(0)  # the mirror follows Redis in this loop's tasks
        routable = time.monotonic()
        answered = await answer
        samples.append(max(0.0, 1000 * (routable - answered["returned"])))
        took.append(1000 * answered["took"])
    return samples, took


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _ms(value: float | None) -> float | None:
    """A latency in milliseconds, to the microsecond; None (never arrived) stays None."""
    return None if value is None else round(value, 3)


async def raw_hop_figures(
    redis: Redis, worker: Worker, channel: str, config: ClusterBenchConfig
) -> dict[str, Any]:
    """The raw hop at the latency phase's rate and length: PUBLISH to ``channel`` on
    ``redis``, drained and reported by ``worker`` (the raw hop's subscriber) as
    :meth:`~router.bench.cluster_node.Recorder.report` reports a prefix."""
    sent = await offered_load(raw_publish(redis, channel, config.rate), config.rate, config.seconds)
    await drain(worker, RAW_PREFIX, sent)
    answer = await asyncio.to_thread(worker.ask, f"report {json.dumps({RAW_PREFIX: sent})}")
    figures: dict[str, Any] = answer["prefixes"][RAW_PREFIX]
    return figures


async def run_async(url: str, config: ClusterBenchConfig) -> dict[str, Any]:
    """Every phase on the Redis at ``url``; the object ``--json`` prints. With
    ``config.traffic_dir``, node A writes a traffic log there (every publish)."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    messages = config.messages
    raw = max([await raw_publish_rate(url, messages, BATCH) for _ in range(2)])
    redis = Redis.from_url(url)
    node = RouterNode(redis, NodeConfig("bench-a", prefix=prefix, traffic_dir=config.traffic_dir))
    with contextlib.ExitStack() as workers:
        interested = Worker.node(url, prefix, "bench-b", "#")
        workers.callback(interested.stop)
        idle = Worker.node(url, prefix, "bench-c", None)
        workers.callback(idle.stop)
        channel = f"{prefix}-raw-hop"
        raw_hop = Worker.raw_hop(url, channel)
        workers.callback(raw_hop.stop)
        try:
            for worker in (interested, idle, raw_hop):
                await asyncio.to_thread(worker.ask, "ready")
            await node.start()
            settle_collector()  # as `router node run` does
            while "bench-b" not in node.mirror.match(validate_topic("tp/0")).nodes:
                await asyncio.sleep(0.01)
            cpu_before = (cpu_seconds(os.getpid()), cpu_seconds(interested.process.pid))
            start = await throughput(node, messages, batch=BATCH, in_flight=4)
            await drain(interested, "tp", messages)
            cpu_after = (cpu_seconds(os.getpid()), cpu_seconds(interested.process.pid))
            forwarded, published = node.stats()["forwarded"], node.stats()["published"]
            sent = await offered_load(node_publish(node, config.rate), config.rate, config.seconds)
            await drain(interested, "lat", sent)
            sent_by_prefix = json.dumps({"tp": messages, "lat": sent})
            report = await asyncio.to_thread(interested.ask, f"report {sent_by_prefix}")
            hop = await raw_hop_figures(redis, raw_hop, channel, config)
            idle_report = await asyncio.to_thread(idle.ask, "report")
            samples, took = await convergence(node, idle, "bench-c", config.convergence_rounds)
            stats = node.stats()
        finally:
            await node.stop()
            await redis.aclose()
    tp, lat = report["prefixes"]["tp"], report["prefixes"]["lat"]
    cross = tp["count"] / (tp["last"] - start) if tp["count"] else 0.0
    p99, raw_p99 = _ms(lat["p99_ms"]), _ms(hop["p99_ms"])
    p99_vs_raw = p99 / raw_p99 if p99 is not None and raw_p99 else None
    return {
        "messages": messages,
        "payload_bytes": len(PAYLOAD),
        "cross_node_msgs_per_s": round(cross),
        "raw_publish_per_s": round(raw),
        "throughput_ratio": cut(cross / raw),
        "delivered": tp["count"],
        # CPU per message of the throughput phase: A (this process, with the generator), B.
        "cpu_us_per_msg_a": cpu_us_per_message(cpu_before[0], cpu_after[0], tp["count"]),
        "cpu_us_per_msg_b": cpu_us_per_message(cpu_before[1], cpu_after[1], tp["count"]),
        "lost": tp["lost"] + lat["lost"],
        "duplicates": tp["duplicates"] + lat["duplicates"],
        "offered_rate": config.rate,
        "latency_sent": sent,
        "latency_messages": lat["count"],
        "latency_lost": lat["lost"],
        "p50_latency_ms": _ms(lat["p50_ms"]),
        "p99_latency_ms": p99,
        "max_latency_ms": _ms(lat["max_ms"]),
        "p50_latency_from_schedule_ms": _ms(lat["scheduled_p50_ms"]),
        "p99_latency_from_schedule_ms": _ms(lat["scheduled_p99_ms"]),
        "raw_latency_messages": hop["count"],
        "raw_latency_lost": hop["lost"],
        "raw_latency_duplicates": hop["duplicates"],
        "raw_p50_latency_ms": _ms(hop["p50_ms"]),
        "raw_p99_latency_ms": raw_p99,
        "raw_max_latency_ms": _ms(hop["max_ms"]),
        "p99_vs_raw": None if p99_vs_raw is None else cut(p99_vs_raw),
        "p99_vs_raw_target": P99_VS_RAW_TARGET,
        "p99_vs_raw_target_met": p99_vs_raw is not None and p99_vs_raw <= P99_VS_RAW_TARGET,
        "convergence_rounds": len(samples),
        "convergence_p50_ms": round(percentile(samples, 0.5), 3),
        "convergence_p99_ms": round(percentile(samples, 0.99), 3),
        "subscribe_p50_ms": round(percentile(took, 0.5), 3),
        "subscribe_p99_ms": round(percentile(took, 0.99), 3),
        "forwards_per_publish": cut(forwarded / published, 3) if published else None,
        "forward_batches": stats["forward_batches"],
        "uninterested_forwards": idle_report["stats"]["received"],
        "traffic_log": config.traffic_dir is not None,
        "traffic_records": stats.get("traffic_records", 0),
        "traffic_dropped": stats.get("traffic_dropped", 0),
    }


def run(url: str | None = None, config: ClusterBenchConfig | None = None) -> dict[str, Any]:
    """Run every phase on ``url`` (checked first), or on a redis-server started for the
    run. Raises :class:`BenchSetupError` before any process starts for a URL that is
    malformed or does not answer."""
    config = config if config is not None else ClusterBenchConfig()
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(embedded_redis())
        else:
            check_redis(url)
        return asyncio.run(run_async(url, config))
