"""Per-client figures, slow subscribers and drop reasons through the HTTP API, on two
nodes: a client of node b that never acknowledges shows its real queue depth and drops
on node a's API, which does not serve it (the figures travel through Redis)."""

from __future__ import annotations

from typing import Any

import aiohttp

from router.core.messages import Outgoing
from router.state.client_figures import NODE_DROP_REASONS
from tests.support import waiting
from tests.support.http_api import WAIT, Site, call
from tests.support.raw_mqtt import RawClient

PUBLISHED = 10_050  # (b's queue keeps 10,000: the node's default queue_limit)
WINDOW = 5  # the client's Receive Maximum: what may be in flight, never acknowledged


async def test_a_client_that_never_reads_shows_its_queue_and_drops_everywhere(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    a, b = sites
    stuck = await RawClient.connect(
        b.port, "slow-1", clean_start=True, expiry=0, receive_maximum=WINDOW
    )
    await stuck.subscribe("plant/#", 1)
    reader = await RawClient.connect(b.port, "fast-1", clean_start=True, expiry=0)
    await reader.subscribe("other/#", 0)
    for start in range(0, PUBLISHED, 1000):
        count = min(1000, PUBLISHED - start)
        await a.node.publish_many([Outgoing("plant/line", b"0123456789", 1)] * count)
    await reader.publish_now("other/x", b"hello")
    last: dict[str, Any] = {}

    async def settled() -> bool:
        status, detail = await call(http, "GET", a.url + "/api/v1/clients/slow-1")
        assert status == 200, detail
        last.update(detail)
        figures = detail["figures"]
        return figures is not None and figures["queued_memory"] == 10_000

    await waiting.eventually(settled, WAIT, lambda: last)
    figures = last["figures"]
    assert figures["node"] == "b" and last["node"] == "b"
    assert (figures["inflight"], figures["messages_out"]) == (WINDOW, WINDOW)
    assert figures["drops"]["queue_full"] == PUBLISHED - 10_000 - WINDOW == figures["dropped"]
    assert figures["queued_memory_bytes"] == 100_000
    assert (last["queued"], last["queued_memory"], last["queued_redis"]) == (10_000, 10_000, 0)
    assert figures["last_activity_ms"] > 0 and "connection" in last  # (null: not a's)

    status, own = await call(http, "GET", b.url + "/api/v1/clients/slow-1")
    assert status == 200 and own["figures"]["queued_memory"] == 10_000  # (b's own, now)
    assert own["connection"]["inflight"] == WINDOW

    status, rows = await call(http, "GET", a.url + "/api/v1/clients?prefix=slow")
    assert status == 200 and [r["queued"] for r in rows["items"]] == [10_000]

    async def fast_reported() -> bool:
        status, detail = await call(http, "GET", a.url + "/api/v1/clients/fast-1")
        last.update(detail)
        return status == 200 and (detail["figures"] or {}).get("messages_in") == 1

    await waiting.eventually(fast_reported, WAIT, lambda: last)
    assert last["figures"]["bytes_in"] == 5 and last["figures"]["dropped"] == 0

    status, slow = await call(http, "GET", a.url + "/api/v1/slow-subscribers?limit=3")
    assert status == 200, slow
    assert [r["client_id"] for r in slow["by_queue"]] == ["slow-1"]
    assert slow["by_drops"][0]["client_id"] == "slow-1"
    assert slow["by_drops"][0]["dropped"] == PUBLISHED - 10_000 - WINDOW

    status, overview = await call(http, "GET", a.url + "/api/v1/overview")
    assert status == 200 and set(overview["drops"]) == set(NODE_DROP_REASONS)
    assert overview["drops"]["queue_drops"]["total"] == PUBLISHED - 10_000 - WINDOW
    assert all(d["per_s"] >= 0 for d in overview["drops"].values())
    status, error = await call(http, "GET", a.url + "/api/v1/slow-subscribers?limit=0")
    assert status == 400, error
    stuck.drop()
    reader.drop()


async def test_the_busiest_topic_filters_add_up_the_publishes_of_every_node(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    """Each publish counts once per matching filter, at the node where it entered; a's
    API ranks the filters of both nodes' publishes (plant/# gets four of every five)."""
    a, b = sites
    subscriber = await RawClient.connect(b.port, "watcher", clean_start=True, expiry=0)
    await subscriber.subscribe("plant/#", 0)
    await subscriber.subscribe("other/#", 0)
    last: dict[str, Any] = {}

    async def ranked() -> bool:
        await a.node.publish_many([Outgoing("plant/line", b"x")] * 3 + [Outgoing("other/x", b"y")])
        await b.node.publish_many([Outgoing("plant/line", b"x"), Outgoing("nobody/x", b"z")])
        status, found = await call(http, "GET", a.url + "/api/v1/busiest-filters?limit=5")
        assert status == 200, found
        last.update(found)
        rows = [(row["filter"], row["nodes"]) for row in found["items"]]
        return rows == [("plant/#", 2), ("other/#", 1)]

    await waiting.eventually(ranked, WAIT, lambda: last)
    assert all(row["per_s"] > 0 for row in last["items"])
    status, error = await call(http, "GET", a.url + "/api/v1/busiest-filters?limit=101")
    assert status == 400, error
    subscriber.drop()
