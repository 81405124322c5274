"""``router pipeline report``: the routing report of a traffic log, on Spark.

Plan (the figures are defined in :mod:`router.pipeline.model`):

1. read the JSON-lines log with its fixed schema and aggregate it by (node, topic,
   forwarded nodes) in the JVM: the only pass over every record;
2. match each distinct topic once in the executors: ``mapPartitions`` builds one
   :class:`~router.pipeline.matching.TopicMatcher` (the project's trie) per partition from
   a broadcast snapshot and answers every topic of the partition;
3. derive the tables from those two (small, cached) frames.

:func:`report_tables` builds the frames, :func:`collect_report` the
:class:`~router.pipeline.model.Report` (the same value :func:`router.pipeline.plain.plain_report`
returns), :func:`write_report` the Parquet tables, ``summary.md`` and the PNG plots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pyspark import Broadcast
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from router.pipeline.matching import TopicMatcher, count_subscriptions
from router.pipeline.model import (
    FilterCost,
    NodeTraffic,
    Report,
    TopicTraffic,
    broadcast_savings,
)
from router.pipeline.plain import cluster_size, traffic_files
from router.pipeline.schemas import TOPIC_TRAFFIC, TRAFFIC
from router.pipeline.summary import write_summary

TABLES = ("per_node", "fanout", "node_fanout", "savings", "topics", "filter_cost", "no_subscriber")
"""The Parquet tables a report writes, each a directory under the output directory."""

Subscriptions = list[tuple[str, str]]


@dataclass(frozen=True)
class ReportTables:
    """The report's Spark frames (cached where several tables read them)."""

    aggregate: DataFrame
    topics: DataFrame
    per_node: DataFrame
    fanout: DataFrame
    node_fanout: DataFrame
    filter_cost: DataFrame
    subscriptions: int
    ignored_subscriptions: int

    def unpersist(self) -> None:
        """Free the cached frames."""
        self.topics.unpersist()
        self.aggregate.unpersist()


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
    """The per-partition matching step: one trie per partition, then every topic of it."""

    def match_partition(rows: Iterable[Row]) -> Iterator[tuple[Any, ...]]:
        matcher = TopicMatcher(subscriptions.value)
        for topic, messages, size in rows:
            found = matcher.match(topic)
            yield topic, messages, size, found.subscribers, [tuple(f) for f in found.filters]

    return match_partition


def report_tables(
    spark: SparkSession, traffic: DataFrame, subscriptions: Subscriptions
) -> ReportTables:
    """The report's frames for a traffic frame (schema :data:`TRAFFIC`) and a snapshot of
    ``(client_id, filter)`` pairs."""
    forwarded = F.coalesce(F.col("forwarded"), F.array().cast("array<string>"))
    local = F.coalesce(F.col("local_deliveries"), F.lit(0))
    aggregate = (
        traffic.select(
            "node",
            "topic",
            forwarded.alias("forwarded"),
            F.coalesce(F.col("payload_bytes"), F.lit(0)).alias("payload_bytes"),
            local.alias("local"),
            ((F.size(forwarded) == 0) & (local == 0)).cast("int").alias("unrouted"),
        )
        .groupBy("node", "topic", "forwarded")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            _sum("payload_bytes").alias("bytes"),
            _sum("local").alias("local"),
            _sum("unrouted").alias("unrouted"),
        )
        .withColumn("copies", F.size("forwarded"))
        .cache()
    )
    by_topic = aggregate.groupBy("topic").agg(
        _sum("messages").alias("messages"), _sum("bytes").alias("bytes")
    )
    snapshot = spark.sparkContext.broadcast(subscriptions)
    matched = by_topic.repartition(spark.sparkContext.defaultParallelism).rdd.mapPartitions(
        _matcher(snapshot)
    )
    topics = spark.createDataFrame(matched, TOPIC_TRAFFIC).cache()
    filters = topics.select(F.explode("filters").alias("f"), "messages", "bytes")
    filter_cost = filters.groupBy(F.col("f.filter").alias("filter")).agg(
        F.max("f.subscribers").alias("subscribers"),
        _sum("messages").alias("messages"),
        _sum(F.col("messages") * F.col("f.deliveries")).alias("deliveries"),
        _sum(F.col("bytes") * F.col("f.deliveries")).alias("delivered_bytes"),
    )
    sent = aggregate.groupBy("node").agg(
        _sum("messages").alias("published"),
        _sum("bytes").alias("published_bytes"),
        _sum(F.col("messages") * F.col("copies")).alias("sent_copies"),
        _sum(F.col("bytes") * F.col("copies")).alias("sent_bytes"),
        _sum("local").alias("local_deliveries"),
    )
    received = (
        aggregate.select(F.explode("forwarded").alias("node"), "messages", "bytes")
        .groupBy("node")
        .agg(_sum("messages").alias("received_copies"), _sum("bytes").alias("received_bytes"))
    )
    per_node = (
        sent.join(received, "node", "full")
        .na.fill(0)
        .select(*(field.name for field in fields(NodeTraffic)))
    )
    valid, ignored = count_subscriptions(subscriptions)
    return ReportTables(
        aggregate=aggregate,
        topics=topics,
        per_node=per_node,
        fanout=topics.groupBy("subscribers").agg(
            _sum("messages").alias("messages"), F.count(F.lit(1)).alias("topics")
        ),
        node_fanout=aggregate.groupBy(F.col("copies").alias("nodes")).agg(
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


def collect_report(tables: ReportTables, *, nodes: int | None = None, top: int = 20) -> Report:
    """The :class:`Report` of the frames (a handful of small Spark jobs)."""
    per_node = tuple(
        NodeTraffic(**row.asDict()) for row in tables.per_node.orderBy("node").collect()
    )
    fanout_rows = tables.fanout.collect()
    fanout = {row["subscribers"]: row["messages"] for row in sorted(fanout_rows)}
    # The totals follow from the node fan-out rows: one job fewer over the aggregate.
    by_copies = sorted(tables.node_fanout.collect())
    node_fanout = {row["nodes"]: row["messages"] for row in by_copies}
    messages = sum(row["messages"] for row in by_copies)
    total_bytes = sum(row["bytes"] for row in by_copies)
    copies = sum(row["nodes"] * row["messages"] for row in by_copies)
    copy_bytes = sum(row["nodes"] * row["bytes"] for row in by_copies)
    unrouted = sum(row["unrouted"] for row in by_copies)
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
        node_fanout=node_fanout,
        savings=broadcast_savings(
            cluster_size(len(per_node), nodes), messages, total_bytes, copies, copy_bytes
        ),
        hot_topics=tuple(_topic(row) for row in hot),
        filter_cost=tuple(FilterCost(**row.asDict()) for row in costly.collect()),
        no_subscriber_messages=fanout.get(0, 0),
        no_subscriber_topics=tuple(_topic(row) for row in silent),
        unrouted_messages=unrouted,
    )


def write_report(
    spark: SparkSession, tables: ReportTables, report: Report, out: str | Path
) -> list[str]:
    """Write the Parquet tables (:data:`TABLES`), ``summary.md`` and the plots into ``out``;
    returns the names written. Tables already there are replaced."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    savings = report.savings
    frames = {
        "per_node": tables.per_node,
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
        "topics": tables.topics.drop("filters"),
        "filter_cost": tables.filter_cost,
        "no_subscriber": tables.topics.where(F.col("subscribers") == 0).drop("filters"),
    }
    for name in TABLES:
        frames[name].write.mode("overwrite").parquet(str(directory / name))
    return [*TABLES, *write_summary(report, directory)]
