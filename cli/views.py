"""Read-only operator commands: nodes, routes, match, subs, aliases, trie dump, channels.

JSON shapes (``--json``):

* ``router nodes``: ``[{"node_id", "alive", "routes", "incarnation", "expires_ms",
  "expires_in_ms", "generation", "routes_version", "version"}]`` (``routes`` null: no
  route set; ``routes_version`` the route set's change count, ``version`` the software,
  ``"router 0.2.0"``, null when the node reported none)
* ``router routes``: ``[{"filter", "nodes": [ids], "members": {id: count}}]`` sorted by
  filter; ``members`` only for share groups (``$share/g/F``)
* ``router match TOPIC``: ``{"topic", "nodes": [ids], "filters": {id: [routes]},
  "shared": {share filter: {id: count}}}``
* ``router subs CLIENT``: ``[{"filter", "qos", "no_local", "retain_as_published",
  "retain_handling", "subscription_identifier"}]``
* ``router aliases CLIENT``: ``{"client": [{"alias", "topic"}], "server": [...]}``
* ``router channels list``: ``[{"name", "clock", "ttl_s"}]``; ``router channels show NAME``:
  ``{"name", "clock", "ttl_s", "subscribers": [{"subscriber", "cursor", "pending",
  "ttl_s"}], "complete"}``

Tables fit the terminal, long values cut with an ellipsis; ``--wide`` prints them whole
(:mod:`router.cli.tables`). A client that ``subs`` or ``aliases`` knows nothing of (no session,
no subscription) is not found: exit 1. Each view warns on stderr when no node is
registered under the prefix (:func:`router.cli.common.warn_without_nodes`).
"""

from __future__ import annotations

import time

import click

from router.core.aliases import Namespace
from router.core.topics import validate_filter, validate_topic
from router.ops.channel_view import DEFAULT_LIMIT, channel_info, list_channels
from router.ops.client_view import unknown_client
from router.ops.route_view import dump_routes, explain_match, load_mirror, node_statuses, route_rows
from router.state.alias_store import RedisAliasTable
from router.state.scripts import RedisClient
from router.state.subscriptions import SubscriptionStore

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

NODE_COLUMNS = (
    Column("node"),
    Column("alive", fixed=True),
    Column("routes", fixed=True),
    Column("incarnation", fixed=True),
    Column("expires in", fixed=True),
    Column("version", fixed=True),
    Column("down since", fixed=True),
)


