"""Topic aliases in Redis against the shared alias table (tests/support/alias_cases.py).

The same steps the in-memory AliasTable passes (tests/core/test_aliases.py) run here on
fakeredis, a real standalone Redis and a 3-master Redis Cluster.
"""

from __future__ import annotations

import pytest

from router.errors import (
    CorruptStateError,
    InvalidAliasError,
    InvalidIdError,
    InvalidTopicError,
    RouterError,
    ScriptError,
    SessionOwnershipError,
)
from router.state.alias_store import AliasCopy, RedisAliasTable
from router.state.keys import Keys
from router.state.scripts import RedisClient, Scripts
from router.state.subscriptions import SubscriptionStore
from tests.support.alias_cases import ALIAS_CASES, Step


@pytest.fixture
def table(redis_client: RedisClient, keys: Keys) -> RedisAliasTable:
    return RedisAliasTable(redis_client, keys)


async def run_steps(table: RedisAliasTable, steps: list[Step]) -> None:
    for step in steps:
        op, *args = step
        if op == "bind":
            await table.bind(*args)
        elif op == "bind!":
            client_id, namespace = args[0], args[1]
            before = await _all(table, client_id)
            with pytest.raises(RouterError):
                await table.bind(*args)
            if namespace in ("client", "server"):
                assert await _all(table, client_id) == before, step
        elif op == "maximum":
            await table.set_maximum(*args)
        elif op == "topic":
            *query, expected = args
            assert await table.topic(*query) == expected, step
        elif op == "alias":
            *query, expected = args
            assert await table.alias(*query) == expected, step
        elif op == "remove_client":
            client_id, expected = args
            assert await table.remove_client(client_id) == expected, step
        else:
            raise AssertionError(f"unknown step {step}")


async def _all(table: RedisAliasTable, client_id: str) -> tuple[dict[int, str], dict[int, str]]:
    return await table.aliases(client_id, "client"), await table.aliases(client_id, "server")


@pytest.mark.parametrize("name", sorted(ALIAS_CASES))
async def test_alias_case(table: RedisAliasTable, name: str) -> None:
    await run_steps(table, ALIAS_CASES[name])


async def test_both_directions_stay_consistent(
    table: RedisAliasTable, redis_client: RedisClient
) -> None:
    await table.bind("c", "client", 1, "a")
    await table.bind("c", "client", 2, "b")
    await table.bind("c", "client", 1, "b")
    await table.bind("c", "client", 3, "c")
    await table.bind("c", "client", 3, "a")
    forward = await table.aliases("c", "client")
    assert forward == {1: "b", 3: "a"}
    reverse = await redis_client.hgetall(table.keys.client_alias_topics("c", "client"))
    assert {int(v): k.decode() for k, v in reverse.items()} == forward


async def test_lowering_the_maximum_drops_aliases_above_it(table: RedisAliasTable) -> None:
    await table.bind("c", "client", 5, "five")
    await table.bind("c", "client", 2, "two")
    assert await table.set_maximum("c", "client", 3) == 1
    assert await table.aliases("c", "client") == {2: "two"}
    assert await table.alias("c", "client", "five") is None
    assert await table.set_maximum("c", "client", 0) == 1
    with pytest.raises(InvalidAliasError) as info:
        await table.bind("c", "client", 1, "one")
    assert info.value.alias == 1
    assert await table.aliases("c", "client") == {}


async def test_bad_maximum_and_ids(table: RedisAliasTable) -> None:
    for maximum in (-1, 65536, "7", 1.5):
        with pytest.raises(InvalidAliasError):
            await table.set_maximum("c", "client", maximum)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        await table.bind("", "client", 1, "t")
    with pytest.raises(InvalidIdError):
        await table.remove_client("")
    with pytest.raises(InvalidTopicError):
        await table.bind("c", "client", 1, "t" * 65536)
    assert await table.aliases("c", "client") == {}


async def test_aliases_are_removed_with_the_client_data(
    table: RedisAliasTable, redis_client: RedisClient, keys: Keys
) -> None:
    await table.set_maximum("c", "server", 100)
    await table.bind("c", "client", 1, "in")
    await table.bind("c", "server", 9, "out")
    removed = await SubscriptionStore(redis_client, keys).remove_client("c")
    assert removed.aliases == 2
    assert await _all(table, "c") == ({}, {})
    assert await table.alias("c", "server", "out") is None
    await table.bind("c", "server", 101, "over/the/old/maximum")


