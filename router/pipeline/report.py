"""``router pipeline report``: the routing report of a traffic log, on Spark.

Plan (the figures are defined in :mod:`router.pipeline.model`):

1. read the JSON-lines log with its fixed schema and sum it in the JVM by (node,
   forwarded nodes): a handful of rows, from which the driver adds up the per-node figures;
2. sum it again by topic: each distinct topic once, with its publishes and bytes;
3. match each distinct topic once in the executors: ``mapPartitions`` builds one
   :class:`~router.pipeline.matching.TopicMatcher` (the project's trie) per partition from
   a broadcast snapshot, answers every topic of the partition and sums the filter costs of
   the partition itself, so one row per topic and one per filter (not a list of filters
   per topic) come back into the JVM (cached);
4. the fan-out histogram, hot and silent topics and the costliest filters from those rows.

:func:`report_tables` builds the frames, :func:`collect_report` the
:class:`~router.pipeline.model.Report` (the same value :func:`router.pipeline.plain.plain_report`
returns), :func:`write_report` the Parquet tables, ``summary.md`` and the PNG plots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Final

from pyspark import Broadcast
from pyspark.sql import Column, DataFrame, Row, SparkSession, functions as F

from router.pipeline.matching import (
    FilterCosts,
    TopicMatcher,
    add_filter_costs,
    count_subscriptions,
)
from router.pipeline.model import (
    FilterCost,
    NodeTraffic,
    Report,
    TopicTraffic,
    broadcast_savings,
)
from router.pipeline.plain import cluster_size, traffic_files
from router.pipeline.schemas import MATCHED, TRAFFIC
from router.pipeline.summary import write_summary

TABLES = ("per_node", "fanout", "node_fanout", "savings", "topics", "filter_cost", "no_subscriber")
"""The Parquet tables a report writes, each a directory under the output directory."""

TOPIC_ROW: Final = 0
FILTER_ROW: Final = 1
"""The ``kind`` of a :data:`~router.pipeline.schemas.MATCHED` row."""

Subscriptions = list[tuple[str, str]]


@dataclass(frozen=True)
class ReportTables:
    """The report's Spark frames: ``routes`` sums the log by (node, forwarded nodes),
    ``matched`` (cached) holds what the executors' matching returned, the others read it."""

    matched: DataFrame
    routes: DataFrame
    topics: DataFrame
    fanout: DataFrame
    node_fanout: DataFrame
    filter_cost: DataFrame
    subscriptions: int
    ignored_subscriptions: int

    def unpersist(self) -> None:
        """Free the cached frames."""
        self.matched.unpersist()


def is_local_path(path: str) -> bool:
    """True for a path on this machine (no URL scheme, or ``file:``)."""
    return "://" not in path or path.startswith("file:")


def read_traffic(spark: SparkSession, path: str) -> DataFrame:
    """The traffic log at ``path`` (a file or a directory of JSON-lines files).

    A local path is checked first (:class:`PipelineInputError` when missing or empty).
    """
    if is_local_path(path):
        traffic_files(path.removeprefix("file:"))
    return spark.read.schema(TRAFFIC).json(path)


def _sum(column: str | Column) -> Column:
    return F.coalesce(F.sum(column), F.lit(0)).cast("long")


def _matcher(
    subscriptions: Broadcast[Subscriptions],
) -> Callable[[Iterable[Row]], Iterator[tuple[Any, ...]]]:
    """The per-partition matching step: one trie per partition, then every topic of it.

    Yields a :data:`TOPIC_ROW` per topic, then a :data:`FILTER_ROW` per filter the
    partition's topics matched, with its costs summed over them (rows of
    :data:`~router.pipeline.schemas.MATCHED`).
    """

    def match_partition(rows: Iterable[Row]) -> Iterator[tuple[Any, ...]]:
        matcher = TopicMatcher(subscriptions.value)
        costs: FilterCosts = {}
        for topic, messages, size in rows:
            found = matcher.match(topic)
            yield TOPIC_ROW, topic, messages, size, found.subscribers, None
            add_filter_costs(costs, found, messages, size)
        for name, (subscribers, messages, deliveries, delivered) in costs.items():
            yield FILTER_ROW, name, messages, delivered, subscribers, deliveries

    return match_partition


def report_tables(
    spark: SparkSession, traffic: DataFrame, subscriptions: Subscriptions
) -> ReportTables:
    """The report's frames for a traffic frame (schema :data:`TRAFFIC`) and a snapshot of
    ``(client_id, filter)`` pairs.

    Already runs the by-topic sum of the log (handing a frame to ``mapPartitions`` executes
    its shuffles); the matching runs at the first action on ``matched``.
    """
    forwarded = F.coalesce(F.col("forwarded"), F.array().cast("array<string>"))
    local = F.coalesce(F.col("local_deliveries"), F.lit(0))
    records = traffic.select(
        "node",
        "topic",
        forwarded.alias("forwarded"),
        F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("payload_bytes"),
        local.alias("local"),
        ((F.size(forwarded) == 0) & (local == 0)).cast("int").alias("unrouted"),
    )
    # Two aggregations straight from the log rather than one cached aggregate: caching
    # rows with an array column costs more than reading the log twice.
    routes = records.groupBy("node", "forwarded").agg(
        F.count(F.lit(1)).alias("messages"),
        _sum("payload_bytes").alias("bytes"),
        _sum("local").alias("local"),
        _sum("unrouted").alias("unrouted"),
    )
    by_topic = records.groupBy("topic").agg(
        F.count(F.lit(1)).alias("messages"), _sum("payload_bytes").alias("bytes")
    )
    snapshot = spark.sparkContext.broadcast(subscriptions)
    rows = by_topic.repartition(spark.sparkContext.defaultParallelism).rdd.mapPartitions(
        _matcher(snapshot)
    )
    matched = spark.createDataFrame(rows, MATCHED, verifySchema=False).cache()
    topics = matched.where(F.col("kind") == TOPIC_ROW).select(
        F.col("name").alias("topic"), "messages", "bytes", "subscribers"
    )
    filter_cost = (
        matched.where(F.col("kind") == FILTER_ROW)
        .groupBy(F.col("name").alias("filter"))
        .agg(
            F.max("subscribers").alias("subscribers"),
            _sum("messages").alias("messages"),
            _sum("deliveries").alias("deliveries"),
            _sum("bytes").alias("delivered_bytes"),
        )
    )
    valid, ignored = count_subscriptions(subscriptions)
    return ReportTables(
        matched=matched,
        routes=routes,
        topics=topics,
        fanout=topics.groupBy("subscribers").agg(
            _sum("messages").alias("messages"), F.count(F.lit(1)).alias("topics")
        ),
        node_fanout=routes.groupBy(F.size("forwarded").alias("nodes")).agg(
            _sum("messages").alias("messages"),
            _sum("bytes").alias("bytes"),
            _sum("unrouted").alias("unrouted"),
        ),
        filter_cost=filter_cost,
        subscriptions=valid,
        ignored_subscriptions=ignored,
    )


