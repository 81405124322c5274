"""The broadcaster backend (router.integrations.broadcast_backend) under broadcaster's own
``Broadcast``, with two workers (two backends, two nodes) on real Redis: standalone and
the 3-master Redis Cluster.

broadcaster's source distributions carry no tests, so these check what its README
documents (subscribe and publish through ``Broadcast``, several subscribers of a channel,
unsubscribe on leaving the ``subscribe`` context) plus what this backend adds: MQTT
wildcards in channel names, and subscribers' streams that go on across a Redis connection
dropped (a proxy cut, every connection killed) or a session the node ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
from broadcaster import Broadcast, Event
from redis.asyncio import Redis

from router.errors import (
    BadRedisURLError,
    BroadcastMessageError,
    ClientNotConnectedError,
    InvalidSettingError,
    InvalidTopicError,
    PublishTimeoutError,
)
from router.integrations.broadcast_backend import RouterBackend, TopicEvent, parse_url
from router.state.keys import Keys
from tests.support.cli import delete_namespace
from tests.support.proxy import proxy_to
from tests.support.servers import RedisClusterServers, RedisServer
from tests.support.waiting import eventually

DEADLINE = 10.0  # seconds any one step may take (the bound of a test, not of the backend)
Namespace = Callable[[str], str]


@pytest.fixture
def namespace(keys: Keys) -> Iterator[Namespace]:
    """The test's key prefix on a Redis URL; every key under it is deleted afterwards."""
    urls: list[str] = []

    def on(url: str) -> str:
        urls.append(url)
        return keys.prefix

    try:
        yield on
    finally:
        for url in urls:
            delete_namespace(url, keys)


@asynccontextmanager
async def workers(
    url: str, prefix: str, *names: str, **options: Any
) -> AsyncIterator[list[tuple[Broadcast, RouterBackend]]]:
    """One ``Broadcast`` per name, each on a backend made from a ``router+`` URL."""
    async with AsyncExitStack() as stack:
        found = []
        for name in names:
            backend = RouterBackend(f"router+{url}?prefix={prefix}&node_id={name}", **options)
            found.append((await stack.enter_async_context(Broadcast(backend=backend)), backend))
        yield found


async def next_event(subscriber: Any) -> TopicEvent:
    async with asyncio.timeout(DEADLINE):
        event = await subscriber.get()
    assert isinstance(event, TopicEvent)
    return event


async def routed(publisher: RouterBackend, subscriber: RouterBackend, topic: str) -> None:
    """Wait until ``publisher``'s node routes ``topic`` to ``subscriber``'s node."""
    await eventually(
        lambda: subscriber.node_id in publisher.node.mirror.match(topic).nodes,
        DEADLINE,
        f"{topic} routed to {subscriber.node_id}",
    )


# -- across workers ---------------------------------------------------------------------------


async def test_a_message_sent_on_one_worker_reaches_the_subscribers_of_every_worker(
    redis_url: str, namespace: Namespace
) -> None:
    async with (
        workers(redis_url, namespace(redis_url), "w1", "w2") as [(one, _), (two, _)],
        one.subscribe("chat/lobby") as here,
        two.subscribe("chat/lobby") as first,
        two.subscribe("chat/lobby") as second,  # (two subscribers, one subscription)
    ):
        await one.publish("chat/lobby", "hello")
        await one.publish("chat/lobby", b"\xffbytes")
        await one.publish("chat/lobby", 42)
        for subscriber in (here, first, second):
            events = [await next_event(subscriber) for _ in range(3)]
            assert events == [
                Event("chat/lobby", "hello"),
                Event("chat/lobby", "\ufffdbytes"),  # (not UTF-8: replaced in .message)
                Event("chat/lobby", "42"),
            ]
            assert [e.payload for e in events] == [b"hello", b"\xffbytes", b"42"]
            assert {e.topic for e in events} == {"chat/lobby"}
            assert events[0].delivery.publisher == "broadcast-w1"


