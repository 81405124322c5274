"""``router clients``: the sessions of clients (connected and away), one client, the kick,
clearing a session.

JSON shapes (``--json``):

* ``router clients``: ``[{"client_id", "node", "node_alive", "protocol", "state",
  "since", "since_ms", "keepalive", "subscriptions", "queued", "expiry", "expires_in"}]``
  sorted by client id; ``protocol`` is ``"5.0"``, ``"3.1.1"``, ``"3.1"`` or ``"api"``,
  ``state`` ``"connected"`` or ``"away"``, ``since`` an ISO UTC time, ``expires_in`` the
  seconds an away session has left, ``"never"``, or null while connected
* ``router clients show CLIENT``: the same fields and ``"username"``,
  ``"awaiting_release"``, ``"filters": [{"filter", "qos", "no_local",
  "retain_as_published", "retain_handling", "subscription_identifier"}]``, ``"figures"``
  (what its node counted: ``GET /api/v1/clients/ID``'s, null when unknown)
* ``router clients kick CLIENT``: ``{"client_id", "node", "protocol"}``
* ``router clients clear CLIENT``: ``{"client_id", "cleared": true}``

The list takes the filters of ``GET /api/v1/clients`` (``--id-prefix``, ``--user``,
``--node``, ``--state``, ``--protocol``: ``--prefix`` is the key namespace, as for every
command). ``clear`` is ``DELETE /api/v1/clients/ID/session``: the same library call,
refused the same way (a client connected to a live node: kick it first); a client with
no session is not found (exit 1) where the API answers ``"cleared": false``. It joins
the cluster as a short-lived node for the time of the call (:mod:`router.ops.tool_node`),
which ends the session as a clean start would.

The logic lives in :mod:`router.ops.client_view`; this module parses and prints.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from router.ops.client_view import (
    DEFAULT_LIMIT,
    PROTOCOL_NAMES,
    STATE_NAMES,
    ClientFilter,
    ClientRow,
    clear_session,
    client_detail,
    client_rows,
    iso_time,
    kick_client,
    unknown_client,
)
from router.ops.tool_node import ephemeral_node
from router.state.client_figures import ClientFigures

from .common import (
    SUBSCRIPTION_COLUMNS,
    Column,
    Target,
    echo_json,
    json_option,
    note,
    print_table,
    redis_client,
    run,
    subscription_cells,
    target_options as target,
    wide_option,
)

# (since and keepalive only with --wide: on 80 columns the ids keep room)
COLUMNS = (
    Column("client"),
    Column("node"),
    Column("protocol", fixed=True),
    Column("state", fixed=True),
    Column("since (UTC)", fixed=True, wide=True),
    Column("keepalive", fixed=True, wide=True),
    Column("subs", fixed=True),
    Column("queued", fixed=True),
    Column("expires in", fixed=True),
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


def _queued(row: ClientRow) -> str:
    """``12 (memory 10, Redis 2)``; memory unknown when its node published no figures."""
    memory = "unknown" if row.queued_memory is None else str(row.queued_memory)
    return f"{row.queued} (memory {memory}, Redis {row.queued_redis})"


def _figure_rows(figures: ClientFigures | None) -> list[tuple[str, str]]:
    """The client's figures in words (unknown: its node is down or published none)."""
    if figures is None:
        return [("figures", "unknown: its node is not alive or publishes none (no --http)")]
    last = figures.last_activity_ms
    rows = [
        ("messages in", f"{figures.received} ({figures.received_bytes} bytes)"),
        ("messages out", f"{figures.sent} ({figures.sent_bytes} bytes)"),
        ("queued in memory", f"{figures.queued} ({figures.queued_bytes} bytes)"),
        ("in flight", str(figures.inflight)),
        ("dropped", str(figures.dropped)),
    ]
    rows += [(f"  {reason.replace('_', ' ')}", str(n)) for reason, n in figures.drops.items() if n]
    rows += [
        ("takeovers", str(figures.takeovers)),
        ("last activity (UTC)", "never" if last is None else iso_time(last)),
        ("as of (UTC)", iso_time(figures.at_ms)),
    ]
    return rows


def _pick(ctx: click.Context, name: str, own: object) -> object:
    """A subcommand's option, the group's where only the group was given it (``router
    clients --redis URL show ID`` means that Redis)."""
    parent = ctx.parent
    if parent is None or ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
        return own
    if parent.get_parameter_source(name) is ParameterSource.COMMANDLINE:
        return parent.params[name]
    return own


