"""Bounded SCAN over a standalone Redis or every primary of a Redis Cluster (never KEYS).

Operator tools find entities that no index lists (route sets of unregistered nodes,
channels, clients) by scanning key names. :func:`scan_keys` walks the keyspace in batches
of ``count`` keys a call (SCAN never blocks the server for long), stops after ``limit``
matches and says whether it saw everything. Keys that are not UTF-8 text cannot be
router keys and are skipped. Redis failing raises as :mod:`router.state.failures` says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final, NamedTuple

from redis.asyncio.cluster import RedisCluster

from router.state.failures import translating
from router.state.scripts import RedisClient

SCAN_COUNT: Final = 500
"""Keys examined per SCAN call (a hint to the server)."""
DEFAULT_LIMIT: Final = 10_000
"""Matches returned at most, unless the caller says otherwise."""


class ScanResult(NamedTuple):
    """Matching key names (at most the limit) and whether the scan covered the keyspace."""

    keys: list[str]
    complete: bool


async def scan_keys(
    redis: RedisClient,
    pattern: str,
    *,
    limit: int = DEFAULT_LIMIT,
    count: int = SCAN_COUNT,
    slot_key: str | None = None,
) -> ScanResult:
    """Key names matching the glob ``pattern``, at most ``limit`` of them.

    On a cluster every primary is scanned, or only the one serving ``slot_key`` when the
    pattern matches keys of one hash tag. A key may be returned twice when the keyspace
    changes during the scan (SCAN's guarantee); duplicates are dropped. Raises
    ``ValueError`` for a ``limit`` below 1.
    """
    if type(limit) is not int or limit < 1:
        raise ValueError(f"limit must be a positive int, not {limit!r}")
    options: dict[str, Any] = {"match": pattern, "count": count}
    if isinstance(redis, RedisCluster):
        target = redis.get_node_from_key(slot_key) if slot_key is not None else None
        options["target_nodes"] = target if target is not None else RedisCluster.PRIMARIES
    found: dict[str, None] = {}
    iterator = redis.scan_iter(**options)
    with translating:
        try:
            async for raw in iterator:
                key = _text(raw)
                if key is None:
                    continue
                found[key] = None
                if len(found) >= limit:
                    # Full: complete only if nothing follows.
                    async for _ in iterator:
                        return ScanResult(list(found), False)
                    return ScanResult(list(found), True)
        finally:
            await iterator.aclose()  # type: ignore[attr-defined]
    return ScanResult(list(found), True)


async def scan_pages(
    redis: RedisClient, pattern: str, *, page: int = SCAN_COUNT, count: int = SCAN_COUNT
) -> AsyncIterator[list[str]]:
    """Every key name matching the glob ``pattern``, in pages of at most ``page`` names
    (no limit on the total: SCAN examines ``count`` keys a call, so the server is never
    blocked for long, and the caller works on a page while the next is not read yet).

    On a cluster every primary is scanned. A key is yielded once even if the keyspace
    changes during the scan; a key added meanwhile may or may not be (SCAN's guarantee).
    """
    if type(page) is not int or page < 1:
        raise ValueError(f"page must be a positive int, not {page!r}")
    options: dict[str, Any] = {"match": pattern, "count": count}
    if isinstance(redis, RedisCluster):
        options["target_nodes"] = RedisCluster.PRIMARIES
    seen: set[str] = set()
    batch: list[str] = []
    iterator = redis.scan_iter(**options)
    with translating:
        try:
            async for raw in iterator:
                key = _text(raw)
                if key is None or key in seen:
                    continue
                seen.add(key)
                batch.append(key)
                if len(batch) >= page:
                    yield batch
                    batch = []
        finally:
            await iterator.aclose()  # type: ignore[attr-defined]
    if batch:
        yield batch


def _text(raw: Any) -> str | None:
    """A key name as text; None for one that is not UTF-8 (no router key)."""
    try:
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    except UnicodeDecodeError:
        return None
