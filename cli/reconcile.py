"""``router reconcile``: report route-table problems visible from Redis; repair stale ones.

Only nodes write their own route sets, so ``--repair`` only purges what no live process
owns (``stale_route_set``, ``dead_node`` without persistent sessions, ``ghost_client``:
the clean sessions of dead nodes); every other problem names who must fix it. See
:mod:`router.ops.reconcile` for the kinds.

JSON shape (``--json``): ``{"ok", "problems": [{"kind", "node_id", "detail", "repair"
("purge" | "node"), "routes", "incarnation", "client_id", "route", "epoch", "repaired"
(null or "purged" | "removed" | "absent" | "skipped")}], "checked": {"nodes",
"route_sets", "clients", "clients_complete"}, "repaired"}``. The exit status is 0 when
nothing is left to fix (``ok``: no problem, or every one repaired), 1 otherwise, so a
cron job or a health check can act on it.
"""

from __future__ import annotations

import click

from router.ops.reconcile import DEFAULT_MAX_CLIENTS, Problem, reconcile as check

from .common import (
    Target,
    echo_json,
    json_option,
    print_table,
    redis_client,
    run,
    target_options as target,
)


@click.command()
@target
@click.option(
    "--repair",
    is_flag=True,
    help="Purge stale route sets, dead nodes and the clean sessions of dead nodes.",
)
@click.option(
    "--max-clients",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_CLIENTS,
    show_default=True,
    help="Check at most this many clients' subscriptions against their node's routes.",
)
@json_option
def reconcile(target: Target, repair: bool, max_clients: int, as_json: bool) -> None:
    """Find stale, missing and inconsistent routes and ghost clients; exit 1 while any is
    left (purge the stale ones with --repair)."""

    async def main() -> bool:
        async with redis_client(target) as redis:
            report = await check(redis, target.keys, repair=repair, max_clients=max_clients)
        if as_json:
            echo_json(report.as_dict())
            return report.ok
        click.echo(
            f"checked {report.nodes} registered nodes, {report.route_sets} route sets, "
            f"{report.clients} clients" + ("" if report.clients_complete else " (bounded)")
        )
        if not report.problems:
            click.echo("no problems found")
            return True
        print_table(
            "problems",
            ["kind", "node", "detail", "fix", "repaired"],
            [
                (
                    p.kind,
                    p.node_id,
                    p.detail,
                    _fixer(p),
                    p.repaired or "-",
                )
                for p in report.problems
            ],
        )
        return report.ok

    if not run(main()):
        raise click.exceptions.Exit(1)


def _fixer(problem: Problem) -> str:
    """Who fixes ``problem``, in words."""
    if problem.repair == "purge":
        return "reconcile --repair"
    if problem.kind in ("dead_node", "orphan_session"):
        return "a live node"
    return "the node itself"
