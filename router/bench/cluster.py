"""``router bench cluster``: nodes in separate processes, beside raw pipelined PUBLISH.

Layout of one run (all on loopback, one Redis):

* node ``bench-a`` in this process publishes;
* node ``bench-b`` (a child process) has one client subscribed to ``#`` below the bench
  topics, so every publish must cross from A to B;
* node ``bench-c`` (a child process) subscribes nothing: it must receive nothing.

Phases:

1. *yardstick*: redis-py pipelined PUBLISH of the same 256-byte payloads, same batch size;
2. *throughput*: A publishes as fast as it can with many publishes in flight; the rate is
   messages over the time from the first publish to B's last arrival;
3. *latency*: A offers 5,000 messages/s for a few seconds (what fell due in each
   millisecond is published together); B measures the time from the publish call to the
   client (``p50/p99_latency_ms``) and, stricter, from the send time the generator
   intended (``..._from_schedule_ms``: adds the generator's own scheduling lag, about a
   millisecond of asyncio timer granularity);
4. *convergence*: two more nodes in this process; a subscribe returns on one, then the
   time until the other's route mirror routes the topic to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import subprocess
import sys
import time
import uuid
from typing import Any

from redis.asyncio import Redis

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.messages import Outgoing
from router.core.topics import validate_topic
from router.ops.embedded_redis import embedded_redis
from router.ops.node_process import freeze_startup_heap

PAYLOAD = b"x" * 256
BATCH = 256  # commands per pipeline round trip, and messages per publish_many call


class Worker:
    """A ``router.bench.cluster_node`` child process, driven by lines on its stdin."""

    def __init__(self, redis_url: str, prefix: str, node_id: str, subscribe: str | None) -> None:
        args = [
            sys.executable,
            "-m",
            "router.bench.cluster_node",
            "--redis",
            redis_url,
            "--prefix",
            prefix,
            "--node-id",
            node_id,
        ]
        if subscribe:
            args += ["--subscribe", subscribe]
        self.process = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

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


async def wait_for_count(worker: Worker, prefix: str, count: int, timeout: float) -> dict[str, Any]:
    """Poll the worker's report until ``count`` deliveries under ``prefix`` arrived."""
    deadline = time.monotonic() + timeout
    while True:
        report = await asyncio.to_thread(worker.ask, "report")
        seen = report["prefixes"].get(prefix, {"count": 0})
        if seen["count"] >= count or time.monotonic() > deadline:
            return report
        await asyncio.sleep(0.05)


