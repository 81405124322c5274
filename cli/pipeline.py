"""``router pipeline report|export|import``: batch jobs on Spark (the ``spark`` extra).

Each command parses its options and calls one job of :mod:`router.pipeline.jobs`. A
missing pyspark or Java, a bad path or an unusable Redis URL is one ``Error:`` line
(:class:`PipelineError` and friends are :class:`RouterError`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from router.pipeline.spark_session import DEFAULT_MASTER
from router.state.keys import DEFAULT_PREFIX

from .common import (
    PREFIX_VARIABLE,
    Target,
    echo_json,
    json_option,
    note,
    print_table,
    target_options as target,
)

FORMATS = ("csv", "jsonl", "parquet")
SHOWN_REJECTS = 20

master_option = click.option(
    "--master",
    envvar="ROUTER_SPARK_MASTER",
    default=DEFAULT_MASTER,
    show_default=True,
    help="Spark master URL (env ROUTER_SPARK_MASTER).",
)
format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="Format of the subscriptions file [default: from its name].",
)


@click.group()
def pipeline() -> None:
    """Batch jobs on Spark: routing report, export and import (needs router[spark], Java 17+)."""


@pipeline.command("report")
@click.option("--traffic", required=True, metavar="PATH", help="Traffic log file or directory.")
@click.option(
    "--subs",
    "subscriptions",
    required=True,
    metavar="SOURCE",
    help="Subscription snapshot: a Redis URL, an export directory, or a CSV/JSONL/Parquet file.",
)
@click.option("--out", required=True, metavar="DIR", help="Where the tables and summary go.")
@click.option(
    "--prefix",
    envvar=PREFIX_VARIABLE,
    default=DEFAULT_PREFIX,
    show_default=True,
    help="Key namespace prefix, when --subs is a Redis URL.",
)
@format_option
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Cluster size for the broadcast comparison [default: the nodes in the log].",
)
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True)
@master_option
@json_option
def report(
    traffic: str,
    subscriptions: str,
    out: str,
    prefix: str,
    fmt: str | None,
    nodes: int | None,
    top: int,
    master: str,
    as_json: bool,
) -> None:
    """Join a traffic log with a subscription snapshot: per-node traffic, fan-out, savings
    against broadcast, hot topics, costly filters, publishes nobody received."""
    from router.pipeline.jobs import run_report

    done = run_report(
        traffic, subscriptions, out, prefix=prefix, fmt=fmt, nodes=nodes, top=top, master=master
    )
    result = done.report
    savings = result.savings
    if as_json:
        data = dataclasses.asdict(result)
        data["savings"].update(
            saved_copies=savings.saved_copies,
            saved_bytes=savings.saved_bytes,
            saved_fraction=round(savings.saved_fraction, 6),
        )
        echo_json({"out": done.out, "files": done.files, "report": data})
        return
    print_table(
        f"router pipeline report -> {done.out}",
        ["measure", "value"],
        [
            ("publishes", f"{result.messages:,}"),
            ("topics", f"{result.topics:,}"),
            ("subscriptions", f"{result.subscriptions:,}"),
            ("nodes", savings.nodes),
            (
                "copies sent / broadcast",
                f"{savings.interest_copies:,} / {savings.broadcast_copies:,}",
            ),
            ("saved by interest-based routing", f"{savings.saved_fraction:.1%}"),
            ("publishes with no subscriber", f"{result.no_subscriber_messages:,}"),
        ],
    )
    note(f"wrote {', '.join(done.files)} under {done.out}")


@pipeline.command("export")
@target
@click.option("--out", required=True, metavar="DIR", help="Directory of the Parquet tables.")
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=1000,
    show_default=True,
    help="Entities read from Redis per batch.",
)
@click.option("--overwrite", is_flag=True, help="Replace the tables of an earlier export.")
@master_option
@json_option
def export(
    target: Target, out: str, batch: int, overwrite: bool, master: str, as_json: bool
) -> None:
    """Subscriptions, routes and retained messages to Parquet (SCAN, bounded batches)."""
    from router.pipeline.jobs import run_export

    summary = run_export(
        target.url, out, prefix=target.prefix, batch=batch, overwrite=overwrite, master=master
    )
    if as_json:
        echo_json(dataclasses.asdict(summary))
        return
    print_table(
        f"router pipeline export -> {summary.out}",
        ["table", "rows", "from"],
        [
            ("subscriptions", summary.subscriptions, f"{summary.clients} clients"),
            ("routes", summary.routes, f"{summary.nodes} nodes"),
            ("retained", summary.retained, "retained store"),
        ],
    )


@pipeline.command("import")
@target
@click.option(
    "--subs",
    "path",
    required=True,
    metavar="FILE",
    help="Subscriptions: CSV with a header, JSON lines or Parquet.",
)
@format_option
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=None,
    help="Spark partitions [default: from the row count].",
)
@master_option
@json_option
def import_(
    target: Target, path: str, fmt: str | None, partitions: int | None, master: str, as_json: bool
) -> None:
    """Bulk-load subscriptions (columns client_id, filter, qos, options optional) through the
    router's Lua scripts: one call per client, idempotent, invalid rows reported."""
    from router.pipeline.jobs import run_import

    options: dict[str, Any] = {"prefix": target.prefix, "fmt": fmt, "partitions": partitions}
    if as_json:
        counts = run_import(target.url, path, master=master, **options)
    else:
        bar = Progress(
            TextColumn("importing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("partitions"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        task = bar.add_task("import", total=None)

        def progress(done: int, total: int) -> None:
            if not bar.live.is_started:  # shown once the write job runs, not before
                bar.start()
            bar.update(task, completed=done, total=total)

        try:
            counts = run_import(target.url, path, master=master, progress=progress, **options)
        finally:
            bar.stop()
    rejects = [dataclasses.asdict(reject) for reject in counts.rejects]
    if as_json:
        echo_json(
            {
                "rows": counts.rows,
                "loaded": counts.loaded,
                "skipped": counts.skipped,
                "rejected": counts.rejected,
                "clients": counts.clients,
                "rejects": rejects,
            }
        )
        return
    print_table(
        f"router pipeline import <- {path}",
        ["rows", "loaded", "skipped", "rejected", "clients written"],
        [(counts.rows, counts.loaded, counts.skipped, counts.rejected, counts.clients)],
    )
    if rejects:
        shown = rejects[:SHOWN_REJECTS]
        print_table(
            f"rejected rows (first {len(shown)} of {counts.rejected})",
            ["client_id", "filter", "qos", "reason"],
            [(r["client_id"], r["filter"], r["qos"], r["reason"]) for r in shown],
        )