async def test_wildcard_channels_each_get_the_messages_they_match(
    redis_url: str, namespace: Namespace
) -> None:
    async with (
        workers(redis_url, namespace(redis_url), "w1", "w2") as [(one, _), (two, backend)],
        two.subscribe("sensors/+/temp") as plus,
        two.subscribe("sensors/#") as hash_,
        two.subscribe("sensors/1/temp") as exact,
    ):
        await one.publish("sensors/1/temp", "21.5")
        await one.publish("sensors/2/humidity", "40")
        await one.publish("sensors/3/temp", "19")
        got = [await next_event(sub) for sub in (plus, exact, plus)]
        assert [(e.channel, e.topic, e.message) for e in got] == [
            ("sensors/+/temp", "sensors/1/temp", "21.5"),
            ("sensors/1/temp", "sensors/1/temp", "21.5"),
            ("sensors/+/temp", "sensors/3/temp", "19"),
        ]
        assert [(await next_event(hash_)).topic for _ in range(3)] == [
            "sensors/1/temp",
            "sensors/2/humidity",
            "sensors/3/temp",
        ]
        # one delivery per message from the node, one event per matching channel: 6 in
        # all, so "exact" got only its one
        assert backend.stats()["events"] == 6


async def test_leaving_the_subscribe_context_unsubscribes_after_the_last_subscriber(
    redis_url: str, namespace: Namespace
) -> None:
    async with workers(redis_url, namespace(redis_url), "w1", "w2") as [
        (one, sender),
        (two, receiver),
    ]:
        async with two.subscribe("news/#") as staying:
            async with two.subscribe("news/#"):
                await one.publish("news/a", "both")
            await one.publish("news/b", "still")
            assert [(await next_event(staying)).message for _ in range(2)] == ["both", "still"]
            assert receiver.node.stats()["routes"] == 1
        await eventually(
            lambda: not sender.node.mirror.match("news/c").nodes, DEADLINE, "route withdrawn"
        )
        assert receiver.node.stats()["routes"] == 0
        unrouted = sender.node.stats()["unrouted"]
        await one.publish("news/c", "nobody")
        assert sender.node.stats()["unrouted"] == unrouted + 1  # (no worker got a copy)


async def test_bad_channels_and_messages_raise_and_change_nothing(
    redis_standalone_url: str, namespace: Namespace
) -> None:
    async with workers(redis_standalone_url, namespace(redis_standalone_url), "w1") as [
        (one, backend)
    ]:
        with pytest.raises(InvalidTopicError):
            await one.publish("chat/+", "a topic has no wildcard")
        with pytest.raises(BroadcastMessageError) as refused:
            await one.publish("chat/lobby", {"not": "a message"})
        assert isinstance(refused.value, TypeError)
        with pytest.raises(InvalidTopicError):
            await backend.subscribe("chat/#/more")
        assert backend.node.stats()["routes"] == 0
        assert backend.stats()["publishes"] == 0
    with pytest.raises(ClientNotConnectedError):
        await backend.publish("chat/lobby", "after disconnect")


async def test_what_the_node_cannot_queue_is_counted_and_so_is_what_no_channel_wants(
    redis_standalone_url: str, namespace: Namespace
) -> None:
    """The backend read without ``Broadcast`` (whose listener would drain the queue):
    the node keeps ``queue_limit`` messages, drops the oldest and counts them; a message
    queued for a channel unsubscribed since is counted, not handed on."""
    prefix = namespace(redis_standalone_url)
    backend = RouterBackend(
        f"router+{redis_standalone_url}?prefix={prefix}&node_id=w1&queue_limit=2"
    )
    await backend.connect()
    try:
        await backend.subscribe("q/#")
        for number in range(5):
            await backend.publish(f"q/{number}", str(number))
        assert backend.stats()["queue_drops"] == 3
        assert [(await backend.next_published()).message for _ in range(2)] == ["3", "4"]
        await backend.publish("q/gone", "queued")
        await backend.unsubscribe("q/#")
        await backend.subscribe("q/again")
        await backend.publish("q/again", "wanted")
        assert (await backend.next_published()).message == "wanted"
        assert backend.stats()["unmatched"] == 1
    finally:
        await backend.disconnect()
    with pytest.raises(ClientNotConnectedError):
        await backend.next_published()


