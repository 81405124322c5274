"""The node's ACL on the way to each client (mosquitto's read check): every copy is judged
on its topic and the session's user name before it is queued, live or retained, local
or from the inbox, and for sessions that resumed, moved or were adopted. The unit part
drives :class:`LocalSessions`; the node part runs on real Redis and the 3-master cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.cluster.policy import load_acl, password_authenticator
from router.cluster.sessions.local_sessions import LocalSessions
from router.core.acl import Acl
from router.core.hooks import ClientInfo, DropReason, HookPoint
from router.core.messages import Delivery, Message
from router.core.options import SubscriptionOptions
from router.core.passwords import PasswordFile
from router.core.topics import TopicName
from router.state.keys import Keys
from tests.support import waiting
from tests.support.nodes import StartNode, die, take

RULES = """
deny all subscribe test/nosubscribe
deny user bob subscribe bob-secret/#
"""


def open_acl() -> Acl:
    """``RULES`` with the default allow (what no rule matches may be received)."""
    acl = load_acl(Acl.parse(RULES, "acl.conf"), "allow")
    assert acl is not None
    return acl


def message(topic: str, qos: int = 0) -> Message:
    return Message(b"m" * 16, TopicName(topic), b"x", qos=qos)


def delivery(topic: str) -> Delivery:
    return Delivery(topic, b"x", 1, False, b"d" * 16)


# -- LocalSessions -------------------------------------------------------------------------


def subscribed(acl: Acl | None, *users: tuple[str, str | None]) -> LocalSessions:
    sessions = LocalSessions(match_cache=None, acl=acl)
    for client_id, user in users:
        sessions.subscribe(client_id, "#", SubscriptionOptions(qos=1))
        sessions.session(client_id).profile = (5, 60, user)
    return sessions


def test_a_denied_copy_is_neither_queued_nor_returned_but_counted_and_reported() -> None:
    sessions = subscribed(open_acl(), ("a", "alice"), ("b", "bob"))
    told: list[tuple[str, Message | Delivery]] = []
    assert sessions.acl is not None
    sessions.acl.on_denied = lambda client_id, what: told.append((client_id, what))
    assert sessions.deliver(message("test/nosubscribe"), None) == (0, 0)
    assert sessions.deliver(message("bob-secret/x"), None) == (1, 0)
    assert sessions.deliver(message("test/other"), None) == (2, 0)
    assert [d.topic for d in sessions.session("a").take_all()] == ["bob-secret/x", "test/other"]
    assert [d.topic for d in sessions.session("b").take_all()] == ["test/other"]
    assert sessions.acl_denied() == 3
    assert [(c, w.topic) for c, w in told] == [
        ("a", "test/nosubscribe"),
        ("b", "test/nosubscribe"),
        ("b", "bob-secret/x"),
    ]


def test_a_client_chosen_for_a_share_group_and_denied_gets_no_copy() -> None:
    sessions = LocalSessions(match_cache=None, acl=open_acl())
    sessions.subscribe("c", "$share/g/test/+", SubscriptionOptions(qos=1))
    sessions.subscribe("c", "test/#", SubscriptionOptions(qos=1))
    assert sessions.deliver(message("test/nosubscribe", 1), None) == (0, 0)
    assert sessions.acl_denied() == 2  # (its plain copy and its group's)
    assert sessions.deliver(message("test/other", 1), None) == (2, 0)


def test_without_an_acl_every_copy_goes() -> None:
    sessions = subscribed(None, ("a", "alice"))
    assert sessions.deliver(message("test/nosubscribe"), None) == (1, 0)
    assert sessions.acl is None and sessions.acl_denied() == 0


class CountingAcl(Acl):
    """An ACL that counts the receive decisions it makes, and its receivers."""

    asked = 0
    made = 0

    def receiver(self, client: ClientInfo) -> Callable[[str], bool]:
        self.made += 1
        judge = super().receiver(client)

        def counted(topic: str) -> bool:
            self.asked += 1
            return judge(topic)

        return counted


def test_decisions_are_cached_per_session_until_its_user_name_changes() -> None:
    acl = CountingAcl(open_acl().rules, open_acl().default)
    sessions = subscribed(acl, ("c", "bob"))
    for _ in range(3):
        sessions.deliver(message("bob-secret/x"), None)
    assert (acl.made, acl.asked) == (1, 1) and sessions.acl_denied() == 3
    session = sessions.session("c")
    session.profile = (5, 30, "bob")  # the same user: the cache stays
    sessions.deliver(message("bob-secret/x"), None)
    assert acl.asked == 1
    session.profile = (5, 30, "alice")  # another user: judged again
    assert sessions.deliver(message("bob-secret/x"), None) == (1, 0)
    assert (acl.made, acl.asked) == (2, 2)


def test_the_caches_are_bounded_over_all_sessions() -> None:
    sessions = subscribed(open_acl(), ("a", "alice"), ("b", "bob"))
    assert sessions.acl is not None
    sessions.acl.limit = 3
    for n in range(4):
        sessions.deliver(message(f"t/{n}"), None)  # 8 decisions, 3 at most kept
    kept = sum(len(sessions.session(c).receives) for c in "ab")
    assert 0 < kept <= 3


def test_copies_a_session_takes_from_elsewhere_are_judged_for_its_user() -> None:
    """What a resumed session gets first (its queue, a handoff, a dead node's inbox) and
    a moving session's tail: judged for the user of the connection that resumed it."""
    sessions = subscribed(open_acl(), ("c", "bob"))
    session = sessions.session("c")
    session.put_first([delivery("bob-secret/1"), delivery("a/1"), delivery("test/nosubscribe")])
    session.hold()
    sessions.deliver(message("bob-secret/2"), None)  # (held: denied before)
    sessions.deliver(message("a/2"), None)
    session.release([delivery("bob-secret/3"), delivery("a/3")])
    assert [d.topic for d in session.take_all()] == ["a/1", "a/3", "a/2"]
    assert sessions.acl_denied() == 4


def test_a_session_handed_on_keeps_its_user_for_the_copies_it_gathers() -> None:
    sessions = subscribed(open_acl(), ("c", "bob"))
    leaving = sessions.hand_on(sessions.session("c"))
    assert leaving.profile[2] == "bob"
    assert sessions.deliver(message("bob-secret/x"), None) == (0, 0)


# -- nodes -----------------------------------------------------------------------------------

on_both_backends = pytest.mark.parametrize(
    "redis_backend", ["standalone", "cluster"], indirect=True
)


@on_both_backends
async def test_a_granted_wildcard_never_delivers_a_denied_topic(start_node: StartNode) -> None:
    """``#`` is granted under ``deny all subscribe test/nosubscribe``; a copy of that topic
    reaches no one, local (node a's publishes) or from the inbox (node b), and each
    denied copy is counted and reported to ``message.dropped`` as ``denied``."""
    a = await start_node("a", acl=open_acl())
    b = await start_node("b", acl=open_acl())
    drops: list[tuple[Any, ...]] = []
    a.hooks.register(HookPoint.MESSAGE_DROPPED, lambda *args: drops.append(args))
    await a.connect("alice-c", username="alice")
    await a.connect("bob-c", username="bob")
    await b.connect("far", username="bob")
    for node, client_id in ((a, "alice-c"), (a, "bob-c"), (b, "far")):
        assert await node.subscribe(client_id, "#", qos=1) is True
    for topic in ("test/nosubscribe", "bob-secret/x", "test/other"):
        await a.publish(topic, topic.encode(), qos=1, publisher="p")
    assert [d.topic for d in await take(a, "alice-c", 2)] == ["bob-secret/x", "test/other"]
    assert [d.topic for d in await take(a, "bob-c", 1)] == ["test/other"]
    assert [d.topic for d in await take(b, "far", 1)] == ["test/other"]
    assert all(n.sessions.session(c).pending() == 0 for n, c in ((a, "alice-c"), (b, "far")))
    assert a.stats()["acl_denied_deliveries"] == 3
    assert b.stats()["acl_denied_deliveries"] == 2
    assert sorted((m.topic, r, c.client_id, c.username) for m, r, c in drops) == [
        ("bob-secret/x", DropReason.DENIED, "bob-c", "bob"),
        ("test/nosubscribe", DropReason.DENIED, "alice-c", "alice"),
        ("test/nosubscribe", DropReason.DENIED, "bob-c", "bob"),
    ]


@on_both_backends
async def test_a_retained_message_goes_only_to_who_may_receive_it(start_node: StartNode) -> None:
    node = await start_node("a", acl=open_acl())
    await node.publish("test/nosubscribe", b"kept", retain=True)
    await node.publish("test/other", b"kept too", retain=True)
    await node.connect("c", username="alice")
    await node.subscribe("c", "test/#")
    [only] = await take(node, "c", 1)
    assert (only.topic, only.retain) == ("test/other", True)
    assert node.sessions.session("c").pending() == 0
    assert node.stats()["acl_denied_deliveries"] == 1


@on_both_backends
async def test_another_user_resuming_a_session_gets_nothing_it_may_not_receive(
    start_node: StartNode,
) -> None:
    """alice's persistent session (``#``) is resumed by bob on another node (the nodes
    share sessions between users): neither what was queued for alice meanwhile nor what
    comes after reaches bob if bob may not receive it (the old subscribe check never
    sees the restored ``#``)."""
    a = await start_node("a", acl=open_acl(), shared_sessions=True)
    b = await start_node("b", acl=open_acl(), shared_sessions=True)
    await a.connect("shared", username="alice", clean_start=False, expiry=300)
    await a.subscribe("shared", "#", qos=1)
    await a.put_away("shared")
    await a.publish("bob-secret/1", b"queued for alice", qos=1)
    assert await b.connect("shared", username="bob", clean_start=False, expiry=300)
    await waiting.eventually(lambda: "b" in a.mirror.match("x").nodes, 5.0, "a routes x to b")
    for topic in ("bob-secret/2", "test/nosubscribe", "test/other"):
        await a.publish(topic, b"live", qos=1)
    [fence] = await take(b, "shared", 1)
    assert fence.topic == "test/other"
    assert b.sessions.session("shared").pending() == 0
    denied = [node.stats()["acl_denied_deliveries"] for node in (a, b)]
    assert denied[1] >= 2 and sum(denied) >= 3  # (test/nosubscribe may stop on a)


@on_both_backends
async def test_an_adopted_session_keeps_its_user_name(
    start_node: StartNode, redis_connect: Callable[..., Any], keys: Keys
) -> None:
    """Node a dies holding alice's persistent session; b adopts it without asking the
    password check (the session is not a client connecting) and judges its copies for
    alice, so what only alice may receive is kept for her."""
    acl = load_acl(Acl.parse("allow user alice subscribe news/#", "acl.conf"), "deny")
    passwords = PasswordFile.parse("", "passwords")
    config = NodeConfig("a", prefix=keys.prefix, heartbeat_interval=0.2, heartbeat_ttl=1.0, acl=acl)
    a = RouterNode(await redis_connect(), config)
    await a.start()
    await a.connect("roamer", username="alice", clean_start=False, expiry=600)
    await a.subscribe("roamer", "news/#", qos=1)
    b = await start_node("b", acl=acl, handoff_timeout=0.5)
    b.hooks.register(
        HookPoint.CLIENT_AUTHENTICATE, password_authenticator(passwords, allow_anonymous=False)
    )
    await waiting.eventually(lambda: "a" in b.mirror.match("news/1").nodes, 5.0, "b routes to a")
    await die(a)
    await b.publish("news/1", b"while a lay dead", qos=1)
    await waiting.eventually(lambda: b.stats()["sessions_adopted"] == 1, 10.0, "b adopted it")
    adopted = b.sessions.find("roamer")
    assert adopted is not None and adopted.profile[2] == "alice"
    await b.publish("news/2", b"after the adoption", qos=1)
    c = await start_node("c", acl=acl)
    assert await c.connect("roamer", username="alice", clean_start=False, expiry=600)
    got = await take(c, "roamer", 2)
    assert [d.payload for d in got] == [b"while a lay dead", b"after the adoption"]
    assert b.stats()["acl_denied_deliveries"] == c.stats()["acl_denied_deliveries"] == 0
