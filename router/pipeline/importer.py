"""``router pipeline import``: bulk-load subscriptions from a file into Redis, on Spark.

The rows are partitioned by ``client_id`` (every row of a client lands in one partition),
and each partition validates and writes its clients from the executor with the project's
own Lua script (:func:`router.pipeline.loader.import_rows`: one script call per client,
through a blocking client per partition; Spark runs one partition per core). The driver
runs the job in a thread and reports progress as partitions finish; the partitions'
counts add up to the summary.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from pyspark.sql import Row, SparkSession

from router.pipeline.loader import ImportCounts, Progress, import_rows
from router.pipeline.sources import read_subscriptions
from router.state.keys import Keys

ROWS_PER_PARTITION: Final = 20_000
POLL: Final = 0.2


def _partition_writer(url: str, prefix: str) -> Callable[[Iterable[Row]], Iterator[ImportCounts]]:
    def write(rows: Iterable[Row]) -> Iterator[ImportCounts]:
        yield import_rows(url, prefix, [tuple(row) for row in rows])

    return write


def partitions_for(rows: int, parallelism: int) -> int:
    """Partitions for ``rows`` rows: enough for every core and a smooth progress bar, and
    about :data:`ROWS_PER_PARTITION` rows each beyond that."""
    return max(1, min(max(rows, 1), max(parallelism * 4, rows // ROWS_PER_PARTITION)))


def import_subscriptions(
    spark: SparkSession,
    url: str,
    prefix: str,
    path: str,
    *,
    fmt: str | None = None,
    partitions: int | None = None,
    progress: Progress | None = None,
) -> ImportCounts:
    """Load the subscription file at ``path`` into the Redis at ``url`` under ``prefix``.

    Returns the summed counts. Raises :class:`PipelineInputError` for a bad file; Redis
    must be checked reachable by the caller (executors fail the job otherwise).
    """
    Keys(prefix)
    frame = read_subscriptions(spark, path, fmt)
    context = spark.sparkContext
    total_rows = frame.count()
    count = partitions or partitions_for(total_rows, context.defaultParallelism)
    job = frame.repartition(count, "client_id").rdd.mapPartitions(_partition_writer(url, prefix))
    group = f"router-import-{uuid.uuid4().hex}"
    outcome: dict[str, list[ImportCounts] | BaseException] = {}

    def run() -> None:
        context.setJobGroup(group, f"import {path}")
        try:
            outcome["counts"] = job.collect()
        except BaseException as exc:  # handed to the calling thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="router-import")
    worker.start()
    while worker.is_alive():
        worker.join(POLL)
        if progress is not None:
            progress(*_tasks_done(spark, group, count))
    error = outcome.get("error")
    if isinstance(error, BaseException):
        raise error
    summary = ImportCounts()
    counts = outcome.get("counts", [])
    assert isinstance(counts, list)
    for part in counts:
        summary.add(part)
    if progress is not None:
        progress(count, count)
    return summary


def _tasks_done(spark: SparkSession, group: str, expected: int) -> tuple[int, int]:
    """(finished, total) tasks of the write stage of the job group (the last stage)."""
    tracker = spark.sparkContext.statusTracker()
    done = 0
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        if info is None:
            continue
        stages = [tracker.getStageInfo(stage) for stage in info.stageIds]
        writes = [s for s in stages if s is not None and s.numTasks == expected]
        done = max([done, *(s.numCompletedTasks for s in writes)])
    return min(done, expected), expected
