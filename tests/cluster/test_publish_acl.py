"""The publish check of a node whose only ``client.check_acl`` callback is its built-in
ACL: judged per publisher and topic without the fold, cached, and always the ACL's own
answer (the fold's), with the same reason on a denial; another callback makes every
publish go through the fold again."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from router.cluster.policy import Policy
from router.core.acl import Acl, AclAction, AclRule, Permission
from router.core.hooks import ClientInfo, Decision, HookPoint, HookRegistry, Stop
from router.core.messages import Message
from router.core.topics import TopicName
from router.errors import NotAuthorizedError

PUBLISH = AclAction.PUBLISH
LEVELS = ["a", "b", "+", "%c", "%u"]


def message(topic: str, publisher: str) -> Message:
    return Message(b"i" * 16, TopicName(topic), b"p", 0, False, publisher)


async def admitted(policy: Policy, topic: str, publisher: str) -> tuple[bool, str | None]:
    try:
        await policy.admit_publish([message(topic, publisher)])
    except NotAuthorizedError as denied:
        return False, denied.reason
    return True, None


@st.composite
def rules(draw: st.DrawFn) -> AclRule:
    levels = draw(st.lists(st.sampled_from(LEVELS), min_size=1, max_size=3))
    if draw(st.booleans()):
        levels.append("#")
    subject = draw(st.sampled_from([{}, {"username": "u"}, {"client_id": "c"}]))
    action = draw(st.sampled_from([PUBLISH, AclAction.SUBSCRIBE, AclAction.ALL]))
    permission = draw(st.sampled_from([Permission.ALLOW, Permission.DENY]))
    return AclRule(permission, action, "/".join(levels), **subject)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(rules(), max_size=5),
    st.sampled_from([Permission.ALLOW, Permission.DENY]),
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(["a", "b", "c", "u", "x"]), min_size=1, max_size=3),
            st.sampled_from([("c", "u"), ("c", None), ("d", "u"), ("u", "c")]),
        ),
        min_size=1,
        max_size=8,
    ),
)
async def test_the_cached_publish_check_is_the_acls_answer(
    acl_rules: list[AclRule],
    default: Permission,
    publishes: list[tuple[list[str], tuple[str, str | None]]],
) -> None:
    acl = Acl(acl_rules, default)
    policy = Policy(HookRegistry(), acl)
    for levels, (client_id, username) in [*publishes, *publishes]:  # (the second: cached)
        client = ClientInfo(client_id, username)
        await policy.attached(client, new=True)
        topic = "/".join(levels)
        expected = acl.check_publish(client, topic)
        got = await admitted(policy, topic, client_id)
        assert got == (expected.allowed, None if expected.allowed else expected.reason)


async def test_a_client_back_under_another_user_name_is_judged_for_that_user() -> None:
    acl = Acl.parse("allow user alice publish alice/#\n")
    policy = Policy(HookRegistry(), acl)
    await policy.attached(ClientInfo("phone", "alice"), new=True)
    assert (await admitted(policy, "alice/x", "phone"))[0]
    await policy.detached("phone", "normal")
    await policy.attached(ClientInfo("phone", "mallory"), new=True)
    assert not (await admitted(policy, "alice/x", "phone"))[0]


async def test_another_check_acl_callback_is_asked_again() -> None:
    hooks = HookRegistry()
    acl = Acl.parse("allow all publish a/#\n")
    policy = Policy(hooks, acl)
    await policy.attached(ClientInfo("c"), new=True)
    assert (await admitted(policy, "a/x", "c"))[0]
    asked: list[str] = []

    def veto(client: ClientInfo, action: AclAction, topic: str, acc: Decision) -> Stop:
        asked.append(topic)
        return Stop(Decision.deny("vetoed"))

    hooks.register(HookPoint.CLIENT_CHECK_ACL, veto, priority=10)
    assert await admitted(policy, "a/x", "c") == (False, "vetoed")
    assert asked == ["a/x"]
    hooks.unregister(HookPoint.CLIENT_CHECK_ACL, veto)
    assert (await admitted(policy, "a/x", "c"))[0]


@pytest.mark.parametrize("size", [3])
async def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr("router.cluster.policy.PUBLISH_DECISIONS", size)
    policy = Policy(HookRegistry(), Acl.parse("allow all publish a/#\n"))
    await policy.attached(ClientInfo("c"), new=True)
    for index in range(10):
        assert (await admitted(policy, f"a/{index}", "c"))[0]
        assert len(policy._may_publish) <= size
    assert not (await admitted(policy, "b", "c"))[0]
