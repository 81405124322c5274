"""The routing report on Spark against answers computed independently: fan-out by the
brute-force matcher (tests/support/brute.py), the rest by plain loops over the records; the
plain-Python report must agree with the Spark one in every figure."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from router.cluster.traffic_log import format_record
from router.core.topics import parse_shared, validate_filter
from router.errors import PipelineInputError
from router.pipeline.model import Report
from router.pipeline.plain import plain_report
from tests.support.brute import BruteModel, brute_matches

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from router.pipeline.report import ReportTables

NODES = ("n1", "n2", "n3")
LEVELS = ("a", "b", "c", "")
TOP = 1000  # every row, so whole lists can be compared


def random_topic(rng: random.Random) -> str:
    levels = [rng.choice(LEVELS) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.1:
        levels[0] = "$SYS"
    return "/".join(levels) or "a"


def random_filter(rng: random.Random) -> str:
    levels = [rng.choice((*LEVELS, "+", "+")) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.3:
        levels.append("#")
    topic_filter = "/".join(levels) or "+"
    if rng.random() < 0.15:
        topic_filter = f"$share/g{rng.randint(1, 2)}/{topic_filter}"
    return topic_filter


@dataclass
class Workload:
    traffic: Path
    subscriptions: list[tuple[str, str]]
    records: list[dict[str, Any]]
    model: BruteModel
    invalid: int


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Workload:
    rng = random.Random(11)
    subscriptions = [(f"c{i % 40}", random_filter(rng)) for i in range(160)]
    invalid = [("c1", "bad/#/x"), ("c2", "a+"), ("", "a/b")]
    model = BruteModel()
    for client_id, topic_filter in subscriptions:
        model.subscribe(client_id, validate_filter(topic_filter), 0)
    topics = [random_topic(rng) for _ in range(70)]
    records = []
    for index in range(600):
        node = rng.choice(NODES)
        others = [n for n in NODES if n != node]
        records.append(
            {
                "time": 1_700_000_000 + index / 10,
                "node": node,
                "topic": rng.choice(topics),
                "payload_bytes": rng.randint(0, 300),
                "qos": rng.randint(0, 2),
                "retain": rng.random() < 0.1,
                "forwarded": sorted(rng.sample(others, rng.randint(0, 2))),
                "local_deliveries": rng.choice((0, 0, 1, 3)),
            }
        )
    directory = tmp_path_factory.mktemp("traffic")
    for part, node in enumerate(NODES):
        mine = [r for r in records if r["node"] == node]
        with (directory / f"traffic-{node}-{part}.jsonl").open("w") as stream:
            for r in mine:
                entry = (
                    r["time"],
                    r["topic"],
                    r["payload_bytes"],
                    r["qos"],
                    r["retain"],
                    tuple(r["forwarded"]),
                    r["local_deliveries"],
                )
                stream.write(format_record(node, entry))
    # A file still being written and Spark's marker files are not part of the log.
    (directory / ".traffic-n1-9.jsonl.part").write_text(
        format_record("zz", (0, "x", 1, 0, False, (), 0))
    )
    (directory / "_SUCCESS").write_text("")
    return Workload(directory, subscriptions + invalid, records, model, len(invalid))


def fanout_of(model: BruteModel, topic: str) -> int:
    return len(model.plain_clients(topic)) + len(model.groups(topic))


def expected_report(w: Workload) -> dict[str, Any]:
    model, records = w.model, w.records
    fanout: Counter[int] = Counter(fanout_of(model, r["topic"]) for r in records)
    per_node = {}
    for node in NODES:
        mine = [r for r in records if r["node"] == node]
        to_me = [r for r in records if node in r["forwarded"]]
        per_node[node] = (
            len(mine),
            sum(r["payload_bytes"] for r in mine),
            sum(len(r["forwarded"]) for r in mine),
            sum(r["payload_bytes"] * len(r["forwarded"]) for r in mine),
            len(to_me),
            sum(r["payload_bytes"] for r in to_me),
            sum(r["local_deliveries"] for r in mine),
        )
    filters: dict[str, tuple[int, int, int, int]] = {}
    for topic_filter in {f for mine in model.subs.values() for f in mine}:
        subscribers = sum(1 for mine in model.subs.values() if topic_filter in mine)
        hits = [r for r in records if brute_matches(topic_filter, r["topic"])]
        if not hits:
            continue
        each = 1 if parse_shared(topic_filter) else subscribers
        filters[topic_filter] = (
            subscribers,
            len(hits),
            len(hits) * each,
            sum(r["payload_bytes"] for r in hits) * each,
        )
    return {
        "fanout": dict(sorted(fanout.items())),
        "per_node": per_node,
        "filters": filters,
        "topics": Counter(r["topic"] for r in records),
        "copies": sum(len(r["forwarded"]) for r in records),
        "unrouted": sum(1 for r in records if not r["forwarded"] and not r["local_deliveries"]),
    }


@pytest.fixture(scope="module")
def spark_tables(spark: SparkSession, workload: Workload) -> Iterator[ReportTables]:
    from router.pipeline.report import read_traffic, report_tables

    traffic = read_traffic(spark, str(workload.traffic))
    tables = report_tables(spark, traffic, workload.subscriptions)
    try:
        yield tables
    finally:
        tables.unpersist()


@pytest.fixture(scope="module")
def spark_report(spark_tables: ReportTables) -> Report:
    from router.pipeline.report import collect_report

    return collect_report(spark_tables, top=TOP)


def test_fanout_matches_the_brute_force_matcher(spark_report: Report, workload: Workload) -> None:
    expected = expected_report(workload)
    assert spark_report.fanout == expected["fanout"]
    assert spark_report.no_subscriber_messages == expected["fanout"].get(0, 0)
    silent = {t.topic for t in spark_report.no_subscriber_topics}
    assert silent == {t for t in expected["topics"] if fanout_of(workload.model, t) == 0}
    for topic in spark_report.hot_topics:
        assert topic.subscribers == fanout_of(workload.model, topic.topic)


def test_per_node_traffic_and_savings(spark_report: Report, workload: Workload) -> None:
    expected = expected_report(workload)
    got = {n.node: astuple(n)[1:] for n in spark_report.per_node}
    assert got == expected["per_node"]
    records = workload.records
    savings = spark_report.savings
    assert savings.nodes == 3
    assert savings.interest_copies == expected["copies"]
    assert savings.broadcast_copies == 2 * len(records)
    assert savings.broadcast_bytes == 2 * sum(r["payload_bytes"] for r in records)
    assert savings.saved_copies == 2 * len(records) - expected["copies"]
    assert spark_report.unrouted_messages == expected["unrouted"]
    assert Counter(len(r["forwarded"]) for r in records) == spark_report.node_fanout


def test_hot_topics_and_costly_filters(spark_report: Report, workload: Workload) -> None:
    expected = expected_report(workload)
    ranked = sorted(expected["topics"].items(), key=lambda item: (-item[1], item[0]))
    assert [(t.topic, t.messages) for t in spark_report.hot_topics] == ranked
    got = {
        c.filter: (c.subscribers, c.messages, c.deliveries, c.delivered_bytes)
        for c in spark_report.filter_cost
    }
    assert got == expected["filters"]
    deliveries = [c.deliveries for c in spark_report.filter_cost]
    assert deliveries == sorted(deliveries, reverse=True)


def test_totals_and_the_snapshot_count(spark_report: Report, workload: Workload) -> None:
    assert spark_report.messages == len(workload.records)
    assert spark_report.bytes == sum(r["payload_bytes"] for r in workload.records)
    assert spark_report.topics == len({r["topic"] for r in workload.records})
    assert spark_report.subscriptions == len(workload.model)
    assert spark_report.ignored_subscriptions == workload.invalid


def test_the_plain_python_report_agrees_in_every_figure(
    spark_report: Report, workload: Workload
) -> None:
    assert plain_report(workload.traffic, workload.subscriptions, top=TOP) == spark_report


def test_nodes_can_be_given_but_not_below_those_seen(workload: Workload) -> None:
    report = plain_report(workload.traffic, workload.subscriptions, nodes=5)
    assert report.savings.broadcast_copies == 4 * len(workload.records)
    with pytest.raises(PipelineInputError, match="below the 3 nodes"):
        plain_report(workload.traffic, workload.subscriptions, nodes=2)


def test_the_written_report(
    spark: SparkSession, spark_tables: ReportTables, spark_report: Report, tmp_path: Path
) -> None:
    from router.pipeline.report import TABLES, write_report

    files = write_report(spark, spark_tables, spark_report, tmp_path)
    assert set(TABLES) <= set(files)
    per_node = spark.read.parquet(str(tmp_path / "per_node")).collect()
    assert sorted(row["node"] for row in per_node) == list(NODES)
    fanout = spark.read.parquet(str(tmp_path / "fanout")).collect()
    assert sum(row["messages"] for row in fanout) == spark_report.messages
    topics = spark.read.parquet(str(tmp_path / "topics")).count()
    assert topics == spark_report.topics
    [savings] = spark.read.parquet(str(tmp_path / "savings")).collect()
    assert savings["saved_copies"] == spark_report.savings.saved_copies
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# Routing report")
    assert f"{spark_report.messages:,} publishes" in summary
    for plot in ("fanout.png", "per_node.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_or_empty_traffic_path_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    from router.pipeline.report import read_traffic

    with pytest.raises(PipelineInputError, match="no such file"):
        read_traffic(spark, str(tmp_path / "missing"))
    (tmp_path / ".only-hidden.part").write_text("{}\n")
    with pytest.raises(PipelineInputError, match="holds no files"):
        read_traffic(spark, str(tmp_path))


def test_the_trie_is_built_once_per_partition(
    monkeypatch: pytest.MonkeyPatch, workload: Workload
) -> None:
    """The executor step builds one matcher for a whole partition, not one per row."""
    from pyspark.sql import Row

    from router.pipeline import report

    built: list[int] = []
    real = report.TopicMatcher

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, subscriptions: Any) -> None:
            built.append(1)
            super().__init__(subscriptions)

    class Snapshot:
        value = workload.subscriptions

    monkeypatch.setattr(report, "TopicMatcher", Counting)
    step = report._matcher(Snapshot())  # type: ignore[arg-type]
    topics = sorted({r["topic"] for r in workload.records})
    rows = [Row(topic=t, messages=2, bytes=10) for t in topics]
    out = list(step(iter(rows)))
    assert len(built) == 1
    per_topic = [row for row in out if row[0] == report.TOPIC_ROW]
    assert [row[1] for row in per_topic] == topics
    assert [row[4] for row in per_topic] == [fanout_of(workload.model, t) for t in topics]
    # The partition's filter costs come back summed: one row per matched filter.
    per_filter = {row[1]: row[2] for row in out if row[0] == report.FILTER_ROW}
    assert len(per_filter) == len(out) - len(per_topic)
    valid = {f for mine in workload.model.subs.values() for f in mine}
    expected = {f: 2 * sum(brute_matches(f, t) for t in topics) for f in valid}
    assert per_filter == {f: n for f, n in expected.items() if n}
