"""Opening Redis from a URL: standalone or cluster, and the cluster's version floor."""

from __future__ import annotations

import logging
from pathlib import Path
from uuid import uuid4

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

import router
from router.errors import RouterError, UnsupportedServerError
from router.state.connection import check_cluster_version, open_redis, pubsub_client, subscriber


@pytest.mark.parametrize("version", ["7.0.0", "7.0.15", "7.2.4", "8.0.1", "255.255.255"])
def test_clusters_from_redis_7_are_accepted(version: str) -> None:
    check_cluster_version(version)


@pytest.mark.parametrize("version", ["", "unknown", "7", "x.y.z"])
def test_a_version_that_does_not_parse_is_not_judged(version: str) -> None:
    check_cluster_version(version)


@pytest.mark.parametrize("version", ["6.2.14", "6.0.0", "5.0.7"])
def test_clusters_older_than_7_are_refused(version: str) -> None:
    with pytest.raises(UnsupportedServerError, match=f"runs {version}") as raised:
        check_cluster_version(version)
    assert isinstance(raised.value, RouterError)
    assert "Redis 7.0 or later" in str(raised.value)


async def test_open_redis_tells_a_cluster_from_a_standalone_server(
    redis_standalone_url: str, redis_cluster_url: str
) -> None:
    standalone = await open_redis(redis_standalone_url)
    cluster = await open_redis(redis_cluster_url)
    try:
        assert type(standalone) is Redis
        assert isinstance(cluster, RedisCluster)
        assert len(cluster.get_primaries()) == 3
    finally:
        await standalone.aclose()
        await cluster.aclose()


async def test_a_subscriber_does_not_format_each_message_for_a_debug_log(
    redis_standalone_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # redis-py 8's own pub/sub handler built "Push response: <the whole message>" for
    # every message (whatever the log level; here at DEBUG, so that it shows).
    redis = await open_redis(redis_standalone_url)
    client = pubsub_client(redis)
    pubsub = subscriber(client)
    channel = f"t{uuid4().hex}"
    try:
        await pubsub.subscribe(channel)
        with caplog.at_level(logging.DEBUG, logger="push_response"):
            await redis.publish(channel, b"x" * 1000)
            messages = []
            for _ in range(20):
                message = await pubsub.get_message(timeout=1.0)
                if message is not None and message["type"] == "message":
                    messages.append(message["data"])
                    break
        assert messages == [b"x" * 1000]
        assert not [record for record in caplog.records if record.name == "push_response"]
    finally:
        await pubsub.aclose()
        await client.aclose()
        await redis.aclose()


def test_every_subscription_of_the_package_goes_through_subscriber() -> None:
    package = Path(router.__file__).parent
    bypassing = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if ".pubsub(" in path.read_text() and path.name != "connection.py"
    ]
    assert bypassing == []
