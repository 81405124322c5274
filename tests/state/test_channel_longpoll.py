"""Channel long polls: wake-ups, timeouts, cancellation and the socket-timeout trap.

"Prompt" means within PROMPT seconds of the publish. The tests wait on conditions with
deadlines (the wake-up subscription is visible in PUBSUB NUMSUB), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import count
from typing import Any

import pytest
import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from router.errors import StateUnavailableError, SubscriptionNotFoundError
from router.state.channels import Channel, FetchResult, WakeUps
from router.state.connection import pubsub_client
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.state.test_channels import EXPIRE, NAME, ids
from tests.support.servers import RedisClusterServers, RedisServer
from tests.support.waiting import eventually, wait_until

# A woken poll returns within milliseconds, one that missed its wake-up only at the end
# of its wait (5 s or more wherever PROMPT judges a wake-up): 1.5 s tells them apart and
# leaves room for a loaded machine (0.5 s was once missed at 1.3 s, 14 minutes into a
# full run on two shared cores).
PROMPT = 1.5


@pytest.fixture
async def channel(redis_client: RedisClient, keys: Keys) -> AsyncIterator[Channel]:
    ch = Channel(redis_client, NAME, expire=EXPIRE, keys=keys)
    try:
        yield ch
    finally:
        await ch.aclose()


def now() -> float:
    return asyncio.get_running_loop().time()


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 5) -> None:
    await eventually(condition, timeout, what)


async def listeners(redis: RedisClient, channel: Channel, *, sharded: bool | None = None) -> int:
    """How many connections are subscribed to the channel's wake-ups (on the listener's node):
    to the shard channel on a cluster, the plain channel otherwise (``sharded`` chooses)."""
    wake = channel.keys.channel_wakeup(channel.name)
    if sharded is None:
        sharded = isinstance(redis, RedisCluster)
    command = "PUBSUB SHARDNUMSUB" if sharded else "PUBSUB NUMSUB"
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(wake)
        reply = await redis.execute_command(command, wake, target_nodes=node)
    else:
        reply = await redis.execute_command(command, wake)  # type: ignore[no-untyped-call]
    counts: list[Any] = list(reply.items()) if isinstance(reply, dict) else list(reply)
    flat: list[Any] = []
    for item in counts:
        flat.extend(item if isinstance(item, list | tuple) else [item])
    return int(flat[1])


def listening(redis: RedisClient, channel: Channel, expected: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await listeners(redis, channel) == expected

    return check


async def armed(redis: RedisClient, channel: Channel) -> None:
    await until(listening(redis, channel, 1), "the wake-up subscription")


async def test_long_poll_returns_promptly_after_a_publish(
    channel: Channel, redis_client: RedisClient
) -> None:
    await channel.add_subscriber("s")
    poll = asyncio.create_task(channel.fetch("s", wait=5))
    await armed(redis_client, channel)
    assert not poll.done()
    published_at = now()
    await channel.publish([("m", b"x")])
    result = await asyncio.wait_for(poll, 2)
    assert now() - published_at < PROMPT
    assert ids(result) == ["m"]


async def test_long_poll_returns_at_once_when_messages_wait(channel: Channel) -> None:
    await channel.add_subscriber("s")
    await channel.publish([("m", b"x")])
    started = now()
    assert ids(await channel.fetch("s", wait=5)) == ["m"]
    assert now() - started < PROMPT


async def test_long_poll_returns_empty_after_the_wait(channel: Channel) -> None:
    await channel.add_subscriber("s")
    started = now()
    result = await channel.fetch("s", wait=2)
    elapsed = now() - started
    assert result == FetchResult((), None, False)
    assert 1.95 <= elapsed < 2 + PROMPT


async def test_long_poll_of_a_missing_subscriber_fails_at_once(channel: Channel) -> None:
    started = now()
    with pytest.raises(SubscriptionNotFoundError):
        await channel.fetch("nobody", wait=5)
    assert now() - started < PROMPT


async def test_cancelled_long_poll_returns_promptly(
    channel: Channel, redis_client: RedisClient
) -> None:
    await channel.add_subscriber("s")
    poll = asyncio.create_task(channel.fetch("s", wait=30))
    await armed(redis_client, channel)
    cancelled_at = now()
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(poll, 2)
    assert now() - cancelled_at < PROMPT
    # The shared subscription survives a cancelled poll: the next one still wakes up.
    poll = asyncio.create_task(channel.fetch("s", wait=5))
    await asyncio.sleep(0)
    published_at = now()
    await channel.publish([("m", b"x")])
    assert ids(await asyncio.wait_for(poll, 2)) == ["m"]
    assert now() - published_at < PROMPT


async def test_no_wake_up_is_lost_between_fetch_and_wait(
    channel: Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message published right after the first (empty) fetch still wakes the poll."""
    await channel.add_subscriber("s")
    fetch_now = channel._fetch_now
    calls = 0

    async def fetch_then_publish(
        subscriber: str, cursor: str, limit: int
    ) -> tuple[FetchResult, int]:
        nonlocal calls
        calls += 1
        result, position = await fetch_now(subscriber, cursor, limit)
        if calls == 1:
            assert result.messages == ()
            await channel.publish([("racer", b"x")])
        return result, position

    monkeypatch.setattr(channel, "_fetch_now", fetch_then_publish)
    started = now()
    result = await channel.fetch("s", wait=10)
    assert ids(result) == ["racer"] and calls == 2
    assert now() - started < PROMPT


