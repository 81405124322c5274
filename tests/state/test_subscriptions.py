"""Client state in Redis: subscriptions, session owner and epochs, removal, bad input.

Every test runs on fakeredis, a real standalone Redis and a 3-master Redis Cluster.
"""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from router.core.aliases import NAMESPACES
from router.core.options import DEFAULT_OPTIONS, SubscriptionOptions
from router.errors import (
    CorruptStateError,
    InvalidIdError,
    InvalidOptionsError,
    InvalidTopicError,
    RouterError,
    ScriptError,
    SessionOwnershipError,
    SessionUserError,
)
from router.state.keys import Keys
from router.state.scripts import RedisClient
from router.state.session_store import NEVER, SessionStore, open_fields
from router.state.subscriptions import Owner, SubscriptionStore, pack_options, unpack_options

QOS1 = SubscriptionOptions(qos=1)
FANCY = SubscriptionOptions(
    qos=2, no_local=True, retain_as_published=True, retain_handling=2, subscription_identifier=7
)


@pytest.fixture
def sessions(redis_client: RedisClient, keys: Keys, store: SubscriptionStore) -> SessionStore:
    return SessionStore(redis_client, keys, store)


@pytest.fixture
def store(redis_client: RedisClient, keys: Keys) -> SubscriptionStore:
    return SubscriptionStore(redis_client, keys)


def test_options_survive_packing() -> None:
    for options in (DEFAULT_OPTIONS, QOS1, FANCY):
        assert unpack_options(pack_options(options)) == options


async def test_subscribe_reports_new_then_replaced(store: SubscriptionStore) -> None:
    assert await store.subscribe("c1", "a/+", QOS1) is True
    assert await store.subscribe("c1", "a/+", FANCY) is False
    assert await store.subscribe("c1", "$share/g/a/#") is True
    assert await store.subscriptions("c1") == {"a/+": FANCY, "$share/g/a/#": DEFAULT_OPTIONS}
    assert await store.subscriptions("c2") == {}


async def test_a_batch_is_one_call_and_reports_each_item(store: SubscriptionStore) -> None:
    await store.subscribe("c1", "old")
    batch = [("old", QOS1), ("x/#", DEFAULT_OPTIONS), ("x/#", FANCY), ("ü/+/z", QOS1)]
    assert await store.subscribe_many("c1", batch) == [False, True, False, True]
    assert await store.subscriptions("c1") == {"old": QOS1, "x/#": FANCY, "ü/+/z": QOS1}
    assert await store.subscribe_many("c1", []) == []


async def test_unsubscribe(store: SubscriptionStore) -> None:
    await store.subscribe_many("c1", [("a", QOS1), ("b", QOS1), ("c", QOS1)])
    assert await store.unsubscribe("c1", "a") is True
    assert await store.unsubscribe("c1", "a") is False
    assert await store.unsubscribe_many("c1", ["b", "nope", "b"]) == [True, False, False]
    assert await store.subscriptions("c1") == {"c": QOS1}
    assert await store.unsubscribe_many("c1", []) == []


async def test_claims_grow_the_epoch_and_change_the_owner(store: SubscriptionStore) -> None:
    assert await store.owner("c1") is None
    first = await store.claim("c1", "node-a")
    assert first.node_id == "node-a"
    assert await store.owner("c1") == first
    second = await store.claim("c1", "node-b")
    third = await store.claim("c1", "node-b")
    assert first.epoch < second.epoch < third.epoch
    assert await store.owner("c1") == third


async def test_a_fresh_claim_removes_the_old_state_and_names_the_owner_it_replaced(
    store: SubscriptionStore, redis_client: RedisClient, keys: Keys
) -> None:
    assert await store.claim_over("c1", "node-a") == (None, await store.owner("c1"))
    old = await store.owner("c1")
    assert old is not None
    await store.subscribe("c1", "keep/#", QOS1, owner=old)
    previous, kept = await store.claim_over("c1", "node-b")
    assert previous == old and kept.epoch > old.epoch
    assert await store.subscriptions("c1") == {"keep/#": QOS1}  # ('keep': state stays)
    previous, fresh = await store.claim_over("c1", "node-c", fresh=True)
    assert previous == kept and fresh.epoch > kept.epoch
    assert await store.owner("c1") == fresh
    assert await store.subscriptions("c1") == {}
    remaining = [k for k in store.client_keys("c1") if await redis_client.exists(k)]
    assert remaining == [keys.client_owner("c1")]


async def test_owners_reads_many_claims_at_once(store: SubscriptionStore) -> None:
    clients = [f"client-{i}" for i in range(20)]  # spread over the slots of a cluster
    for index, client_id in enumerate(clients[:15]):
        await store.claim(client_id, f"node-{index % 3}")
    assert await store.owners([]) == []
    owners = await store.owners([*reversed(clients), clients[0]])
    assert owners == [await store.owner(c) for c in [*reversed(clients), clients[0]]]
    assert owners[:5] == [None] * 5 and all(owner is not None for owner in owners[5:])


