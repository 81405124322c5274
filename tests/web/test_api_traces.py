"""``/api/v1/traces`` (router.web.api_traces) on two nodes' listeners over a real Redis:
a trace started through the API follows its client where it is connected, its records
are read page after page, and bad traces are refused in words."""

from __future__ import annotations

import aiohttp

from tests.support import waiting
from tests.support.http_api import WAIT, Site, call, csrf
from tests.support.raw_mqtt import RawClient


async def test_a_trace_started_by_the_api_follows_its_client_on_its_node(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    a, b = sites
    headers = await csrf(http, a)
    body = {"kind": "client", "value": "probe-{1}", "seconds": 30}
    status, spec = await call(http, "POST", a.url + "/api/v1/traces", json=body, headers=headers)
    assert status == 201 and spec["value"] == "probe-{1}" and spec["by"] == "api"
    status, listed = await call(http, "GET", b.url + "/api/v1/traces")
    assert [s["id"] for s in listed["items"]] == [spec["id"]]
    client = await RawClient.connect(b.port, "probe-{1}", clean_start=True, expiry=0)
    records_url = b.url + f"/api/v1/traces/{spec['id']}"
    try:

        async def traced() -> bool:
            await client.publish_now("probe/x", b"hello")
            found = (await call(http, "GET", records_url))[1]["items"]
            return {"in", "routed"} <= {r["what"] for r in found}

        await waiting.eventually(traced, WAIT, "the probe's packets in its trace")
    finally:
        client.drop()
    status, found = await call(http, "GET", records_url)
    records = found["items"]
    assert status == 200 and {r["node"] for r in records} == {"b"}
    assert any(r["text"].startswith("PUBLISH qos 0") for r in records)
    last = records[-1]["id"]
    status, after = await call(http, "GET", records_url + f"?after={last}")
    assert status == 200 and all(_order(r["id"]) > _order(last) for r in after["items"])
    status, stopped = await call(http, "DELETE", records_url, headers=await csrf(http, b))
    assert (status, stopped) == (200, {"stopped": True})
    assert (await call(http, "GET", a.url + "/api/v1/traces"))[1]["items"] == []
    status, kept = await call(http, "GET", records_url)  # (kept an hour after it ended)
    assert status == 200 and kept["items"]


async def test_bad_traces_are_refused_in_words(
    sites: list[Site], http: aiohttp.ClientSession
) -> None:
    a, _ = sites
    headers = await csrf(http, a)
    for body in (
        {"kind": "socket", "value": "x"},
        {"kind": "topic", "value": "a/#/b"},
        {"kind": "client", "value": "x", "seconds": 10_000},
        {"kind": "client", "value": "x", "seconds": True},
    ):
        status, error = await call(
            http, "POST", a.url + "/api/v1/traces", json=body, headers=headers
        )
        assert status == 400 and error["message"], body
    status, error = await call(http, "GET", a.url + "/api/v1/traces/nothing-here")
    assert status == 404 and "no trace" in error["message"]


def _order(record_id: str) -> tuple[int, int]:
    millis, _, seq = record_id.partition("-")
    return int(millis), int(seq)
