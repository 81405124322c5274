"""A node process for ``router bench cluster``: ``python -m router.bench.cluster_node``.

It starts a :class:`RouterNode`, optionally subscribes one client, then reads commands on
standard input, one per line, and answers each with one JSON line on standard output:

* ``ready``  -> ``{"ready": true}`` once the node runs (and its subscription is durable);
* ``count``  -> ``{"counts": {prefix: distinct messages arrived}}`` (cheap, for polling);
* ``report SENT`` -> counters and, per topic prefix (the first level), what arrived, the
  first and last arrival (``time.monotonic()``, which is one clock for all processes of a
  Linux machine) and latency percentiles over what was sent; ``SENT`` is a JSON object
  ``{prefix: messages sent}`` (see :func:`latency_figures`);
* ``subscribe FILTER`` -> subscribes a client ``probe`` to FILTER on this node, answers
  ``{"returned": time.monotonic()}`` once ``subscribe`` returned (route convergence is
  measured from it by a node in another process);
* ``stop``   -> leaves the cluster and exits.

Every payload starts with :data:`STAMP`: the send time its generator intended and the
message's sequence number within its prefix, so that a repeat is told from a new message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from redis.asyncio import Redis

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.ops.node_process import settle_collector

STAMP: Final = struct.Struct("!dQ")
"""Payload head: intended send time (``time.monotonic()``) and sequence number."""


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def quantile_of_sent(ordered: list[float], sent: int, fraction: float) -> float | None:
    """The ``fraction`` quantile of ``sent`` latencies of which ``ordered`` (sorted) are
    the ones that arrived: the missing ``sent - len(ordered)`` count as never arriving
    (infinitely late, at the end), so a quantile that falls on one of them is None."""
    if sent <= 0:
        return None
    index = min(sent - 1, int(sent * fraction))
    return ordered[index] if index < len(ordered) else None


def latency_figures(latencies: list[float], sent: int, name: str = "") -> dict[str, Any]:
    """p50, p99 and max in milliseconds over ``sent`` messages, of which ``latencies``
    (seconds) arrived; None where the figure is a message that never arrived."""
    ordered = sorted(latencies)
    return {
        f"{name}p50_ms": _ms(quantile_of_sent(ordered, sent, 0.5)),
        f"{name}p99_ms": _ms(quantile_of_sent(ordered, sent, 0.99)),
        f"{name}max_ms": _ms(quantile_of_sent(ordered, sent, 1.0)),
    }


class Recorder:
    """Arrivals per topic prefix: which sequence numbers came (and how often), when, and
    their latencies (first arrivals only)."""

    def __init__(self) -> None:
        self.prefixes: dict[str, dict[str, Any]] = {}

    def record(self, topic: str, payload: bytes, sent_at: float) -> None:
        """A message on ``topic`` (counted under its first level) arrived now; ``sent_at``
        is when it was handed over (the router's publish call, the raw hop's PUBLISH);
        ``payload`` starts with :data:`STAMP`."""
        now = time.monotonic()
        prefix = topic.split("/", 1)[0]
        seen = self.prefixes.get(prefix)
        if seen is None:
            seen = self.prefixes[prefix] = {
                "seqs": set(),
                "duplicates": 0,
                "first": now,
                "last": now,
                "latencies": [],
                "from_schedule": [],
            }
        due, seq = STAMP.unpack_from(payload)
        if seq in seen["seqs"]:
            seen["duplicates"] += 1
            return
        seen["seqs"].add(seq)
        seen["last"] = now
        # From the moment the router took the message (publish called) to the client...
        seen["latencies"].append(now - sent_at)
        # ... and from the send time the load generator intended (stamped in the payload).
        seen["from_schedule"].append(now - due)

    def counts(self) -> dict[str, int]:
        return {prefix: len(seen["seqs"]) for prefix, seen in self.prefixes.items()}

    def report(self, sent: dict[str, int]) -> dict[str, Any]:
        """Per prefix in ``sent`` (or that arrived): ``count`` (distinct messages),
        ``lost`` (sent, never arrived), ``duplicates``, ``first``/``last`` arrival (None
        if none), latency figures over what was sent."""
        result = {}
        for prefix in {*sent, *self.prefixes}:
            seen = self.prefixes.get(prefix)
            count = len(seen["seqs"]) if seen else 0
            expected = sent.get(prefix, count)
            result[prefix] = {
                "count": count,
                "lost": max(0, expected - count),
                "duplicates": seen["duplicates"] if seen else 0,
                "first": seen["first"] if seen else None,
                "last": seen["last"] if seen else None,
                **latency_figures(seen["latencies"] if seen else [], expected),
                **latency_figures(seen["from_schedule"] if seen else [], expected, "scheduled_"),
            }
        return result


async def consume(node: RouterNode, client_id: str, recorder: Recorder) -> None:
    async for delivery in node.messages(client_id):
        recorder.record(delivery.topic, delivery.payload, delivery.sent_at)


def say(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


async def commands() -> AsyncIterator[tuple[str, str]]:
    """The lines on standard input as (command, argument), until ``stop`` or its end."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        command, _, argument = line.partition(" ")
        if command == "stop":
            return
        yield command, argument


async def serve(args: argparse.Namespace) -> None:
    redis = Redis.from_url(args.redis)
    config = NodeConfig(args.node_id, prefix=args.prefix, queue_limit=1_000_000)
    node = RouterNode(redis, config)
    await node.start()
    settle_collector()  # as `router node run` does
    recorder = Recorder()
    consumer = None
    if args.subscribe:
        await node.subscribe("sink", args.subscribe)
        consumer = asyncio.create_task(consume(node, "sink", recorder))
    try:
        async for command, argument in commands():
            if command == "ready":
                say({"ready": True, "node_id": node.node_id})
            elif command == "count":
                say({"counts": recorder.counts()})
            elif command == "report":
                sent = json.loads(argument) if argument else {}
                say({"stats": node.stats(), "prefixes": recorder.report(sent)})
            elif command == "subscribe":
                called = time.monotonic()
                await node.subscribe("probe", argument)
                returned = time.monotonic()
                say({"returned": returned, "took": returned - called})
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
