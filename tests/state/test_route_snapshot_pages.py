"""A large route set is read in pages (HSCAN) and brought to one version with the stream:
the same answer as one atomic read, also while the writer goes on; on every backend.

The sets here are larger than 128 routes: Redis answers HSCAN on a smaller hash (a
listpack) in one reply whatever the COUNT."""

from __future__ import annotations

import random
from typing import Any

import pytest

from router.errors import InvalidIdError, ResyncRequiredError
from router.state.keys import Keys
from router.state.routes import RouteStore
from router.state.scripts import RedisClient

NODE = "node-a"
INC = "inc-1"
ROUTES = {f"site/{i}/+": 1 for i in range(300)} | {f"$share/g{i}/jobs/#": i + 2 for i in range(5)}


@pytest.fixture
def store(redis_client: RedisClient, keys: Keys) -> RouteStore:
    return RouteStore(redis_client, keys)


async def test_a_set_larger_than_a_page_is_read_in_pages_with_the_same_answer(
    store: RouteStore,
) -> None:
    claim = await store.claim(NODE, INC, ROUTES)
    await store.apply(NODE, INC, [("site/0/+", 0), ("extra", 1)])
    whole = await store.snapshot(NODE)  # (one script: the set fits the default page)
    calls = []
    hscan = store.redis.hscan

    async def counted(*args: Any, **options: Any) -> Any:
        calls.append(options.get("count"))
        return await hscan(*args, **options)

    store.redis.hscan = counted  # type: ignore[method-assign]
    paged = await store.snapshot(NODE, page=7)
    assert calls and set(calls) == {7}
    assert whole.routes == {**{r: n for r, n in ROUTES.items() if r != "site/0/+"}, "extra": 1}
    assert paged == whole
    assert (paged.generation, paged.version) == (claim.generation, 2)


async def test_a_paged_read_while_the_writer_goes_on_is_one_consistent_version(
    store: RouteStore,
) -> None:
    """The writer changes the set between every two pages and after the read: the routes
    the read returns are those of the version it returns (following the stream from
    there gives the final set)."""
    await store.claim(NODE, INC, ROUTES)
    shuffle = random.Random(7)
    names = [*ROUTES, *(f"new/{i}" for i in range(40))]

    async def write() -> None:
        batch = []
        for _ in range(3):
            name = shuffle.choice(names)
            batch.append((name, shuffle.choice([0, 1, 3] if "$share" in name else [0, 1])))
        await store.apply(NODE, INC, batch)

    hscan = store.redis.hscan

    async def interleaved(*args: Any, **options: Any) -> Any:
        await write()
        return await hscan(*args, **options)

    store.redis.hscan = interleaved  # type: ignore[method-assign]
    snap = await store.snapshot(NODE, page=5)
    store.redis.hscan = hscan  # type: ignore[method-assign]
    for _ in range(10):
        await write()
    routes = dict(snap.routes)
    followed = await store.changes(NODE, snap.generation, snap.version, limit=10_000)
    for change in followed.changes:
        if change.members:
            routes[change.route] = change.members
        else:
            routes.pop(change.route, None)
    final = await store.snapshot(NODE)
    assert final.version > snap.version > 0
    assert routes == final.routes


async def test_a_set_claimed_again_during_the_read_is_read_again_and_then_given_up(
    store: RouteStore,
) -> None:
    await store.claim(NODE, INC, ROUTES)
    hscan = store.redis.hscan
    claims_left = [1]

    async def reclaiming(*args: Any, **options: Any) -> Any:
        if claims_left[0]:
            claims_left[0] -= 1
            await store.claim(NODE, "inc-2", {"after/#": 1} | ROUTES)
        return await hscan(*args, **options)

    store.redis.hscan = reclaiming  # type: ignore[method-assign]
    snap = await store.snapshot(NODE, page=10)
    assert snap.incarnation == "inc-2" and snap.routes == {"after/#": 1} | ROUTES

    claims_left[0] = 10**6  # (claimed again during every read)
    with pytest.raises(ResyncRequiredError) as raised:
        await store.snapshot(NODE, page=10)
    assert raised.value.reason == "churn"


@pytest.mark.parametrize("page", [0, -1, 1.5, "10", None])
async def test_a_bad_page_size_is_refused(store: RouteStore, page: Any) -> None:
    with pytest.raises(InvalidIdError):
        await store.snapshot(NODE, page=page)
