"""A Django Channels worker killed with -9 leaves nothing behind (issue 41).

Before, the worker's node was gone but its client's owner, session and subscription
keys (its groups) stayed in Redis with no expiry, three keys more per crashed worker,
for good: the adoption skipped sessions of Session Expiry 0. A real worker process
(a layer in a process of its own) joins five groups and is killed; another worker's
node purges the dead one and removes its session's keys within the heartbeat TTL.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from router.integrations.channel_hub import process_of
from router.integrations.channels_layer import RouterChannelLayer
from router.state.keys import Keys
from tests.support.cli import delete_namespace
from tests.support.waiting import eventually

TTL = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
DEADLINE = 15.0
WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from router.integrations.channels_layer import RouterChannelLayer

    async def main():
        layer = RouterChannelLayer(sys.argv[1], prefix=sys.argv[2], **{ttl})
        channel = await layer.new_channel()
        for index in range(5):
            await layer.group_add(f"room-{{index}}", channel)
        print(channel, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
).format(ttl=TTL)


@pytest.fixture
def url(redis_standalone_url: str, keys: Keys) -> Iterator[str]:
    yield redis_standalone_url
    delete_namespace(redis_standalone_url, keys)


async def test_a_killed_worker_leaves_no_key_of_its_session(url: str, keys: Keys) -> None:
    redis_url, prefix = url, keys.prefix
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, redis_url, prefix],
        stdout=subprocess.PIPE,
        text=True,
    )
    survivor = RouterChannelLayer(redis_url, prefix=prefix, **TTL)
    redis = aioredis.Redis.from_url(redis_url)
    try:
        assert worker.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), DEADLINE)
        process = process_of(line.strip())
        assert process is not None, line
        held = keys.client_keys(f"channels-{process}")
        await survivor.group_add("room-0", await survivor.new_channel())  # (its node runs)
        assert await redis.exists(*held) == 3  # (subscriptions, owner, session)
        worker.kill()
        worker.wait(DEADLINE)

        async def gone() -> bool:
            return await redis.exists(*held) == 0

        await eventually(gone, DEADLINE, "the killed worker's keys to be removed")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(DEADLINE)
        if worker.stdout is not None:
            worker.stdout.close()
        await survivor.close()
        await redis.aclose()
