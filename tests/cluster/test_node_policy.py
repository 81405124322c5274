"""Hooks, authentication and the ACL, driven through the node API on real Redis and a cluster."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import router
from router import NotAuthorizedError
from router.cluster.node import RouterNode
from router.cluster.policy import load_acl
from router.core.acl import Acl, AclAction
from router.core.hooks import STOP, ClientInfo, Decision, DropReason, HookPoint, Ok, Stop
from router.core.messages import Message
from router.core.options import SubscriptionOptions
from router.errors import AclRuleError
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import StartNode, take

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)

PUBLIC_ONLY = """
allow all subscribe public/#
allow all publish public/#
"""


async def routed(node: RouterNode, topic: str, node_id: str) -> None:
    await waiting.eventually(
        lambda: node_id in node.mirror.match(topic).nodes, 5.0, f"{node_id} routes {topic}"
    )


async def client_state_in_redis(node: RouterNode, client_id: str) -> int:
    """How many of the client's keys exist in Redis (one hash tag: one call)."""
    found: int = await node.subscriptions.redis.exists(*node.subscriptions.client_keys(client_id))
    return found


def recorder(calls: list[tuple[Any, ...]]) -> Callable[..., None]:
    """A notification callback that records its arguments."""
    return lambda *args: calls.append(args)


# -- the ACL -----------------------------------------------------------------------------


async def test_a_denied_subscribe_changes_nothing(start_node: StartNode) -> None:
    node = await start_node("a", acl=Acl.parse(PUBLIC_ONLY, "acl.conf"))
    with pytest.raises(NotAuthorizedError) as caught:
        await node.subscribe("c1", "secret/#")
    assert (caught.value.client_id, caught.value.action) == ("c1", "subscribe")
    assert caught.value.topic == "secret/#"
    assert caught.value.reason == "denied: no rule matched"
    # Not even the implicit connect happened: nothing in Redis, nothing local.
    assert await client_state_in_redis(node, "c1") == 0
    assert node.sessions.clients() == []
    assert (await node.routes.snapshot("a")).routes == {}
    assert node.sessions.routes() == {}
    assert node.mirror.match("secret/x").nodes == {}

    # An attached client keeps exactly what it had.
    assert await node.subscribe("c1", "public/news", qos=1) is True
    with pytest.raises(NotAuthorizedError):
        await node.subscribe("c1", "private/#")  # not one topic of it may be received
    assert await node.subscriptions.subscriptions("c1") == {
        "public/news": SubscriptionOptions(qos=1)
    }
    assert node.sessions.trie.subscriptions("c1") == {"public/news": SubscriptionOptions(qos=1)}
    assert (await node.routes.snapshot("a")).routes == {"public/news": 1}


async def test_a_denied_publish_sends_nothing(start_node: StartNode) -> None:
    rules = "allow all subscribe #\nallow all publish public/#"
    a = await start_node("a", acl=Acl.parse(rules, "acl.conf"))
    b = await start_node("b")
    await a.subscribe("local", "#")
    await b.subscribe("remote", "#")
    await routed(a, "secret/x", "b")
    drops: list[tuple[Any, ...]] = []
    a.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))

    with pytest.raises(NotAuthorizedError) as caught:
        await a.publish("secret/x", b"leak", publisher="mallory")
    assert (caught.value.action, caught.value.topic) == ("publish", "secret/x")
    assert a.stats()["published"] == 0
    assert a.stats()["forwarded"] == 0
    [(message, reason, client)] = drops
    assert (message.topic, reason, client) == ("secret/x", DropReason.DENIED, ClientInfo("mallory"))

    # A fence: the next allowed publish is the first (and only) thing either client gets.
    result = await a.publish("public/x", b"ok", publisher="mallory")
    assert sorted(result.nodes) == ["a", "b"]
    [remote] = await take(b, "remote", 1)
    [local] = await take(a, "local", 1)
    assert remote.payload == local.payload == b"ok"
    assert b.stats()["received"] == 1
    assert a.sessions.session("local").pending() == 0


