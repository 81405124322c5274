"""``router demo``: three nodes on one Redis, and who received what."""

from __future__ import annotations

import click

from router.ops.demo import run_demo


@click.command()
@click.option(
    "--redis",
    "url",
    envvar="ROUTER_REDIS_URL",
    default=None,
    help="Redis URL; without one an embedded Redis is started.",
)
def demo(url: str | None) -> None:
    """Run three nodes, subscribe clients, publish, and show where messages went."""
    for line in run_demo(url).lines():
        click.echo(line)
