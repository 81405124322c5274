"""Controls that say what they do: the users and ACL lists name the nodes that enforce
them, and ``match`` names every node's receivers (not only the answering node's), with
share groups as groups. Real nodes on real Redis (standalone and a 3-master cluster)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import aiohttp
import pytest

from router.cluster.node import RouterNode
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from router.ops.receivers import find_receivers
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_store import SessionStore
from router.state.subscriptions import SubscriptionStore
from router.web.listener import serve_http
from tests.support import waiting
from tests.support.http_api import WAIT, Site, call
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


# -- who enforces the users and rules ------------------------------------------------------


@pytest.fixture
async def told(start_node: StartNode) -> AsyncIterator[list[Site | RouterNode]]:
    """Nodes r (``--auth-redis``), f (files) and h (HTTP, says nothing) serving HTTP, and
    q with no HTTP listener (so no telemetry)."""
    async with AsyncExitStack() as stack:
        found: list[Site | RouterNode] = []
        for node_id, auth in (("r", "redis"), ("f", "files"), ("h", "")):
            node = await start_node(node_id)
            mqtt = await stack.enter_async_context(
                serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0))
            )
            host, port = await stack.enter_async_context(
                serve_http(node, "127.0.0.1:0", mqtt, telemetry_interval=0.2, auth=auth)
            )
            found.append(Site(node, mqtt, mqtt.addresses[0][1], f"http://{host}:{port}"))
        found.append(await start_node("q"))
        yield found


async def test_the_users_and_acl_lists_name_the_nodes_that_enforce_them(
    told: list[Site | RouterNode], http: aiohttp.ClientSession
) -> None:
    site = told[1]
    assert isinstance(site, Site)
    expected = {
        "enforced_by": ["r"],
        "not_enforced_by": [{"node_id": "f", "auth": "files"}],
        "unknown": ["h", "q"],
    }
    for path in ("/api/v1/users", "/api/v1/acl"):

        async def says(path: str = path) -> bool:
            status, answer = await call(http, "GET", site.url + path)
            assert status == 200, answer
            return {name: answer.get(name) for name in expected} == expected

        await waiting.eventually(says, WAIT, f"{path} names who enforces it")
    status, nodes = await call(http, "GET", site.url + "/api/v1/nodes")
    assert status == 200, nodes
    assert {row["node_id"]: row["auth"] for row in nodes["items"]} == {
        "f": "files",
        "h": None,
        "q": None,
        "r": "redis",
    }


# -- who would receive ---------------------------------------------------------------------


async def test_match_names_every_nodes_receivers_and_share_groups(
    sites: list[Site], http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    a, b = sites
    clients = []
    try:
        for site, client_id, topic_filter, qos in (
            (a, "near", "plant/#", 1),
            (b, "far", "plant/+/temp", 0),
            (b, "sleeper", "plant/#", 1),
            (a, "s1", "$share/g/plant/#", 1),
            (b, "s2", "$share/g/plant/#", 0),
            (b, "s3", "$share/g/plant/#", 0),
            (b, "other", "garden/#", 0),
        ):
            client = await RawClient.connect(site.port, client_id, clean_start=True, expiry=600)
            await client.subscribe(topic_filter, qos)
            clients.append(client)
        clients[2].drop()  # sleeper goes away: its session keeps what comes
        sessions = SessionStore(redis_client, keys, SubscriptionStore(redis_client, keys))

        async def settled() -> bool:
            info = await sessions.describe("sleeper")
            table = a.node.mirror.table()
            return (
                info is not None
                and not info.connected
                and table.get("$share/g/plant/#") == {"a": 1, "b": 2}
                and "b" in table.get("plant/+/temp", {})
            )

        await waiting.eventually(settled, WAIT, "a's mirror has every route, sleeper is away")
        status, report = await call(http, "GET", a.url + "/api/v1/match?topic=plant/7/temp")
        assert status == 200, report
        assert report["nodes"] == ["a", "b"]
        assert report["clients"] == {"a": ["near", "s1"], "b": ["far", "s2", "s3", "sleeper"]}
        assert report["receivers"] == {
            "a": [{"client_id": "near", "filter": "plant/#", "qos": 1, "connected": True}],
            "b": [
                {"client_id": "far", "filter": "plant/+/temp", "qos": 0, "connected": True},
                {"client_id": "sleeper", "filter": "plant/#", "qos": 1, "connected": False},
            ],
        }
        assert report["receiver_counts"] == {"a": 1, "b": 2}
        assert report["groups"] == [
            {
                "route": "$share/g/plant/#",
                "group": "g",
                "filter": "plant/#",
                "member_count": 3,
                "nodes": {"a": 1, "b": 2},
                "members": {"a": ["s1"], "b": ["s2", "s3"]},
                "members_found": 3,
            }
        ]
        assert report["complete"] is True and report["clients_read"] == 7

        status, report = await call(http, "GET", a.url + "/api/v1/match?topic=nowhere")
        assert (status, report["nodes"], report["clients"], report["clients_read"]) == (
            200,
            [],
            {},
            0,
        )
        bounded = await find_receivers(redis_client, keys, a.node.mirror, "plant/7/temp", limit=2)
        assert bounded.clients_read == 2 and bounded.complete is False
        shown = await find_receivers(redis_client, keys, a.node.mirror, "plant/7/temp", shown=1)
        assert [len(found) for found in shown.receivers.values()] == [1, 1]
        assert shown.receiver_counts == {"a": 1, "b": 2}
        assert shown.groups["$share/g/plant/#"].members == {"a": ["s1"], "b": ["s2"]} or (
            shown.groups["$share/g/plant/#"].members == {"a": ["s1"], "b": ["s3"]}
        )
    finally:
        for client in clients:
            client.drop()