async def throughput(node: RouterNode, count: int, batch: int, in_flight: int) -> float:
    """Publish ``count`` messages in ``publish_many`` batches of ``batch``, with up to
    ``in_flight`` batches awaiting at once; returns the start time."""
    limit = asyncio.Semaphore(in_flight)

    async def one(offset: int) -> None:
        try:
            await node.publish_many(
                [
                    Outgoing(f"tp/{i % 100}", stamped(time.monotonic()))
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


def stamped(due: float) -> bytes:
    """A payload that carries its intended send time (``time.monotonic()``), padded."""
    return struct.pack("!d", due) + PAYLOAD[8:]


async def offered_load(node: RouterNode, rate: float, seconds: float) -> int:
    """Offer ``rate`` messages/s for ``seconds``; returns how many were published.

    Every millisecond, the messages that fell due are published together. Each payload
    carries its *intended* send time and latency is measured from it, so a publisher
    that falls behind shows up in the figures (no coordinated omission).
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
            batch = [
                Outgoing(f"lat/{i % 100}", stamped(start + i / rate))
                for i in range(sent, due_count)
            ]
            tasks.append(loop.create_task(node.publish_many(batch)))
            sent = due_count
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    return total


async def convergence(url: str, prefix: str, rounds: int) -> list[float]:
    """Milliseconds from ``subscribe`` returning on one node to routable on another."""
    clients = [Redis.from_url(url), Redis.from_url(url)]
    first = RouterNode(clients[0], NodeConfig("bench-conv-1", prefix=prefix))
    second = RouterNode(clients[1], NodeConfig("bench-conv-2", prefix=prefix))
    samples = []
    try:
        await first.start()
        await second.start()
        loop = asyncio.get_running_loop()
        for index in range(rounds):
            topic = validate_topic(f"conv/{index}")
            await first.subscribe("watcher", topic)
            returned = loop.time()
            while "bench-conv-1" not in second.mirror.match(topic).nodes:
                await asyncio.sleep(0)
            samples.append(1000 * (loop.time() - returned))
    finally:
        await first.stop()
        await second.stop()
        for client in clients:
            await client.aclose()
    return samples


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def run_async(
    url: str,
    messages: int,
    latency_seconds: float,
    rate: float,
    convergence_rounds: int,
    traffic_dir: str | None = None,
) -> dict[str, Any]:
    """Every phase on the Redis at ``url``; the object ``--json`` prints. With
    ``traffic_dir``, node A writes a traffic log there (every publish)."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    raw = max([await raw_publish_rate(url, messages, BATCH) for _ in range(2)])
    interested = Worker(url, prefix, "bench-b", "#")
    idle = Worker(url, prefix, "bench-c", None)
    redis = Redis.from_url(url)
    node = RouterNode(redis, NodeConfig("bench-a", prefix=prefix, traffic_dir=traffic_dir))
    try:
        await asyncio.to_thread(interested.ask, "ready")
        await asyncio.to_thread(idle.ask, "ready")
        await node.start()
        freeze_startup_heap()  # as `router node run` does
        while "bench-b" not in node.mirror.match(validate_topic("tp/0")).nodes:
            await asyncio.sleep(0.01)
        start = await throughput(node, messages, batch=BATCH, in_flight=4)
        report = await wait_for_count(interested, "tp", messages, timeout=120)
        tp = report["prefixes"]["tp"]
        forwarded, published = node.stats()["forwarded"], node.stats()["published"]
        sent = await offered_load(node, rate, latency_seconds)
        report = await wait_for_count(interested, "lat", sent, timeout=60)
        lat = report["prefixes"]["lat"]
        idle_report = await asyncio.to_thread(idle.ask, "report")
    finally:
        await node.stop()
        await redis.aclose()
        interested.stop()
        idle.stop()
    samples = await convergence(url, prefix, convergence_rounds)
    cross = tp["count"] / (tp["last"] - start)
    return {
        "messages": messages,
        "payload_bytes": len(PAYLOAD),
        "cross_node_msgs_per_s": round(cross),
        "raw_publish_per_s": round(raw),
        "throughput_ratio": round(cross / raw, 2),
        "delivered": tp["count"],
        "offered_rate": rate,
        "latency_messages": lat["count"],
        "p50_latency_ms": round(lat["p50_ms"], 3),
        "p99_latency_ms": round(lat["p99_ms"], 3),
        "max_latency_ms": round(lat["max_ms"], 3),
        "p50_latency_from_schedule_ms": round(lat["scheduled_p50_ms"], 3),
        "p99_latency_from_schedule_ms": round(lat["scheduled_p99_ms"], 3),
        "convergence_p50_ms": round(percentile(samples, 0.5), 3),
        "convergence_p99_ms": round(percentile(samples, 0.99), 3),
        "forwards_per_publish": round(forwarded / published, 3),
        "forward_batches": node.stats()["forward_batches"],
        "uninterested_forwards": idle_report["stats"]["received"],
        "traffic_log": traffic_dir is not None,
        "traffic_records": node.stats().get("traffic_records", 0),
        "traffic_dropped": node.stats().get("traffic_dropped", 0),
    }


def run(
    url: str | None = None,
    messages: int = 20_000,
    latency_seconds: float = 3.0,
    rate: float = 5000.0,
    convergence_rounds: int = 200,
    *,
    traffic_dir: str | None = None,
) -> dict[str, Any]:
    """Run every phase on ``url``, or on a redis-server started for the run."""
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(embedded_redis())
        return asyncio.run(
            run_async(url, messages, latency_seconds, rate, convergence_rounds, traffic_dir)
        )
