"""After a Redis Cluster failover, a channel's long polls hear its wake-ups again.

A wake-up listener is a plain connection to the master the client's slot map names for
the channel's slot (see :mod:`router.state.wakeups`). When that master is killed, the
map goes on naming it until something refreshes it; the listener read no key through
the cluster client, so nothing did: found by the Redis Cluster fault scenarios
(``tests/system/test_cluster_faults.py``), where a node's inbox went unread for half a
minute after its master's replica had taken over. The listener reads the map again.
"""

from __future__ import annotations

import asyncio
import contextlib

from redis.asyncio.cluster import RedisCluster

from router.errors import StateUnavailableError
from router.state.channels import Channel, FetchedMessage
from router.state.connection import open_redis
from router.state.keys import Keys
from tests.support.servers import RedisClusterServers
from tests.support.topology import admin, agreed_owner, owner, replica_of, slot_of
from tests.support.waiting import eventually, wait_until

FAILOVER = 30.0  # seconds for the replica to be promoted, at most


async def test_a_long_poll_hears_its_channel_again_after_the_master_failed_over(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys
) -> None:
    cluster = redis_cluster_with_replicas
    name = "box"
    slot = slot_of(keys.channel_clock(name))
    victim = owner(cluster, slot)
    heir = replica_of(cluster, victim)
    survivor = next(server for server in cluster.nodes if server not in (victim, heir))
    reader = await open_redis(cluster.url, socket_timeout=1, socket_connect_timeout=1)
    writer = await open_redis(survivor.node_url, socket_timeout=1, socket_connect_timeout=1)
    assert isinstance(reader, RedisCluster)
    channel, publisher = Channel(reader, name, 60.0, keys), Channel(writer, name, 60.0, keys)
    try:
        await channel.add_subscriber("r")
        assert (await channel.fetch("r", wait=0.05)).messages == ()  # its wake-ups are heard
        with admin(victim) as direct:
            direct.execute_command("WAIT", 1, 5000)  # the replica has the cursor
        assert victim.process is not None
        victim.process.kill()
        victim.process.wait()
        await asyncio.to_thread(
            wait_until, lambda: agreed_owner(cluster, slot) is heir, FAILOVER, "the promotion"
        )

        async def stored() -> bool:
            with contextlib.suppress(StateUnavailableError):
                await publisher.publish([("m1", b"after the failover")])
                return True
            return False

        await eventually(stored, 10.0, "a publish the new master took")
        got: list[FetchedMessage] = []

        async def polled() -> bool:  # as a channel's follower does: arm, fetch, wait
            with contextlib.suppress(StateUnavailableError):
                got.extend((await channel.fetch("r", wait=0.2)).messages)
            return bool(got)

        await eventually(polled, 10.0, "the message, read where the slot went")
        assert [message.content for message in got] == [b"after the failover"]
    finally:
        await channel.aclose()
        await publisher.aclose()
        await reader.aclose()
        await writer.aclose()