def _inherited(ctx: click.Context, target: Target, as_json: bool) -> tuple[Target, bool]:
    """The target and ``--json`` of a subcommand, the group's where only it had them."""
    url, prefix = _pick(ctx, "redis_url", target.url), _pick(ctx, "prefix", target.prefix)
    return Target(str(url), str(prefix)), bool(_pick(ctx, "as_json", as_json))


@click.group(invoke_without_command=True)
@target
@click.option(
    "--id-prefix",
    default=None,
    metavar="TEXT",
    help="Only client ids that start with TEXT (--prefix is the key namespace).",
)
@click.option("--user", default=None, help="Only the sessions of this user name (exactly).")
@click.option("--node", "node_id", default=None, help="Only the sessions on this node.")
@click.option("--state", type=click.Choice(STATE_NAMES), default=None, help="Only these.")
@click.option("--protocol", type=click.Choice(PROTOCOL_NAMES), default=None, help="Only these.")
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
@wide_option
@click.pass_context
def clients(
    ctx: click.Context,
    target: Target,
    id_prefix: str | None,
    user: str | None,
    node_id: str | None,
    state: str | None,
    protocol: str | None,
    limit: int,
    page: int,
    as_json: bool,
    wide: bool,
) -> None:
    """Client sessions, connected and away (persistent), sorted by client id; the
    filters are those of the HTTP API's list, all of them applying."""
    if ctx.invoked_subcommand is not None:
        return
    which = ClientFilter(id_prefix, user, node_id, state, protocol)  # type: ignore[arg-type]

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            rows, complete = await client_rows(redis, target.keys, which, limit=limit, page=page)
        if not complete:
            note(f"more sessions follow: --page {page + 1}")
        if as_json:
            echo_json([row.as_dict() for row in rows])
            return
        title = "clients" + (f" on node {node_id}" if node_id else "")
        print_table(title, COLUMNS, [_cells(row) for row in rows], wide)

    run(main())


@clients.command("show")
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
@wide_option
@click.pass_context
def clients_show(
    ctx: click.Context, target: Target, client_id: str, as_json: bool, wide: bool
) -> None:
    """One client's session and its subscriptions (exit 1 when it has none)."""
    target, as_json = _inherited(ctx, target, as_json)
    wide = bool(_pick(ctx, "wide", wide))

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            detail = await client_detail(redis, target.keys, client_id)
        if as_json:
            echo_json(detail.as_dict())
            return
        headers = [column.header for column in COLUMNS[1:]]
        fields = dict(zip(headers, _cells(detail.row)[1:], strict=True))
        fields["queued"] = _queued(detail.row)
        fields["username"] = "-" if detail.username is None else detail.username
        if detail.awaiting_release:
            fields["awaiting PUBREL"] = ", ".join(map(str, detail.awaiting_release))
        print_table(
            f"client {client_id!r}",
            (Column("field", fixed=True), Column("value")),
            list(fields.items()),
            wide,
        )
        print_table(
            "figures" + ("" if detail.figures is None else f" (node {detail.figures.node_id})"),
            (Column("figure", fixed=True), Column("value")),
            _figure_rows(detail.figures),
            wide,
        )
        print_table(
            "subscriptions",
            SUBSCRIPTION_COLUMNS,
            [subscription_cells(f, options) for f, options in detail.filters.items()],
            wide,
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


@clients.command("clear")
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
@click.pass_context
def clients_clear(ctx: click.Context, target: Target, client_id: str, as_json: bool) -> None:
    """End CLIENT's session wherever it is kept: its subscriptions, queue and routes go,
    on every node (the API's DELETE .../session). Exit 1 when it has no session, or while
    it is connected to a live node (kick it first)."""
    target, as_json = _inherited(ctx, target, as_json)
    keys = target.keys  # (an unusable prefix fails before joining)

    async def main() -> None:
        async with ephemeral_node(target.url, prefix=target.prefix) as node:
            cleared = await clear_session(node, client_id)
        if not cleared:
            raise unknown_client(client_id, keys)
        if as_json:
            echo_json({"client_id": client_id, "cleared": True})
            return
        click.echo(f"cleared the session of client {client_id!r}: subscriptions, queue, routes")

    run(main())
