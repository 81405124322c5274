"""The HTTP API under attack, against real nodes on real Redis (standalone and a 3-master
cluster): a login throttle shared by the cluster and taken before the password hash, per
user and per address; JSON bodies too deep or too large; CSRF on logout; client ids of
any characters in paths; state errors told as bad input, not as Redis being down.

(The status of each kind of error and the depth scan are tested without a node in
tests/web/test_replies.py; the minimum password length in tests/state/test_console_store.py
and tests/cli/test_cli_dashboard.py.)
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from yarl import URL

from router.core.passwords import PasswordHash
from router.state.console_store import ConsoleStore
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.web.access import LOGIN_BODY, LOGIN_FAILURES, LOGIN_WINDOW
from router.web.replies import MAX_BODY, MAX_DEPTH
from tests.support import waiting
from tests.support.http_api import ADMIN_PASSWORD, WAIT, Site, call, csrf
from tests.support.raw_mqtt import RawClient

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

VIEWER_PASSWORD = "viewer-password"
CLASS_NAME = re.compile(r"\w+Error\b")


@asynccontextmanager
async def from_address(host: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client session whose connections come from ``host`` (a loopback address: Linux
    routes all of 127.0.0.0/8 to the loopback interface)."""
    connector = aiohttp.TCPConnector(local_addr=(host, 0))
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as session:
        yield session


async def login(
    session: aiohttp.ClientSession, site: Site, user: str, password: str
) -> tuple[int, Any]:
    """The status and JSON answer of a login."""
    body = {"user": user, "password": password}
    return await call(session, "POST", site.url + "/api/v1/login", json=body)


# -- the login throttle ------------------------------------------------------------------


