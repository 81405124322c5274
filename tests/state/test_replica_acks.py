"""Writes that wait for replicas (``redis_replicas``, router.state.turn_batch): against a
real master and replica, a write the replica does not acknowledge in time fails instead
of being acknowledged, and an MQTT publish it carries gets no PUBACK."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from uuid import uuid4

import pytest
from redis.asyncio.cluster import RedisCluster

import router
from router.cluster.node import RouterNode
from router.errors import InvalidSettingError, StateUnavailableError
from router.mqtt.codec import encode
from router.mqtt.packets import MQTT_5, PubAck, Publish
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from router.state.connection import require_replicas
from tests.support.raw_mqtt import RawClient
from tests.support.servers import RedisServer, replica_in_sync, stopped
from tests.support.waiting import wait_until

TIMEOUT = 1.0  # (redis_timeout: a replica has half of it to acknowledge)
WAIT = 10.0


@pytest.fixture
def master_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    master = RedisServer()
    master.start()
    replica = RedisServer(replica_of=master.port)
    try:
        replica.start()
        wait_until(lambda: replica_in_sync(replica.url), WAIT, "the replica in sync")
        yield master, replica
    finally:
        replica.stop()
        master.stop()


def replicated_node(master: RedisServer) -> AbstractAsyncContextManager[RouterNode]:
    """A node on ``master`` whose every write waits for one replica."""
    return router.connect(
        master.url,
        node_id="a",
        prefix=f"t{uuid4().hex[:8]}",
        redis_timeout=TIMEOUT,
        redis_replicas=1,
    )


async def test_a_write_no_replica_acknowledged_fails_and_one_it_did_succeeds(
    master_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = master_and_replica
    async with replicated_node(master) as node:
        await node.publish("kept/x", b"replicated", retain=True)
        with stopped(replica), pytest.raises(StateUnavailableError, match="replicas required"):
            await node.publish("kept/y", b"not replicated", retain=True)
        await node.publish("kept/z", b"replicated again", retain=True)
        assert node.stats()["redis_replicas_behind"] >= 1  # (counted, not silent)


async def test_an_mqtt_publish_no_replica_acknowledged_gets_no_puback(
    master_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    """The publisher is not told the message is safe: its connection ends (a 5.0 client
    gets DISCONNECT), and it sends the message again when it is back."""
    master, replica = master_and_replica
    async with replicated_node(master) as node:
        settings = MqttSettings(sys_interval=0)
        async with serve(node, ["127.0.0.1:0"], settings) as server:
            port = server.addresses[0][1]
            client = await RawClient.connect(port, "pub", clean_start=True, expiry=0)
            try:
                first = Publish("kept/a", b"x", 1, retain=True, packet_id=1)
                client.writer.write(encode(first, MQTT_5))
                [ack] = await client.next(PubAck, 1)
                assert (
                    isinstance(ack, PubAck) and ack.reason_code < 0x80
                )  # (0x10: nobody subscribed)
                with stopped(replica):
                    client.writer.write(
                        encode(Publish("kept/b", b"y", 1, retain=True, packet_id=2), MQTT_5)
                    )
                    await client.closed()
                assert not any(type(answer) is PubAck for answer in client.pending)
            finally:
                client.drop()


def test_a_redis_cluster_client_is_refused() -> None:
    cluster = RedisCluster(host="127.0.0.1", port=1)  # (not connected: nothing is sent)
    with pytest.raises(InvalidSettingError, match="not a Redis Cluster"):
        require_replicas(cluster, 1, 0.5)
