"""``router bench pipeline``: the Spark report job beside the same computation in one
Python process, and the Spark import into a real Redis, in one run.

PipelineWorkload (seeded): ``subscriptions`` subscriptions of device-fleet clients
(``filters_per_client`` each, clients spread over ``nodes`` nodes): exact device topics,
per-device ``+``, per-site ``device/+`` and ``#``, share groups, and filters nothing
publishes to. A pool of ``topics`` device topics; ``publishes`` traffic-log records (one
JSON-lines file per node, written with
:func:`router.cluster.traffic_log.format_record`), topics drawn with a skew (hot topics),
each forwarded to the other nodes that have an interested client as the router does (one
copy per node, share groups served by one member).

Measures:

* ``spark_rows_per_s``: publishes over the wall time of the report job on ``master``
  (default ``local[2]``): read and aggregate the log, match each distinct topic with one
  trie per partition, collect every figure (:func:`~router.pipeline.report.report_tables`
  and :func:`~router.pipeline.report.collect_report`; the Parquet/summary writing is not
  timed, the plain-Python peer writes nothing either). The session is started before the
  clock runs.
* ``python_rows_per_s``: :func:`~router.pipeline.plain.plain_report` on the same files in
  this process (the same plan: aggregate, match each distinct topic once, derive).
* The two reports must be equal, figure for figure, or the run fails.
* ``import_subs_per_s``: the subscriptions (a CSV) imported by
  :func:`~router.pipeline.importer.import_subscriptions` into a redis-server started for the
  run (or ``--redis``), Spark job start to finish.

The Spark session is started, and one report job runs on a small slice of the log, before
the clock runs (executors started, JVM warm: what a long-lived Spark deployment gives).

Each timed step runs ``rounds`` times (Spark and Python alternating); the fastest counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from router.bench.broker_runs import cut
from router.bench.checks import check_redis
from router.cluster.traffic_log import format_record
from router.errors import BenchSetupError, PipelineBenchError
from router.ops.embedded_redis import embedded_redis
from router.pipeline.matching import TopicMatcher
from router.pipeline.model import Report
from router.pipeline.plain import plain_report
from router.state.connection import open_redis
from router.state.keys import Keys

SPARK_RATIO_TARGET: Final = 1.5
IMPORT_TARGET: Final = 20_000
METRICS: Final = ("telemetry", "status", "alarm", "config", "battery")
WARM_UP_LINES: Final = 20_000
MASTER: Final = re.compile(
    r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|(spark|mesos|k8s)://\S+|yarn"
)
"""The forms of a Spark master URL."""


@dataclass(frozen=True)
class PipelineBenchConfig:
    """Sizes of one run (see the module docstring)."""

    publishes: int = 2_000_000
    subscriptions: int = 100_000
    topics: int = 200_000
    nodes: int = 4
    filters_per_client: int = 5
    sites: int = 400
    devices: int = 1000
    seed: int = 7
    rounds: int = 2
    master: str = "local[2]"

    def __post_init__(self) -> None:
        for name in ("publishes", "subscriptions", "topics", "filters_per_client", "rounds"):
            if getattr(self, name) < 1:
                raise BenchSetupError(f"--{name.replace('_', '-')} must be at least 1")
        if self.nodes < 2:
            raise BenchSetupError("--nodes must be at least 2")
        if self.sites < 1 or self.devices < 1:
            raise BenchSetupError("sites and devices must be at least 1")
        if not MASTER.fullmatch(self.master):
            raise BenchSetupError(
                f"--master {self.master!r} is not a Spark master URL "
                "(local, local[N], local[*], spark://HOST:PORT, yarn, k8s://..., mesos://...)"
            )


@dataclass
class PipelineWorkload:
    """Generated files and the subscription pairs."""

    traffic: Path
    subscriptions_csv: Path
    pairs: list[tuple[str, str]]
    traffic_bytes: int
    distinct_topics: int


def _device_topic(rng: random.Random, config: PipelineBenchConfig) -> str:
    site, device = rng.randrange(config.sites), rng.randrange(config.devices)
    return f"site/{site}/device/{device}/{rng.choice(METRICS)}"


def _filter(rng: random.Random, config: PipelineBenchConfig) -> str:
    site, device = rng.randrange(config.sites), rng.randrange(config.devices)
    draw = rng.random()
    if draw < 0.6:
        return f"site/{site}/device/{device}/{rng.choice(METRICS)}"
    if draw < 0.75:
        return f"site/{site}/device/{device}/+"
    if draw < 0.85:
        return f"site/{site}/device/+/{rng.choice(METRICS)}"
    if draw < 0.88:
        return f"site/{site}/#"
    if draw < 0.93:
        return f"$share/workers{site % 8}/site/{site}/device/+/status"
    return f"fleet/{site}/device/{device}/ota"


def generate(config: PipelineBenchConfig, directory: Path) -> PipelineWorkload:
    """Write the traffic log and the subscriptions CSV under ``directory``."""
    rng = random.Random(config.seed)
    nodes = [f"node-{n + 1}" for n in range(config.nodes)]
    pairs: list[tuple[str, str]] = []
    home: dict[str, str] = {}
    clients = max(1, config.subscriptions // config.filters_per_client)
    for index in range(config.subscriptions):
        client = f"dev-{index % clients:06d}"
        home[client] = nodes[(index % clients) % len(nodes)]
        pairs.append((client, _filter(rng, config)))
    csv = directory / "subscriptions.csv"
    with csv.open("w", encoding="utf-8") as stream:
        stream.write("client_id,filter,qos\n")
        stream.writelines(f"{c},{f},{i % 3}\n" for i, (c, f) in enumerate(pairs))
    matcher = TopicMatcher(pairs)
    pool = list(dict.fromkeys(_device_topic(rng, config) for _ in range(config.topics)))
    # Per topic: the nodes with an interested client, and the local copies on each node.
    routing: list[tuple[str, frozenset[str], dict[str, int]]] = []
    for topic in pool:
        plain, groups = matcher.trie.candidates(topic)
        local: dict[str, int] = {}
        for client in plain:
            local[home[client]] = local.get(home[client], 0) + 1
        for members in groups.values():
            chosen = home[members[zlib.crc32(topic.encode()) % len(members)]]
            local[chosen] = local.get(chosen, 0) + 1
        routing.append((topic, frozenset(local), local))
    traffic = directory / "traffic"
    traffic.mkdir()
    streams = {n: (traffic / f"traffic-{n}-000001.jsonl").open("w") for n in nodes}
    try:
        start = 1_700_000_000.0
        for index in range(config.publishes):
            topic, interested, local = routing[int(len(routing) * rng.random() ** 3)]
            node = nodes[rng.randrange(len(nodes))]
            forwarded = tuple(sorted(interested - {node}))
            entry = (start + index / 1000, topic, 256, 1, False, forwarded, local.get(node, 0))
            streams[node].write(format_record(node, entry))
    finally:
        for stream in streams.values():
            stream.close()
    size = sum(p.stat().st_size for p in traffic.iterdir())
    return PipelineWorkload(traffic, csv, pairs, size, len(pool))


def warm_up_workload(
    workload: PipelineWorkload, directory: Path, lines: int = WARM_UP_LINES
) -> PipelineWorkload:
    """A small log (the first ``lines`` records of one file) for an untimed first job, so
    the timed rounds run on started executors and a warm JVM, as a long-lived deployment."""
    directory.mkdir()
    first = min(workload.traffic.iterdir())
    with first.open() as source, (directory / first.name).open("w") as target:
        target.writelines(line for _, line in zip(range(lines), source, strict=False))
    return PipelineWorkload(directory, workload.subscriptions_csv, workload.pairs, 0, 0)


def _timed_spark(spark: Any, workload: PipelineWorkload) -> tuple[Report, float]:
    from router.pipeline.report import collect_report, read_traffic, report_tables

    start = time.perf_counter()
    tables = report_tables(spark, read_traffic(spark, str(workload.traffic)), workload.pairs)
    report = collect_report(tables)
    elapsed = time.perf_counter() - start
    tables.unpersist()
    return report, elapsed


def _timed_python(workload: PipelineWorkload) -> tuple[Report, float]:
    start = time.perf_counter()
    report = plain_report(workload.traffic, workload.pairs)
    return report, time.perf_counter() - start


async def _delete_namespace(url: str, keys: Keys) -> None:
    redis = await open_redis(url)
    try:
        batch = [key async for key in redis.scan_iter(match=keys.pattern(), count=1000)]
        for offset in range(0, len(batch), 1000):
            await redis.delete(*batch[offset : offset + 1000])
    finally:
        await redis.aclose()


def _timed_import(spark: Any, url: str, workload: PipelineWorkload) -> tuple[int, float]:
    from router.pipeline.importer import import_subscriptions

    keys = Keys(f"bp{uuid.uuid4().hex[:8]}")
    try:
        start = time.perf_counter()
        counts = import_subscriptions(spark, url, keys.prefix, str(workload.subscriptions_csv))
        elapsed = time.perf_counter() - start
    finally:
        asyncio.run(_delete_namespace(url, keys))
    if counts.rejected or counts.rows != len(workload.pairs):
        raise PipelineBenchError(f"the import did not load every row: {counts}")
    return counts.rows, elapsed


@contextlib.contextmanager
def _redis(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    with embedded_redis() as started:
        yield started


def check_setup(url: str | None) -> None:
    """Raise :class:`BenchSetupError` for a ``url`` that is malformed or does not answer,
    and :class:`SparkUnavailableError` without pyspark or Java 17+: before the data is
    generated and any process starts (the Redis URL first: it costs no process)."""
    from router.pipeline.spark_session import require_java, require_pyspark

    if url is not None:
        check_redis(url)
    require_pyspark()
    require_java()


def run(config: PipelineBenchConfig, url: str | None = None) -> dict[str, Any]:
    """Check the setup (:func:`check_setup`), generate, measure, compare; the object
    ``--json`` prints."""
    check_setup(url)
    from router.pipeline.spark_session import spark_errors, spark_session

    with tempfile.TemporaryDirectory(prefix="router-bench-pipeline-") as scratch:
        generated = time.perf_counter()
        workload = generate(config, Path(scratch))
        generated = time.perf_counter() - generated
        spark = spark_session(config.master)
        spark_times, python_times, import_times = [], [], []
        with spark_errors(), _redis(url) as redis_url:
            _timed_spark(spark, warm_up_workload(workload, Path(scratch) / "warm-up"))
            for _ in range(config.rounds):
                spark_result, seconds = _timed_spark(spark, workload)
                spark_times.append(seconds)
                python_result, seconds = _timed_python(workload)
                python_times.append(seconds)
                if spark_result != python_result:
                    raise PipelineBenchError("the Spark and the plain-Python reports differ")
            for _ in range(config.rounds):
                rows, seconds = _timed_import(spark, redis_url, workload)
                import_times.append(seconds)
    spark_rate = config.publishes / min(spark_times)
    python_rate = config.publishes / min(python_times)
    return {
        **asdict(config),
        "distinct_topics": workload.distinct_topics,
        "traffic_mb": round(workload.traffic_bytes / 1e6, 1),
        "generate_seconds": round(generated, 1),
        "spark_seconds": [round(s, 2) for s in spark_times],
        "python_seconds": [round(s, 2) for s in python_times],
        "spark_rows_per_s": int(spark_rate),
        "python_rows_per_s": int(python_rate),
        "spark_ratio": cut(spark_rate / python_rate),
        "spark_ratio_target": SPARK_RATIO_TARGET,
        "report_messages": spark_result.messages,
        "report_saved_fraction": cut(spark_result.savings.saved_fraction, 4),
        "import_rows": rows,
        "import_seconds": [round(s, 2) for s in import_times],
        "import_subs_per_s": int(rows / min(import_times)),
        "import_target": IMPORT_TARGET,
    }
