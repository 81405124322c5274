"""An inbox whose Redis Cluster slot is being migrated: copies wait, nothing fails.

While a slot is split between two masters (some keys moved, some not), Redis answers
every script on that channel TRYAGAIN; redis-py retries for about half a second, then
raises ``ClusterError("TTL exhausted.")``. Found by the Redis Cluster fault scenarios
(``tests/system/test_cluster_faults.py``): the inbox reader took that for a failure (its
task restarted until the node withheld its heartbeat and was purged, with its routes),
and a forward gave up at once, so a migration of a few seconds lost messages. Both wait
it out now, as they wait out a Redis they cannot reach, and count it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio.cluster import RedisCluster

from router.cluster.forwarding import Forwarder, InboxReader
from router.cluster.inbox import Forward, Notice
from router.cluster.tasks import stop_task
from router.core.messages import Message
from router.state.connection import open_redis
from router.state.keys import Keys
from tests.support.servers import RedisClusterServers
from tests.support.topology import Migration, masters, owner, redirects, slot_of
from tests.support.waiting import eventually

EXPIRE = 60.0
GAVE_UP = 3 * 16  # TRYAGAIN replies: redis-py gave up (16 tries a call) at least twice


@pytest.fixture
async def cluster_client(
    redis_cluster_factory: Callable[..., RedisClusterServers],
) -> AsyncIterator[tuple[RedisCluster, RedisClusterServers]]:
    cluster = redis_cluster_factory()
    client = await open_redis(cluster.url, socket_timeout=1, socket_connect_timeout=1)
    assert isinstance(client, RedisCluster)
    try:
        yield client, cluster
    finally:
        await client.aclose()


async def test_an_inbox_split_by_a_migration_is_waited_out_by_its_reader_and_writers(
    cluster_client: tuple[RedisCluster, RedisClusterServers], keys: Keys
) -> None:
    client, cluster = cluster_client
    got: list[Forward] = []

    async def dispatch(forwards: list[Forward]) -> None:
        got.extend(forwards)

    async def on_notice(notice: Notice) -> None:
        raise AssertionError(f"no notice was sent: {notice}")

    forwarder = Forwarder(client, keys, EXPIRE)
    reader = InboxReader(client, keys, "n1", EXPIRE, dispatch, on_notice, poll=0.1)
    await reader.open()
    reading = asyncio.create_task(reader.run())
    try:
        await forwarder.send("n1", [Forward(Message(b"\x01" * 16, "t", b"before"))])
        await eventually(lambda: len(got) == 1, 10.0, "the copy before the migration")

        slot = slot_of(keys.channel_clock(keys.inbox("n1")))
        source = owner(cluster, slot)
        migration = Migration(cluster, slot, next(m for m in masters(cluster) if m is not source))
        assert migration.begin() >= 3  # clock, epoch, cursor, bodies, dedup ids
        migration.move(limit=1)  # split: whatever the scripts touch, some key is elsewhere
        tried = redirects(cluster)["TRYAGAIN"]
        sent = forwarder.send("n1", [Forward(Message(b"\x02" * 16, "t", b"during"))])
        await eventually(
            lambda: (
                reading.done() or sent.done() or redirects(cluster)["TRYAGAIN"] >= tried + GAVE_UP
            ),
            10.0,
            "redis-py giving up on TRYAGAIN, more than once",
            poll=0.1,
        )
        assert not reading.done(), "the inbox reader gave up"
        assert not sent.done(), "the forward gave up"
        await asyncio.to_thread(migration.finish)

        await asyncio.wait_for(sent, 10.0)
        await eventually(lambda: len(got) == 2, 10.0, "the copy sent during the migration")
        assert [forward.message.payload for forward in got] == [b"before", b"during"]
        assert reader.stats()["inbox_waits"] > 0
        assert forwarder.stats()["forward_retries"] > 0
    finally:
        await stop_task(reading)
        await reader.stop()
        await forwarder.stop()