async def test_publishes_without_a_publisher_are_not_checked(start_node: StartNode) -> None:
    node = await start_node("a", acl=Acl.parse(PUBLIC_ONLY))
    result = await node.publish("secret/x", b"from the program itself")
    assert result.nodes == []


async def test_a_denied_item_refuses_the_whole_batch(start_node: StartNode) -> None:
    node = await start_node("a", acl=Acl.parse(PUBLIC_ONLY))
    await node.subscribe("c", "public/#")
    batch = [
        router.cluster.node.Outgoing("public/1", b"1", publisher="p"),
        router.cluster.node.Outgoing("secret/2", b"2", publisher="p"),
    ]
    with pytest.raises(NotAuthorizedError):
        await node.publish_many(batch)
    assert node.stats()["published"] == 0
    assert node.sessions.session("c").pending() == 0


async def test_publish_each_judges_every_item_alone_and_sends_the_allowed_in_one_batch(
    start_node: StartNode,
) -> None:
    """The MQTT listener's batch: a denied item (or one under ``$SYS/``) gets the error
    :meth:`publish` would have raised, reported to ``message.dropped`` once; the ACL is
    asked once per item (never for ``$SYS/``); the allowed items are routed with the ids
    their results carry."""
    node = await start_node("a", acl=Acl.parse(PUBLIC_ONLY))
    await node.subscribe("c", "public/#")
    asked: list[str] = []
    node.hooks.register(HookPoint.CLIENT_CHECK_ACL, lambda c, a, topic, acc: asked.append(topic), 1)
    drops: list[tuple[Any, ...]] = []
    node.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))
    batch = [
        router.Outgoing("public/1", b"1", publisher="p"),
        router.Outgoing("secret/2", b"2", publisher="p"),
        router.Outgoing("$SYS/3", b"3", publisher="p"),
        router.Outgoing("public/4", b"4", publisher="p"),
    ]
    first, denied, system, last = await node.publish_each(batch)
    assert isinstance(denied, NotAuthorizedError) and denied.topic == "secret/2"
    assert isinstance(system, NotAuthorizedError) and system.topic == "$SYS/3"
    assert not isinstance(first, NotAuthorizedError) and first.nodes == ["a"]
    assert not isinstance(last, NotAuthorizedError) and last.nodes == ["a"]
    assert asked == ["public/1", "secret/2", "public/4"]
    [(message, reason, client)] = drops
    assert (message.topic, reason, client) == ("secret/2", DropReason.DENIED, ClientInfo("p"))
    assert message.id not in (first.message_id, last.message_id)
    got = await take(node, "c", 2)
    assert [(d.message_id, d.payload) for d in got] == [
        (first.message_id, b"1"),
        (last.message_id, b"4"),
    ]
    assert node.stats()["published"] == 2


async def test_publish_each_refuses_a_batch_with_an_invalid_topic_before_any_hook(
    start_node: StartNode,
) -> None:
    node = await start_node("a", acl=Acl.parse(PUBLIC_ONLY))
    drops: list[tuple[Any, ...]] = []
    node.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))
    batch = [
        router.Outgoing("secret/1", b"1", publisher="p"),
        router.Outgoing("public/#", b"2", publisher="p"),
    ]
    with pytest.raises(router.InvalidTopicError):
        await node.publish_each(batch)
    assert drops == []
    assert node.stats()["published"] == 0


async def test_substitution_of_client_id_and_username(start_node: StartNode) -> None:
    rules = """
    allow all subscribe users/%u/#
    allow all publish clients/%c/#
    """
    node = await start_node("a", acl=Acl.parse(rules))
    await node.connect("c1", username="alice")
    assert await node.subscribe("c1", "users/alice/#") is True
    with pytest.raises(NotAuthorizedError):
        await node.subscribe("c1", "users/bob/#")
    with pytest.raises(NotAuthorizedError):
        await node.subscribe("anonymous", "users/alice/#")  # no username: %u never allows
    await node.publish("clients/c1/status", b"up", publisher="c1")
    with pytest.raises(NotAuthorizedError):
        await node.publish("clients/c2/status", b"up", publisher="c1")
    assert await node.subscriptions.subscriptions("c1") == {"users/alice/#": SubscriptionOptions()}


