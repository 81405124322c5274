"""``router pipeline import`` and ``export`` on real Redis, standalone and the 3-master
cluster: clients written whole or not at all, rejects with their reason, idempotence, and
an export -> import round trip that reproduces the state exactly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import pytest
from click.testing import CliRunner, Result

from router.cli import app
from router.core.options import SubscriptionOptions, make_options
from router.state.blocking import BlockingRedisCluster, blocking_client
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.retained_store import RetainedStore
from router.state.routes import RouteStore
from router.state.subscriptions import SubscriptionStore
from tests.support.cli import delete_namespace

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HOSTILE = "ü{x}%7B"
ROWS = [
    ("client_id", "filter", "qos", "no_local", "retain_handling", "subscription_identifier"),
    ("c1", "sensors/#", "1", "", "", ""),
    ("c1", "sensors/+/temp", "0", "", "", ""),
    ("c1", "sensors/#", "2", "true", "1", "7"),  # the last row of a filter wins
    ("c2", "$share/g/jobs/#", "1", "false", "", ""),
    (HOSTILE, "a/{b}/c", "0", "", "2", ""),
    ("c3", "ok/filter", "0", "", "", ""),
    ("c3", "bad/#/filter", "0", "", "", ""),  # rejects all of c3
    ("c4", "x/y", "3", "", "", ""),  # qos 3: rejects c4
    ("", "x/y", "0", "", "", ""),  # no client id
    ("c5", "$share/g/x", "0", "true", "", ""),  # shared + no_local
]
EXPECTED = {
    "c1": {
        "sensors/#": make_options(
            qos=2, no_local=True, retain_handling=1, subscription_identifier=7
        ),
        "sensors/+/temp": make_options(),
    },
    "c2": {"$share/g/jobs/#": make_options(qos=1)},
    HOSTILE: {"a/{b}/c": make_options(retain_handling=2)},
}
LOADED, SKIPPED, REJECTED = 4, 1, 5


def write_csv(path: Path, rows: list[tuple[str, ...]]) -> Path:
    path.write_text("\n".join(",".join(row) for row in rows) + "\n", encoding="utf-8")
    return path


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def invoke_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: "), result.output
    return lines[0]


def run_import(url: str, keys: Keys, path: Path, *extra: str) -> Any:
    args = ["pipeline", "import", "--redis", url, "--prefix", keys.prefix, "--subs", str(path)]
    return invoke_json(*args, *extra)


async def _state(url: str, keys: Keys, clients: list[str]) -> dict[str, Any]:
    client = await open_redis(url)
    try:
        store = SubscriptionStore(client, keys)
        return {c: await store.subscriptions(c) for c in clients}
    finally:
        await client.aclose()


def stored(url: str, keys: Keys, clients: list[str]) -> dict[str, dict[str, SubscriptionOptions]]:
    """The subscriptions of ``clients`` as the router reads them (empty ones left out)."""
    return {c: subs for c, subs in asyncio.run(_state(url, keys, clients)).items() if subs}


def raw_dump(url: str, keys: Keys) -> dict[bytes, dict[bytes, bytes]]:
    """Every hash under the namespace, byte for byte (every primary of a cluster)."""
    client = blocking_client(url)
    try:
        options: dict[str, Any] = {"match": keys.pattern()}
        if isinstance(client, BlockingRedisCluster):
            options["target_nodes"] = BlockingRedisCluster.PRIMARIES
        return {key: client.hgetall(key) for key in client.scan_iter(**options)}
    finally:
        client.close()


@pytest.fixture
def namespace(redis_url: str, keys: Keys) -> Iterator[Keys]:
    try:
        yield keys
    finally:
        delete_namespace(redis_url, keys)


@pytest.fixture
def other_namespace(redis_url: str) -> Iterator[Keys]:
    keys = Keys(f"t{uuid4().hex[:12]}")
    try:
        yield keys
    finally:
        delete_namespace(redis_url, keys)


def test_import_writes_clients_whole_reports_rejects_and_is_idempotent(
    spark: SparkSession, redis_url: str, namespace: Keys, tmp_path: Path
) -> None:
    source = write_csv(tmp_path / "subs.csv", ROWS)
    first = run_import(redis_url, namespace, source)
    assert (first["loaded"], first["skipped"], first["rejected"]) == (LOADED, SKIPPED, REJECTED)
    assert first["rows"] == len(ROWS) - 1
    assert first["clients"] == len(EXPECTED)
    reasons = {(r["client_id"], r["filter"]): r["reason"] for r in first["rejects"]}
    assert "'#' must be the last level" in reasons[("c3", "bad/#/filter")]
    assert reasons[("c3", "ok/filter")] == "another row of this client was rejected"
    assert "qos" in reasons[("c4", "x/y")]
    assert reasons[(None, "x/y")] == "client_id is missing"
    assert "no_local" in reasons[("c5", "$share/g/x")]
    clients = [*EXPECTED, "c3", "c4", "c5"]
    assert stored(redis_url, namespace, clients) == EXPECTED
    before = raw_dump(redis_url, namespace)
    assert len(before) == len(EXPECTED)  # nothing else was written, c3 not even half
    second = run_import(redis_url, namespace, source)
    assert (second["loaded"], second["skipped"], second["rejected"]) == (0, LOADED + 1, REJECTED)
    assert raw_dump(redis_url, namespace) == before


def test_export_then_import_reproduces_the_state(
    spark: SparkSession, redis_url: str, namespace: Keys, other_namespace: Keys, tmp_path: Path
) -> None:
    run_import(redis_url, namespace, write_csv(tmp_path / "subs.csv", ROWS))
    asyncio.run(_routes_and_retained(redis_url, namespace))
    out = tmp_path / "export"
    summary = invoke_json(
        "pipeline",
        "export",
        "--redis",
        redis_url,
        "--prefix",
        namespace.prefix,
        "--out",
        str(out),
        "--batch",
        "2",
    )
    assert summary["subscriptions"] == 4 and summary["clients"] == 3
    assert (summary["routes"], summary["nodes"]) == (3, 2)
    assert summary["retained"] == 2
    subscriptions = spark.read.parquet(str(out / "subscriptions")).collect()
    exported = {(r["client_id"], r["filter"]): r.asDict() for r in subscriptions}
    for client_id, filters in EXPECTED.items():
        for topic_filter, options in filters.items():
            row = exported.pop((client_id, topic_filter))
            assert {k: row[k] for k in options.as_dict()} == options.as_dict()
    assert exported == {}
    routes = {
        (r["node_id"], r["route"]): r["members"]
        for r in spark.read.parquet(str(out / "routes")).collect()
    }
    assert routes == {("n1", "a/#"): 1, ("n1", "$share/g/b"): 2, ("n{2}", "c"): 1}
    retained = {
        r["topic"]: (r["payload"], r["qos"], r["publisher"])
        for r in spark.read.parquet(str(out / "retained")).collect()
    }
    assert retained == {"r/1": (b"one", 1, "p"), "$SYS/r": (b"two", 0, None)}
    copied = run_import(redis_url, other_namespace, out / "subscriptions")
    assert (copied["loaded"], copied["rejected"]) == (4, 0)
    assert stored(redis_url, other_namespace, list(EXPECTED)) == EXPECTED


async def _routes_and_retained(url: str, keys: Keys) -> None:
    client = await open_redis(url)
    try:
        routes = RouteStore(client, keys)
        await routes.claim("n1", "inc-1", {"a/#": 1, "$share/g/b": 2})
        await routes.claim("n{2}", "inc-2", {"c": 1})
        retained = RetainedStore(client, keys)
        await retained.store("r/1", b"one", qos=1, publisher="p")
        await retained.store("$SYS/r", b"two")
    finally:
        await client.aclose()


def test_a_report_reads_its_snapshot_from_redis(
    spark: SparkSession, redis_url: str, namespace: Keys, tmp_path: Path
) -> None:
    run_import(redis_url, namespace, write_csv(tmp_path / "subs.csv", ROWS))
    traffic = tmp_path / "traffic.jsonl"
    record = {
        "time": 1.0,
        "node": "n1",
        "topic": "sensors/k/temp",
        "payload_bytes": 4,
        "qos": 0,
        "retain": False,
        "forwarded": ["n2"],
        "local_deliveries": 0,
    }
    traffic.write_text(json.dumps(record) + "\n")
    done = invoke_json(
        "pipeline",
        "report",
        "--traffic",
        str(traffic),
        "--subs",
        redis_url,
        "--prefix",
        namespace.prefix,
        "--out",
        str(tmp_path / "report"),
    )
    report = done["report"]
    assert report["subscriptions"] == 4
    assert report["fanout"] == {"1": 1}  # c1 twice over, once
    assert {c["filter"] for c in report["filter_cost"]} == {"sensors/#", "sensors/+/temp"}
    assert (tmp_path / "report" / "summary.md").is_file()
