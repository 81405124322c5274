"""The cluster's bans in Redis: added, listed, ended by time, lifted; bad input refused
with nothing written; on fakeredis, a real Redis and the 3-master cluster."""

from __future__ import annotations

import msgpack
import pytest

from router.errors import InvalidIdError, InvalidSettingError
from router.state.ban_store import Ban, BanStore
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support import waiting


async def test_bans_are_listed_until_they_end_or_are_lifted(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = BanStore(redis_client, keys)
    assert await store.bans() == []
    await store.add("client", "spammer", reason="floods")
    await store.add("user", "mallory", seconds=0.3)
    made = await store.add("address", "0:0::1", seconds=600)
    assert (made.kind, made.value) == ("address", "::1")  # (normalised)
    listed = await store.bans()
    assert [(b.kind, b.value, b.reason) for b in listed] == [
        ("address", "::1", ""),
        ("client", "spammer", "floods"),
        ("user", "mallory", ""),
    ]
    assert listed[1].until == 0 and listed[2].until > 0

    async def mallory_gone() -> bool:
        return [b.value for b in await store.bans()] == ["::1", "spammer"]

    await waiting.eventually(mallory_gone, 5.0, "mallory's ban ended, the others stay")
    assert len(await redis_client.hgetall(store.key)) == 2  # (the ended one is gone)
    assert await store.remove("client", "spammer")
    assert not await store.remove("client", "spammer")
    assert [b.value for b in await store.bans()] == ["::1"]


@pytest.mark.parametrize(
    ("kind", "value", "seconds", "error"),
    [
        ("host", "x", None, InvalidSettingError),
        ("address", "not-an-ip", None, InvalidSettingError),
        ("client", "", None, InvalidIdError),
        ("client", "x", 0, InvalidSettingError),
        ("client", "x", float("inf"), InvalidSettingError),
    ],
)
async def test_a_bad_ban_is_refused_and_nothing_is_written(
    redis_client: RedisClient,
    keys: Keys,
    kind: str,
    value: str,
    seconds: float | None,
    error: type[Exception],
) -> None:
    store = BanStore(redis_client, keys)
    with pytest.raises(error):
        await store.add(kind, value, seconds=seconds)
    assert await redis_client.hgetall(store.key) == {}


async def test_an_entry_the_router_did_not_write_is_skipped(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = BanStore(redis_client, keys)
    await redis_client.hset(store.key, "client:odd", b"not msgpack \xc1")
    await redis_client.hset(store.key, "planet:mars", msgpack.packb([0, ""]))
    await store.add("client", "real")
    assert await store.bans() == [Ban("client", "real", 0.0, "")]


async def test_a_ban_that_does_not_replace_keeps_the_one_there(
    redis_client: RedisClient, keys: Keys
) -> None:
    """The flapping detector's ban must not shorten an operator's ban for good."""
    store = BanStore(redis_client, keys)
    await store.add("client", "spammer", reason="floods")
    kept = await store.add("client", "spammer", seconds=60, reason="flapping", replace=False)
    assert (kept.until, kept.reason) == (0.0, "floods")
    assert await store.bans() == [kept]
    made = await store.add("client", "new", seconds=60, reason="flapping", replace=False)
    assert made.reason == "flapping" and made.until > 0