async def test_the_login_throttle_is_shared_by_the_nodes_and_taken_before_the_hash(
    sites: list[Site],
    http: aiohttp.ClientSession,
    redis_client: RedisClient,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: each node counted failures in its own memory, after the hash: 60 wrong
    logins sent at once to two nodes were all hashed and all answered 401."""
    a, b = sites
    await ConsoleStore(redis_client, keys).add_user("root", ADMIN_PASSWORD, "admin")
    hashed: list[str] = []
    verify = PasswordHash.verify

    def counted(self: PasswordHash, password: str) -> bool:
        hashed.append(password)
        return verify(self, password)

    monkeypatch.setattr(PasswordHash, "verify", counted)
    tries = 60
    answers = await asyncio.gather(
        *(login(http, site, "root", "not the password") for site in (a, b) * (tries // 2))
    )
    statuses = sorted(status for status, _ in answers)
    assert statuses == [401] * LOGIN_FAILURES + [429] * (tries - LOGIN_FAILURES)
    assert len(hashed) == LOGIN_FAILURES  # (the refused ones were never hashed)
    refused = next(body for status, body in answers if status == 429)
    assert refused["error"] == "LoginThrottledError"
    assert "too many failed logins" in refused["message"]

    # the right password waits as well, on either node; Retry-After says how long
    right = {"user": "root", "password": ADMIN_PASSWORD}
    async with http.post(b.url + "/api/v1/login", json=right) as answer:
        assert answer.status == 429
        assert 1 <= int(answer.headers["Retry-After"]) <= LOGIN_WINDOW
    assert len(hashed) == LOGIN_FAILURES


async def test_the_login_throttle_counts_per_user_and_per_address(
    sites: list[Site], redis_client: RedisClient, keys: Keys
) -> None:
    """Before: only the source address was counted: guesses at one user from many
    addresses were never refused."""
    a, b = sites
    console = ConsoleStore(redis_client, keys)
    await console.add_user("root", ADMIN_PASSWORD, "admin")
    await console.add_user("ops", VIEWER_PASSWORD, "viewer")
    async with (
        from_address("127.0.0.1") as here,
        from_address("127.0.0.2") as there,
        from_address("127.0.0.3") as third,
    ):
        for _ in range(LOGIN_FAILURES):
            assert (await login(here, a, "root", "wrong"))[0] == 401
        # root is refused from any address, and this address for any user
        status, error = await login(there, b, "root", ADMIN_PASSWORD)
        assert (status, error["error"]) == (429, "LoginThrottledError")
        assert "root" in error["message"]
        status, error = await login(here, b, "ops", VIEWER_PASSWORD)
        assert (status, error["error"]) == (429, "LoginThrottledError")
        assert "127.0.0.1" in error["message"]
        # another user from another address is not (a refused try took no slot)
        status, me = await login(there, a, "ops", VIEWER_PASSWORD)
        assert (status, me["user"]) == (200, "ops")
        # a login that succeeds gives its slot back
        for _ in range(LOGIN_FAILURES + 2):
            status, _ = await login(third, b, "ops", VIEWER_PASSWORD)
            assert status == 200


# -- bodies ------------------------------------------------------------------------------


async def test_bodies_too_deep_or_too_large_are_refused_in_words(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    """Before: 100,000 nested ``[`` answered 500 (a RecursionError inside json), and a
    body past the size limit 413 as a "NotFoundError"; a login's body was let as large as
    any other."""
    a = sites[0]
    for body in (b"[" * 100_000, b"[" * 50_000 + b"]" * 50_000, b'{"user": ' + b"[" * 5_000):
        status, error = await call(http, "POST", a.url + "/api/v1/login", data=body)
        assert (status, error["error"]) == (400, "RequestError"), error
        assert f"deeper than {MAX_DEPTH} levels" in error["message"]

    status, error = await call(http, "POST", a.url + "/api/v1/login", data=b" " * LOGIN_BODY * 2)
    assert (status, error["error"]) == (413, "BodyTooLargeError")  # (a login is small)

    headers = await csrf(http, a)
    url = a.url + "/api/v1/publish"

    def nested(depth: int) -> str:
        return '{"topic": "t", "extra": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"

    status, _ = await call(http, "POST", url, data=nested(MAX_DEPTH), headers=headers)
    assert status == 200
    status, error = await call(http, "POST", url, data=nested(MAX_DEPTH + 1), headers=headers)
    assert (status, error["error"]) == (400, "RequestError")
    # brackets inside strings are text, not nesting
    text = {"topic": "t", "payload": '"[\\' + "[{" * 20_000}
    status, _ = await call(http, "POST", url, data=json.dumps(text), headers=headers)
    assert status == 200

    status, error = await call(
        http, "POST", url, data=io.BytesIO(b" " * (MAX_BODY + 1)), headers=headers
    )
    assert (status, error["error"]) == (413, "BodyTooLargeError")
    assert f"{MAX_BODY:,}" in error["message"]


# -- CSRF on logout ----------------------------------------------------------------------


async def test_logout_needs_the_csrf_token(
    sites: list[Site], http: aiohttp.ClientSession, redis_client: RedisClient, keys: Keys
) -> None:
    """Before: ``POST /api/v1/logout`` was exempt, so another site could log a user out."""
    a, b = sites
    await ConsoleStore(redis_client, keys).add_user("ops", VIEWER_PASSWORD, "viewer")
    status, me = await login(http, a, "ops", VIEWER_PASSWORD)
    assert status == 200
    status, error = await call(http, "POST", b.url + "/api/v1/logout")
    assert (status, error["error"]) == (403, "AccessDeniedError")
    assert "X-CSRF-Token" in error["message"]
    assert (await call(http, "GET", a.url + "/api/v1/nodes"))[0] == 200  # (still logged in)
    wrong = {"X-CSRF-Token": "not-the-token"}
    assert (await call(http, "POST", b.url + "/api/v1/logout", headers=wrong))[0] == 403
    token = {"X-CSRF-Token": me["csrf"]}
    status, done = await call(http, "POST", b.url + "/api/v1/logout", headers=token)
    assert (status, done) == (200, {"logged_out": True})
    assert (await call(http, "GET", a.url + "/api/v1/nodes"))[0] == 401


# -- ids in paths ------------------------------------------------------------------------

ODD_IDS = ["{dev}", "a}{b", "plant/7 {x}", "100% #+ ?", "%7B", "ünï ☃"]


def client_url(site: Site, client_id: str, tail: str = "") -> URL:
    """The API path of a client, its id percent-encoded as one path segment."""
    return URL(f"{site.url}/api/v1/clients/{quote(client_id, safe='')}{tail}", encoded=True)


async def test_client_ids_of_any_characters_are_viewed_kicked_and_cleared(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    """Before: an id holding ``{`` or ``}`` (or an encoded ``/``) matched no route: 404."""
    a, b = sites
    headers = await csrf(http, a)
    for client_id in ODD_IDS:
        client = await RawClient.connect(b.port, client_id, clean_start=True, expiry=600)
        try:
            status, detail = await call(http, "GET", client_url(a, client_id))
            assert (status, detail.get("client_id")) == (200, client_id), detail
            status, sent = await call(
                http, "POST", client_url(a, client_id, "/kick"), headers=headers
            )
            assert (status, sent["client_id"], sent["node"]) == (200, client_id, "b"), sent
            await client.closed(WAIT)

            async def away(client_id: str = client_id) -> bool:
                found = await call(http, "GET", client_url(a, client_id))
                return found[0] == 200 and found[1]["state"] == "away"

            await waiting.eventually(away, WAIT, f"{client_id!r} is away")
            url = client_url(a, client_id, "/session")
            status, cleared = await call(http, "DELETE", url, headers=headers)
            assert (status, cleared) == (200, {"client_id": client_id, "cleared": True})
            status, error = await call(http, "GET", client_url(b, client_id))
            assert (status, error["error"]) == (404, "ClientNotFoundError")
        finally:
            client.drop()

    # a ban on such an id is lifted by its path too
    ban = {"kind": "client", "value": "{dev}/1"}
    status, _ = await call(http, "POST", a.url + "/api/v1/bans", json=ban, headers=headers)
    assert status == 201
    lift = URL(f"{a.url}/api/v1/bans/client/{quote('{dev}/1', safe='')}", encoded=True)
    status, removed = await call(http, "DELETE", lift, headers=headers)
    assert (status, removed) == (200, {"removed": True})


# -- state errors ------------------------------------------------------------------------


async def test_a_rule_position_out_of_range_is_bad_input_not_redis_down(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    """Before: the script's refusal (a ScriptError, a StateError) answered 503 as if
    Redis were down."""
    a = sites[0]
    headers = await csrf(http, a)
    for position in (10**30, 10**9):
        rule = {"rule": "allow all subscribe sensors/#", "position": position}
        status, error = await call(http, "POST", a.url + "/api/v1/acl", json=rule, headers=headers)
        assert (status, error["error"]) == (400, "InvalidSettingError"), error
        assert "position" in error["message"] and not CLASS_NAME.search(error["message"])
    rule = {"rule": "allow all subscribe sensors/#", "position": 999_999_999}
    status, added = await call(http, "POST", a.url + "/api/v1/acl", json=rule, headers=headers)
    assert (status, added) == (201, {"position": 1})
