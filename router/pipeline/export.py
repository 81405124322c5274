"""``router pipeline export``: subscriptions, routes and retained messages to Parquet.

The driver reads Redis in bounded batches (:mod:`router.pipeline.snapshot`: SCAN, then a
batch of entities at a time, each entity consistent on its own) and hands Spark at most
``rows_per_write`` rows at a time, each appended to its table::

    OUT/subscriptions   client_id, filter, qos, no_local, retain_as_published,
                        retain_handling, subscription_identifier
    OUT/routes          node_id, route, members, generation, version
    OUT/retained        topic, payload, qos, message_id, publisher, expiry_interval

Memory stays bounded by the batch sizes (plus the ids of the entities already seen, see
:mod:`~router.pipeline.snapshot`). Each table exists after an export, empty or not, and
``router pipeline import`` reads the subscriptions table back as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from router.errors import PipelineInputError
from router.pipeline import schemas
from router.pipeline.snapshot import (
    DEFAULT_BATCH,
    retained_batches,
    route_batches,
    subscription_batches,
)
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.scripts import RedisClient

ROWS_PER_WRITE: Final = 100_000
TABLES: Final = ("subscriptions", "routes", "retained")


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: rows per table and the entities they came from."""

    out: str
    subscriptions: int
    clients: int
    routes: int
    nodes: int
    retained: int


class _TableWriter:
    """Rows of one table, handed to Spark ``rows_per_write`` at a time."""

    def __init__(
        self, spark: SparkSession, path: str, schema: StructType, rows_per_write: int
    ) -> None:
        self.spark = spark
        self.path = path
        self.schema = schema
        self.rows_per_write = rows_per_write
        self.pending: list[Sequence[Any]] = []
        self.rows = 0
        self._mode = "overwrite"

    def add(self, rows: Sequence[Sequence[Any]]) -> None:
        self.pending += rows
        self.rows += len(rows)
        if len(self.pending) >= self.rows_per_write:
            self.flush()

    def flush(self) -> None:
        """Write what is pending (an empty table if nothing was ever written)."""
        if not self.pending and self._mode == "append":
            return
        frame = self.spark.createDataFrame(self.pending, self.schema)
        frame.write.mode(self._mode).parquet(self.path)
        self._mode = "append"
        self.pending = []


def check_output(out: str, overwrite: bool) -> None:
    """Refuse a local ``out`` that exists and is not empty, unless ``overwrite``."""
    where = Path(out)
    if "://" in out or overwrite or not where.exists():
        return
    if not where.is_dir() or any(where.iterdir()):
        raise PipelineInputError(f"{out} exists and is not empty: give --overwrite to replace")


async def _copy(
    batches: AsyncIterator[Sequence[Sequence[Any]]], writer: _TableWriter, entity: int
) -> int:
    """Copy every batch into the writer; returns the distinct values of column ``entity``."""
    seen: set[Any] = set()
    async for batch in batches:
        seen.update(row[entity] for row in batch)
        writer.add(batch)
    writer.flush()
    return len(seen)


async def export_state(
    spark: SparkSession,
    redis: RedisClient,
    keys: Keys,
    out: str,
    *,
    batch: int = DEFAULT_BATCH,
    rows_per_write: int = ROWS_PER_WRITE,
) -> ExportSummary:
    """Export the namespace of ``keys`` into the tables under ``out`` (see the module)."""
    root = out.rstrip("/")

    def writer(table: str, schema: StructType) -> _TableWriter:
        return _TableWriter(spark, f"{root}/{table}", schema, rows_per_write)

    subscriptions = writer("subscriptions", schemas.SUBSCRIPTION)
    clients = await _copy(subscription_batches(redis, keys, batch=batch), subscriptions, 0)
    routes = writer("routes", schemas.ROUTE)
    nodes = await _copy(route_batches(redis, keys, batch=batch), routes, 0)
    retained = writer("retained", schemas.RETAINED)
    await _copy(retained_batches(redis, keys, batch=batch), retained, 0)
    return ExportSummary(out, subscriptions.rows, clients, routes.rows, nodes, retained.rows)


def export(
    spark: SparkSession,
    url: str,
    prefix: str,
    out: str,
    *,
    batch: int = DEFAULT_BATCH,
    overwrite: bool = False,
) -> ExportSummary:
    """Export the Redis at ``url`` (namespace ``prefix``) to Parquet tables under ``out``."""
    keys = Keys(prefix)
    check_output(out, overwrite)

    async def main() -> ExportSummary:
        redis = await open_redis(url)
        try:
            return await export_state(spark, redis, keys, out, batch=batch)
        finally:
            await redis.aclose()

    return asyncio.run(main())
