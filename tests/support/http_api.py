"""Helpers of the HTTP API tests (tests/web/): a node's two listeners, JSON calls, the
CSRF header of a session, an admin's login. The fixtures that start them are in
tests/web/conftest.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from router.cluster.node import RouterNode
from router.mqtt.server import MqttServer
from router.state.console_store import ConsoleStore
from router.state.keys import Keys
from router.state.scripts import RedisClient

WAIT: Final = 10.0
ADMIN_PASSWORD: Final = "s3cret-admin-pass"


@dataclass
class Site:
    node: RouterNode
    mqtt: MqttServer
    port: int  # MQTT
    url: str  # http://127.0.0.1:PORT


async def call(
    http: aiohttp.ClientSession, method: str, url: Any, **options: Any
) -> tuple[int, Any]:
    """The status and JSON body of one request (``url`` a str or a yarl.URL)."""
    async with http.request(method, url, **options) as response:
        return response.status, await response.json(content_type=None)


async def csrf(http: aiohttp.ClientSession, site: Site) -> dict[str, str]:
    """The header a state-changing request of this session carries."""
    status, me = await call(http, "GET", site.url + "/api/v1/me")
    assert status == 200, me
    return {"X-CSRF-Token": me["csrf"]}


async def admin_login(
    http: aiohttp.ClientSession, site: Site, redis_client: RedisClient, keys: Keys
) -> dict[str, str]:
    """Add the admin ``root`` and log ``http`` in as it; the CSRF header of the login."""
    await ConsoleStore(redis_client, keys).add_user("root", ADMIN_PASSWORD, "admin")
    status, me = await call(
        http, "POST", site.url + "/api/v1/login", json={"user": "root", "password": ADMIN_PASSWORD}
    )
    assert status == 200, me
    return {"X-CSRF-Token": me["csrf"]}
