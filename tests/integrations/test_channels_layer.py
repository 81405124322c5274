"""The Django Channels layer (router/integrations/channels_layer.py) against real Redis.

Each layer is one process's layer (its own node, its own channels); two or three of them in
one test stand for the workers of a site. Most tests run on standalone Redis and on the
3-master Redis Cluster; the connection cuts need a proxy, so standalone only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull

import router
from router.errors import (
    ChannelMessageError,
    ForeignChannelError,
    InvalidSettingError,
    RouterError,
)
from router.integrations.channels_layer import RouterChannelLayer
from tests.support.proxy import Proxy, proxy_to
from tests.support.waiting import eventually, retried

Make = Callable[..., RouterChannelLayer]
DEADLINE = 5.0
CUT_DEADLINE = 15.0  # (a node cut from Redis reads its inbox again within its inbox poll)


@pytest.fixture
async def layers(redis_url: str, prefix: str) -> AsyncIterator[Make]:
    """Makes layers on the test's Redis and namespace; all are closed afterwards."""
    made: list[RouterChannelLayer] = []

    def make(**config: Any) -> RouterChannelLayer:
        layer = RouterChannelLayer(config.pop("url", redis_url), prefix=prefix, **config)
        made.append(layer)
        return layer

    try:
        yield make
    finally:
        for layer in made:
            await layer.close()


async def receive(layer: RouterChannelLayer, channel: str) -> Any:
    async with asyncio.timeout(DEADLINE):
        return await layer.receive(channel)


async def test_a_group_message_reaches_the_members_of_every_process(layers: Make) -> None:
    east, west = layers(), layers()
    here = await east.new_channel()
    there = [await west.new_channel(), await west.new_channel()]
    for channel, layer in ((here, east), (there[0], west), (there[1], west)):
        await layer.group_add("lobby", channel)
    await west.group_add("west-only", there[0])

    await east.group_send("lobby", {"type": "chat.message", "text": "hello"})
    await east.group_send("west-only", {"type": "chat.message", "text": "west"})

    assert await receive(east, here) == {"type": "chat.message", "text": "hello"}
    assert [(await receive(west, c))["text"] for c in there] == ["hello", "hello"]
    assert (await receive(west, there[0]))["text"] == "west"
    # one copy per process and message, whatever the number of members there
    assert west.stats()["received"] == 2


async def test_a_send_to_a_process_channel_reaches_that_process_only(layers: Make) -> None:
    owner, bystander, sender = layers(), layers(), layers()
    channel = await owner.new_channel()
    await bystander.new_channel()

    await sender.send(channel, {"type": "direct", "n": 1})

    assert await receive(owner, channel) == {"type": "direct", "n": 1}
    assert owner.stats()["received"] == 1
    assert bystander.stats()["received"] == 0
    with pytest.raises(ForeignChannelError):
        await bystander.receive(channel)
    await sender.send("specific.gone!x", {"n": 2})  # (no live process has that channel)
    assert sender.stats()["unrouted"] == 1


async def test_a_discarded_member_gets_nothing(layers: Make) -> None:
    east, west = layers(), layers()
    kept, dropped = await west.new_channel(), await west.new_channel()
    await west.group_add("room", kept)
    await west.group_add("room", dropped)
    await west.group_discard("room", dropped)
    await west.group_discard("room", "never.added!x")  # (no member: nothing happens)

    await east.group_send("room", {"n": 1})

    assert await receive(west, kept) == {"n": 1}
    await west.send(dropped, {"n": "marker"})  # (the members got it at once: none came)
    assert await receive(west, dropped) == {"n": "marker"}


async def test_a_full_channel_of_this_process_raises_channel_full(layers: Make) -> None:
    layer = layers(capacity=2, channel_capacity={"tiny.*": 1})
    channel, tiny = await layer.new_channel(), await layer.new_channel("tiny")
    await layer.send(channel, {"n": 1})
    await layer.send(channel, {"n": 2})
    await layer.send(tiny, {"n": 1})

    with pytest.raises(ChannelFull):
        await layer.send(channel, {"n": 3})
    with pytest.raises(ChannelFull):
        await layer.send(tiny, {"n": 2})
    assert [(await receive(layer, channel))["n"] for _ in range(2)] == [1, 2]
    await layer.send(channel, {"n": 4})  # (room again)
    assert (await receive(layer, channel))["n"] == 4


async def test_a_full_channel_elsewhere_drops_and_counts(layers: Make) -> None:
    sender, receiver = layers(), layers(capacity=2)
    channel = await receiver.new_channel()
    await receiver.group_add("room", channel)

    for n in range(3):
        await sender.send(channel, {"n": n})  # (no ChannelFull: the mailbox is not here)
    await sender.group_send("room", {"n": "group"})

    await eventually(lambda: receiver.stats()["full"] == 2, DEADLINE, receiver.stats)
    assert [(await receive(receiver, channel))["n"] for _ in range(2)] == [0, 1]


