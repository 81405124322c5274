"""The raw hop of ``router bench cluster``: ``python -m router.bench.raw_hop``.

The latency phase's peer, measured in the same run at the same rate: the bench process
PUBLISHes the latency phase's messages (same rate, same size, same batches, see
:func:`router.bench.cluster.raw_publish`) to a channel of the same Redis, and this process,
subscribed to the channel, measures the time from the PUBLISH call to the message's
arrival. It is what carrying a message from one Python process to another through Redis
costs without the router, on that machine at that moment: the router's p99 is reported
beside it (``p99_vs_raw``).

It answers the commands of :mod:`router.bench.cluster_node` (``ready`` once subscribed,
``count``, ``report SENT``, ``stop``) and records every message under the prefix
:data:`RAW_PREFIX` with the same :class:`~router.bench.cluster_node.Recorder`, so the bench
drives and counts both alike (what arrived, what never did, what came twice).

Payload: :data:`~router.bench.cluster_node.STAMP` (intended send time, sequence number),
then :data:`SENT` (the time of the PUBLISH call), padded to the latency phase's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
from typing import Final

from redis.asyncio import Redis
from redis.asyncio.client import PubSub

from router.bench.cluster_node import STAMP, Recorder, commands, say
from router.errors import BenchSetupError
from router.ops.node_process import settle_collector
from router.state.connection import subscriber

SENT: Final = struct.Struct("!d")
"""After :data:`STAMP`: when the PUBLISH was called (``time.monotonic()``)."""
RAW_PREFIX: Final = "raw"
"""The prefix the raw hop's messages are counted under (``count``, ``report``)."""
SUBSCRIBE_TIMEOUT: Final = 10.0


def sent_at(payload: bytes) -> float:
    """The time of the PUBLISH call stamped in a raw hop payload."""
    sent: float = SENT.unpack_from(payload, STAMP.size)[0]
    return sent


async def subscribed(redis: Redis, channel: str) -> PubSub:
    """A PubSub subscribed to ``channel``, once Redis confirmed it (a message PUBLISHed
    after this returns reaches it); :class:`BenchSetupError` without a confirmation.
    Through :func:`~router.state.connection.subscriber`, as the nodes subscribe: the peer
    pays what the router pays per message, no more."""
    pubsub = subscriber(redis)
    await pubsub.subscribe(channel)
    try:
        async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
            while True:
                message = await pubsub.get_message(timeout=SUBSCRIBE_TIMEOUT)
                if message is not None and message["type"] == "subscribe":
                    return pubsub
    except TimeoutError:
        raise BenchSetupError(f"no confirmation of SUBSCRIBE {channel}") from None


async def consume(pubsub: PubSub, recorder: Recorder) -> None:
    async for message in pubsub.listen():
        if message["type"] == "message":
            payload = message["data"]
            recorder.record(RAW_PREFIX, payload, sent_at(payload))


async def serve(args: argparse.Namespace) -> None:
    redis = Redis.from_url(args.redis)
    recorder = Recorder()
    pubsub = await subscribed(redis, args.channel)
    settle_collector()  # as the node processes do
    consumer = asyncio.create_task(consume(pubsub, recorder))
    try:
        async for command, argument in commands():
            if command == "ready":
                say({"ready": True, "channel": args.channel})
            elif command == "count":
                say({"counts": recorder.counts()})
            elif command == "report":
                sent = json.loads(argument) if argument else {}
                say({"prefixes": recorder.report(sent)})
    finally:
        consumer.cancel()
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--channel", required=True)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