async def test_epochs_keep_growing_after_the_client_was_removed(store: SubscriptionStore) -> None:
    before = await store.claim("c1", "node-a")
    await store.remove_client("c1")
    assert await store.owner("c1") is None
    after = await store.claim("c1", "node-a")
    assert after.epoch > before.epoch


async def test_a_stale_owner_cannot_write(store: SubscriptionStore) -> None:
    old = await store.claim("c1", "node-a")
    await store.subscribe("c1", "keep", QOS1, owner=old)
    new = await store.claim("c1", "node-b")
    stale_same_node = Owner("node-b", old.epoch)
    for stale in (old, stale_same_node, Owner("node-a", new.epoch)):
        with pytest.raises(SessionOwnershipError):
            await store.subscribe("c1", "lost", owner=stale)
        with pytest.raises(SessionOwnershipError):
            await store.unsubscribe("c1", "keep", owner=stale)
        with pytest.raises(SessionOwnershipError):
            await store.remove_client("c1", owner=stale)
    assert await store.subscriptions("c1") == {"keep": QOS1}
    assert await store.owner("c1") == new
    assert await store.subscribe("c1", "won", owner=new) is True
    assert await store.unsubscribe("c1", "keep", owner=new) is True
    assert set(await store.subscriptions("c1")) == {"won"}


async def test_an_owner_check_without_an_owner_fails(store: SubscriptionStore) -> None:
    with pytest.raises(SessionOwnershipError):
        await store.subscribe("c1", "a", owner=Owner("node-a", 1))
    assert await store.subscriptions("c1") == {}


async def test_remove_client_deletes_every_key_of_the_client(
    store: SubscriptionStore, redis_client: RedisClient
) -> None:
    owner = await store.claim("c1", "node-a")
    await store.subscribe_many("c1", [("a", QOS1), ("b", QOS1)], owner=owner)
    await store.subscribe("c2", "a")
    for key, field, value in (
        (store.keys.client_aliases("c1", "client"), "1", "t"),
        (store.keys.client_alias_topics("c1", "client"), "t", "1"),
        (store.keys.client_aliases("c1", "server"), "2", "u"),
        (store.keys.client_alias_topics("c1", "server"), "u", "2"),
        (store.keys.client_alias_maximum("c1"), "client", "10"),
    ):
        await redis_client.hset(key, field, value)
    removed = await store.remove_client("c1", owner=owner)
    assert (removed.subscriptions, removed.aliases, removed.owner) == (2, 2, True)
    for key in store.client_keys("c1"):
        assert await redis_client.exists(key) == 0, key
    assert await store.subscriptions("c2") == {"a": DEFAULT_OPTIONS}
    again = await store.remove_client("c1")
    assert tuple(again) == (0, 0, False)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.subscribe("", "a"), InvalidIdError),
        (lambda s: s.subscribe("c1", "a/#/b"), InvalidTopicError),
        (lambda s: s.subscribe("c1", "x" * 65536), InvalidTopicError),
        (lambda s: s.subscribe("c1", "ü" * 40000), InvalidTopicError),
        (lambda s: s.subscribe("c1", ""), InvalidTopicError),
        (lambda s: s.subscribe("c1", "$share/g"), InvalidTopicError),
        (lambda s: s.subscribe("c1", "a", {"qos": 1}), InvalidOptionsError),
        (lambda s: s.subscribe_many("c1", [("ok", QOS1), ("bad+", QOS1)]), InvalidTopicError),
        (lambda s: s.unsubscribe_many("c1", ["ok", "#/x"]), InvalidTopicError),
        (lambda s: s.claim("c1", ""), InvalidIdError),
        (lambda s: s.claim("", "node-a"), InvalidIdError),
        (lambda s: s.subscribe("c1", "a", owner=Owner("", 1)), InvalidIdError),
        (lambda s: s.subscribe("c1", "a", owner=Owner("n", 0)), InvalidIdError),
        (lambda s: s.remove_client(""), InvalidIdError),
    ],
)
async def test_bad_input_raises_and_changes_nothing(
    store: SubscriptionStore, call: object, error: type[RouterError]
) -> None:
    await store.subscribe("c1", "keep", QOS1)
    owner = await store.claim("c1", "node-a")
    with pytest.raises(error):
        await call(store)  # type: ignore[operator]
    assert await store.subscriptions("c1") == {"keep": QOS1}
    assert await store.owner("c1") == owner


