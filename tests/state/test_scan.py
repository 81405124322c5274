"""Paged SCAN: every matching key, once, in pages of the asked size, with no cap on the
total; on fakeredis, a real Redis and a 3-master Redis Cluster (every master scanned)."""

from __future__ import annotations

from router.state.keys import Keys
from router.state.scan import scan_keys, scan_pages
from router.state.scripts import RedisClient


async def test_pages_cover_every_key_once_and_a_limit_says_it_stopped(
    redis_client: RedisClient, keys: Keys
) -> None:
    names = {f"{keys.prefix}:{{c:{index}}}:session" for index in range(25)}
    for name in names:
        await redis_client.set(name, b"1")
    await redis_client.set(f"{keys.prefix}:other", b"1")
    pattern = f"{keys.prefix}:{{c:*}}:session"
    pages = [page async for page in scan_pages(redis_client, pattern, page=4, count=3)]
    assert all(1 <= len(page) <= 4 for page in pages)
    found = [name for page in pages for name in page]
    assert sorted(found) == sorted(names)
    capped = await scan_keys(redis_client, pattern, limit=10)
    assert len(capped.keys) == 10 and not capped.complete
    whole = await scan_keys(redis_client, pattern, limit=100)
    assert sorted(whole.keys) == sorted(names) and whole.complete
