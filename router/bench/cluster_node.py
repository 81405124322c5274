"""A node process for ``router bench cluster``: ``python -m router.bench.cluster_node``.

It starts a :class:`RouterNode`, optionally subscribes one client, then reads commands on
standard input, one per line, and answers each with one JSON line on standard output:

* ``ready``  -> ``{"ready": true}`` once the node runs (and its subscription is durable);
* ``report`` -> counters and, per topic prefix (the first level), how many deliveries
  arrived, the first and last arrival (``time.monotonic()``, which is one clock for all
  processes of a Linux machine) and latency percentiles from ``sent_at`` to arrival;
* ``stop``   -> leaves the cluster and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from typing import Any

from redis.asyncio import Redis

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.core.messages import Delivery
from router.ops.node_process import freeze_startup_heap


def _quantile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


class Recorder:
    """Arrival times and latencies per topic prefix."""

    def __init__(self) -> None:
        self.prefixes: dict[str, dict[str, Any]] = {}

    def record(self, delivery: Delivery) -> None:
        now = time.monotonic()
        prefix = delivery.topic.split("/", 1)[0]
        seen = self.prefixes.get(prefix)
        if seen is None:
            seen = self.prefixes[prefix] = {
                "count": 0,
                "first": now,
                "latencies": [],
                "from_schedule": [],
            }
        seen["count"] += 1
        seen["last"] = now
        # From the moment the router took the message (publish called) to the client...
        seen["latencies"].append(now - delivery.sent_at)
        # ... and from the send time the load generator intended (stamped in the payload).
        (due,) = struct.unpack_from("!d", delivery.payload)
        seen["from_schedule"].append(now - due)

    def report(self) -> dict[str, Any]:
        result = {}
        for prefix, seen in self.prefixes.items():
            latencies = sorted(seen["latencies"])
            scheduled = sorted(seen["from_schedule"])
            result[prefix] = {
                "count": seen["count"],
                "first": seen["first"],
                "last": seen["last"],
                "p50_ms": 1000 * _quantile(latencies, 0.5),
                "p99_ms": 1000 * _quantile(latencies, 0.99),
                "max_ms": 1000 * latencies[-1],
                "scheduled_p50_ms": 1000 * _quantile(scheduled, 0.5),
                "scheduled_p99_ms": 1000 * _quantile(scheduled, 0.99),
            }
        return result


async def consume(node: RouterNode, client_id: str, recorder: Recorder) -> None:
    async for delivery in node.messages(client_id):
        recorder.record(delivery)


def say(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    redis = Redis.from_url(args.redis)
    config = NodeConfig(args.node_id, prefix=args.prefix, queue_limit=1_000_000)
    node = RouterNode(redis, config)
    await node.start()
    freeze_startup_heap()  # as `router node run` does
    recorder = Recorder()
    consumer = None
    if args.subscribe:
        await node.subscribe("sink", args.subscribe)
        consumer = asyncio.create_task(consume(node, "sink", recorder))
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := (await reader.readline()).decode().strip():
            if line == "ready":
                say({"ready": True, "node_id": node.node_id})
            elif line == "report":
                say({"stats": node.stats(), "prefixes": recorder.report()})
            elif line == "stop":
                break
    finally:
        if consumer is not None:
            consumer.cancel()
        await node.stop()
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--subscribe", help="subscribe a client 'sink' to this filter")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
