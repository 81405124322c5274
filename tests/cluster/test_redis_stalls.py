"""A Redis that stops answering (its process stopped with SIGSTOP): calls fail within
their deadlines instead of blocking (issue 14, silent loss 6), on a throwaway server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import router
from router.errors import PublishTimeoutError
from router.state.keys import Keys
from tests.support import waiting
from tests.support.servers import RedisServer, stopped


async def test_a_publish_fails_within_its_deadline_when_redis_stops_answering(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    server = redis_server_factory()
    options = {"prefix": keys.prefix, "heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    bounds = {"redis_timeout": 0.5, "publish_timeout": 1.0}
    async with (
        router.connect(server.url, node_id="a", **bounds, **options) as a,
        router.connect(server.url, node_id="b", **options) as b,
    ):
        await b.subscribe("phone", "news")
        await waiting.eventually(lambda: "b" in a.mirror.match("news").nodes, 5.0, "a routes")
        with stopped(server):
            async with asyncio.timeout(5.0):  # (the bound of the test, not of the node)
                with pytest.raises(PublishTimeoutError):
                    await a.publish("news", b"unanswered")
