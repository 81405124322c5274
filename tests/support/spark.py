"""The test run's one Spark session, registered by tests/conftest.py.

``spark``: a session-scoped local SparkSession (``local[2]``: the machine has two cores),
created through :func:`router.pipeline.spark_session.spark_session` so the pipeline's jobs and
CLI commands reuse it instead of starting their own: no UI, no console progress, two
shuffle partitions, executors running this interpreter (``PYSPARK_PYTHON``). Stopped
after the last test. Only tests that ask for it start it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER = "local[2]"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The local Spark session every pipeline test shares."""
    from router.pipeline.spark_session import spark_session, stop_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = spark_session(MASTER)
    try:
        yield session
    finally:
        stop_session()