@pytest.mark.parametrize("default", ["allow", "deny"])
async def test_the_default_decides_what_no_rule_matches(
    start_node: StartNode, default: str
) -> None:
    acl = load_acl(Acl.parse("deny all all secret/#"), default)
    node = await start_node("a", acl=acl)
    with pytest.raises(NotAuthorizedError):
        await node.subscribe("c", "secret/+")  # the deny rule takes all of it, whatever the default
    with pytest.raises(NotAuthorizedError):
        await node.publish("secret/x", b"", publisher="c")
    if default == "allow":
        assert await node.subscribe("c", "#") is True  # (secret/x is kept out on delivery)
        assert await node.subscribe("c", "news/#") is True
        await node.publish("news/x", b"", publisher="c")
    else:
        with pytest.raises(NotAuthorizedError, match="no rule matched"):
            await node.subscribe("c", "#")
        with pytest.raises(NotAuthorizedError, match="no rule matched"):
            await node.subscribe("c", "news/#")
        with pytest.raises(NotAuthorizedError, match="no rule matched"):
            await node.publish("news/x", b"", publisher="c")


async def test_a_crashing_acl_hook_fails_closed(start_node: StartNode) -> None:
    node = await start_node("a")

    def broken(client: ClientInfo, action: AclAction, topic: str, acc: Decision) -> None:
        raise RuntimeError("ACL backend down")

    node.hooks.register(HookPoint.CLIENT_CHECK_ACL, broken)
    with pytest.raises(NotAuthorizedError, match="no ACL hook allowed it"):
        await node.subscribe("c", "a/b")
    node.hooks.unregister(HookPoint.CLIENT_CHECK_ACL, broken)
    assert await node.subscribe("c", "a/b") is True


async def test_an_acl_file_through_the_embedding_api(
    redis_backend: str, request: pytest.FixtureRequest, keys: Keys, tmp_path: Path
) -> None:
    url = request.getfixturevalue(f"redis_{redis_backend}_url")
    path = tmp_path / "acl.conf"
    path.write_text("allow all all public/#\n", encoding="utf-8")
    async with router.connect(url, node_id="api", prefix=keys.prefix, acl=str(path)) as node:
        await node.subscribe("c", "public/#")
        with pytest.raises(NotAuthorizedError, match="no rule matched"):
            await node.subscribe("c", "private/#")
        await node.disconnect("c")
    path.write_text("allow all all public/#\nallow everyone\n", encoding="utf-8")
    with pytest.raises(AclRuleError, match=r"acl\.conf:2: "):
        async with router.connect(url, node_id="api", prefix=keys.prefix, acl=path):
            pass
    with pytest.raises(AclRuleError, match="needs an ACL"):
        async with router.connect(url, node_id="api", prefix=keys.prefix, acl_default="allow"):
            pass


# -- authentication and the client points --------------------------------------------------


def password_check(client: ClientInfo, password: object, acc: Decision) -> Any:
    if client.username == "alice" and password == b"secret":
        return Stop(Decision.allow("alice's password"))
    return Stop(Decision.deny("bad username or password"))


