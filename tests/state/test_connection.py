"""Opening Redis from a URL: standalone or cluster, and the cluster's version floor."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from router.errors import RouterError, UnsupportedServerError
from router.state.connection import check_cluster_version, open_redis


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
