"""Sentinel URLs: what ``redis+sentinel://`` and ``rediss+sentinel://`` URLs say, and the
typed error (and no connection) for each malformed one."""

from __future__ import annotations

import pytest

from router.errors import BadRedisURLError
from router.state.connection import open_redis
from router.state.sentinel_url import DEFAULT_PORT, SentinelURL, is_sentinel_url


@pytest.mark.parametrize(
    ("url", "sentinels", "master", "db"),
    [
        ("redis+sentinel://10.0.0.1:26380/mymaster", (("10.0.0.1", 26380),), "mymaster", 0),
        (
            "redis+sentinel://s1:1,s2:2,s3:3/cache/4",
            (("s1", 1), ("s2", 2), ("s3", 3)),
            "cache",
            4,
        ),
        ("redis+sentinel://s1,s2/m/", (("s1", DEFAULT_PORT), ("s2", DEFAULT_PORT)), "m", 0),
        ("redis+sentinel://[::1]:26380,[fe80::1]/m", (("::1", 26380), ("fe80::1", 26379)), "m", 0),
        ("REDIS+SENTINEL://h/my%20master/15", (("h", DEFAULT_PORT),), "my master", 15),
    ],
)
def test_a_sentinel_url_names_its_sentinels_master_and_database(
    url: str, sentinels: tuple[tuple[str, int], ...], master: str, db: int
) -> None:
    parsed = SentinelURL.parse(url)
    assert (parsed.sentinels, parsed.master, parsed.db) == (sentinels, master, db)
    assert parsed.master_options() == {"db": db}
    assert parsed.sentinel_options() == {}
    assert is_sentinel_url(url)


def test_credentials_go_to_the_master_and_the_sentinels_have_their_own() -> None:
    parsed = SentinelURL.parse(
        "redis+sentinel://router:p%40ss%3Aword@h1,h2/m/2"
        "?sentinel_username=watch&sentinel_password=s3cret"
    )
    assert parsed.master_options() == {"db": 2, "username": "router", "password": "p@ss:word"}
    assert parsed.sentinel_options() == {"username": "watch", "password": "s3cret"}
    assert "p@ss" not in repr(parsed) and "p@ss" not in parsed.shown()
    assert parsed.shown() == "redis+sentinel://router:***@h1:26379,h2:26379/m/2"
    password_only = SentinelURL.parse("redis+sentinel://secret@h/m")
    assert password_only.master_options() == {"db": 0, "password": "secret"}


def test_rediss_sentinel_speaks_tls_to_both_with_the_given_files() -> None:
    parsed = SentinelURL.parse(
        "rediss+sentinel://h:26380/m?ssl_ca_certs=/etc/ca.crt&ssl_cert_reqs=required"
    )
    tls = {"ssl": True, "ssl_ca_certs": "/etc/ca.crt", "ssl_cert_reqs": "required"}
    assert parsed.tls
    assert parsed.master_options() == {"db": 0, **tls}
    assert parsed.sentinel_options() == tls


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://h/0", "unix:///tmp/redis.sock", "sentinel://h/m"],
)
def test_other_urls_are_not_sentinel_urls(url: str) -> None:
    assert not is_sentinel_url(url)
    with pytest.raises(BadRedisURLError, match="starts with"):
        SentinelURL.parse(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379,h2:26379", "names the master"),
        ("redis+sentinel://h1:26379/", "names the master"),
        ("redis+sentinel://h1:26379//0", "names the master"),
        ("redis+sentinel:///mymaster", "at least one sentinel"),
        ("redis+sentinel://user:pw@/mymaster", "at least one sentinel"),
        ("redis+sentinel://h1,,h2/mymaster", "stray comma"),
        ("redis+sentinel://h1,/mymaster", "stray comma"),
        ("redis+sentinel://h1:port/mymaster", "a port is 1..65535"),
        ("redis+sentinel://h1:0/mymaster", "a port is 1..65535"),
        ("redis+sentinel://h1:65536/mymaster", "a port is 1..65535"),
        ("redis+sentinel://h1:-1/mymaster", "a port is 1..65535"),
        ("redis+sentinel://h1:/mymaster", "a port is 1..65535"),
        ("redis+sentinel://:26379/mymaster", "no host"),
        ("redis+sentinel://::1/mymaster", "goes in \\[ \\]"),
        ("redis+sentinel://[::1/mymaster", "\\[IPV6\\]:PORT"),
        ("redis+sentinel://[::1]26379/mymaster", "\\[IPV6\\]:PORT"),
        ("redis+sentinel://h/mymaster/zero", "is a number"),
        ("redis+sentinel://h/mymaster/0/1", "too many parts"),
        ("redis+sentinel://h/mymaster#x", "no #fragment"),
        ("redis+sentinel://h/mymaster?db=1", "unknown option 'db'"),
        ("redis+sentinel://h/mymaster?ssl_ca_certs=/ca", "need rediss\\+sentinel"),
        ("rediss+sentinel://h/mymaster?ssl_cert_reqs=maybe", "ssl_cert_reqs is one of"),
    ],
)
async def test_a_malformed_sentinel_url_is_a_typed_error_before_connecting(
    url: str, says: str
) -> None:
    with pytest.raises(BadRedisURLError, match=says) as raised:
        SentinelURL.parse(url)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(BadRedisURLError, match=says):  # (no sentinel listens there)
        await open_redis(url, socket_connect_timeout=0.5)