async def test_expired_messages_are_not_delivered(layers: Make) -> None:
    sender, receiver = layers(expiry=1), layers(expiry=1)
    channel = await receiver.new_channel()
    sent = time.time()
    await receiver.send(channel, {"n": "local"})
    await sender.send(channel, {"n": "remote"})

    await eventually(lambda: receiver.stats()["expired"] == 2, DEADLINE, receiver.stats)
    assert time.time() >= sent + 1  # (not before their second was up)
    await sender.send(channel, {"n": "fresh"})
    assert await receive(receiver, channel) == {"n": "fresh"}


async def test_a_membership_ends_after_the_group_expiry(layers: Make) -> None:
    sender, receiver = layers(), layers(group_expiry=1)
    old = await receiver.new_channel()
    await receiver.group_add("room", old)

    await eventually(lambda: receiver.stats()["groups"] == 0, DEADLINE, receiver.stats)
    young = await receiver.new_channel()
    await receiver.group_add("room", young)
    await sender.group_send("room", {"n": 1})
    await receiver.send(old, {"n": "marker"})

    assert await receive(receiver, young) == {"n": 1}
    assert await receive(receiver, old) == {"n": "marker"}


async def test_a_normal_channel_keeps_messages_until_a_process_receives(layers: Make) -> None:
    sender, receiver = layers(capacity=5), layers()
    for n in range(5):
        await sender.send("jobs.resize", {"n": n})
    with pytest.raises(ChannelFull):
        await sender.send("jobs.resize", {"n": 5})
    assert sender.stats()["parked"] == 5

    assert [(await receive(receiver, "jobs.resize"))["n"] for _ in range(5)] == [0, 1, 2, 3, 4]
    assert sender.stats()["parked"] == 0


async def test_the_receivers_of_a_normal_channel_share_its_messages(layers: Make) -> None:
    sender, receivers = layers(), [layers(), layers()]
    got: list[int] = []

    async def drain(layer: RouterChannelLayer) -> None:
        while True:
            got.append((await layer.receive("jobs.mail"))["n"])

    draining = [asyncio.create_task(drain(layer)) for layer in receivers]
    try:
        for n in range(20):
            await sender.send("jobs.mail", {"n": n})
        await eventually(lambda: len(got) >= 20, DEADLINE, lambda: sorted(got))
    finally:
        for task in draining:
            task.cancel()
        await asyncio.gather(*draining, return_exceptions=True)
    assert sorted(got) == list(range(20))  # (each message once, in one process or the other)


async def test_flush_forgets_messages_and_memberships(layers: Make) -> None:
    sender, receiver = layers(), layers()
    channel = await receiver.new_channel()
    await receiver.group_add("room", channel)
    await receiver.send(channel, {"n": "before"})
    first_node = receiver.node_id

    await receiver.flush()

    assert receiver.node_id is None
    await receiver.new_channel()  # (the layer goes on: a new node)
    assert receiver.node_id not in (None, first_node)
    await sender.group_send("room", {"n": "group"})
    await sender.send(channel, {"n": "after"})  # (the same inbox, after the group message)
    assert await receive(receiver, channel) == {"n": "after"}


async def test_sync_callers_share_the_process_node(layers: Make) -> None:
    layer = layers()
    channel = await layer.new_channel()
    await layer.group_add("room", channel)
    node_id = layer.node_id

    def from_a_view() -> None:  # (a Django view: every call on a new event loop)
        for n in range(3):
            async_to_sync(layer.group_send)("room", {"n": n})

    await asyncio.to_thread(from_a_view)

    assert layer.node_id == node_id
    assert [(await receive(layer, channel))["n"] for _ in range(3)] == [0, 1, 2]


async def test_mqtt_clients_see_groups_as_topics(redis_url: str, prefix: str, layers: Make) -> None:
    layer = layers()
    async with router.connect(redis_url, node_id="mqtt-side", prefix=prefix) as node:
        await node.subscribe("dashboard", "$asgi/g/+", qos=1)
        await layer.group_send("lobby", {"type": "chat.message", "text": "hi"})
        async with asyncio.timeout(DEADLINE):
            delivery = await anext(aiter(node.messages("dashboard")))
    assert delivery.topic == "$asgi/g/lobby"
    assert layer.deserialize(delivery.payload) == {"type": "chat.message", "text": "hi"}


