"""The dashboard's login throttle in Redis (real Redis and a 3-master cluster): slots
per user and per address, taken at once or not at all, given back, freed by time."""

from __future__ import annotations

import math

import pytest

from router.errors import InvalidSettingError, LoginThrottledError
from router.state.keys import Keys
from router.state.login_attempts import LoginAttempts
from router.state.scripts import RedisClient
from tests.support import waiting

pytestmark = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def test_slots_per_user_and_per_address(redis_client: RedisClient, keys: Keys) -> None:
    attempts = LoginAttempts(redis_client, keys, limit=2, window=60.0)
    first = await attempts.take("root", "10.0.0.1")
    await attempts.take("root", "10.0.0.2")
    with pytest.raises(LoginThrottledError) as refused:
        await attempts.take("root", "10.0.0.3")  # (the user is full: nothing taken)
    assert "for user 'root'" in str(refused.value) and 1 <= refused.value.retry_after <= 60
    await attempts.take("ops", "10.0.0.1")
    with pytest.raises(LoginThrottledError, match=r"from 10\.0\.0\.1"):
        await attempts.take("other", "10.0.0.1")  # (the address is full)
    await attempts.take("other", "10.0.0.3")  # (the refused tries took no slot there)
    # a slot given back is free again, for the user and for the address
    await attempts.release(first)
    await attempts.take("root", "10.0.0.1")
    stored = await redis_client.zcard(keys.console_login_attempts("address", "10.0.0.1"))
    assert stored == 2
    assert await redis_client.pttl(keys.console_login_attempts("address", "10.0.0.1")) > 0


async def test_a_slot_leaves_the_window_with_time(redis_client: RedisClient, keys: Keys) -> None:
    attempts = LoginAttempts(redis_client, keys, limit=1, window=0.3)
    await attempts.take("root", "::1")
    with pytest.raises(LoginThrottledError) as refused:
        await attempts.take("root", "::1")
    assert refused.value.retry_after == 1  # (whole seconds, at least one)

    async def free() -> bool:
        try:
            await attempts.take("root", "::1")
        except LoginThrottledError:
            return False
        return True

    await waiting.eventually(free, 5.0, "the slot left the 0.3 s window")


@pytest.mark.parametrize(("limit", "window"), [(0, 60.0), (10**6, 60.0), (10, 0.0), (10, -1.0)])
def test_bad_settings(redis_client: RedisClient, keys: Keys, limit: int, window: float) -> None:
    with pytest.raises(InvalidSettingError):
        LoginAttempts(redis_client, keys, limit=limit, window=window)


def test_not_a_number_is_no_window(redis_client: RedisClient, keys: Keys) -> None:
    for window in (math.nan, math.inf):
        with pytest.raises(InvalidSettingError):
            LoginAttempts(redis_client, keys, limit=10, window=window)
