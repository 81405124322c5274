"""The three jobs as the CLI runs them: each opens the Spark session, runs, and closes it.

Every function checks pyspark and Java first (:class:`SparkUnavailableError`), then imports
the Spark modules, so ``router --help`` and the rest of the package never load pyspark.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from router.pipeline.export import ExportSummary
from router.pipeline.loader import ImportCounts, Progress
from router.pipeline.model import Report
from router.pipeline.snapshot import subscription_batches
from router.pipeline.spark_session import (
    DEFAULT_MASTER,
    pipeline_session,
    require_java,
    require_pyspark,
)
from router.state.connection import open_redis
from router.state.keys import Keys

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://")


@dataclass(frozen=True)
class ReportRun:
    """A finished report: its figures and the files written under ``out``."""

    report: Report
    out: str
    files: list[str]


def is_redis_url(source: str) -> bool:
    """True when a ``--subs`` source names a Redis server rather than a file."""
    return source.startswith(REDIS_SCHEMES)


async def _redis_pairs(url: str, prefix: str) -> list[tuple[str, str]]:
    redis = await open_redis(url)
    try:
        return [
            (record.client_id, record.filter)
            async for batch in subscription_batches(redis, Keys(prefix))
            for record in batch
        ]
    finally:
        await redis.aclose()


def _check_spark() -> None:
    require_pyspark()
    require_java()


def run_report(
    traffic: str,
    subscriptions: str,
    out: str,
    *,
    prefix: str = "rt",
    fmt: str | None = None,
    nodes: int | None = None,
    top: int = 20,
    master: str = DEFAULT_MASTER,
) -> ReportRun:
    """The routing report of the traffic log at ``traffic`` against ``subscriptions`` (a
    Redis URL, an export directory, or a CSV/JSON-lines/Parquet file), written to ``out``."""
    _check_spark()
    from router.pipeline.report import collect_report, read_traffic, report_tables, write_report
    from router.pipeline.sources import read_subscriptions

    with pipeline_session(master) as spark:
        frame = read_traffic(spark, traffic)
        if is_redis_url(subscriptions):
            pairs = asyncio.run(_redis_pairs(subscriptions, prefix))
        else:
            exported = Path(subscriptions) / "subscriptions"
            path = str(exported) if exported.is_dir() else subscriptions
            rows = read_subscriptions(spark, path, fmt).select("client_id", "filter").collect()
            pairs = [(row[0], row[1]) for row in rows]
        tables = report_tables(spark, frame, pairs)
        try:
            report = collect_report(tables, nodes=nodes, top=top)
            files = write_report(spark, tables, report, out)
        finally:
            tables.unpersist()
    return ReportRun(report, out, files)


def run_export(
    url: str,
    out: str,
    *,
    prefix: str = "rt",
    batch: int = 1000,
    overwrite: bool = False,
    master: str = DEFAULT_MASTER,
) -> ExportSummary:
    """Subscriptions, routes and retained messages of the Redis at ``url`` to Parquet."""
    _check_spark()
    from router.pipeline.export import check_output, export

    Keys(prefix)
    check_output(out, overwrite)
    with pipeline_session(master) as spark:
        return export(spark, url, prefix, out, batch=batch, overwrite=overwrite)


async def _reachable(url: str) -> None:
    redis = await open_redis(url)
    try:
        await redis.ping()
    finally:
        await redis.aclose()


def run_import(
    url: str,
    path: str,
    *,
    prefix: str = "rt",
    fmt: str | None = None,
    partitions: int | None = None,
    master: str = DEFAULT_MASTER,
    progress: Progress | None = None,
) -> ImportCounts:
    """Load the subscription file at ``path`` into the Redis at ``url`` (checked first)."""
    _check_spark()
    from router.pipeline.importer import import_subscriptions
    from router.pipeline.sources import detect_format

    Keys(prefix)
    detect_format(path, fmt)
    asyncio.run(_reachable(url))
    with pipeline_session(master) as spark:
        return import_subscriptions(
            spark, url, prefix, path, fmt=fmt, partitions=partitions, progress=progress
        )
