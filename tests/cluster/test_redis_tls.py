"""Nodes and the CLI on a TLS-only ``redis-server`` (``rediss://`` with the CA in the
URL: ``?ssl_ca_certs=FILE``); a URL without the CA is refused with one error line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import router
from router.cli import app
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import take
from tests.support.pki import make_pki
from tests.support.servers import RedisServer

pytestmark = pytest.mark.redis  # (a server of its own, not from the fixtures)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tls=make_pki(tmp_path_factory.mktemp("pki")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_nodes_route_across_a_tls_only_redis(tls_redis: RedisServer, keys: Keys) -> None:
    options = {"prefix": keys.prefix, "heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    async with (
        router.connect(tls_redis.url, node_id="a", **options) as a,
        router.connect(tls_redis.url, node_id="b", **options) as b,
    ):
        await b.subscribe("phone", "news")
        await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5.0, "a routes")
        await a.publish("news", b"over TLS")
        [delivery] = await take(b, "phone", 1)
        assert delivery.payload == b"over TLS"


def test_the_cli_over_tls_and_without_the_ca(tls_redis: RedisServer, keys: Keys) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["nodes", "--redis", tls_redis.url, "--prefix", keys.prefix])
    assert listed.exit_code == 0, listed.output
    no_ca = tls_redis.url.partition("?")[0]
    refused = runner.invoke(app, ["nodes", "--redis", no_ca])
    assert refused.exit_code == 1
    assert (
        refused.stderr.startswith("Error: cannot reach Redis") and "certificate" in refused.stderr
    )
    assert len(refused.stderr.splitlines()) == 1
