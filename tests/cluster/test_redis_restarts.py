"""Sessions across a restart of a real ``redis-server`` (append-only file): what the
model-based session test found there, each as a test of its own."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from router.errors import RouterError
from router.state.keys import Keys
from tests.support.nodes import RestartableNodes, take
from tests.support.servers import RedisServer
from tests.support.waiting import retried

TIMING = {
    "heartbeat_interval": 0.2,
    "heartbeat_ttl": 1.0,
    "handoff_timeout": 1.0,
    "handoff_grace": 0.3,
}


@pytest.mark.redis
async def test_a_takeover_right_after_a_restart_hands_on_what_the_old_node_held(
    redis_server_factory: Callable[..., RedisServer], keys: Keys, restartable: RestartableNodes
) -> None:
    """Found by the model-based session test: a client's connection on c holds a QoS 1
    copy it has not read; Redis restarts; the client connects to a. c's inbox reader was
    still catching up after the restart when its heartbeat audit saw a's claim twice, so
    c closed its copy of the session (as for a lost takeover notice) and dropped the copy
    instead of handing it on; a waited its whole handoff timeout for nothing. The audit
    now leaves that to the notice while the inbox is not heard."""
    server = redis_server_factory(aof=True)
    a = await restartable.start(server.url, keys, "a", **TIMING)
    await restartable.start(server.url, keys, "b", **TIMING)
    c = await restartable.start(server.url, keys, "c", **TIMING)
    await c.connect("phone", clean_start=False, expiry=600)
    await c.subscribe("phone", "news", qos=1)
    server.kill()
    with pytest.raises(RouterError):  # (Redis is away: CONNACK 0x88)
        await a.connect("phone", clean_start=False, expiry=600)
    server.restart()
    await retried(  # (a pooled connection may meet the restart: not acknowledged)
        functools.partial(c.publish, "news", b"held by c", qos=1), 5, (RouterError,), poll=0.1
    )

    await retried(
        functools.partial(a.connect, "phone", clean_start=False, expiry=600),
        5,
        (RouterError,),
        poll=0.1,
    )

    [delivery] = await take(a, "phone", 1)
    assert delivery.payload == b"held by c"
    assert a.stats()["handoffs_missed"] == 0