async def test_garbage_options_in_redis_raise_corrupt_state(
    store: SubscriptionStore, redis_client: RedisClient
) -> None:
    key = store.keys.client_subscriptions("c1")
    for garbage in (b"\xc1", b"not msgpack at all", msgpack.packb([9, 0, 0, 0, None]), b"\x90"):
        await redis_client.hset(key, "a", garbage)
        with pytest.raises(CorruptStateError):
            await store.subscriptions("c1")
        assert await redis_client.hget(key, "a") == garbage


async def test_a_garbage_epoch_in_redis_raises_corrupt_state(
    store: SubscriptionStore, redis_client: RedisClient
) -> None:
    owner = await store.claim("c1", "node-a")
    await store.subscribe("c1", "keep", owner=owner)
    key = store.keys.client_owner("c1")
    await redis_client.hset(key, "epoch", "twelve")
    with pytest.raises(CorruptStateError):
        await store.claim("c1", "node-b")
    with pytest.raises(CorruptStateError):
        await store.owner("c1")
    with pytest.raises(CorruptStateError):
        await store.owners(["c2", "c1"])
    with pytest.raises(CorruptStateError):
        await store.subscribe("c1", "new", owner=owner)
    assert await redis_client.hgetall(key) == {
        b"node": b"node-a",
        b"epoch": b"twelve",
        b"user": b"",
    }
    assert set(await store.subscriptions("c1")) == {"keep"}


async def test_an_adoption_claims_marks_away_and_returns_the_session_in_one_step(
    store: SubscriptionStore, sessions: SessionStore, redis_client: RedisClient, keys: Keys
) -> None:
    dead = await store.claim("c1", "node-a")
    await sessions.mark_open("c1", dead, expiry=60, protocol=5, keepalive=30, username="u")
    await store.subscribe("c1", "a/+", QOS1, owner=dead)
    await store.subscribe("c1", "b/#", FANCY, owner=dead)
    adopted = await sessions.adopt("c1", dead, "node-b")
    assert adopted is not None
    owner, info, filters = adopted
    assert owner.node_id == "node-b" and owner.epoch > dead.epoch
    assert filters == {"a/+": QOS1, "b/#": FANCY}
    assert (info.node_id, info.connected, info.expiry) == ("node-b", False, 60)
    assert (info.protocol, info.keepalive, info.username) == (5, 30, "u")
    assert info == await sessions.describe("c1")
    assert await store.owner("c1") == owner
    for key in store.client_keys("c1"):
        assert 0 < await redis_client.pttl(key) <= 60_000 or not await redis_client.exists(key)
    assert await sessions.adopt("c1", dead, "node-c") is None  # (adopted already)
    assert await store.owner("c1") == owner


async def test_an_adopted_session_that_never_expires_keeps_its_keys(
    store: SubscriptionStore, sessions: SessionStore, redis_client: RedisClient, keys: Keys
) -> None:
    dead = await store.claim("c1", "node-a")
    await sessions.mark_open("c1", dead, expiry=NEVER)
    await store.subscribe("c1", "a/+", QOS1, owner=dead)
    adopted = await sessions.adopt("c1", dead, "node-b")
    assert adopted is not None and adopted.info.expiry == NEVER
    for key in (keys.client_subscriptions("c1"), keys.client_owner("c1")):
        assert await redis_client.pttl(key) == -1


async def test_an_adoption_leaves_a_session_its_client_resumed_meanwhile(
    store: SubscriptionStore, sessions: SessionStore
) -> None:
    dead = await store.claim("c1", "node-a")
    await sessions.mark_open("c1", dead, expiry=60)
    await store.subscribe("c1", "a/+", QOS1, owner=dead)
    resumed = await store.claim("c1", "node-c")
    assert await sessions.adopt("c1", dead, "node-b") is None
    assert await store.owner("c1") == resumed
    assert await sessions.adopt("gone", Owner("node-a", 5), "node-b") is None
    assert await store.owner("gone") is None


async def test_an_adoption_leaves_a_session_that_is_not_persistent_as_it_is(
    store: SubscriptionStore, sessions: SessionStore, redis_client: RedisClient
) -> None:
    clean = await store.claim("clean", "node-a")
    await sessions.mark_open("clean", clean, expiry=0)
    undescribed = await store.claim("undescribed", "node-a")
    for client_id, dead in (("clean", clean), ("undescribed", undescribed)):
        await store.subscribe(client_id, "a/+", QOS1, owner=dead)
        before = {key: await redis_client.dump(key) for key in store.client_keys(client_id)}
        assert await sessions.adopt(client_id, dead, "node-b") is None
        after = {key: await redis_client.dump(key) for key in store.client_keys(client_id)}
        assert after == before
        assert await store.owner(client_id) == dead


