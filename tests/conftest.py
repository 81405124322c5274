"""Shared pytest fixtures: real Redis servers, one client per backend, a key namespace per test.

Tiers: the tests are laid out like the package (``tests/core``, ``tests/state``,
``tests/cluster``, ``tests/ops``, ``tests/cli``, ``tests/pipeline``, ``tests/system``)
and each test carries its folder's marker. On top, every test that needs a real
``redis-server`` carries ``redis`` (added here from the fixtures it uses, or marked by
hand where a test starts a server itself), and every test that needs Spark (a JDK)
carries ``spark``: ``pytest -m "not redis"`` runs with no server at all, ``pytest -m
core`` only the pure core. Helpers live in :mod:`tests.support`.

Servers (session scope, started lazily: only when a test asks for them, so pure-core tests
stay fast; a missing redis-server fails the tests loudly, it never skips them):

* ``redis_standalone_url``: a standalone ``redis-server``;
* ``redis_cluster_url``: one node of a 3-master Redis Cluster (no replicas);
* ``redis_server_factory``: starts throwaway servers for one test (e.g. to restart one).

Per test, for tests that break the cluster itself (fail over, kill a master, move slots):

* ``redis_cluster_with_replicas``: a Redis Cluster of 3 masters with a replica each and a
  1.5 s ``cluster-node-timeout`` (a dead master's replica takes over within seconds);
  stopped after the test, whatever it did to it;
* ``redis_cluster_factory``: starts such clusters with other settings (no replicas, a
  long node timeout...);
* ``redis_sentinels``: a master, a replica and three ``redis-sentinel`` processes
  (:mod:`tests.support.sentinels`); its ``url`` is a ``redis+sentinel://`` URL.

Per test (function scope):

* ``redis_backend``: ``"fake"``, ``"standalone"`` or ``"cluster"``. Tests that use
  ``redis_client`` run once per backend; narrow it with
  ``@pytest.mark.parametrize("redis_backend", ["cluster"], indirect=True)``.
* ``redis_client``: a redis.asyncio client for the backend (bytes responses):
  ``fakeredis.FakeAsyncRedis`` (Lua via lupa, a fresh FakeServer per test),
  ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``.
* ``redis_connect``: makes more clients for the same backend (same FakeServer on ``fake``),
  with extra keyword arguments such as ``socket_timeout``; they are closed after the test.
* ``keys``: :class:`router.state.keys.Keys` with a unique prefix; every key under it is deleted
  after a test that connected (``redis_client`` or ``redis_connect``); on a cluster each
  primary is scanned.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import fakeredis
import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from router.cluster.sessions import states as session_states
from router.state.connection import DEFAULT_POOL_SIZE, BoundedRedisCluster, pooled
from router.state.keys import Keys
from tests.support import cli as cli_support
from tests.support.sentinels import SentinelServers
from tests.support.servers import RedisClusterServers, RedisServer

# The session machine's shadow check raises at a disagreement with the lifecycle (here,
# and in the nodes the tests start in processes of their own): router.core.session_machine.
os.environ["ROUTER_SESSION_MACHINE_STRICT"] = "1"
session_states.strict = True


@pytest.fixture(autouse=True)
def _session_machine_agrees() -> Iterator[None]:
    """No test makes the session machine disagree with the lifecycle, even where the
    error it raises would be caught (a handoff logs what Redis refused, a dropped
    session's close is let go): the disagreements are counted too."""
    before = session_states.disagreements()
    yield
    assert session_states.disagreements() == before, "the session machine disagreed"


RedisClient = Redis | RedisCluster
Connect = Callable[..., Awaitable[RedisClient]]

BACKENDS = ("fake", "standalone", "cluster")

# ``start_node`` (tests/support/nodes.py) and the session-scoped ``spark`` fixture.
pytest_plugins = ("tests.support.nodes", "tests.support.spark", "tests.support.browser")

TESTS = Path(__file__).resolve().parent
TIERS = (
    *("core", "state", "cluster", "mqtt", "ops", "web", "cli", "pipeline", "system"),
    "integrations",
)
# Fixtures that start a redis-server (their users need one), and parameters that pick one.
SERVER_FIXTURES = frozenset(
    {
        "redis_standalone_server",
        "redis_cluster_servers",
        "redis_server_factory",
        "redis_cluster_factory",
        "redis_cluster_with_replicas",
        "redis_sentinels",
    }
)
SERVER_URL_FIXTURES = frozenset({"redis_standalone_url", "redis_cluster_url"})
SERVER_PARAMETERS = {
    "redis_backend": ("standalone", "cluster"),
    "redis_url": ("standalone", "cluster"),
}


def needs_redis_server(item: pytest.Item) -> bool:
    """True if the test starts (or reaches) a real redis-server through the fixtures."""
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(isinstance(v, str) and v in SERVER_URL_FIXTURES for v in params.values()):
        return True  # parametrized by the name of a URL fixture it then asks for
    return any(params.get(name) in values for name, values in SERVER_PARAMETERS.items())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (its folder), ``redis`` and ``spark`` where it needs them."""
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(tier)
        if needs_redis_server(item):
            item.add_marker("redis")
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker("spark")


@pytest.fixture(scope="session")
def redis_standalone_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_standalone_url(redis_standalone_server: RedisServer) -> str:
    """The URL of the session's standalone redis-server."""
    return redis_standalone_server.url


@pytest.fixture(scope="session")
def redis_cluster_servers() -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(redis_cluster_servers: RedisClusterServers) -> str:
    """The URL of one node of the session's 3-master Redis Cluster."""
    return redis_cluster_servers.url


#: The cluster-node-timeout of ``redis_cluster_with_replicas`` (ms): a replica starts its
#: election this long after its master stopped answering.
FAST_FAILOVER_NODE_TIMEOUT_MS = 1500


@pytest.fixture
def redis_cluster_factory() -> Iterator[Callable[..., RedisClusterServers]]:
    """Start Redis Clusters for this test only (keyword arguments: those of
    :class:`RedisClusterServers`: ``replicas``, ``node_timeout_ms``); all are stopped
    after it, whatever it did to them."""
    clusters: list[RedisClusterServers] = []

    def start(**options: Any) -> RedisClusterServers:
        cluster = RedisClusterServers(**options)
        clusters.append(cluster)
        cluster.start()
        return cluster

    try:
        yield start
    finally:
        for cluster in clusters:
            cluster.stop()


@pytest.fixture
def redis_cluster_with_replicas(
    redis_cluster_factory: Callable[..., RedisClusterServers],
) -> RedisClusterServers:
    """A cluster of this test's own: 3 masters, one replica each, fast automatic failover."""
    return redis_cluster_factory(replicas=1, node_timeout_ms=FAST_FAILOVER_NODE_TIMEOUT_MS)


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start throwaway standalone servers for this test only (keyword arguments: those of
    :class:`RedisServer`, e.g. ``aof=True``); all are stopped after it."""
    servers: list[RedisServer] = []

    def start(**options: Any) -> RedisServer:
        server = RedisServer(**options)
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(params=BACKENDS)
def redis_backend(request: pytest.FixtureRequest) -> str:
    """The backend a ``redis_client`` test runs against."""
    backend: str = request.param
    return backend


@pytest.fixture
def keys() -> Keys:
    """A key namespace of this test's own."""
    return Keys(prefix=f"t{uuid4().hex[:12]}")


@pytest.fixture(params=["standalone", "cluster"])
def redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of a real Redis: standalone, then the 3-master cluster (for CLI tests)."""
    url: str = request.getfixturevalue(f"redis_{request.param}_url")
    return url


@pytest.fixture
def prefix(redis_url: str, keys: Keys) -> Iterator[str]:
    """The test's key namespace on ``redis_url``; everything under it is deleted afterwards."""
    try:
        yield keys.prefix
    finally:
        cli_support.delete_namespace(redis_url, keys)


@pytest.fixture
async def redis_connect(
    request: pytest.FixtureRequest, redis_backend: str, keys: Keys
) -> AsyncIterator[Connect]:
    """A factory of clients for the current backend.

    After the test, every key under the test's ``keys`` prefix is deleted (through a fresh
    client, so a test may close or break its own) and every client is closed.
    """
    clients: list[RedisClient] = []
    fake_server = fakeredis.FakeServer() if redis_backend == "fake" else None
    # Resolve the (lazily started) server before the test body runs.
    url = None
    if redis_backend == "standalone":
        url = request.getfixturevalue("redis_standalone_url")
    elif redis_backend == "cluster":
        url = request.getfixturevalue("redis_cluster_url")

    async def connect(**options: Any) -> RedisClient:
        client: RedisClient
        if redis_backend == "fake":
            client = fakeredis.FakeAsyncRedis(server=fake_server, **options)
        elif redis_backend == "standalone":  # (pooled as open_redis pools a node's)
            client = Redis.from_pool(pooled(url, DEFAULT_POOL_SIZE, **options))
        else:
            client = BoundedRedisCluster.from_url(url, **options)
            await client.initialize()
        clients.append(client)
        return client

    try:
        yield connect
    finally:
        try:
            if clients:
                await delete_namespace(await connect(), keys)
        finally:
            for client in reversed(clients):
                await client.aclose()


@pytest.fixture
async def redis_client(redis_connect: Connect) -> RedisClient:
    """A client for the current backend (closed, and the test's keys deleted, afterwards)."""
    return await redis_connect()


async def delete_namespace(client: RedisClient, keys: Keys) -> int:
    """Delete every key under the namespace (scanning each primary of a cluster)."""
    pattern = keys.pattern()
    if isinstance(client, RedisCluster):
        scan = client.scan_iter(match=pattern, count=1000, target_nodes=RedisCluster.PRIMARIES)
    else:
        scan = client.scan_iter(match=pattern, count=1000)
    found = [key async for key in scan]
    for key in found:
        await client.delete(key)
    return len(found)


@pytest.fixture
def redis_sentinels() -> Iterator[SentinelServers]:
    """Redis behind Sentinel for this test only: a master, one replica, three
    ``redis-sentinel`` processes (``mymaster``, quorum 2, a master judged down after 1 s);
    ``.url`` is its ``redis+sentinel://`` URL. Stopped after the test, whatever it did."""
    servers = SentinelServers()
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()