@pytest.mark.parametrize(
    ("config", "complaint"),
    [
        ({"capacity": 0}, "capacity must be a positive int"),
        ({"capacity": 1.5}, "capacity must be a positive int"),
        ({"expiry": 0}, "expiry must be a positive number"),
        ({"group_expiry": -1}, "group_expiry must be a positive number"),
        ({"channel_capacity": {"chat.*": 0}}, "channel_capacity"),
        ({"hosts": ["redis://x"]}, "no option hosts"),
        ({"topic_root": "a/+/b"}, "topic_root"),
        ({"topic_root": "$share/x"}, "topic_root"),
    ],
)
def test_bad_settings_are_refused(config: dict[str, Any], complaint: str) -> None:
    with pytest.raises(InvalidSettingError, match=re.escape(complaint)):
        RouterChannelLayer("redis://127.0.0.1:1/0", **config)


@pytest.mark.parametrize("redis_url", ["standalone"], indirect=True)
async def test_bad_input_is_refused(layers: Make) -> None:
    layer = layers()
    with pytest.raises(TypeError):  # (channels' own name rules)
        await layer.send("bad/name", {})
    with pytest.raises(TypeError):
        await layer.group_add("bad group", "chan")
    with pytest.raises(ChannelMessageError):
        await layer.send("chan", {"when": object()})
    with pytest.raises(ForeignChannelError):
        await layer.receive("specific.someoneelse!abc")
    assert layer.serialize({"a": True}) == b"\x81\xa1a\xc3"  # (channels_redis's msgpack)


@pytest.mark.parametrize("redis_url", ["standalone"], indirect=True)
async def test_a_receiver_cut_from_redis_loses_nothing(redis_url: str, layers: Make) -> None:
    with proxy_to(port_of(redis_url)) as proxy:
        # (inbox_poll: how soon a node that missed its inbox's announcements reads it)
        sender, receiver = layers(), layers(url=through(proxy, redis_url), inbox_poll=0.5)
        channel = await receiver.new_channel()
        await receiver.group_add("room", channel)
        await sender.new_channel()  # (started before: a start waits for every node's ack)
        try:
            proxy.cut()
            for n in range(10):
                await sender.send(channel, {"n": n})
                await sender.group_send("room", {"n": 100 + n})
            proxy.heal()
            async with asyncio.timeout(CUT_DEADLINE):
                got = [(await receiver.receive(channel))["n"] for _ in range(20)]
        finally:
            proxy.heal()
            await receiver.close()
    assert sorted(got) == [*range(10), *range(100, 110)]
    assert receiver.stats()["full"] == receiver.stats()["expired"] == 0


@pytest.mark.parametrize("redis_url", ["standalone"], indirect=True)
async def test_a_sender_cut_from_redis_loses_no_acknowledged_message(
    redis_url: str, layers: Make
) -> None:
    with proxy_to(port_of(redis_url)) as proxy:
        sender = layers(
            url=through(proxy, redis_url), publish_timeout=0.5, redis_timeout=0.5, heartbeat_ttl=10
        )
        receiver = layers()
        channel = await receiver.new_channel()
        acknowledged: list[int] = []
        refused: list[int] = []

        async def send(n: int) -> None:
            try:
                await sender.send(channel, {"n": n})
            except RouterError:  # (a timeout says nothing of whether it was stored)
                refused.append(n)
                raise
            acknowledged.append(n)

        try:
            await send(0)
            proxy.cut()
            for n in (1, 2):
                with contextlib.suppress(RouterError):
                    await send(n)
            proxy.heal()
            for n in (3, 4):  # (retried until Redis answers again)
                await retried(lambda n=n: send(n), CUT_DEADLINE, (RouterError,))
            got: list[int] = []
            async with asyncio.timeout(CUT_DEADLINE):
                while not set(acknowledged) <= set(got):
                    got.append((await receiver.receive(channel))["n"])
        finally:
            proxy.heal()
            await sender.close()
    assert {1, 2} <= set(refused)
    assert set(acknowledged) <= set(got) <= set(range(5))
    assert all(got.count(n) == 1 or n in refused for n in got)  # (a refused one may come twice)


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def through(proxy: Proxy, url: str) -> str:
    return url.replace(f":{port_of(url)}", f":{proxy.port}")


@pytest.mark.parametrize("redis_url", ["standalone"], indirect=True)
async def test_a_first_use_without_redis_raises_and_the_next_one_starts(
    redis_url: str, layers: Make
) -> None:
    with proxy_to(port_of(redis_url)) as proxy:
        layer = layers(url=through(proxy, redis_url), redis_timeout=0.5)
        try:
            proxy.cut()
            with pytest.raises(RouterError):
                await layer.new_channel()
            assert layer.node_id is None
            proxy.heal()
            channel = await layer.new_channel()
            await layer.send(channel, {"n": 1})
            assert await receive(layer, channel) == {"n": 1}
        finally:
            proxy.heal()
            await layer.close()
