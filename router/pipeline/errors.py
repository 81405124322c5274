"""Errors of the pipeline (all :class:`~router.errors.RouterError`, one CLI line each)."""

from __future__ import annotations

from router.errors import RouterError


class PipelineError(RouterError):
    """A pipeline job could not run or failed (the message says why)."""


class SparkUnavailableError(PipelineError):
    """pyspark is not installed, or no Java 17+ is available to run it."""


class PipelineInputError(PipelineError, ValueError):
    """An input the job cannot use: a missing path, an unknown format, a missing column."""
