"""The Spark session of a pipeline run, and what it needs: pyspark and Java 17+.

:func:`spark_session` returns the process's one session, creating it on first use with
settings for batch jobs (no UI, no console progress bar, few shuffle partitions, executors
running this interpreter, Spark's JVM logging errors only). Later calls return the same
session whatever ``master`` they give (Spark allows one per process), which is how the
test suite shares one session. :func:`pipeline_session` stops the session at the end of
a block only if the block created it.

:func:`spark_errors` turns what Spark raises (analysis errors, failed jobs, a Python
exception inside an executor) into one-line :class:`PipelineError` messages.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from importlib.util import find_spec
from typing import TYPE_CHECKING, Final

from router.errors import PipelineError, SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA: Final = 17
DEFAULT_MASTER: Final = "local[*]"
APP_NAME: Final = "router-pipeline"
JAVA_TIMEOUT: Final = 30.0

_current: dict[str, SparkSession] = {}  # "session": the process's one session


def require_pyspark() -> None:
    """Raise :class:`SparkUnavailableError` unless pyspark can be imported."""
    if find_spec("pyspark") is None:
        raise SparkUnavailableError(
            "pyspark is not installed: pip install 'router[spark]' (needs Java 17+)"
        )


def java_binary() -> str:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java``, else ``java`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise SparkUnavailableError(f"JAVA_HOME={home} has no bin/java: Spark needs Java 17+")
        return java
    found = shutil.which("java")
    if found is None:
        raise SparkUnavailableError(
            "Spark needs Java 17+ and no `java` was found: install a JDK "
            "(Debian: openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return found


@functools.cache
def java_version(java: str) -> int:
    """The major version of ``java`` (8 for ``1.8.0_292``, 17 for ``17.0.15``)."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=JAVA_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkUnavailableError(f"cannot run {java} -version: {exc}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if found is None:
        raise SparkUnavailableError(f"cannot tell the version of {java}")
    major = int(found[1])
    return int(found[2] or 0) if major == 1 else major


def require_java() -> None:
    """Raise :class:`SparkUnavailableError` unless Java 17 or newer is available."""
    java = java_binary()
    version = java_version(java)
    if version < MIN_JAVA:
        raise SparkUnavailableError(
            f"Spark needs Java {MIN_JAVA}+, but {java} is Java {version}: install a newer JDK "
            "(Debian: openjdk-17-jre-headless) or point JAVA_HOME at one"
        )


def local_cores(master: str) -> int | None:
    """The cores of a ``local``/``local[N]``/``local[*]`` master; None for other masters."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if found is None:
        return None
    if found[1] in (None, "*"):
        return 1 if found[1] is None else os.cpu_count() or 1
    return max(1, int(found[1]))


def spark_session(master: str = DEFAULT_MASTER) -> SparkSession:
    """The process's Spark session (created on first use with ``master``).

    Raises :class:`SparkUnavailableError` without pyspark or Java 17+.
    """
    current = _current.get("session")
    if current is not None:
        return current
    require_pyspark()
    require_java()
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = local_cores(master)
    if cores is not None:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    logging = resources.files("router.pipeline").joinpath("log4j2.properties")
    builder = (
        SparkSession.builder.master(master)
        .appName(APP_NAME)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={logging}")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if cores is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(max(2, cores)))
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: report it as one line
        raise SparkUnavailableError(f"cannot start Spark ({master}): {first_line(exc)}") from None
    session.sparkContext.setLogLevel("ERROR")
    _current["session"] = session
    return session


def stop_session() -> None:
    """Stop the process's Spark session, if there is one."""
    session = _current.pop("session", None)
    if session is not None:
        session.stop()


@contextlib.contextmanager
def pipeline_session(master: str = DEFAULT_MASTER) -> Iterator[SparkSession]:
    """The Spark session for a block; stopped at the end only if the block created it."""
    created = "session" not in _current
    session = spark_session(master)
    try:
        with spark_errors():
            yield session
    finally:
        if created:
            stop_session()


def first_line(exc: BaseException) -> str:
    """The telling line of an exception's message (Spark's run over many lines).

    For a Python exception raised inside an executor, that is the traceback's last line.
    """
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    for index, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            tail = [ln for ln in lines[index:] if not ln.startswith(("File ", "^", "~"))]
            return tail[-1] if tail else lines[-1]
    return lines[0]


@contextlib.contextmanager
def spark_errors() -> Iterator[None]:
    """Turn Spark's exceptions raised in the block into :class:`PipelineError`."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JError) as exc:
        raise PipelineError(f"Spark job failed: {first_line(exc)}") from None
