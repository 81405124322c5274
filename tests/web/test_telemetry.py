"""Node telemetry on real Redis and the 3-master cluster: a node samples its figures while
MQTT clients publish, the cluster's rows and overview add up the live nodes, a restarted
node's history gives no negative rate, and Redis trouble does not stop the sampling."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.cluster.tasks import stop_task
from router.mqtt.encoder import encode
from router.mqtt.packets import MQTT_5, Publish
from router.mqtt.server import MqttServer, serve
from router.mqtt.settings import MqttSettings
from router.ops.nodes_view import cluster_nodes, cluster_overview
from router.ops.telemetry import DROPPED, Telemetry
from router.state.keys import Keys
from router.state.node_history import NodeHistoryStore, TrafficSample
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient
from tests.support.nodes import StartNode, die, take
from tests.support.raw_mqtt import RawClient
from tests.support.waiting import eventually

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

INTERVAL = 0.1
DEADLINE = 10.0
ROW_FIELDS = {
    "node_id",
    "alive",
    "listeners",
    "uptime_s",
    "version",
    "connections",
    "rss_kib",
    "cpu_percent",
    "loop_lag_ms",
    "redis_latency_ms",
    "heartbeat_age_ms",
    "routes",
    "auth",
    "down_since_ms",
    "reload",
    "retired",
}


@pytest.fixture
async def mqtt_node(start_node: StartNode) -> AsyncIterator[MqttServer]:
    node = await start_node("a")
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        yield server


def listeners_of(server: MqttServer) -> list[str]:
    return [f"{scheme}://{host}:{port}" for scheme, host, port in server.listeners]


async def stored(redis: RedisClient, keys: Keys, node_id: str) -> list[TrafficSample]:
    return (await NodeHistoryStore(redis, keys).read([node_id]))[node_id].history


def no_negative(overview: dict[str, Any]) -> bool:
    history = overview["history"]
    values = [*overview["rates"].values(), *history["in"], *history["out"], *history["dropped"]]
    return min(values, default=0.0) >= 0


async def test_a_node_samples_what_its_clients_publish(
    mqtt_node: MqttServer, redis_client: RedisClient, keys: Keys
) -> None:
    node, port = mqtt_node.node, mqtt_node.addresses[0][1]
    listeners = [*listeners_of(mqtt_node), "http://127.0.0.1:8080"]
    async with Telemetry(node, mqtt_node, listeners, interval=INTERVAL, keep=50) as telemetry:
        subscriber = await RawClient.connect(port, "sub", clean_start=True, expiry=600)
        publisher = await RawClient.connect(port, "pub", clean_start=True, expiry=0)
        try:
            await subscriber.subscribe("news", 0)
            for _ in range(50):
                publisher.writer.write(encode(Publish("news", b"x", 0), MQTT_5))
            await subscriber.take(50)

            async def counted() -> bool:
                history = await stored(redis_client, keys, "a")
                return bool(history) and history[-1].messages_out == 50

            await eventually(counted, DEADLINE, "50 messages in and out in the stored history")
            history = await stored(redis_client, keys, "a")
            assert (history[0].messages_in, history[-1].messages_in) == (0, 50)
            assert [s.t for s in history] == sorted(s.t for s in history)
            assert 2 <= len(history) <= 50
            assert set(history) <= set(telemetry.history)  # (the same samples, in memory)
            assert set(DROPPED) <= set(node.stats()) | set(mqtt_node.stats())
            overview = await cluster_overview(redis_client, keys, retained_count=7)
            moved = overview["history"]
            assert max(moved["in"]) > 0 and max(moved["out"]) > 0
            assert moved["interval_s"] == INTERVAL
            assert moved["t"] == sorted(moved["t"]) and len(moved["t"]) == len(moved["in"])
            assert no_negative(overview)
            assert overview["nodes"] == {"alive": 1, "total": 1, "down": [], "retired": []}
            assert overview["retained"] == 7
            assert (overview["connections"], overview["subscriptions"], overview["routes"]) == (
                2,
                1,
                1,
            )

            subscriber.drop()  # its persistent session stays, away

            async def away() -> bool:
                latest = telemetry.latest
                return latest is not None and (latest.connections, latest.sessions) == (1, 2)

            await eventually(away, DEADLINE, lambda: telemetry.latest)
            [row] = await cluster_nodes(redis_client, keys)
        finally:
            publisher.drop()
    assert set(row) == ROW_FIELDS
    assert row["node_id"] == "a" and row["alive"] is True and row["routes"] == 1
    assert row["reload"] == {  # (an embedded node: nothing reloaded, nothing told)
        "reloads": 0,
        "failures": 0,
        "last_ms": None,
        "error": None,
        "loaded": None,
    }
    assert row["listeners"] == listeners and row["version"].startswith("router ")
    assert row["uptime_s"] >= 0 and row["rss_kib"] > 1024 and row["cpu_percent"] >= 0
    assert row["loop_lag_ms"] >= 0 and row["redis_latency_ms"] is not None
    assert 0 <= row["heartbeat_age_ms"] <= 1000  # (start_node's heartbeat TTL is 1 s)
    assert await stored(redis_client, keys, "a") == []  # stopping deleted its keys
    assert await redis_client.exists(keys.node_telemetry("a")) == 0


async def test_the_cluster_adds_up_its_live_nodes(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    a, b, quiet = await start_node("a"), await start_node("b"), await start_node("quiet")
    await b.subscribe("phone", "news")
    await eventually(lambda: "b" in a.mirror.match("news").nodes, DEADLINE, "a routes to b")
    http = ["http://127.0.0.1:1"]
    async with (
        Telemetry(a, None, http, interval=INTERVAL) as at_a,
        Telemetry(b, None, http, interval=2 * INTERVAL) as at_b,
    ):
        sent = 0

        async def both_move() -> bool:
            nonlocal sent
            await a.publish("news", b"x")  # one more message each poll
            sent += 1
            overview = await cluster_overview(redis_client, keys, 0)
            history = overview["history"]
            merged = any(
                i > 0 and o > 0 for i, o in zip(history["in"], history["out"], strict=True)
            )
            rates = overview["rates"]
            return merged and rates["in"] > 0 and rates["out"] > 0

        await eventually(both_move, DEADLINE, "in (at a) and out (at b) in one history")
        await take(b, "phone", sent)
        overview = await cluster_overview(redis_client, keys, 0)
        assert overview["history"]["interval_s"] == 2 * INTERVAL  # the coarser grid
        assert overview["nodes"] == {"alive": 3, "total": 3, "down": [], "retired": []}
        assert (overview["subscriptions"], overview["routes"]) == (1, 1)
        assert no_negative(overview)
        assert at_a.rates() is not None and at_b.rates() is not None
        counts = {node_id: a.mirror.route_count(node_id) for node_id in a.mirror.nodes()}
        found = await cluster_nodes(redis_client, keys, counts)
        rows = {row["node_id"]: row for row in found}
        assert list(rows) == ["a", "b", "quiet"]
        assert rows["a"]["listeners"] == http and rows["b"]["routes"] == 1
        quiet_row = rows["quiet"]  # alive, without an HTTP listener: figures unknown
        assert (quiet_row["alive"], quiet_row["routes"]) == (True, 0)
        assert quiet_row["listeners"] is quiet_row["connections"] is quiet_row["uptime_s"] is None
        assert quiet_row["heartbeat_age_ms"] >= 0
        await quiet.stop()
        await a.stop()  # (stops routing to b; a's telemetry stays until its hash expires)

        async def a_left() -> bool:
            overview = await cluster_overview(redis_client, keys, 0)
            alone = {"alive": 1, "total": 1, "down": [], "retired": []}
            return overview["nodes"] == alone and overview["rates"]["in"] == 0

        await eventually(a_left, DEADLINE, "a's figures to leave the sums")


async def test_a_dead_node_stays_listed_after_its_purge_and_its_past_traffic_stays(
    start_node: StartNode, redis_connect: Any, redis_client: RedisClient, keys: Keys
) -> None:
    """Before, a killed node left the overview's count and the node list at its purge
    (about its heartbeat TTL after the kill: "Nodes alive 1 / 1"), and the last hour's
    chart dropped its traffic, rewriting the past. Now it stays, down since the event
    that told it, and its history stays in the merged one."""
    config = NodeConfig("a", prefix=keys.prefix, heartbeat_interval=0.2, heartbeat_ttl=1.0)
    doomed = RouterNode(await redis_connect(), config)
    await doomed.start()
    b = await start_node("b")
    sampling = Telemetry(doomed, None, [], interval=INTERVAL)
    sampling.start()
    await eventually(lambda: sampling.latest is not None, DEADLINE, "a's first sample")
    for _ in range(30):
        await doomed.publish("news", b"x")

    async def moved() -> bool:
        return max((await cluster_overview(redis_client, keys, 0))["history"]["in"] or [0]) > 0

    await eventually(moved, DEADLINE, "a's traffic in the history")
    await stop_task(sampling._task)
    await die(doomed)

    async def purged() -> bool:
        registered = await NodeRegistry(redis_client, keys).nodes()
        return [info.node_id for info in registered] == ["b"]

    await eventually(purged, DEADLINE, "b to purge a")
    overview = await cluster_overview(redis_client, keys, 0)
    [down] = overview["nodes"]["down"]
    assert (overview["nodes"]["alive"], overview["nodes"]["total"]) == (1, 2)
    assert down["node_id"] == "a" and down["down_since_ms"] > 0
    assert max(overview["history"]["in"]) > 0
    rows = {row["node_id"]: row for row in await cluster_nodes(redis_client, keys)}
    assert rows["a"]["alive"] is False and rows["a"]["down_since_ms"] == down["down_since_ms"]
    assert rows["b"]["alive"] is True and rows["b"]["down_since_ms"] is None
    assert b.stats()["nodes_purged"] == 1


async def test_a_restarted_node_gives_no_negative_rate(
    start_node: StartNode, redis_connect: Any, redis_client: RedisClient, keys: Keys
) -> None:
    config = NodeConfig("a", prefix=keys.prefix, heartbeat_interval=0.2, heartbeat_ttl=1.0)
    first = RouterNode(await redis_connect(), config)
    await first.start()
    before = Telemetry(first, None, [], interval=INTERVAL)
    before.start()
    await eventually(lambda: before.latest is not None, DEADLINE, "a's first sample")
    for _ in range(30):
        await first.publish("news", b"x")

    async def thirty() -> bool:
        history = await stored(redis_client, keys, "a")
        return len(history) >= 2 and history[-1].messages_in == 30

    await eventually(thirty, DEADLINE, "a's 30 messages in its stored history")
    await stop_task(before._task)  # killed as kill -9 would: its keys stay in Redis
    await die(first)

    async def dead() -> bool:
        return not (await cluster_nodes(redis_client, keys))[0]["alive"]

    await eventually(dead, DEADLINE, "a's heartbeat to expire")
    [row] = await cluster_nodes(redis_client, keys)
    assert row["heartbeat_age_ms"] > 1000  # (its TTL, from the telemetry it left)
    assert row["connections"] is row["listeners"] is None  # a dead node's figures: unknown

    second = await start_node("a")
    async with Telemetry(second, None, [], interval=INTERVAL):
        for _ in range(3):
            await second.publish("news", b"x")

        async def restarted() -> bool:
            history = await stored(redis_client, keys, "a")
            counts = [sample.messages_in for sample in history]
            return 30 in counts and counts[-2:] == [3, 3]

        await eventually(restarted, DEADLINE, "samples of the new incarnation after the old")
        overview = await cluster_overview(redis_client, keys, 0)
        assert no_negative(overview)
        assert max(overview["history"]["in"]) > 0  # the old incarnation's rates stay
        assert overview["rates"]["in"] == 0


async def test_redis_trouble_does_not_stop_the_sampling(
    start_node: StartNode, redis_client: RedisClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    node = await start_node("a")
    await redis_client.set(keys.node_history("a"), b"not a list")  # LPUSH fails WRONGTYPE
    with caplog.at_level(logging.WARNING, logger="router.ops.telemetry"):
        async with Telemetry(node, None, [], interval=INTERVAL) as telemetry:

            def failed() -> bool:
                return any("not written" in r.getMessage() for r in caplog.records)

            await eventually(failed, DEADLINE, "a warning of the failed write")
            count = len(telemetry.history)
            await redis_client.delete(keys.node_history("a"))

            async def written() -> bool:
                return len(await stored(redis_client, keys, "a")) >= 2

            await eventually(written, DEADLINE, "the writes to resume")
            assert len(telemetry.history) > count


async def test_bad_settings(start_node: StartNode) -> None:
    node = await start_node("a")
    for bad in ({"interval": 0}, {"interval": -1.0}, {"keep": 1}, {"keep": 2.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Telemetry(node, None, [], **bad)


async def test_a_node_that_died_stays_listed_dead(
    start_node: Any, redis_client: RedisClient, keys: Keys
) -> None:
    """Before, a node killed without goodbye left the list once its peers purged it."""
    node = await start_node("watcher")
    store = NodeHistoryStore(redis_client, keys)
    now = time.time()
    await store.mark_seen("ghost", now - 30, now - 3600)  # (it wrote telemetry, then died)
    await store.mark_seen("ancient", now - 7200, now - 7200)
    rows = {row["node_id"]: row for row in await cluster_nodes(redis_client, keys)}
    assert set(rows) == {"watcher", "ghost"}
    assert rows["watcher"]["alive"] and not rows["ghost"]["alive"]
    assert 29_000 <= rows["ghost"]["heartbeat_age_ms"] <= 60_000
    await store.delete("ghost")  # (a node that stops gracefully is forgotten)
    assert [row["node_id"] for row in await cluster_nodes(redis_client, keys)] == ["watcher"]
    assert node.running
