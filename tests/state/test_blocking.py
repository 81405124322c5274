"""The blocking clients (router.state.blocking) against real servers: the fitting client for
each, and no socket left open once it is closed."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
import redis

from router.state.blocking import BlockingRedisCluster, BlockingSentinelRedis, blocking_client
from tests.support.sentinels import SentinelServers


def open_sockets() -> set[str]:
    """The sockets this process holds open (their /proc links, ``socket:[inode]``)."""
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # (the listing's own descriptor, closed by now)
            continue
        if link.startswith("socket:"):
            links.add(link)
    return links


@pytest.fixture
def no_collection() -> Iterator[None]:
    """The garbage collector off: a socket dropped unclosed stays open until asked for."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.usefixtures("no_collection")
@pytest.mark.parametrize(
    ("url_fixture", "kind"),
    [("redis_standalone_url", redis.Redis), ("redis_cluster_url", BlockingRedisCluster)],
)
def test_a_closed_blocking_client_leaves_no_socket_open(
    request: pytest.FixtureRequest, url_fixture: str, kind: type
) -> None:
    url: str = request.getfixturevalue(url_fixture)
    before = open_sockets()
    client = blocking_client(url)
    assert isinstance(client, kind)
    client.set("blocking:{t}:probe", "1", ex=5)
    assert client.get("blocking:{t}:probe") == b"1"
    client.close()
    assert open_sockets() - before == set()


@pytest.mark.usefixtures("no_collection")
def test_a_blocking_client_behind_sentinel_reaches_the_master_and_closes_everything(
    redis_sentinels: SentinelServers,
) -> None:
    master = redis_sentinels.master()
    assert master is not None
    before = open_sockets()
    client = blocking_client(redis_sentinels.url)
    assert isinstance(client, BlockingSentinelRedis)
    client.set("blocking:{t}:probe", "1", ex=5)
    assert client.get("blocking:{t}:probe") == b"1"
    assert client.connection_pool.get_master_address() == ("127.0.0.1", master.port)
    client.close()
    assert open_sockets() - before == set()