async def test_concurrent_long_polls_share_one_subscription(
    channel: Channel, redis_client: RedisClient
) -> None:
    await channel.add_subscriber("s")
    await channel.add_subscriber("t")
    polls = [asyncio.create_task(channel.fetch(sub, wait=5)) for sub in ("s", "t", "s")]
    await armed(redis_client, channel)
    assert await listeners(redis_client, channel) == 1
    published_at = now()
    await channel.publish([("m", b"x")])
    results = await asyncio.wait_for(asyncio.gather(*polls), 2)
    assert now() - published_at < PROMPT
    assert [ids(result) for result in results] == [["m"], ["m"], ["m"]]


async def test_a_wake_up_exactly_when_something_was_stored(
    channel: Channel, redis_client: RedisClient
) -> None:
    listener = pubsub_client(redis_client, channel.keys.channel_wakeup(NAME))
    pubsub = listener.pubsub()
    sharded = isinstance(redis_client, RedisCluster)  # a shard channel on a cluster
    try:
        if sharded:
            await pubsub.ssubscribe(channel.keys.channel_wakeup(NAME))
        else:
            await pubsub.subscribe(channel.keys.channel_wakeup(NAME))
        first = await pubsub.get_message(timeout=5)
        assert first is not None and first["type"] == ("ssubscribe" if sharded else "subscribe")

        async def next_wake_up() -> bytes:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
            assert message is not None
            assert message["type"] == ("smessage" if sharded else "message")
            data: bytes = message["data"]
            return data

        await channel.publish([("a", b"1"), ("b", b"2"), ("c", b"3")])
        assert await next_wake_up() == b"3"  # one wake-up for the batch
        await channel.publish([])
        await channel.publish([("a", b"again"), ("b", b"again")])  # duplicates only
        await channel.publish([("a", b"again"), ("d", b"4")])
        assert await next_wake_up() == b"4"  # nothing came from the two calls before
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await listener.aclose()


@pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)
async def test_long_poll_outlives_the_default_socket_timeout(
    channel: Channel, redis_client: RedisClient
) -> None:
    """redis-py's default socket_timeout is 5 s; a wait=10 poll must neither fail nor stall."""
    assert isinstance(redis_client, Redis)
    connection = await redis_client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    try:  # the client's connections have redis-py's default timeout: the trap is live
        assert connection.socket_timeout == 5
    finally:
        await redis_client.connection_pool.release(connection)
    await channel.add_subscriber("s")
    await channel.add_subscriber("quiet")
    started = now()
    poll = asyncio.create_task(channel.fetch("s", wait=10))
    # Beside it, without a publish, a poll longer than the socket timeout returns empty at
    # its end.
    quiet = asyncio.create_task(channel.fetch("quiet", wait=6))
    await armed(redis_client, channel)
    pubsub = channel.wakeups._pubsub
    assert pubsub is not None and pubsub.connection is not None
    assert pubsub.connection.socket_timeout is None  # the listener's own: no socket timeout
    assert await asyncio.wait_for(quiet, 6 + PROMPT + 1) == FetchResult((), None, False)
    assert 5.95 <= now() - started < 6 + PROMPT
    assert not poll.done()  # still waiting after more than 5 s of silence
    published_at = now()
    await channel.publish([("m", b"x")])
    result = await asyncio.wait_for(poll, 2)
    assert now() - published_at < PROMPT
    assert ids(result) == ["m"] and result.ack_handle is not None
    assert await channel.ack("s", result.ack_handle) is True


@pytest.mark.parametrize("redis_backend", ["standalone"], indirect=True)
async def test_long_poll_recovers_when_its_connection_is_killed(
    channel: Channel, redis_client: RedisClient
) -> None:
    await channel.add_subscriber("s")
    poll = asyncio.create_task(channel.fetch("s", wait=10))
    await armed(redis_client, channel)
    assert isinstance(redis_client, Redis)
    (killed,) = [client["id"] for client in await redis_client.client_list(_type="pubsub")]
    assert await redis_client.client_kill_filter(_type="pubsub") == 1

    async def subscribed_again() -> bool:
        clients = await redis_client.client_list(_type="pubsub")
        return [c["id"] for c in clients if c["id"] != killed] != [] and await listening(
            redis_client, channel, 1
        )()

    # The poll notices, subscribes again on a new connection and keeps waiting.
    await until(subscribed_again, "a new subscription")
    assert not poll.done()
    published_at = now()
    await channel.publish([("m", b"x")])
    assert ids(await asyncio.wait_for(poll, 2)) == ["m"]
    assert now() - published_at < PROMPT


