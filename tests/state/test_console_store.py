"""The dashboard's accounts in Redis (fakeredis, real Redis, a 3-master cluster): users
with roles, logins that end with their user, API keys kept as digests, bad input."""

from __future__ import annotations

import pytest

from router.errors import CorruptStateError, InvalidSettingError, WeakPasswordError
from router.state.console_store import MIN_PASSWORD, ConsoleStore
from router.state.keys import Keys
from router.state.scripts import RedisClient

ROOT_PASSWORD = "root-password"
OPS_PASSWORD = "ops-password"


async def test_users_roles_and_logins(redis_client: RedisClient, keys: Keys) -> None:
    store = ConsoleStore(redis_client, keys)
    assert not await store.has_accounts()
    assert await store.add_user("root", ROOT_PASSWORD, "admin")
    assert not await store.add_user("root", "other-password", "viewer")  # (taken: nothing written)
    assert await store.add_user("ops", OPS_PASSWORD, "viewer")
    assert await store.users() == [("ops", "viewer"), ("root", "admin")]
    assert await store.has_accounts()

    found = await store.user_hash("root")
    assert found is not None and found[0] == "admin"
    assert found[1].verify(ROOT_PASSWORD) and not found[1].verify("other-password")
    assert await store.user_hash("nobody") is None
    assert await store.user_hash("bad name!") is None

    token, csrf = await store.open_login("root", "admin")
    principal = await store.login(token)
    assert principal is not None
    assert (principal.user, principal.role, principal.csrf) == ("root", "admin", csrf)
    assert await store.login(token + "x") is None
    # only the token's digest names the login: nothing in Redis holds the token
    stored = [key async for key in redis_client.scan_iter(match=f"{keys.prefix}*")]
    assert not any(token.encode() in key for key in stored)

    # a role changed or a user removed: the login follows at once
    assert await store.add_user("root", ROOT_PASSWORD, "viewer", replace=True)
    principal = await store.login(token)
    assert principal is not None and principal.role == "viewer"
    assert await store.remove_user("root")
    assert await store.login(token) is None
    assert not await store.remove_user("root")

    token, _ = await store.open_login("ops", "viewer")
    await store.close_login(token)
    assert await store.login(token) is None


async def test_api_keys(redis_client: RedisClient, keys: Keys) -> None:
    store = ConsoleStore(redis_client, keys)
    key = await store.add_api_key("ci", "admin")
    principal = await store.api_key(key)
    assert principal is not None and (principal.user, principal.role) == ("key:ci", "admin")
    assert principal.csrf is None  # (a key needs no CSRF token)
    [listed] = await store.api_keys()
    assert (listed.name, listed.role) == ("ci", "admin") and listed.key_id in key
    assert await store.api_key(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert await store.api_key("rk_nothing") is None
    assert all(
        key.split("_", 2)[2] not in str(v)
        for v in (await redis_client.hgetall(keys.console_api_keys())).values()
    )
    assert await store.remove_api_key(listed.key_id)
    assert await store.api_key(key) is None


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "ü", None])
async def test_bad_names_and_roles_write_nothing(
    redis_client: RedisClient, keys: Keys, name: object
) -> None:
    store = ConsoleStore(redis_client, keys)
    with pytest.raises(InvalidSettingError):
        await store.add_user(name, "pw", "admin")  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError):
        await store.add_user("ok", "pw", "owner")  # type: ignore[arg-type]
    with pytest.raises(WeakPasswordError):
        await store.add_user("ok", "", "admin")
    with pytest.raises(InvalidSettingError):
        await store.add_api_key("ok", "root")  # type: ignore[arg-type]
    assert not await store.has_accounts()


@pytest.mark.parametrize("replace", [False, True])
async def test_a_short_password_is_refused_before_anything_is_written(
    redis_client: RedisClient, keys: Keys, replace: bool
) -> None:
    """Before: a dashboard admin could be given a password of 5 characters."""
    store = ConsoleStore(redis_client, keys)
    for short in ("admin", "x" * (MIN_PASSWORD - 1)):
        with pytest.raises(WeakPasswordError) as raised:
            await store.add_user("root", short, "admin", replace=replace)
        assert raised.value.minimum == MIN_PASSWORD
        assert f"at least {MIN_PASSWORD} characters" in str(raised.value)
    assert not await store.has_accounts()
    assert await store.add_user("root", "x" * MIN_PASSWORD, "admin", replace=replace)


async def test_an_entry_written_by_hand_is_not_trusted(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = ConsoleStore(redis_client, keys)
    await redis_client.hset(keys.console_users(), "root", "god $7$bad")
    with pytest.raises(CorruptStateError):
        await store.user_hash("root")
    await redis_client.hset(keys.console_users(), "root", "admin not-a-hash")
    with pytest.raises(CorruptStateError):
        await store.user_hash("root")
