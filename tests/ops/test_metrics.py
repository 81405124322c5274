"""``/metrics`` and ``/healthz`` of a running node, read over HTTP as Prometheus would,
on real Redis and a cluster."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.errors import StateUnavailableError
from router.ops.metrics import NodeCollector
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.web.listener import serve_http
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def get(address: tuple[str, int], path: str) -> tuple[int, str]:
    """(status, body) of a GET, over a plain socket."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode()


def samples(text: str) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels.get("le")
    }


async def test_metrics_and_health_of_a_node(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    a, b = await start_node("a"), await start_node("b", inbox_poll=0.2)
    await b.subscribe("phone", "news")
    await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5.0, "a routes")
    for _ in range(3):
        await a.publish("news", b"x")
    await take(b, "phone", 3)
    async with (
        serve_http(a, "127.0.0.1:0", api=False) as at_a,
        serve_http(b, "127.0.0.1:0", api=False) as at_b,
    ):
        status, text = await get(at_a, "/metrics")
        assert status == 200
        figures = samples(text)
        assert figures["router_published_total"] == 3
        assert figures["router_forwarded_total"] == 3
        assert figures["router_publish_seconds_count"] == 3
        assert figures["router_up"] == 1
        assert "router_inbox_lag" in figures
        assert samples((await get(at_b, "/metrics"))[1])["router_routes"] == 1
        assert await get(at_b, "/healthz") == (200, "ok\n")
        assert (await get(at_b, "/nothing"))[0] == 404

        await redis_client.set(keys.channel_clock(keys.inbox("b")), b"not a clock")

        async def unhealthy() -> bool:
            status, why = await get(at_b, "/healthz")
            return status == 503 and "inbox" in why

        await waiting.eventually(unhealthy, 10.0, "b's health says its inbox fails")


class OverloadedServer:
    """An MQTT server's figures as a busy, overloaded, draining node gives them."""

    def stats(self) -> dict[str, int]:
        return {
            "mqtt_overloaded": 1,
            "mqtt_overload_busy": 1,
            "mqtt_loop_busy_percent": 93,
            "mqtt_draining": 1,
            "mqtt_overload_slowed": 5,
        }


async def test_the_overload_and_drain_states_are_gauges(start_node: StartNode) -> None:
    """They were exported as counters (``router_mqtt_overloaded_total``), which a
    Prometheus rate() or alert on a gauge would misread."""
    node = await start_node("a")
    families = {
        family.name: family.type
        for family in NodeCollector(node, OverloadedServer()).collect()  # type: ignore[arg-type]
    }
    for name in ("overloaded", "overload_busy", "loop_busy_percent", "draining"):
        assert families[f"router_mqtt_{name}"] == "gauge"
    assert families["router_mqtt_overload_slowed"] == "counter"


async def test_a_bug_behind_a_scrape_is_counted_as_one_and_redis_away_is_not(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inbox lag a scrape reads: Redis away leaves it out; a programming error leaves
    it out too but is counted in ``router_internal_errors`` (it was told as Redis away)."""
    node = await start_node("a")
    collector = NodeCollector(node)
    failure: Exception = StateUnavailableError("Redis is restarting")

    async def backlog() -> int:
        raise failure

    def internal_errors() -> float:
        [family] = [f for f in collector.collect() if f.name == "router_internal_errors"]
        assert family.type == "counter"
        return float(family.samples[0].value)

    monkeypatch.setattr(node, "inbox_backlog", backlog)
    await collector.refresh()
    assert internal_errors() == 0
    failure = TypeError("an argument the code forgot")
    await collector.refresh()
    assert internal_errors() == 1
    assert all(f.name != "router_inbox_lag" for f in collector.collect())
