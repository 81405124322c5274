"""Route hints (router.state.route_hints): which subscription hears them, so that a node
can tell whether a hint may have been missed since it last looked (a join announced
while its connection was down); on a real Redis and a cluster."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from router.errors import StateFailureError
from router.state.keys import Keys
from router.state.route_hints import RouteHints
from router.state.scripts import RedisClient

DEAD_URL = "redis://127.0.0.1:1/0"  # (nothing listens on port 1: refused at once)


@pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)
async def test_each_subscription_has_a_number_and_none_is_listening_once_closed(
    redis_client: RedisClient, keys: Keys
) -> None:
    hints = RouteHints(redis_client, keys)
    assert hints.listening is None
    await hints.subscribe()
    assert hints.listening == 1
    await redis_client.publish(hints.channel, "n1")
    heard = None
    for _ in range(20):  # (bounded: the subscription's own confirmation comes first)
        heard = heard or await hints.message(0.1)
    assert heard is not None and heard.data == b"n1"
    await hints.subscribe()  # (a new connection: a hint in between may be missed)
    assert hints.listening == 2
    await hints.close()
    assert hints.listening is None


async def test_a_subscription_that_fails_leaves_none_listening(keys: Keys) -> None:
    dead = Redis.from_url(DEAD_URL, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    hints = RouteHints(dead, keys)
    try:
        with pytest.raises(StateFailureError):
            await hints.subscribe()
        assert hints.listening is None
    finally:
        await hints.close()
        await dead.aclose()