async def test_garbage_in_redis_raises_corrupt_state(
    table: RedisAliasTable, redis_client: RedisClient
) -> None:
    await table.bind("c", "client", 1, "keep")
    await redis_client.hset(table.keys.client_alias_maximum("c"), "client", "lots")
    with pytest.raises(CorruptStateError):
        await table.bind("c", "client", 2, "new")
    await redis_client.hset(table.keys.client_alias_topics("c", "client"), "keep", "one")
    with pytest.raises(CorruptStateError):
        await table.alias("c", "client", "keep")
    await redis_client.hset(table.keys.client_aliases("c", "client"), "x", "bad")
    with pytest.raises(CorruptStateError):
        await table.aliases("c", "client")
    assert await redis_client.hget(table.keys.client_aliases("c", "client"), "2") is None


async def test_scripts_refuse_malformed_argv(
    table: RedisAliasTable, redis_client: RedisClient
) -> None:
    await table.bind("c", "client", 1, "keep")
    scripts = Scripts(redis_client)
    keys = [
        table.keys.client_aliases("c", "client"),
        table.keys.client_alias_topics("c", "client"),
        table.keys.client_alias_maximum("c"),
    ]
    for args in ([], ["client", "2"], ["sideways", "2", "t"], ["client", "2", ""]):
        with pytest.raises(ScriptError):
            await scripts.run("alias_bind", keys, args)
    for alias in ("0", "65536", "x", "-1", "1.5", "070000"):
        with pytest.raises(InvalidAliasError):
            await scripts.run("alias_bind", keys, ["client", alias, "t"])
    for args in ([], ["client"], ["client", "x"], ["client", "65536"], ["up", "1"]):
        with pytest.raises(ScriptError):
            await scripts.run("alias_maximum", keys, args)
    with pytest.raises(ScriptError):
        await scripts.run("alias_remove", [*keys[:2], *keys], ["extra"])
    assert await table.aliases("c", "client") == {1: "keep"}
    assert await table.alias("c", "client", "keep") == 1


async def test_a_mirrored_copy_replaces_both_namespaces_under_its_owner(
    table: RedisAliasTable, redis_client: RedisClient, keys: Keys
) -> None:
    subs = SubscriptionStore(redis_client, keys)
    owner = await subs.claim("c", "n1")
    await table.bind("c", "client", 9, "old/left")
    copy = AliasCopy("c", owner, ((10, {1: "a/b", 2: "c"}), (3, {1: "out/x"})))
    assert await table.mirror([copy]) == [3]
    assert await _all(table, "c") == ({1: "a/b", 2: "c"}, {1: "out/x"})
    assert await table.alias("c", "client", "a/b") == 1
    assert await table.alias("c", "client", "old/left") is None  # (the reverse replaced too)
    with pytest.raises(InvalidAliasError):  # (the maximums are the copy's)
        await table.bind("c", "server", 4, "t")
    assert await table.mirror([AliasCopy("c", owner, None)]) == [0]
    assert await _all(table, "c") == ({}, {})
    assert await redis_client.exists(keys.client_alias_maximum("c")) == 0


async def test_a_mirrored_copy_under_an_older_claim_changes_nothing(
    table: RedisAliasTable, redis_client: RedisClient, keys: Keys
) -> None:
    """A takeover: node n2 claims the session after n1; n1's late copies are refused."""
    subs = SubscriptionStore(redis_client, keys)
    old = await subs.claim("c", "n1")
    new = await subs.claim("c", "n2")
    fresh = AliasCopy("c", new, ((5, {1: "new/topic"}), (0, {})))
    stale = AliasCopy("c", old, ((5, {2: "old/topic"}), (0, {})))
    gone = AliasCopy("unclaimed", old, None)
    assert await table.mirror([fresh]) == [1]
    replies = await table.mirror([stale, AliasCopy("c", old, None), gone])
    assert all(isinstance(reply, SessionOwnershipError) for reply in replies), replies
    assert await _all(table, "c") == ({1: "new/topic"}, {})