@pytest.mark.parametrize(
    ("url", "redis", "options"),
    [
        ("router+redis://h:1/0", "redis://h:1/0", {}),
        (
            "router+rediss://h:1/2?prefix=p&node_id=n",
            "rediss://h:1/2",
            {"prefix": "p", "node_id": "n"},
        ),
        (
            "redis://h:1/0?qos=0&heartbeat_ttl=2.5",
            "redis://h:1/0",
            {"qos": 0, "heartbeat_ttl": 2.5},
        ),
        (
            "router+redis://h:1/0?socket_keepalive=true&queue_limit=5",
            "redis://h:1/0?socket_keepalive=true",
            {"queue_limit": 5},
        ),
        ("router+redis://h:1/0?allow_eviction=yes", "redis://h:1/0", {"allow_eviction": True}),
    ],
)
def test_a_url_names_redis_and_the_router_options(
    url: str, redis: str, options: dict[str, Any]
) -> None:
    assert parse_url(url) == (redis, options)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: RouterBackend("memory://"), BadRedisURLError),
        (lambda: RouterBackend("router+redis://h/0?queue_limit=many"), InvalidSettingError),
        (lambda: RouterBackend("router+redis://h/0?allow_eviction=maybe"), InvalidSettingError),
        (lambda: RouterBackend("router+redis://h/0", qos=3), InvalidSettingError),
        (lambda: RouterBackend("router+redis://h/0", colour="blue"), InvalidSettingError),
    ],
)
def test_a_bad_url_or_option_raises_before_anything_connects(make: Any, error: type) -> None:
    with pytest.raises(error):
        make()


def test_keyword_arguments_win_over_the_url() -> None:
    backend = RouterBackend("router+redis://h/0?node_id=from-url&qos=0", node_id="kw", qos=2)
    assert (backend.node_id, backend.client_id, backend.qos) == ("kw", "broadcast-kw", 2)


# -- faults -----------------------------------------------------------------------------------


async def test_a_cut_redis_connection_loses_nothing_acknowledged_and_counts_what_failed(
    redis_standalone_server: RedisServer, namespace: Namespace
) -> None:
    """Worker w1 reaches Redis through a proxy the test cuts (shorter than the heartbeat
    TTL) and heals. Acknowledged publishes from both sides arrive, a publish that timed
    out raised and was counted, a subscribe made during the cut is applied after it, and
    the subscribers' streams go on."""
    url = redis_standalone_server.url
    prefix = namespace(url)
    with proxy_to(redis_standalone_server.port) as proxy:
        cut_url = f"redis://127.0.0.1:{proxy.port}/0"
        async with (
            workers(cut_url, prefix, "w1", redis_timeout=0.5, publish_timeout=1.0) as [(one, a)],
            workers(url, prefix, "w2") as [(two, b)],
            one.subscribe("t/#") as on_one,
            two.subscribe("t/#") as on_two,
            AsyncExitStack() as stack,
        ):
            await routed(b, a, "t/x")
            await routed(a, b, "t/x")
            proxy.cut()
            await two.publish("t/during", "from w2")  # (w2 reaches Redis: acknowledged)
            with pytest.raises(PublishTimeoutError):
                await one.publish("t/timed-out", "maybe later")
            late = asyncio.create_task(one.publish("t/late", "from w1"))
            async with asyncio.timeout(DEADLINE):  # (deferred: it returns during the cut)
                on_later = await stack.enter_async_context(one.subscribe("later/+"))
            proxy.heal()
            async with asyncio.timeout(DEADLINE):
                await late  # acknowledged once Redis is back
            assert a.stats()["publish_failures"] == 1
            assert a.stats()["deferred"] >= 1

            seen_one = [(await next_event(on_one)).message for _ in range(2)]
            # ("maybe later" may come too, at least once, before or between them)
            seen_one += [
                e.message async for e in until(on_one, {"from w1", "from w2"} - {*seen_one})
            ]
            assert {"from w2", "from w1"} <= set(seen_one)
            assert "from w1" in [e.message async for e in until(on_two, {"from w1"})]

            await routed(b, a, "later/x")
            await two.publish("t/after", "after the heal")
            await two.publish("later/x", "deferred subscribe")
            assert [e.message async for e in until(on_one, {"after the heal"})][
                -1
            ] == "after the heal"
            event = await next_event(on_later)
            assert (event.channel, event.topic, event.message) == (
                "later/+",
                "later/x",
                "deferred subscribe",
            )