async def test_long_poll_fails_loudly_when_redis_goes_away_and_recovers(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    server = redis_server_factory()
    redis = Redis.from_url(server.url)
    try:
        async with Channel(redis, NAME, expire=EXPIRE, keys=keys) as channel:
            await channel.add_subscriber("s")
            poll = asyncio.create_task(channel.fetch("s", wait=10))
            await armed(redis, channel)
            server.kill()
            killed_at = now()
            with pytest.raises(StateUnavailableError) as raised:
                await asyncio.wait_for(poll, 2)
            assert isinstance(raised.value.__cause__, RedisConnectionError)
            assert now() - killed_at < PROMPT
            server.start()  # same port, empty: no keys, no scripts

            async def reconnected() -> bool:  # the test's own client drops its stale socket
                with contextlib.suppress(RedisConnectionError):
                    return bool(await redis.ping())
                return False

            await until(reconnected, "the client to reconnect")
            assert await channel.add_subscriber("s") is True
            poll = asyncio.create_task(channel.fetch("s", wait=5))
            await armed(redis, channel)
            published_at = now()
            await channel.publish([("m", b"x")])
            assert ids(await asyncio.wait_for(poll, 2)) == ["m"]
            assert now() - published_at < PROMPT
    finally:
        await redis.aclose()


@pytest.mark.parametrize("redis_backend", ["cluster"], indirect=True)
async def test_long_polls_on_every_master(redis_client: RedisClient, keys: Keys) -> None:
    assert isinstance(redis_client, RedisCluster)
    by_node: dict[str, str] = {}
    for i in count():
        name = f"poll{i}"
        node = redis_client.get_node_from_key(keys.channel(name))
        assert node is not None
        by_node.setdefault(node.name, name)
        if len(by_node) == 3:
            break
    for name in by_node.values():
        async with Channel(redis_client, name, expire=EXPIRE, keys=keys) as channel:
            await channel.add_subscriber("s")
            poll = asyncio.create_task(channel.fetch("s", wait=5))
            await armed(redis_client, channel)
            # A shard channel: the announcement stays on this master (SPUBLISH), and the
            # only listener is on the shard channel, so it is what wakes the poll.
            assert await listeners(redis_client, channel, sharded=False) == 0
            published_at = now()
            await channel.publish([("m", b"x")])
            assert ids(await asyncio.wait_for(poll, 2)) == ["m"]
            assert now() - published_at < PROMPT


def _move_slot(servers: RedisClusterServers, slot: int, source: int, target: int) -> None:
    """Hand an empty slot from master ``source`` to master ``target`` (indexes of
    ``servers.nodes``), the way ``redis-cli --cluster reshard`` does, and wait until every
    master agrees."""
    clients = [redis.Redis(host="127.0.0.1", port=node.port) for node in servers.nodes]
    try:
        node_ids = [client.execute_command("CLUSTER", "MYID").decode() for client in clients]
        assert clients[source].execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        clients[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_ids[source])
        clients[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_ids[target])
        for index in (
            target,
            source,
            *(i for i in range(len(clients)) if i not in (source, target)),
        ):
            clients[index].execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_ids[target])

        def agreed() -> bool:
            for client in clients:
                owner = [
                    e for e in client.execute_command("CLUSTER", "SLOTS") if e[0] <= slot <= e[1]
                ]
                if not owner or owner[0][2][1] != servers.nodes[target].port:
                    return False
            return True

        wait_until(agreed, 10, f"every master to see slot {slot} on its new owner")
    finally:
        for client in clients:
            client.close()


def _owned_slots(client: redis.Redis) -> set[int]:
    """The slots the master behind ``client`` serves."""
    port = client.connection_pool.connection_kwargs["port"]
    ranges = client.execute_command("CLUSTER", "SLOTS")
    return {
        slot
        for start, end, primary, *_ in ranges
        if primary[1] == port
        for slot in range(start, end + 1)
    }


@pytest.mark.parametrize("redis_backend", ["cluster"], indirect=True)
async def test_wake_ups_follow_a_slot_that_moves(
    redis_client: RedisClient, redis_cluster_servers: RedisClusterServers
) -> None:
    assert isinstance(redis_client, RedisCluster)
    first = redis.Redis(host="127.0.0.1", port=redis_cluster_servers.nodes[0].port)
    try:  # a channel in an empty slot of the first master (an empty slot can just be handed on)
        owned = _owned_slots(first)
        channel = next(
            name
            for name in (f"moving-{i}" for i in count())
            if redis_client.keyslot(name) in owned
            and first.execute_command("CLUSTER", "COUNTKEYSINSLOT", redis_client.keyslot(name)) == 0
        )
    finally:
        first.close()
    slot = redis_client.keyslot(channel)
    wake_ups = WakeUps(redis_client, channel)
    try:
        generation = await wake_ups.arm()
        _move_slot(redis_cluster_servers, slot, 0, 1)
        try:
            # The old owner ends the shard subscription: the waiters are woken to fetch.
            assert await wake_ups.wait(generation, 5)
            assert wake_ups.lost
            generation = await wake_ups.arm()  # subscribes again, on the new owner
            new_owner = redis_client.get_node_from_key(channel)
            assert new_owner is not None and new_owner.port == redis_cluster_servers.nodes[1].port
            await redis_client.execute_command("SPUBLISH", channel, "7", target_nodes=new_owner)
            assert await wake_ups.wait(generation, 5)
        finally:
            await wake_ups.aclose()
            _move_slot(redis_cluster_servers, slot, 1, 0)
    finally:
        await wake_ups.aclose()
        await redis_client.initialize()