def _topic(row: Row) -> TopicTraffic:
    return TopicTraffic(row["topic"], row["messages"], row["bytes"], row["subscribers"])


def _per_node(routes: list[Row]) -> tuple[NodeTraffic, ...]:
    """Per-node traffic from the (node, forwarded nodes) sums."""
    per_node: dict[str, list[int]] = {}
    for row in routes:
        copies = len(row["forwarded"])
        mine = per_node.setdefault(row["node"], [0] * 7)
        mine[0] += row["messages"]
        mine[1] += row["bytes"]
        mine[2] += row["messages"] * copies
        mine[3] += row["bytes"] * copies
        mine[6] += row["local"]
        for target in row["forwarded"]:
            theirs = per_node.setdefault(target, [0] * 7)
            theirs[4] += row["messages"]
            theirs[5] += row["bytes"]
    return tuple(NodeTraffic(node, *per_node[node]) for node in sorted(per_node))


def collect_report(tables: ReportTables, *, nodes: int | None = None, top: int = 20) -> Report:
    """The :class:`Report` of the frames (five small Spark jobs)."""
    routes = tables.routes.collect()
    per_node = _per_node(routes)
    node_fanout: dict[int, int] = {}
    for row in routes:
        copies = len(row["forwarded"])
        node_fanout[copies] = node_fanout.get(copies, 0) + row["messages"]
    messages = sum(row["messages"] for row in routes)
    total_bytes = sum(row["bytes"] for row in routes)
    fanout_rows = tables.fanout.collect()
    fanout = {row["subscribers"]: row["messages"] for row in sorted(fanout_rows)}
    ranked = [F.desc("messages"), F.asc("topic")]
    hot = tables.topics.orderBy(*ranked).limit(top).collect()
    silent = tables.topics.where(F.col("subscribers") == 0).orderBy(*ranked).limit(top).collect()
    costly = tables.filter_cost.orderBy(F.desc("deliveries"), F.asc("filter")).limit(top)
    return Report(
        messages=messages,
        bytes=total_bytes,
        topics=sum(row["topics"] for row in fanout_rows),
        subscriptions=tables.subscriptions,
        ignored_subscriptions=tables.ignored_subscriptions,
        per_node=per_node,
        fanout=fanout,
        node_fanout=dict(sorted(node_fanout.items())),
        savings=broadcast_savings(
            cluster_size(len(per_node), nodes),
            messages,
            total_bytes,
            sum(node.sent_copies for node in per_node),
            sum(node.sent_bytes for node in per_node),
        ),
        hot_topics=tuple(_topic(row) for row in hot),
        filter_cost=tuple(FilterCost(**row.asDict()) for row in costly.collect()),
        no_subscriber_messages=fanout.get(0, 0),
        no_subscriber_topics=tuple(_topic(row) for row in silent),
        unrouted_messages=sum(row["unrouted"] for row in routes),
    )


def write_report(
    spark: SparkSession, tables: ReportTables, report: Report, out: str | Path
) -> list[str]:
    """Write the Parquet tables (:data:`TABLES`), ``summary.md`` and the plots into ``out``;
    returns the names written. Tables already there are replaced."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    savings = report.savings
    node_columns = ", ".join(
        f"{field.name} {'string' if field.name == 'node' else 'long'}"
        for field in fields(NodeTraffic)
    )
    frames = {
        "per_node": spark.createDataFrame(
            [astuple(node) for node in report.per_node], node_columns
        ),
        "fanout": tables.fanout,
        "node_fanout": tables.node_fanout,
        "savings": spark.createDataFrame(
            [
                (
                    savings.nodes,
                    savings.messages,
                    savings.interest_copies,
                    savings.interest_bytes,
                    savings.broadcast_copies,
                    savings.broadcast_bytes,
                    savings.saved_copies,
                    savings.saved_bytes,
                    savings.saved_fraction,
                )
            ],
            "nodes long, messages long, interest_copies long, interest_bytes long, "
            "broadcast_copies long, broadcast_bytes long, saved_copies long, saved_bytes long, "
            "saved_fraction double",
        ),
        "topics": tables.topics,
        "filter_cost": tables.filter_cost,
        "no_subscriber": tables.topics.where(F.col("subscribers") == 0),
    }
    for name in TABLES:
        frames[name].write.mode("overwrite").parquet(str(directory / name))
    return [*TABLES, *write_summary(report, directory)]