async def test_a_cut_longer_than_the_ttl_is_counted_and_the_streams_go_on_after_it(
    redis_standalone_server: RedisServer, namespace: Namespace
) -> None:
    """w1's cut outlasts the heartbeat TTL: w2 purges it (and stops routing to it), w1
    counts the cut off; once healed w1 registers again with its routes and the
    subscribers' streams on both sides go on."""
    url = redis_standalone_server.url
    prefix = namespace(url)
    fast = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
    with proxy_to(redis_standalone_server.port) as proxy:
        cut_url = f"redis://127.0.0.1:{proxy.port}/0"
        async with (
            workers(cut_url, prefix, "w1", redis_timeout=0.5, **fast) as [(one, a)],
            workers(url, prefix, "w2", **fast) as [(two, b)],
            one.subscribe("t/#") as on_one,
            two.subscribe("t/#") as on_two,
        ):
            await routed(b, a, "t/x")
            await eventually(b.node.liveness.steady, DEADLINE, "w2 may purge")
            proxy.cut()
            await eventually(lambda: a.stats()["cut_offs"] == 1, DEADLINE, "w1 cut off")
            await eventually(lambda: "w1" not in b.node.mirror.nodes(), DEADLINE, "w1 purged by w2")
            proxy.heal()
            await routed(b, a, "t/x")
            await routed(a, b, "t/x")
            await two.publish("t/back", "from w2")
            await one.publish("t/back", "from w1")
            assert "from w2" in [e.message async for e in until(on_one, {"from w2", "from w1"})]
            assert "from w1" in [e.message async for e in until(on_two, {"from w2", "from w1"})]
            assert b.stats()["cut_offs"] == 0


async def until(subscriber: Any, messages: set[str]) -> AsyncIterator[TopicEvent]:
    """The subscriber's events up to the one that brings the last of ``messages``."""
    waiting = set(messages)
    while waiting:
        event = await next_event(subscriber)
        waiting.discard(event.message)
        yield event


async def test_every_connection_killed_on_the_cluster_loses_nothing_acknowledged(
    redis_cluster_servers: RedisClusterServers, namespace: Namespace
) -> None:
    """Every client connection of every master is killed, and the masters stop answering
    for a second: a message published meanwhile arrives once they answer, and the
    subscribers' streams go on (broadcaster's Redis backend hangs here: broadcaster#144)."""
    url = redis_cluster_servers.url
    async with (
        workers(url, namespace(url), "w1", "w2") as [(one, a), (two, b)],
        one.subscribe("room/+") as on_one,
        two.subscribe("room/+") as on_two,
    ):
        await routed(a, b, "room/x")
        await routed(b, a, "room/x")
        await one.publish("room/before", "before")
        assert (await next_event(on_two)).message == "before"
        assert (await next_event(on_one)).message == "before"
        killed = 0
        for server in redis_cluster_servers.nodes:
            admin = Redis(host="127.0.0.1", port=server.port)
            try:
                pipe = admin.pipeline(transaction=False)
                pipe.execute_command("CLIENT", "KILL", "TYPE", "normal")
                pipe.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                pipe.execute_command("CLIENT", "PAUSE", "1000", "ALL")
                normal, pubsub, _ = await pipe.execute()
                killed += normal + pubsub
            finally:
                await admin.aclose()
        assert killed > 0
        async with asyncio.timeout(DEADLINE):
            await one.publish("room/during", "during")  # (waits for the masters)
            await two.publish("room/after", "after")
        # (two publishers: MQTT orders the messages of each, not of both together)
        assert {(await next_event(on_two)).message for _ in range(2)} == {"during", "after"}
        assert {(await next_event(on_one)).message for _ in range(2)} == {"during", "after"}
        assert a.stats()["publish_failures"] == b.stats()["publish_failures"] == 0


async def test_a_session_the_node_ended_is_attached_again_with_every_channel(
    redis_standalone_url: str, namespace: Namespace
) -> None:
    """An operator's kick ends the backend's client on its node: the backend attaches
    again, subscribes every channel again, and the subscriber's stream goes on."""
    async with (
        workers(redis_standalone_url, namespace(redis_standalone_url), "w1", "w2") as [
            (one, a),
            (two, b),
        ],
        two.subscribe("alerts/#") as alerts,
        two.subscribe("jobs/+") as jobs,
    ):
        assert await b.node.kick(b.client_id)
        await eventually(lambda: b.stats()["resubscribes"] == 1, DEADLINE, "resubscribed")
        await routed(a, b, "alerts/fire")
        await routed(a, b, "jobs/1")
        await one.publish("alerts/fire", "evacuate")
        await one.publish("jobs/1", "run")
        assert (await next_event(alerts)).topic == "alerts/fire"
        assert (await next_event(jobs)).channel == "jobs/+"
