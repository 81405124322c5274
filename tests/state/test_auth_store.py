"""The cluster's users and ACL rules in Redis: each change is written with the change
count in one step, bad input is refused with nothing written, entries written by hand
that do not parse are left out; on fakeredis, a real Redis and the 3-master cluster."""

from __future__ import annotations

import pytest

from router.core.acl import AclAction, Permission
from router.errors import AclRuleError, InvalidIdError, PasswordFileError
from router.state.auth_store import ITERATIONS, AuthStore
from router.state.keys import Keys
from router.state.scripts import RedisClient


async def test_users_are_added_changed_and_removed(redis_client: RedisClient, keys: Keys) -> None:
    store = AuthStore(redis_client, keys)
    assert await store.count() == 0 and await store.users() == []
    assert await store.add_user("bob", "b0b")
    assert await store.add_user("alice", "wonder land", superuser=True)
    assert not await store.add_user("bob", "other")  # (exists: nothing written)
    assert await store.count() == 2
    listed = await store.users()
    assert [(u.name, u.superuser) for u in listed] == [("alice", True), ("bob", False)]
    assert listed[0].password.iterations == ITERATIONS
    assert listed[1].password.verify("b0b") and not listed[1].password.verify("other")

    assert await store.set_password("alice", "new")
    assert not await store.set_password("carol", "new")  # (no such user: nothing written)
    [alice, _] = await store.users()
    assert alice.superuser and alice.password.verify("new")  # (still a superuser)
    assert await store.add_user("bob", "replaced", replace=True)
    assert await store.remove_user("bob")
    assert not await store.remove_user("bob")
    assert [u.name for u in await store.users()] == ["alice"]
    assert await store.count() == 5  # (the changes that wrote something)


async def test_rules_keep_their_order_and_one_spelling(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = AuthStore(redis_client, keys)
    assert await store.add_rule("allow user alice publish sensors/%u/#") == 1
    assert await store.add_rule("allow   all   subscribe   public/#") == 2
    assert await store.add_rule("deny all all $SYS/#", position=1) == 1
    assert await store.add_rule("allow client dash subscribe x", position=99) == 4
    assert [str(rule) for rule in await store.rules()] == [
        "deny all all $SYS/#",
        "allow user alice publish sensors/%u/#",
        "allow all subscribe public/#",
        "allow client dash subscribe x",
    ]
    assert await store.remove_rule("allow all subscribe   public/#") == 3
    assert await store.remove_rule("allow all subscribe public/#") == 0
    [first, *_] = await store.rules()
    assert (first.permission, first.action) == (Permission.DENY, AclAction.ALL)
    assert await store.count() == 5


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda s: s.add_user("", "pw"), InvalidIdError),
        (lambda s: s.add_user("a:b", "pw"), PasswordFileError),
        (lambda s: s.add_user("alice", ""), PasswordFileError),
        (lambda s: s.add_user("alice", "p\0w"), PasswordFileError),
        (lambda s: s.add_rule("allow everyone publish x"), AclRuleError),
        (lambda s: s.add_rule("# a comment"), AclRuleError),
        (lambda s: s.add_rule("allow all publish a/#/b"), AclRuleError),
    ],
)
async def test_bad_input_writes_nothing(
    redis_client: RedisClient, keys: Keys, change: object, error: type[Exception]
) -> None:
    store = AuthStore(redis_client, keys)
    with pytest.raises(error):
        await change(store)  # type: ignore[operator]
    assert await store.count() == 0
    assert await store.users() == [] and await store.rules() == []


async def test_entries_written_by_hand_that_do_not_parse_are_left_out(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = AuthStore(redis_client, keys)
    await store.add_user("alice", "pw")
    await store.add_rule("allow all publish a/#")
    await redis_client.hset(store.users_key, "mallory", "s plain-text")
    await redis_client.rpush(store.rules_key, "allow anything")
    snapshot = await store.snapshot()
    assert [u.name for u in snapshot.users] == ["alice"]
    assert [str(r) for r in snapshot.rules] == ["allow all publish a/#"]
    assert snapshot.skipped == ("user mallory", "rule 2")