async def test_a_refused_authentication_changes_nothing(start_node: StartNode) -> None:
    node = await start_node("a")
    node.hooks.register(HookPoint.CLIENT_AUTHENTICATE, password_check)
    connected: list[tuple[Any, ...]] = []
    node.hooks.register(HookPoint.CLIENT_CONNECTED, recorder(connected))

    with pytest.raises(NotAuthorizedError) as caught:
        await node.connect("c1", username="alice", password=b"wrong")
    assert (caught.value.action, caught.value.reason) == ("connect", "bad username or password")
    with pytest.raises(NotAuthorizedError):
        await node.subscribe("c1", "a/b")  # the implicit connect has no credentials
    assert await client_state_in_redis(node, "c1") == 0
    assert node.sessions.clients() == []
    assert connected == []

    await node.connect("c1", username="alice", password=b"secret")
    assert connected == [(ClientInfo("c1", "alice"),)]
    assert await node.subscribe("c1", "a/b") is True
    # Connecting again proves the identity again; a refusal keeps the session as it was.
    with pytest.raises(NotAuthorizedError):
        await node.connect("c1", username="alice", password=b"wrong")
    assert node.sessions.trie.subscriptions("c1") == {"a/b": SubscriptionOptions()}
    assert connected == [(ClientInfo("c1", "alice"),)]


async def test_with_no_authentication_hook_everyone_may_connect(start_node: StartNode) -> None:
    node = await start_node("a")
    await node.connect("c1", username="bob", password="anything")
    assert node.sessions.clients() == ["c1"]


async def test_connected_and_disconnected(start_node: StartNode) -> None:
    node = await start_node("a")
    events: list[tuple[Any, ...]] = []
    node.hooks.register(HookPoint.CLIENT_CONNECTED, lambda c: events.append(("up", c)))
    node.hooks.register(HookPoint.CLIENT_DISCONNECTED, lambda c, r: events.append(("down", c, r)))
    await node.connect("c1", username="alice")
    await node.subscribe("c2", "x")
    await node.connect("c1", username="alice")  # attached already: not connected again
    await node.disconnect("c1")
    await node.stop()
    assert events == [
        ("up", ClientInfo("c1", "alice")),
        ("up", ClientInfo("c2")),
        ("down", ClientInfo("c1", "alice"), "normal"),
        ("down", ClientInfo("c2"), "node_stopped"),
    ]


async def test_subscribe_and_unsubscribe_hooks_may_rewrite_the_filter(
    start_node: StartNode,
) -> None:
    node = await start_node("a", acl=Acl.parse("allow all subscribe tenants/%c/#"))

    def into_tenant(client: ClientInfo, acc: tuple[str, SubscriptionOptions]) -> Any:
        topic_filter, options = acc
        return Ok((f"tenants/{client.client_id}/{topic_filter}", options))

    def unsubscribe_in_tenant(client: ClientInfo, acc: str) -> Any:
        return Ok(f"tenants/{client.client_id}/{acc}")

    node.hooks.register(HookPoint.CLIENT_SUBSCRIBE, into_tenant)
    node.hooks.register(HookPoint.CLIENT_UNSUBSCRIBE, unsubscribe_in_tenant)
    assert await node.subscribe("c1", "sensors/+", qos=1) is True  # the ACL sees the rewrite
    assert await node.subscriptions.subscriptions("c1") == {
        "tenants/c1/sensors/+": SubscriptionOptions(qos=1)
    }
    await node.publish("tenants/c1/sensors/t", b"21")
    [delivery] = await take(node, "c1", 1)
    assert delivery.topic == "tenants/c1/sensors/t"
    assert await node.unsubscribe("c1", "sensors/+") is True
    assert await node.subscriptions.subscriptions("c1") == {}


async def test_a_subscribe_hook_may_refuse(start_node: StartNode) -> None:
    node = await start_node("a")
    node.hooks.register(HookPoint.CLIENT_SUBSCRIBE, lambda client, acc: Stop(None))
    with pytest.raises(NotAuthorizedError, match=r"client\.subscribe hook"):
        await node.subscribe("c1", "a/b")
    assert node.sessions.clients() == []
    assert await client_state_in_redis(node, "c1") == 0


