"""Redis behind Sentinel (real ``redis-sentinel`` processes): the client reaches the
master the sentinels name, its urgent client and pub/sub listeners too, and after
``SENTINEL FAILOVER`` every one of its connections leaves the old master for the new one
(before the sentinels make the old master a replica, seconds later); ``rediss+sentinel://``
speaks TLS to TLS-only sentinels and servers."""

from __future__ import annotations

from pathlib import Path
from uuid import uuid4

import pytest

from router.errors import StateUnavailableError
from router.ops.processes import free_port
from router.state.connection import open_redis, urgent_client
from router.state.sentinel import SentinelRedis
from router.state.wakeups import WakeUps
from tests.support.pki import make_pki
from tests.support.sentinels import SentinelServers, clients_of, role
from tests.support.servers import RedisServer
from tests.support.waiting import eventually

NAME = "router-sentinel-test"  # the client name of every connection the test opens


def ours(server: RedisServer) -> list[str]:
    """The last command of each connection this test opened on ``server``."""
    return [str(c["cmd"]) for c in clients_of(server) if c.get("name") == NAME]


async def test_every_connection_follows_the_master_through_a_failover(
    redis_sentinels: SentinelServers,
) -> None:
    old = redis_sentinels.master()
    assert old is not None
    client = await open_redis(redis_sentinels.url, socket_timeout=2, client_name=NAME)
    urgent = urgent_client(client)
    channel = f"t{uuid4().hex}"
    wakeups = WakeUps(client, channel)
    try:
        assert isinstance(client, SentinelRedis)
        await client.set(channel, b"before")
        await urgent.ping()
        await wakeups.arm()
        assert sorted(ours(old)) == ["ping", "set", "subscribe"]

        _, new, _ = redis_sentinels.fail_over()
        await eventually(lambda: client.sentinels.moves == 1, 10, "the move followed")
        assert role(old) == "master"  # (not yet made a replica: it still takes writes)
        assert ours(old) == []  # every connection left it: none writes there any more

        assert await client.get(channel) == b"before"  # (replicated before the failover)
        await client.set(channel, b"after")
        await urgent.ping()
        generation = await wakeups.arm()  # (the listener subscribes again, on the new master)
        await client.publish(channel, b"wake")
        assert await wakeups.wait(generation, 5)
        assert sorted(ours(new)) == ["ping", "publish", "subscribe"]
        assert ours(old) == []
    finally:
        await wakeups.aclose()
        await urgent.aclose()
        await client.aclose()


async def test_a_sentinel_url_without_a_sentinel_or_a_master_is_unavailable(
    redis_sentinels: SentinelServers,
) -> None:
    port = free_port()
    nobody = f"redis+sentinel://127.0.0.1:{port}/mymaster"
    with pytest.raises(StateUnavailableError, match=f"no sentinel \\(127.0.0.1:{port}\\) answ"):
        await open_redis(nobody, socket_connect_timeout=1)
    unknown = redis_sentinels.url.replace("/mymaster/", "/othermaster/")
    with pytest.raises(StateUnavailableError, match="a master 'othermaster' in good standing"):
        await open_redis(unknown, socket_connect_timeout=1)
    # One sentinel that answers among dead ones is enough.
    alive = redis_sentinels.sentinels[2].port
    some = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{alive}/mymaster"
    client = await open_redis(some, socket_connect_timeout=1)
    try:
        assert await client.ping()
    finally:
        await client.aclose()


@pytest.mark.redis  # (servers of its own, not from the fixtures)
async def test_rediss_sentinel_speaks_tls_to_the_sentinels_and_the_master(
    tmp_path: Path,
) -> None:
    servers = SentinelServers(tls=make_pki(tmp_path))
    try:
        servers.start()
        master = servers.master()
        assert master is not None
        url = servers.url
        assert url.startswith("rediss+sentinel://")
        client = await open_redis(url, socket_timeout=2, client_name=NAME)
        wakeups = WakeUps(client, "tls-wake")
        try:
            await client.set("tls", b"over TLS")
            generation = await wakeups.arm()
            await client.publish("tls-wake", b"wake")
            assert await wakeups.wait(generation, 5)
            assert sorted(ours(master)) == ["publish", "subscribe"]
        finally:
            await wakeups.aclose()
            await client.aclose()
        without_ca = url.partition("?")[0]
        with pytest.raises(StateUnavailableError, match="no sentinel"):
            await open_redis(without_ca, socket_connect_timeout=1)
    finally:
        servers.stop()
