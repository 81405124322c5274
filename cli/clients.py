"""``router clients``: the sessions of clients (connected and away), one client, the kick.

JSON shapes (``--json``):

* ``router clients``: ``[{"client_id", "node", "node_alive", "protocol", "state",
  "since", "since_ms", "keepalive", "subscriptions", "queued", "expiry", "expires_in"}]``
  sorted by client id; ``protocol`` is ``"5.0"``, ``"3.1.1"``, ``"3.1"`` or ``"api"``,
  ``state`` ``"connected"`` or ``"away"``, ``since`` an ISO UTC time, ``expires_in`` the
  seconds an away session has left, ``"never"``, or null while connected
* ``router clients show CLIENT``: the same fields and ``"username"``,
  ``"awaiting_release"``, ``"filters": [{"filter", "qos", "no_local",
  "retain_as_published", "retain_handling", "subscription_identifier"}]``
* ``router clients kick CLIENT``: ``{"client_id", "node", "protocol"}``

The logic lives in :mod:`router.ops.client_view`; this module parses and prints.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from router.ops.client_view import (
    DEFAULT_LIMIT,
    ClientRow,
    client_detail,
    client_rows,
    kick_client,
)

from .common import (
    Target,
    echo_json,
    json_option,
    note,
    print_table,
    redis_client,
    run,
    target_options as target,
)

COLUMNS = (
    "client",
    "node",
    "protocol",
    "state",
    "since (UTC)",
    "keepalive",
    "subs",
    "queued",
    "expires in",
)


def _cells(row: ClientRow) -> tuple[object, ...]:
    return (
        row.client_id,
        row.node_id if row.node_alive else f"{row.node_id} (down)",
        row.protocol,
        row.state,
        row.since,
        row.keepalive,
        row.subscriptions,
        row.queued,
        "-" if row.expires_in is None else row.expires_in,
    )


def _inherited(ctx: click.Context, target: Target, as_json: bool) -> tuple[Target, bool]:
    """A subcommand's options, with the group's where only the group was given them
    (``router clients --redis URL show ID`` means that Redis)."""
    parent = ctx.parent
    if parent is None:
        return target, as_json

    def pick(name: str, own: object) -> object:
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            return own
        if parent.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            return parent.params[name]
        return own

    url, prefix = pick("redis_url", target.url), pick("prefix", target.prefix)
    return Target(str(url), str(prefix)), bool(pick("as_json", as_json))


@click.group(invoke_without_command=True)
@target
@click.option("--node", "node_id", default=None, help="Only the sessions on this node.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Sessions a page.",
)
@click.option(
    "--page",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Page P of --limit sessions in client-id order (every session is read: SCAN).",
)
@json_option
@click.pass_context
def clients(
    ctx: click.Context,
    target: Target,
    node_id: str | None,
    limit: int,
    page: int,
    as_json: bool,
) -> None:
    """Client sessions, connected and away (persistent), sorted by client id."""
    if ctx.invoked_subcommand is not None:
        return

    async def main() -> None:
        async with redis_client(target) as redis:
            rows, complete = await client_rows(
                redis, target.keys, node_id=node_id, limit=limit, page=page
            )
        if not complete:
            note(f"more sessions follow: --page {page + 1}")
        if as_json:
            echo_json([row.as_dict() for row in rows])
            return
        title = "clients" + (f" on node {node_id}" if node_id else "")
        print_table(title, COLUMNS, [_cells(row) for row in rows])

    run(main())


@clients.command("show")
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
@click.pass_context
def clients_show(ctx: click.Context, target: Target, client_id: str, as_json: bool) -> None:
    """One client's session and its subscriptions (exit 1 when it has none)."""
    target, as_json = _inherited(ctx, target, as_json)

    async def main() -> None:
        async with redis_client(target) as redis:
            detail = await client_detail(redis, target.keys, client_id)
        if as_json:
            echo_json(detail.as_dict())
            return
        fields = dict(zip(COLUMNS[1:], _cells(detail.row)[1:], strict=True))
        fields["username"] = "-" if detail.username is None else detail.username
        if detail.awaiting_release:
            fields["awaiting PUBREL"] = ", ".join(map(str, detail.awaiting_release))
        print_table(f"client {client_id!r}", ["field", "value"], list(fields.items()))
        print_table(
            "subscriptions",
            ["filter", "qos", "no_local", "retain_as_published", "retain_handling", "sub id"],
            [(f, *options.as_dict().values()) for f, options in detail.filters.items()],
        )

    run(main())


@clients.command("kick")
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
@click.pass_context
def clients_kick(ctx: click.Context, target: Target, client_id: str, as_json: bool) -> None:
    """End a connected client's connection on its node (MQTT 5: DISCONNECT 0x98); a
    persistent session stays. Exit 1 when the client is unknown or not connected."""
    target, as_json = _inherited(ctx, target, as_json)

    async def main() -> None:
        async with redis_client(target) as redis:
            sent = await kick_client(redis, target.keys, client_id)
        if as_json:
            echo_json(sent.as_dict())
            return
        how = "disconnects it" if sent.protocol == "api" else "ends its connection"
        if sent.protocol == "5.0":
            how += " with DISCONNECT 0x98"
        click.echo(
            f"kick sent to node {sent.node_id!r} for client {client_id!r}: the node {how}; "
            "a persistent session stays"
        )

    run(main())
