"""Fixtures of the HTTP API tests: two nodes serving MQTT and HTTP, and an HTTP client
session that keeps cookies (helpers: tests/support/http_api.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from router.web.listener import serve_http
from tests.support.http_api import Site
from tests.support.nodes import StartNode


@pytest.fixture
async def sites(start_node: StartNode) -> AsyncIterator[list[Site]]:
    """Two nodes, a and b, each serving MQTT and HTTP on loopback."""
    async with AsyncExitStack() as stack:
        found = []
        for node_id in ("a", "b"):
            node = await start_node(node_id, inbox_poll=0.05)
            mqtt = await stack.enter_async_context(
                serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0))
            )
            host, port = await stack.enter_async_context(
                serve_http(node, "127.0.0.1:0", mqtt, telemetry_interval=0.2)
            )
            found.append(Site(node, mqtt, mqtt.addresses[0][1], f"http://{host}:{port}"))
        yield found


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        yield session