async def test_a_rewrite_that_cannot_be_used_is_skipped(
    start_node: StartNode, caplog: pytest.LogCaptureFixture
) -> None:
    node = await start_node("a")
    node.hooks.register(HookPoint.CLIENT_SUBSCRIBE, lambda c, acc: Ok(("bad/#/filter", acc[1])))
    node.hooks.register(
        HookPoint.MESSAGE_PUBLISH, lambda c, acc: Ok(Message(b"\0" * 16, acc.topic, b""))
    )
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        assert await node.subscribe("c1", "a/b") is True
        result = await node.publish("a/b", b"kept")
    assert list(node.sessions.trie.subscriptions("c1")) == ["a/b"]
    [delivery] = await take(node, "c1", 1)
    assert (delivery.payload, delivery.message_id) == (b"kept", result.message_id)
    assert len(caplog.records) == 2


# -- message points ------------------------------------------------------------------------


async def test_publish_hooks_run_by_priority_and_may_rewrite_or_stop(
    start_node: StartNode,
) -> None:
    a, b = await start_node("a"), await start_node("b")
    await b.subscribe("remote", "#", qos=2)
    await routed(a, "t", "b")

    def tag(mark: bytes) -> Callable[[ClientInfo | None, Message], Any]:
        def callback(client: ClientInfo | None, message: Message) -> Any:
            if message.payload == b"stop":
                return Stop(None)
            return Ok(Message(message.id, "t/rewritten", message.payload + mark, 1))

        return callback

    def halt(client: ClientInfo | None, message: Message) -> Any:
        return STOP if message.payload.startswith(b"halt") else None

    a.hooks.register(HookPoint.MESSAGE_PUBLISH, tag(b"-low"), priority=-1)
    a.hooks.register(HookPoint.MESSAGE_PUBLISH, tag(b"-high"), priority=10)
    a.hooks.register(HookPoint.MESSAGE_PUBLISH, halt, priority=5)
    drops: list[tuple[Any, ...]] = []
    a.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))

    await a.publish("t", b"x", publisher="p")
    await a.publish("t", b"halt")  # STOP after the high-priority rewrite: low never runs
    stopped = await a.publish("t", b"stop")
    assert stopped.nodes == [] and a.stats()["published"] == 2
    got = await take(b, "remote", 2)
    assert [(d.topic, d.payload, d.qos) for d in got] == [
        ("t/rewritten", b"x-high-low", 1),
        ("t/rewritten", b"halt-high", 1),
    ]
    assert [(m.payload, r, c) for m, r, c in drops] == [(b"stop", DropReason.STOPPED, None)]


async def test_a_crashing_hook_does_not_break_publishing(
    start_node: StartNode, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await start_node("a"), await start_node("b")

    def crash(*args: Any) -> None:
        raise RuntimeError("plugin bug")

    for point in (
        HookPoint.MESSAGE_PUBLISH,
        HookPoint.MESSAGE_DELIVERED,
        HookPoint.MESSAGE_DROPPED,
        HookPoint.CLIENT_CONNECTED,
        HookPoint.CLIENT_SUBSCRIBE,
    ):
        a.hooks.register(point, crash)
        b.hooks.register(point, crash)
    await a.subscribe("local", "t")
    await b.subscribe("remote", "t")
    await routed(a, "t", "b")
    with caplog.at_level(logging.ERROR, logger="router.core.hooks"):
        result = await a.publish("t", b"still here")
        await a.publish("nobody/listens", b"")
        [remote] = await take(b, "remote", 1)
    [local] = await take(a, "local", 1)
    assert sorted(result.nodes) == ["a", "b"]
    assert local.payload == remote.payload == b"still here"
    assert caplog.records  # every crash was logged


async def test_dropped_with_no_subscribers(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    await b.subscribe("remote", "wanted")
    await routed(a, "wanted", "b")
    drops: list[tuple[Any, ...]] = []
    a.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))
    unwanted = await a.publish("unwanted", b"1", publisher="p")
    await a.publish("wanted", b"2")
    [(message, reason, client)] = drops
    assert (message.id, message.topic) == (unwanted.message_id, "unwanted")
    assert (reason, client) == (DropReason.NO_SUBSCRIBERS, ClientInfo("p"))


