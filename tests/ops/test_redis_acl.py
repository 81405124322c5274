"""Nodes, an MQTT listener and the CLI run as the Redis ACL user ``router acl`` describes,
on a standalone server and on the cluster: Redis denies them nothing (``ACL LOG`` stays
empty), and the user cannot touch a key outside the prefix."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner
from redis import Redis
from redis.exceptions import NoPermissionError

import router
from router.cli import app
from router.ops.redis_acl import acl_setuser
from router.state.connection import open_redis
from router.state.keys import Keys
from tests.support import waiting
from tests.support.mqtt import V5, Paho, mqtt_node, routed_to
from tests.support.nodes import take
from tests.support.servers import RedisClusterServers, RedisServer

PASSWORD = "acl-test-pw"


@pytest.fixture(params=["standalone", "cluster"])
def restricted(
    request: pytest.FixtureRequest, keys: Keys, redis_server_factory: object
) -> Iterator[tuple[str, list[Redis]]]:
    """(the user's URL, an admin client per master) with the router user made."""
    if request.param == "standalone":
        server: RedisServer = request.getfixturevalue("redis_server_factory")()
        masters, url = [server.url], server.url
    else:
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster_servers")
        masters, url = [node.node_url for node in cluster.nodes], cluster.url
    admins = [Redis.from_url(master) for master in masters]
    version = str(admins[0].info("server")["redis_version"]).split(".")
    line = acl_setuser(keys.prefix, "router", PASSWORD, (int(version[0]), int(version[1])))
    line_parts = line.split(" ")
    for admin in admins:
        admin.execute_command(*line_parts)
        admin.execute_command("ACL", "LOG", "RESET")
    parts = urlsplit(url)
    try:
        yield f"{parts.scheme}://router:{PASSWORD}@{parts.netloc}{parts.path}", admins
    finally:
        for admin in admins:
            admin.execute_command("ACL", "DELUSER", "router")
            admin.close()


async def node_work(url: str, keys: Keys) -> None:
    """What nodes do: routes, forwarding, a shared group, retained, a persistent session
    that goes away and resumes, a takeover."""
    options = {"prefix": keys.prefix, "heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    async with (
        router.connect(url, node_id="a", **options) as a,
        router.connect(url, node_id="b", **options) as b,
    ):
        await b.subscribe("phone", "news/#", qos=1)
        await b.subscribe("worker", "$share/g/jobs")
        await waiting.eventually(
            lambda: all("b" in a.mirror.match(topic).nodes for topic in ("news/x", "jobs")),
            5.0,
            "both routes",
        )
        await a.publish("news/x", b"1", qos=1, retain=True)
        await a.publish("jobs", b"job")
        await take(b, "phone", 1)
        await take(b, "worker", 1)
        await b.connect("roamer", clean_start=False, expiry=60)
        await b.subscribe("roamer", "news/#", qos=1)
        await b.put_away("roamer", expiry=60)
        await a.publish("news/y", b"queued", qos=1)
        assert await a.connect("roamer", clean_start=False, expiry=60)  # resumed on a
        await a.disconnect("roamer")
        await a.connect("parked", clean_start=False, expiry=600)  # (outlives the nodes)
        await a.subscribe("parked", "news/#", qos=1)
        await a.put_away("parked", expiry=600)


def test_the_router_user_is_denied_nothing(restricted: tuple[str, list[Redis]], keys: Keys) -> None:
    url, admins = restricted
    asyncio.run(node_work(url, keys))
    env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
    runner = CliRunner()
    target = ["--redis", url, "--prefix", keys.prefix]
    added = runner.invoke(
        app,
        ["dashboard", "users", "add", "root", "--role", "admin", *target],
        input="pw-root-password\n",
    )
    assert added.exit_code == 0, added.output
    made = runner.invoke(app, ["dashboard", "keys", "add", "ci", "--role", "admin", *target])
    assert made.exit_code == 0, made.output
    key = made.output.strip()
    http = ("--http", "127.0.0.1:0")
    with mqtt_node("m", env, "--mqtt-sys-interval", "0.2", *http) as (process, port):
        watcher, talker = Paho(port, "watcher", V5), Paho(port, "talker", V5)
        try:
            assert watcher.subscribe("t/#", 1) == [1]
            routed_to(talker, "t/probe", watcher)
        finally:
            watcher.close()
            talker.close()
        base = re.search(r"HTTP on (http://\S+)", "\n".join(process.stderr_lines))
        assert base is not None
        for path in ("/api/v1/overview", "/api/v1/nodes", "/api/v1/clients", "/api/v1/bans"):
            request = urllib.request.Request(
                base.group(1) + path, headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert answer.status == 200, path
        login = urllib.request.Request(
            base.group(1) + "/api/v1/login",
            data=json.dumps({"user": "root", "password": "pw-root-password"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(login, timeout=10) as answer:
            assert answer.status == 200
    for command in (
        ["nodes"],
        ["routes"],
        ["match", "news/x"],
        ["subs", "parked"],
        ["clients"],
        ["channels", "list"],
        ["reconcile"],
        ["retained", "list"],
        ["publish", "news/z", "x"],
        ["bans", "add", "client", "x", "--for", "5"],
        ["bans", "add", "user", "y"],
        ["bans", "list"],
        ["bans", "remove", "client", "x"],
    ):
        result = runner.invoke(app, [*command, "--redis", url, "--prefix", keys.prefix])
        # (parked, a persistent session, is held by the last node that stopped: it
        # retired with it, for the next node to adopt; reconcile finds nothing wrong)
        assert result.exit_code == 0, (command, result.output)
        assert "NOPERM" not in result.output
    for admin in admins:
        assert admin.execute_command("ACL", "LOG") == []
    asyncio.run(refused_elsewhere(url))


async def refused_elsewhere(url: str) -> None:
    """A key outside the prefix is not the user's (checked last: Redis logs the denial)."""
    redis = await open_redis(url)
    try:
        with pytest.raises(NoPermissionError):
            await redis.set("someone-else:key", b"x")
    finally:
        await redis.aclose()


def test_router_redis_acl_prints_the_line() -> None:
    result = CliRunner().invoke(app, ["redis-acl", "--prefix", "fleet", "--redis-version", "7.0"])
    assert result.exit_code == 0
    assert result.output == acl_setuser("fleet", "router", "CHANGE-ME", (7, 0)) + "\n"
    assert "~fleet:* resetchannels &fleet:*" in result.output
    assert "client|setinfo" not in result.output
