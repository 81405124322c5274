"""``router bench ...``: benchmarks that measure the router beside a peer in one run."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table


@click.group()
def bench() -> None:
    """Measure the router beside a peer in the same run (JSON with --json)."""


def _print_table(title: str, rows: dict[str, dict[str, Any]]) -> None:
    table = Table(title=title)
    names = list(rows)
    table.add_column("measure")
    for name in names:
        table.add_column(name, justify="right")
    for measure in rows[names[0]]:
        table.add_row(measure, *(str(rows[name][measure]) for name in names))
    Console().print(table)


@bench.command("match")
@click.option("--subscriptions", default=100_000, show_default=True, help="Subscriptions.")
@click.option("--topics", default=50_000, show_default=True, help="Publish topics matched.")
@click.option("--seed", default=7, show_default=True, help="Workload seed.")
@click.option("--rounds", default=3, show_default=True, help="Timed rounds; the best counts.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_match(subscriptions: int, topics: int, seed: int, rounds: int, as_json: bool) -> None:
    """The subscription trie beside paho-mqtt's MQTTMatcher."""
    from router.bench import match

    result = match.run(subscriptions, topics, seed, rounds)
    if as_json:
        click.echo(json.dumps(result))
    else:
        _print_table("router bench match", result["workloads"])
