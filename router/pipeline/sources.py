"""Subscription files for ``import`` and ``report``: CSV with a header row, JSON lines, Parquet.

Every column is read as text (a CSV knows nothing else; JSON numbers and booleans keep their
text), so every source is validated by the same rules (:mod:`router.pipeline.loader`). The
format comes from ``--format`` or the name: ``.csv``; ``.jsonl``/``.json``/``.ndjson``;
``.parquet`` or a directory (a directory of CSV or JSON-lines files is told by its files'
names, as Spark writes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from pyspark.sql import DataFrame, SparkSession, functions as F

from router.errors import PipelineInputError
from router.pipeline.loader import COLUMNS, OPTION_COLUMNS

FORMATS: Final = ("csv", "jsonl", "parquet")
_SUFFIXES: Final = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}


def detect_format(path: str, given: str | None = None) -> str:
    """The format of the subscription file at ``path`` (``given`` wins).

    Raises :class:`PipelineInputError` for a missing local path or a name that tells nothing.
    """
    where = Path(path)
    if "://" not in path and not where.exists():
        raise PipelineInputError(f"no subscriptions file at {path}: no such file or directory")
    if given is not None:
        if given not in FORMATS:
            raise PipelineInputError(f"unknown format {given!r}: use one of {', '.join(FORMATS)}")
        return given
    found = _SUFFIXES.get(where.suffix.lower())
    if found is not None:
        return found
    if where.is_dir():
        kinds = {
            _SUFFIXES.get(p.suffix.lower())
            for p in where.iterdir()
            if p.is_file() and not p.name.startswith((".", "_"))
        }
        kinds.discard(None)
        if len(kinds) == 1:
            return str(kinds.pop())
        if not kinds:
            return "parquet"
    raise PipelineInputError(f"cannot tell the format of {path}: give --format csv|jsonl|parquet")


def read_subscriptions(spark: SparkSession, path: str, fmt: str | None = None) -> DataFrame:
    """The rows of a subscription file as text columns: :data:`COLUMNS`, then
    :data:`OPTION_COLUMNS` (null where the file has no such column).

    Raises :class:`PipelineInputError` when a required column is missing.
    """
    kind = detect_format(path, fmt)
    if kind == "csv":
        frame = spark.read.option("header", True).option("inferSchema", False).csv(path)
    elif kind == "jsonl":
        frame = spark.read.option("primitivesAsString", True).json(path)
    else:
        frame = spark.read.parquet(path)
    missing = [name for name in COLUMNS if name not in frame.columns]
    if missing:
        raise PipelineInputError(
            f"{path} has no column {', '.join(missing)} (it has: {', '.join(frame.columns)})"
        )
    return frame.select(
        *(F.col(name).cast("string").alias(name) for name in COLUMNS),
        *(
            (
                F.col(name).cast("string") if name in frame.columns else F.lit(None).cast("string")
            ).alias(name)
            for name in OPTION_COLUMNS
        ),
    )