async def test_a_session_is_claimed_only_by_the_user_it_records(
    store: SubscriptionStore, redis_client: RedisClient
) -> None:
    """Before, any user's client could claim (resume, take over) any client id's session."""
    _, alice = await store.claim_over("phone", "node-a", user="alice", shared=False)
    await store.subscribe("phone", "alice/secret", owner=alice)
    key = store.keys.client_owner("phone")
    before = await redis_client.hgetall(key)
    for user, fresh in (("bob", False), ("bob", True), (None, False)):
        with pytest.raises(SessionUserError):
            await store.claim_over("phone", "node-b", fresh=fresh, user=user, shared=False)
    assert await redis_client.hgetall(key) == before  # (nothing changed)
    assert set(await store.subscriptions("phone")) == {"alice/secret"}
    previous, again = await store.claim_over("phone", "node-b", user="alice", shared=False)
    assert previous == alice and again.epoch > alice.epoch
    _, anyone = await store.claim_over("phone", "node-c", user="bob", shared=True)
    assert await store.owner("phone") == anyone
    with pytest.raises(SessionUserError):  # (bob's now: the claim records the claimer)
        await store.claim_over("phone", "node-a", user="alice", shared=False)
    await store.claim_over("kiosk", "node-a", shared=False)
    with pytest.raises(SessionUserError):
        await store.claim_over("kiosk", "node-a", user="mallory", shared=False)
    await redis_client.hdel(store.keys.client_owner("kiosk"), "user")  # (written before users)
    await store.claim_over("kiosk", "node-b", user="mallory", shared=False)
    with pytest.raises(InvalidIdError):
        await store.claim_over("kiosk", "node-b", user="a\x00b", shared=False)


async def test_an_empty_user_name_is_a_user_of_its_own(store: SubscriptionStore) -> None:
    """Before, an empty user name (allowed by MQTT 5.0 3.1.3.5 and 3.1.1 3.1.3.4) was
    refused as an invalid id, so its CONNECT got 0x85 / 0x02."""
    _, empty = await store.claim_over("tablet", "node-a", user="", shared=False)
    previous, again = await store.claim_over("tablet", "node-b", user="", shared=False)
    assert previous == empty and again.epoch > empty.epoch
    for other in (None, "bob"):
        with pytest.raises(SessionUserError):
            await store.claim_over("tablet", "node-a", user=other, shared=False)
    await store.claim_over("desk", "node-a", shared=False)  # (no user name)
    with pytest.raises(SessionUserError):
        await store.claim_over("desk", "node-a", user="", shared=False)


@pytest.mark.parametrize("client_id", ["c1", "a{b}%c", "ü/+#"])
def test_client_keys_are_the_keys_of_each_kind_in_the_scripts_order(client_id: str) -> None:
    keys = Keys("rt")
    store = SubscriptionStore(None, keys)  # type: ignore[arg-type]
    aliases = [
        name
        for namespace in NAMESPACES
        for name in (
            keys.client_aliases(client_id, namespace),
            keys.client_alias_topics(client_id, namespace),
        )
    ]
    assert store.client_keys(client_id) == [
        keys.client_subscriptions(client_id),
        keys.client_owner(client_id),
        *aliases,
        keys.client_alias_maximum(client_id),
        keys.client_session(client_id),
    ]


async def test_a_claim_that_opens_the_session_leaves_what_claim_then_mark_open_leave(
    store: SubscriptionStore, redis_client: RedisClient, keys: Keys
) -> None:
    sessions = SessionStore(redis_client, keys, store)
    for client_id in ("two-steps", "one-step"):  # (each away first: its keys expire)
        owner = await store.claim(client_id, "n0")
        await store.subscribe(client_id, "a/b", QOS1, owner=owner)
        await sessions.mark_away(client_id, owner, expiry=60)
    first = await store.claim("two-steps", "n1")
    await sessions.mark_open("two-steps", first, expiry=0, protocol=4, keepalive=30, username="u")
    fields = open_fields(0, 4, 30, "u")
    _previous, second = await store.claim_over("one-step", "n1", open_session=fields)
    assert await store.owner("one-step") == second
    two, one = await sessions.describe("two-steps"), await sessions.describe("one-step")
    assert one is not None and two is not None
    assert replace(one, client_id="", since=0) == replace(two, client_id="", since=0)
    assert one.connected and one.node_id == "n1" and one.username == "u"
    for key in store.client_keys("one-step"):
        assert await redis_client.pttl(key) < 0  # (connected: nothing expires)


async def test_a_claim_that_opens_refuses_bad_fields_before_anything_changes(
    store: SubscriptionStore,
) -> None:
    owner = await store.claim("c1", "n0")
    with pytest.raises(ScriptError):
        await store.claim_over("c1", "n1", open_session=["expiry"])  # (a field without value)
    assert await store.owner("c1") == owner
