"""Node figures in Redis: written with an expiry, read back for the live nodes only."""

from __future__ import annotations

import pytest

from router.errors import CorruptStateError, InvalidIdError
from router.state.keys import Keys
from router.state.node_figures import NodeFigures, NodeFigureStore
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient
from tests.support.waiting import eventually

real_redis = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

DEADLINE = 5.0
ONE = NodeFigures(3, 10, 20, 4, 60, "router 1.0")
TWO = NodeFigures(clients=1, messages_received=5, uptime=7, version="router 1.1")


@pytest.fixture
def store(redis_client: RedisClient, keys: Keys) -> NodeFigureStore:
    return NodeFigureStore(redis_client, keys)


@real_redis
async def test_written_figures_read_back_with_an_expiry(
    store: NodeFigureStore, redis_client: RedisClient, keys: Keys
) -> None:
    await store.write("n1", ONE, ttl=30.0)
    await store.write("n{2}", TWO, ttl=30.0)  # ids are escaped inside the tag
    assert await store.read(["n{2}", "n1", "gone"]) == {"n1": ONE, "n{2}": TWO}
    assert list(await store.read(["n{2}", "n1"])) == ["n1", "n{2}"]  # sorted by id
    assert 0 < await redis_client.pttl(keys.node_figures("n1")) <= 30_000
    assert await redis_client.hget(keys.node_figures("n1"), "uptime") == b"60"
    assert await store.read([]) == {}


@real_redis
async def test_figures_expire_and_a_rewrite_extends_them(store: NodeFigureStore) -> None:
    await store.write("n1", ONE, ttl=0.2)
    await store.write("n2", TWO, ttl=30.0)
    await eventually(lambda: _gone(store, "n1"), DEADLINE, "n1's figures to expire", poll=0.02)
    await store.write("n1", TWO, ttl=30.0)
    assert await store.read(["n1", "n2"]) == {"n1": TWO, "n2": TWO}


async def _gone(store: NodeFigureStore, node_id: str) -> bool:
    return node_id not in await store.read([node_id])


@real_redis
async def test_delete(store: NodeFigureStore) -> None:
    await store.write("n1", ONE, ttl=30.0)
    assert await store.delete("n1") is True
    assert await store.delete("n1") is False
    assert await store.read(["n1"]) == {}


@real_redis
async def test_only_live_nodes_count(
    store: NodeFigureStore, redis_client: RedisClient, keys: Keys
) -> None:
    registry = NodeRegistry(redis_client, keys, ttl=30.0)
    await registry.register("live", "inc-1")
    await registry.register("quiet", "inc-2")  # live, but writes no figures
    await registry.register("left", "inc-3")
    for node_id in ("live", "left", "unregistered"):
        await store.write(node_id, ONE, ttl=30.0)
    await registry.unregister("left")
    assert await store.live(registry) == {"live": ONE}


@real_redis
async def test_a_corrupt_hash_and_bad_arguments(
    store: NodeFigureStore, redis_client: RedisClient, keys: Keys
) -> None:
    await redis_client.hset(keys.node_figures("n1"), mapping={"clients": "many"})
    with pytest.raises(CorruptStateError, match="clients"):
        await store.read(["n1"])
    await redis_client.hset(keys.node_figures("n1"), mapping={"clients": "2", "future": "x"})
    assert await store.read(["n1"]) == {"n1": NodeFigures(clients=2)}  # missing: 0
    with pytest.raises(ValueError, match="ttl"):
        await store.write("n1", ONE, ttl=0)
    with pytest.raises(InvalidIdError):
        await store.write("", ONE, ttl=1.0)
    with pytest.raises(InvalidIdError):
        await store.read([""])


@pytest.mark.parametrize(
    "fields",
    [{"clients": -1}, {"uptime": 1.5}, {"messages_sent": True}, {"version": 3}],
    ids=["negative", "float", "bool", "version"],
)
def test_figures_check_themselves(fields: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        NodeFigures(**fields)  # type: ignore[arg-type]