def _utc(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%H:%M:%S UTC", time.gmtime(ms / 1000))


@click.command()
@target
@json_option
@wide_option
def nodes(target: Target, as_json: bool, wide: bool) -> None:
    """Registered nodes: alive or not, route count, heartbeat expiry, software version."""

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            found = await node_statuses(redis, target.keys)
        if as_json:
            echo_json([status.as_dict() for status in found])
            return
        rows = [
            (
                s.node_id,
                "yes" if s.alive else "left" if s.retired else "NO",
                "-" if s.routes is None else s.routes,
                s.incarnation[:12],
                f"{s.expires_in_ms / 1000:.1f}s" if s.registered else "purged",
                s.version or "-",
                _utc(s.down_since_ms),
            )
            for s in found
        ]
        print_table("nodes", NODE_COLUMNS, rows, wide)

    run(main())


@click.command()
@target
@click.option("--node", "node_id", default=None, help="Only this node's routes (any state).")
@click.option(
    "--filter",
    "overlapping",
    default=None,
    metavar="F",
    help="Only routes that overlap F: some topic matches both (for a topic name: the "
    "routes that match it).",
)
@json_option
@wide_option
def routes(
    target: Target, node_id: str | None, overlapping: str | None, as_json: bool, wide: bool
) -> None:
    """The cluster route table (live nodes), sorted by filter."""
    if overlapping is not None:
        validate_filter(overlapping)

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            mirror = await load_mirror(redis, target.keys, node_id)
        rows = route_rows(mirror, overlapping)
        if as_json:
            echo_json([row.as_dict() for row in rows])
            return
        print_table(
            "routes" + (f" of node {node_id}" if node_id else ""),
            ["filter", "nodes", "members"],
            [
                (
                    row.filter,
                    ", ".join(row.nodes),
                    ", ".join(f"{n}: {c}" for n, c in (row.members or {}).items()),
                )
                for row in rows
            ],
            wide,
        )

    run(main())


@click.command()
@target
@click.argument("topic")
@json_option
@wide_option
def match(target: Target, topic: str, as_json: bool, wide: bool) -> None:
    """Which nodes a publish to TOPIC would reach, and the routes that say so."""
    validate_topic(topic)

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            mirror = await load_mirror(redis, target.keys)
        report = explain_match(mirror, topic)
        if as_json:
            echo_json(report.as_dict())
            return
        if not report.nodes:
            click.echo(f"no node is interested in {topic!r}")
            return
        print_table(
            f"publish to {topic!r} reaches",
            ["node", "matching routes"],
            [(node, ", ".join(found)) for node, found in report.filters.items()],
            wide,
        )
        for group, holders in report.shared.items():
            members = ", ".join(f"{n} ({c})" for n, c in holders.items())
            click.echo(f"{group}: one member of [{members}] gets each message")

    run(main())


@click.command()
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
@wide_option
def subs(target: Target, client_id: str, as_json: bool, wide: bool) -> None:
    """A client's subscriptions and their options, as stored in Redis (exit 1 when the
    client has neither a session nor a subscription)."""

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            store = SubscriptionStore(redis, target.keys)
            found = await store.subscriptions(client_id)
            owner = await store.owner(client_id)
            if not found and owner is None:
                raise unknown_client(client_id, target.keys)
        if as_json:
            echo_json([{"filter": f, **found[f].as_dict()} for f in sorted(found)])
            return
        where = f"owner {owner.node_id} (epoch {owner.epoch})" if owner else "no owner"
        print_table(
            f"client {client_id!r}: {where}",
            SUBSCRIPTION_COLUMNS,
            [subscription_cells(f, found[f]) for f in sorted(found)],
            wide,
        )

    run(main())


async def _known(redis: RedisClient, target: Target, client_id: str) -> bool:
    """Whether the client has a session (an owner) or a subscription."""
    store = SubscriptionStore(redis, target.keys)
    return await store.owner(client_id) is not None or bool(await store.subscriptions(client_id))


@click.command()
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
@wide_option
def aliases(target: Target, client_id: str, as_json: bool, wide: bool) -> None:
    """A client's topic aliases in both namespaces (client: inbound, server: outbound);
    exit 1 when the client has neither an alias nor a session."""

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            table = RedisAliasTable(redis, target.keys)
            spaces: tuple[Namespace, ...] = ("client", "server")
            found = {ns: await table.aliases(client_id, ns) for ns in spaces}
            if not any(found.values()) and not await _known(redis, target, client_id):
                raise unknown_client(client_id, target.keys)
        data = {
            ns: [{"alias": a, "topic": t} for a, t in sorted(bound.items())]
            for ns, bound in found.items()
        }
        if as_json:
            echo_json(data)
            return
        rows = [(ns, item["alias"], item["topic"]) for ns, items in data.items() for item in items]
        columns = (Column("namespace", fixed=True), Column("alias", fixed=True), Column("topic"))
        print_table(f"aliases of client {client_id!r}", columns, rows, wide)

    run(main())


@click.group()
def trie() -> None:
    """The route table as a trie."""


@trie.command("dump")
@target
@click.option("--node", "node_id", default=None, help="Only this node's routes (any state).")
def trie_dump(target: Target, node_id: str | None) -> None:
    """Draw the cluster route table (or one node's routes) as a trie of filter levels."""

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            mirror = await load_mirror(redis, target.keys, node_id)
        click.echo(dump_routes(mirror), nl=False)

    run(main())


@click.group()
def channels() -> None:
    """Channel-clock channels: node inboxes and queues."""


SUBSCRIBER_COLUMNS = (
    Column("subscriber"),
    *(Column(header, fixed=True) for header in ("cursor", "pending", "ttl (s)")),
)

limit_option = click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Scan at most this many keys (SCAN, never KEYS).",
)


@channels.command("list")
@target
@limit_option
@json_option
@wide_option
def channels_list(target: Target, limit: int, as_json: bool, wide: bool) -> None:
    """Channels under the prefix (found by SCAN), with their clocks and TTLs."""

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            found, complete = await list_channels(redis, target.keys, limit)
        if not complete:
            note(f"only the first {limit} channels are shown (--limit)")
        if as_json:
            echo_json([info.as_dict() for info in found])
            return
        print_table(
            "channels",
            (Column("channel"), Column("clock", fixed=True), Column("ttl (s)", fixed=True)),
            [(info.name, info.clock, info.ttl_s) for info in found],
            wide,
        )

    run(main())


@channels.command("show")
@target
@click.argument("name")
@limit_option
@json_option
@wide_option
def channels_show(target: Target, name: str, limit: int, as_json: bool, wide: bool) -> None:
    """One channel: clock, TTL, and its subscribers' cursors (found by SCAN)."""

    async def main() -> None:
        async with redis_client(target, expect_nodes=True) as redis:
            info = await channel_info(redis, target.keys, name, limit)
        if not info.complete:
            note(f"only the first {limit} subscribers are shown (--limit)")
        if as_json:
            echo_json(info.as_dict())
            return
        ttl = "no expiry" if info.ttl_s is None else f"{info.ttl_s}s"
        click.echo(f"channel {info.name!r}: clock {info.clock}, ttl {ttl}")
        print_table(
            "subscribers",
            SUBSCRIBER_COLUMNS,
            [(s.subscriber, s.cursor, s.pending, s.ttl_s) for s in info.subscribers or []],
            wide,
        )

    run(main())


COMMANDS = [nodes, routes, match, subs, aliases, trie, channels]
