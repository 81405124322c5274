"""A burst of CONNECTs against a node on a real Redis: the node's CONNECT work runs
``max_connecting`` at a time (the others wait their turn, counted), so that the burst
is served instead of running the node's Redis connection pool out; a CONNECT whose turn
does not come within ``connect_timeout`` of its accept gets CONNACK 0x89 (3.1.1: 3),
counted as ``server_busy``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from router.errors import InvalidSettingError
from router.mqtt.codec import encode
from router.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.waiting import eventually

ON_REDIS = pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)

WAIT = 20.0


async def connack(port: int, connect: Connect) -> int:
    """The CONNACK return code (3.1.1) or reason code (5.0) ``connect`` gets."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(encode(connect, connect.protocol_level))
        async with asyncio.timeout(WAIT):
            head = await reader.readexactly(4)  # (type, length, flags, code)
        assert head[0] == 0x20, head
        return head[3]
    finally:
        writer.close()


@ON_REDIS
async def test_a_burst_of_connects_is_served_in_turns(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await start_node("n1")
    at_once = most = 0
    connect = node.connect

    async def counted(*args: Any, **kwargs: Any) -> bool:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        try:
            return await connect(*args, **kwargs)
        finally:
            at_once -= 1

    monkeypatch.setattr(node, "connect", counted)
    settings = MqttSettings(max_connecting=2, sys_interval=0)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        levels = (MQTT_3_1_1, MQTT_5)
        codes = await asyncio.gather(
            *(connack(port, Connect(f"burst-{n}", levels[n % 2])) for n in range(200))
        )
        assert codes == [0] * 200
        assert most == 2
        stats = server.stats()
        assert stats["mqtt_connect_waited"] > 0
        assert stats.get("mqtt_closed_server_busy", 0) == 0


@ON_REDIS
@pytest.mark.parametrize(("level", "refused"), [(MQTT_5, 0x89), (MQTT_3_1_1, 3)])
async def test_a_connect_whose_turn_does_not_come_in_time_gets_server_busy(
    start_node: StartNode, monkeypatch: pytest.MonkeyPatch, level: int, refused: int
) -> None:
    node = await start_node("n1")
    holding, letting_go = asyncio.Event(), asyncio.Event()
    connect = node.connect

    async def slow(client_id: str, *args: Any, **kwargs: Any) -> bool:
        if client_id == "slow":  # (holds the only turn until the test lets go)
            holding.set()
            await letting_go.wait()
        return await connect(client_id, *args, **kwargs)

    monkeypatch.setattr(node, "connect", slow)
    settings = MqttSettings(max_connecting=1, connect_timeout=0.5, sys_interval=0)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        first = asyncio.create_task(connack(port, Connect("slow", level)))
        await holding.wait()
        started = time.monotonic()
        assert await connack(port, Connect("late", level)) == refused
        assert 0.4 < time.monotonic() - started < WAIT
        letting_go.set()
        assert await first == 0  # (it had its turn: no timeout once the node works)
        assert await connack(port, Connect("later", level)) == 0
        stats = server.stats()
        assert stats["mqtt_closed_server_busy"] == 1
        assert stats["mqtt_connect_waited"] == 1


@ON_REDIS
async def test_a_connect_waiting_for_its_sessions_adoption_leaves_the_turns_to_others(
    start_node: StartNode,
) -> None:
    node = await start_node("n1")
    held, release = asyncio.Event(), asyncio.Event()

    async def adoption() -> None:  # (an adoption holds its clients' locks throughout)
        async with node._lifecycle.locks.hold("adopted"):
            held.set()
            await release.wait()

    holder = asyncio.create_task(adoption())
    await held.wait()
    settings = MqttSettings(max_connecting=1, connect_timeout=3, sys_interval=0)
    async with serve(node, ["127.0.0.1:0"], settings) as server:
        port = server.addresses[0][1]
        waiting = asyncio.create_task(connack(port, Connect("adopted", MQTT_5)))
        await eventually(lambda: server.stats()["mqtt_connect_waited"] == 1, 5, "the wait")
        assert await connack(port, Connect("other", MQTT_5)) == 0  # (the one turn was free)
        assert not waiting.done()
        release.set()
        assert await waiting == 0
    await holder


def test_max_connecting_is_at_least_one() -> None:
    with pytest.raises(InvalidSettingError, match="max_connecting"):
        MqttSettings(max_connecting=0)