@pytest.mark.parametrize("overflow", ["drop_oldest", "drop_newest"])
async def test_dropped_with_queue_full_and_delivered_counts(
    start_node: StartNode, overflow: str
) -> None:
    a = await start_node("a", queue_limit=2, overflow=overflow)
    delivered: list[tuple[Any, ...]] = []
    drops: list[tuple[Any, ...]] = []
    a.hooks.register(HookPoint.MESSAGE_DELIVERED, recorder(delivered))
    a.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))
    await a.connect("slow", username="u")
    await a.subscribe("slow", "q", qos=1)
    await a.subscribe("other", "q")
    for index in range(3):
        await a.publish("q", str(index).encode(), qos=1)
    got = [d.payload for d in await take(a, "other", 2)]
    assert got == ([b"0", b"1"] if overflow == "drop_newest" else [b"1", b"2"])

    [(lost, reason, _)] = [d for d in drops if d[2] == ClientInfo("slow", "u")]
    assert reason is DropReason.QUEUE_FULL
    assert isinstance(lost, Message)
    assert lost.payload == (b"2" if overflow == "drop_newest" else b"0")
    per_client = {
        client_id: [d.payload for c, d in delivered if c.client_id == client_id]
        for client_id in ("slow", "other")
    }
    expected = [b"0", b"1"] if overflow == "drop_newest" else [b"0", b"1", b"2"]
    assert per_client == {"slow": expected, "other": expected}
    assert all(d.qos == (1 if c.client_id == "slow" else 0) for c, d in delivered)


async def test_delivered_runs_on_the_receiving_node(start_node: StartNode) -> None:
    a, b = await start_node("a"), await start_node("b")
    delivered: list[tuple[Any, ...]] = []
    b.hooks.register(HookPoint.MESSAGE_DELIVERED, recorder(delivered))
    for client_id in ("r1", "r2"):
        await b.subscribe(client_id, "t/#")
    await routed(a, "t/x", "b")
    for index in range(5):
        await a.publish(f"t/{index}", b"")
    for client_id in ("r1", "r2"):
        await take(b, client_id, 5)
    assert sorted((c.client_id, d.topic) for c, d in delivered) == sorted(
        (client_id, f"t/{index}") for client_id in ("r1", "r2") for index in range(5)
    )


async def test_retained_copies_run_delivered_and_dropped_hooks(start_node: StartNode) -> None:
    a = await start_node("a", queue_limit=1, overflow="drop_newest")
    delivered: list[tuple[Any, ...]] = []
    drops: list[tuple[Any, ...]] = []
    a.hooks.register(HookPoint.MESSAGE_DELIVERED, recorder(delivered))
    a.hooks.register(HookPoint.MESSAGE_DROPPED, recorder(drops))
    for topic in ("r/1", "r/2"):
        await a.publish(topic, topic.encode(), retain=True)
    await a.connect("late", username="u")
    await a.subscribe("late", "r/+")

    [(client, delivery)] = delivered
    assert (client, delivery.topic, delivery.retain) == (ClientInfo("late", "u"), "r/1", True)
    full = [
        (lost.topic, client) for lost, reason, client in drops if reason is DropReason.QUEUE_FULL
    ]
    assert full == [("r/2", ClientInfo("late", "u"))]


async def test_the_queue_drop_count_keeps_the_drops_of_clients_that_left(
    start_node: StartNode,
) -> None:
    """A counter never goes down: the drops of a session count after it closed too."""
    a = await start_node("a", queue_limit=1, overflow="drop_newest")
    await a.subscribe("slow", "t")
    for number in range(3):
        await a.publish("t", b"%d" % number)
    assert a.stats()["queue_drops"] == 2
    await a.disconnect("slow")
    assert a.stats()["queue_drops"] == 2
