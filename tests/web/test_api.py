"""The JSON API of ``--http`` against real nodes, on real Redis and a 3-master cluster:
every endpoint, its bad input and its refusals.

Two nodes run in this process, each with an MQTT listener and an HTTP listener; MQTT
clients are raw asyncio clients (tests/support/raw_mqtt.py) so that nothing blocks the
event loop the nodes run in.
"""

from __future__ import annotations

import aiohttp
import aiohttp.web
import pytest

from router.core.acl import Acl
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from router.state.ban_store import Ban, ban_event
from router.state.console_store import ConsoleStore
from router.state.event_log import EventLog
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.web import listener
from router.web.listener import build_app, serve_http
from tests.support import waiting
from tests.support.http_api import WAIT, Site, admin_login, call, csrf
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

VIEWER_PASSWORD = "viewer-password"
ADMIN_PASSWORD = "admin-password"


# -- access ------------------------------------------------------------------------------


async def test_open_access_on_loopback_until_an_account_exists(
    sites: list[Site], http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    a = sites[0]
    status, me = await call(http, "GET", a.url + "/api/v1/me")
    assert status == 200 and me["user"] is None and me["role"] == "admin"
    # (the CSRF rule holds for the open access too)
    body = {"topic": "t", "payload": "x"}
    status, error = await call(http, "POST", a.url + "/api/v1/publish", json=body)
    assert (status, error["error"]) == (403, "AccessDeniedError")
    status, _ = await call(
        http, "POST", a.url + "/api/v1/publish", json=body, headers={"X-CSRF-Token": me["csrf"]}
    )
    assert status == 200
    # a Host that is not a loopback name (DNS rebinding) is refused
    status, error = await call(http, "GET", a.url + "/api/v1/me", headers={"Host": "evil.test"})
    assert status == 403

    await ConsoleStore(redis_client, keys).add_user("ops", VIEWER_PASSWORD, "viewer")
    status, error = await call(http, "GET", a.url + "/api/v1/nodes")
    assert (status, error["error"]) == (401, "LoginRequiredError")


async def test_login_roles_csrf_logout_and_api_keys(
    sites: list[Site], http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    a, b = sites
    console = ConsoleStore(redis_client, keys)
    await console.add_user("ops", VIEWER_PASSWORD, "viewer")
    await console.add_user("root", ADMIN_PASSWORD, "admin")

    status, error = await call(
        http, "POST", a.url + "/api/v1/login", json={"user": "root", "password": "wrong"}
    )
    assert (status, error["error"]) == (401, "LoginRequiredError")
    status, error = await call(http, "POST", a.url + "/api/v1/login", data=b"not json")
    assert (status, error["error"]) == (400, "RequestError")

    status, me = await call(
        http, "POST", a.url + "/api/v1/login", json={"user": "ops", "password": VIEWER_PASSWORD}
    )
    assert (status, me["role"]) == (200, "viewer")
    # the login holds on the other node too (kept in Redis)
    status, _ = await call(http, "GET", b.url + "/api/v1/nodes")
    assert status == 200
    status, error = await call(
        http,
        "POST",
        b.url + "/api/v1/publish",
        json={"topic": "t"},
        headers={"X-CSRF-Token": me["csrf"]},
    )
    assert (status, error["error"]) == (403, "AccessDeniedError")
    assert "viewer" in error["message"]

    status, _ = await call(
        http, "POST", a.url + "/api/v1/logout", headers={"X-CSRF-Token": me["csrf"]}
    )
    assert status == 200  # (a viewer may log out: with its login's CSRF token)
    status, _ = await call(http, "GET", a.url + "/api/v1/nodes")
    assert status == 401

    status, me = await call(
        http, "POST", a.url + "/api/v1/login", json={"user": "root", "password": ADMIN_PASSWORD}
    )
    assert status == 200
    status, error = await call(http, "POST", a.url + "/api/v1/publish", json={"topic": "t"})
    assert (status, error["error"]) == (403, "AccessDeniedError")  # no CSRF token
    # removing the user ends their login at once
    await console.remove_user("root")
    status, _ = await call(http, "GET", a.url + "/api/v1/nodes")
    assert status == 401

    key = await console.add_api_key("ci", "admin")
    async with aiohttp.ClientSession() as script:
        bearer = {"Authorization": f"Bearer {key}"}
        body = {"topic": "t", "payload": "x"}
        status, _ = await call(script, "POST", b.url + "/api/v1/publish", json=body, headers=bearer)
        assert status == 200  # (a key needs no CSRF token: no cookie is involved)
        wrong = {"Authorization": f"Bearer {key[:-2]}xx"}
        status, error = await call(script, "GET", b.url + "/api/v1/nodes", headers=wrong)
        assert (status, error["error"]) == (401, "LoginRequiredError")


async def test_errors_are_json(sites: list[Site], http: aiohttp.ClientSession) -> None:
    a = sites[0]
    status, error = await call(http, "GET", a.url + "/api/v1/nothing")
    assert (status, error["error"]) == (404, "NotFoundError")
    status, error = await call(http, "PUT", a.url + "/api/v1/nodes")
    assert status in (403, 405)  # (the CSRF rule answers before the router)
    headers = await csrf(http, a)
    status, error = await call(http, "PUT", a.url + "/api/v1/nodes", headers=headers)
    assert (status, error["error"]) == (405, "MethodNotAllowedError")
    status, error = await call(http, "GET", a.url + "/api/v1/clients?limit=0")
    assert (status, error["error"]) == (400, "RequestError")
    status, error = await call(http, "GET", a.url + "/api/v1/clients?cursor=%%%")
    assert status == 400
    status, document = await call(http, "GET", a.url + "/api/v1/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.1")
    assert {"get"} <= set(document["paths"]["/api/v1/clients"])
    assert "post" in document["paths"]["/api/v1/publish"]


# -- the cluster, clients and sessions ---------------------------------------------------


async def test_overview_and_nodes(sites: list[Site], http: aiohttp.ClientSession) -> None:
    a, b = sites
    status, found = await call(http, "GET", b.url + "/api/v1/nodes")
    assert status == 200
    rows = {row["node_id"]: row for row in found["items"]}
    assert set(rows) == {"a", "b"} and all(row["alive"] for row in rows.values())

    client = await RawClient.connect(a.port, "sender", clean_start=True, expiry=0)
    try:

        async def rate_moves() -> bool:
            await client.publish_now("load", b"x")
            overview = (await call(http, "GET", b.url + "/api/v1/overview"))[1]
            return overview["rates"]["in"] > 0 and overview["connections"] >= 1

        await waiting.eventually(rate_moves, WAIT, "the overview's message rate moves")
    finally:
        client.drop()


async def test_events_tell_the_nodes_and_bans_newest_first_and_filter(
    sites: list[Site], http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    a, _ = sites
    await EventLog(redis_client, keys).add(
        ban_event(Ban("client", "spammer", reason="floods"), "cli")
    )

    async def both_up() -> bool:
        status, found = await call(http, "GET", a.url + "/api/v1/events?kind=node_up")
        return status == 200 and {e["subject"] for e in found["items"]} == {"a", "b"}

    await waiting.eventually(both_up, WAIT, "a node_up event of each node")
    status, found = await call(http, "GET", a.url + "/api/v1/events")
    assert status == 200 and found["next"] is None
    newest = found["items"][0]
    assert (newest["kind"], newest["subject"], newest["node"]) == (
        "ban_added",
        "client:spammer",
        "cli",
    )
    assert "floods" in newest["text"]
    times = [event["at_ms"] for event in found["items"]]
    assert times == sorted(times, reverse=True)
    status, found = await call(http, "GET", a.url + "/api/v1/events?subject=a&limit=1")
    assert [(e["kind"], e["subject"]) for e in found["items"]] == [("node_up", "a")]
    since = newest["at_ms"]
    status, found = await call(http, "GET", a.url + f"/api/v1/events?since_ms={since}")
    assert found["items"] == []
    for bad in ("kind=made_up", "since_ms=soon", "limit=0"):
        status, error = await call(http, "GET", a.url + f"/api/v1/events?{bad}")
        assert status == 400 and error["error"] == "RequestError", bad


async def test_clients_filters_detail_kick_and_clear(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    a, b = sites
    kept = await RawClient.connect(b.port, "phone-1", clean_start=True, expiry=600)
    await kept.subscribe("news/#", 1)
    other = await RawClient.connect(a.port, "sensor-1", clean_start=True, expiry=0)
    try:
        status, page = await call(http, "GET", a.url + "/api/v1/clients?prefix=phone")
        assert status == 200
        assert [row["client_id"] for row in page["items"]] == ["phone-1"]
        assert page["items"][0]["node"] == "b" and page["items"][0]["state"] == "connected"
        status, page = await call(http, "GET", a.url + "/api/v1/clients?node=a&limit=1")
        assert [row["client_id"] for row in page["items"]] == ["sensor-1"]
        status, page = await call(http, "GET", a.url + "/api/v1/clients?limit=1")
        first = page["items"]
        status, following = await call(
            http, "GET", a.url + f"/api/v1/clients?limit=1&cursor={page['next']}"
        )
        assert [r["client_id"] for r in first + following["items"]] == ["phone-1", "sensor-1"]
        assert following["next"] is None
        status, error = await call(http, "GET", a.url + "/api/v1/clients?state=asleep")
        assert status == 400

        status, detail = await call(http, "GET", b.url + "/api/v1/clients/phone-1")
        assert status == 200
        assert [f["filter"] for f in detail["filters"]] == ["news/#"]
        assert detail["connection"]["node"] == "b"
        status, error = await call(http, "GET", b.url + "/api/v1/clients/nobody")
        assert (status, error["error"]) == (404, "ClientNotFoundError")

        headers = await csrf(http, a)
        url = a.url + "/api/v1/clients/phone-1/session"
        status, error = await call(http, "DELETE", url, headers=headers)
        assert (status, error["error"]) == (409, "SessionInUseError")

        status, sent = await call(
            http, "POST", a.url + "/api/v1/clients/phone-1/kick", headers=headers
        )
        assert (status, sent["node"]) == (200, "b")
        await kept.closed(WAIT)  # (the node serving it ended the connection)

        async def away() -> bool:
            rows = (await call(http, "GET", a.url + "/api/v1/clients?state=away"))[1]["items"]
            return [row["client_id"] for row in rows] == ["phone-1"]

        await waiting.eventually(away, WAIT, "phone-1's session is away")
        status, cleared = await call(http, "DELETE", url, headers=headers)
        assert (status, cleared["cleared"]) == (200, True)
        status, _ = await call(http, "GET", b.url + "/api/v1/clients/phone-1")
        assert status == 404
        await waiting.eventually(
            lambda: "news/#" not in b.node.mirror.table() and "news/#" not in a.node.mirror.table(),
            WAIT,
            "the cleared session's route is gone",
        )
    finally:
        kept.drop()
        other.drop()


# -- topics, retained, publish -----------------------------------------------------------


async def test_subscriptions_match_publish_and_retained(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    a, b = sites
    listener = await RawClient.connect(b.port, "reader", clean_start=True, expiry=0)
    await listener.subscribe("plant/+/temp", 0)
    try:
        await waiting.eventually(
            lambda: "b" in a.node.mirror.match("plant/1/temp").nodes, WAIT, "a routes to b"
        )
        status, page = await call(http, "GET", a.url + "/api/v1/subscriptions?filter=plant/%23")
        assert status == 200 and page["items"] == [{"filter": "plant/+/temp", "nodes": ["b"]}]
        status, report = await call(http, "GET", b.url + "/api/v1/match?topic=plant/7/temp")
        assert report["nodes"] == ["b"] and report["clients"] == {"b": ["reader"]}
        status, error = await call(http, "GET", b.url + "/api/v1/match?topic=plant/%23")
        assert (status, error["error"]) == (400, "InvalidTopicError")

        headers = await csrf(http, a)
        body = {"topic": "plant/7/temp", "payload": "21.5", "qos": 1, "retain": True}
        status, sent = await call(
            http, "POST", a.url + "/api/v1/publish", json=body, headers=headers
        )
        assert (status, sent["nodes"]) == (200, ["b"])
        [delivered] = await listener.take(1)
        assert (delivered.topic, delivered.payload) == ("plant/7/temp", b"21.5")

        status, page = await call(http, "GET", b.url + "/api/v1/retained?filter=plant/%23")
        assert [(m["topic"], m["payload"]) for m in page["items"]] == [("plant/7/temp", "21.5")]
        binary = {"topic": "plant/8/raw", "payload": "AAH/", "encoding": "base64", "retain": True}
        status, _ = await call(
            http, "POST", a.url + "/api/v1/publish", json=binary, headers=headers
        )
        assert status == 200
        status, page = await call(http, "GET", b.url + "/api/v1/retained?limit=1&filter=plant/%23")
        assert len(page["items"]) == 1 and page["next"] is not None
        status, rest = await call(
            http, "GET", b.url + f"/api/v1/retained?limit=1&filter=plant/%23&cursor={page['next']}"
        )
        assert rest["items"][0] == {
            **rest["items"][0],
            "topic": "plant/8/raw",
            "encoding": "base64",
            "payload": "AAH/",
            "bytes": 3,
        }
        status, deleted = await call(
            http, "DELETE", b.url + "/api/v1/retained?filter=plant/%23", headers=await csrf(http, b)
        )
        assert (status, deleted) == (200, {"deleted": 2})

        for bad, kind in (
            ({"topic": "$SYS/broker/version", "payload": "x"}, "NotAuthorizedError"),
            ({"topic": "a/+", "payload": "x"}, "InvalidTopicError"),
            ({"topic": "a", "qos": 3}, "RequestError"),
            ({"topic": "a", "payload": "%%", "encoding": "base64"}, "RequestError"),
            ({"payload": "x"}, "RequestError"),
            ({"topic": 5}, "RequestError"),
        ):
            status, error = await call(
                http, "POST", a.url + "/api/v1/publish", json=bad, headers=headers
            )
            assert (status // 100, error["error"]) == (4, kind), bad
        assert listener.nothing_pending()
    finally:
        listener.drop()


async def test_http_publish_passes_the_acl_as_the_dashboard_user(
    start_node: StartNode, http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    acl = Acl.parse("allow user root publish ops/#\n")
    node = await start_node("acl", acl=acl)
    async with (
        serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as mqtt,
        serve_http(node, "127.0.0.1:0", mqtt) as (host, port),
    ):
        site = Site(node, mqtt, mqtt.addresses[0][1], f"http://{host}:{port}")
        headers = await admin_login(http, site, redis_client, keys)
        url = site.url + "/api/v1/publish"
        ok = await call(http, "POST", url, json={"topic": "ops/x"}, headers=headers)
        assert ok[0] == 200
        status, error = await call(http, "POST", url, json={"topic": "other"}, headers=headers)
        assert (status, error["error"]) == (403, "NotAuthorizedError")


# -- bans, users, ACL --------------------------------------------------------------------


async def test_bans_users_and_rules(sites: list[Site], http: aiohttp.ClientSession) -> None:
    a, b = sites
    headers = await csrf(http, a)
    ban = {"kind": "client", "value": "rogue", "seconds": 60, "reason": "flooding"}
    status, added = await call(http, "POST", a.url + "/api/v1/bans", json=ban, headers=headers)
    assert (status, added["value"], added["reason"]) == (201, "rogue", "flooding")
    status, page = await call(http, "GET", b.url + "/api/v1/bans")
    assert [(x["kind"], x["value"]) for x in page["items"]] == [("client", "rogue")]
    bad = {"kind": "planet", "value": "x"}
    status, error = await call(http, "POST", a.url + "/api/v1/bans", json=bad, headers=headers)
    assert (status, error["error"]) == (400, "InvalidSettingError")
    status, removed = await call(
        http, "DELETE", a.url + "/api/v1/bans/client/rogue", headers=headers
    )
    assert removed == {"removed": True}

    user = {"name": "alice", "password": "pw-alice"}
    status, _ = await call(http, "POST", a.url + "/api/v1/users", json=user, headers=headers)
    assert status == 201
    status, error = await call(http, "POST", a.url + "/api/v1/users", json=user, headers=headers)
    assert status == 409
    status, page = await call(http, "GET", b.url + "/api/v1/users")
    assert page["items"] == [{"name": "alice", "superuser": False}]
    status, changed = await call(
        http,
        "PUT",
        a.url + "/api/v1/users/alice/password",
        json={"password": "pw-2"},
        headers=headers,
    )
    assert changed == {"name": "alice", "changed": True}
    status, _ = await call(
        http, "PUT", a.url + "/api/v1/users/bob/password", json={"password": "x"}, headers=headers
    )
    assert status == 404
    status, removed = await call(http, "DELETE", a.url + "/api/v1/users/alice", headers=headers)
    assert removed == {"removed": True}

    rule = {"rule": "allow all subscribe sensors/#"}
    status, added = await call(http, "POST", a.url + "/api/v1/acl", json=rule, headers=headers)
    assert (status, added) == (201, {"position": 1})
    status, rules = await call(http, "GET", b.url + "/api/v1/acl")
    assert rules["rules"] == ["allow all subscribe sensors/#"]
    bad_rule = {"rule": "allow all fly sensors/#"}
    status, error = await call(http, "POST", a.url + "/api/v1/acl", json=bad_rule, headers=headers)
    assert (status, error["error"]) == (400, "AclRuleError")
    status, removed = await call(http, "DELETE", a.url + "/api/v1/acl", json=rule, headers=headers)
    assert removed == {"position": 1}


async def test_a_network_listener_refuses_everyone_until_an_account_exists(
    start_node: StartNode, http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    node = await start_node("net")
    runner = aiohttp.web.AppRunner(build_app(node, loopback=False))
    await runner.setup()
    try:
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        status, error = await call(http, "GET", url + "/api/v1/me")
        assert (status, error["error"]) == (403, "AccessDeniedError")
        assert "router dashboard users add" in error["message"]
        async with http.get(url + "/healthz") as response:
            assert response.status == 200  # (monitoring stays open)
        await ConsoleStore(redis_client, keys).add_user("root", ADMIN_PASSWORD, "admin")
        status, error = await call(http, "GET", url + "/api/v1/me")
        assert (status, error["error"]) == (401, "LoginRequiredError")
    finally:
        await runner.cleanup()


async def test_pages_carry_security_headers_and_say_when_their_libraries_are_missing(
    sites: list[Site], http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = sites[0]
    async with http.get(a.url + "/") as page:
        assert page.status == 200
        policy = page.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
        assert page.headers["X-Content-Type-Options"] == "nosniff"
    async with http.get(a.url + "/api/v1/me") as answer:
        assert answer.headers["X-Frame-Options"] == "DENY"
    monkeypatch.setattr(listener, "missing", lambda: ["alpine.min.js"])
    async with http.get(a.url + "/") as page:
        assert page.status == 503 and "make web-assets" in await page.text()
