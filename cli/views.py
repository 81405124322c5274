"""Read-only operator commands: nodes, routes, match, subs, aliases, trie dump, channels.

JSON shapes (``--json``):

* ``router nodes``: ``[{"node_id", "alive", "routes", "incarnation", "expires_ms",
  "expires_in_ms", "generation", "version"}]`` (``routes`` null: no route set)
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
"""

from __future__ import annotations

import click

from router.core.aliases import Namespace
from router.core.topics import validate_filter, validate_topic
from router.ops.channel_view import DEFAULT_LIMIT, channel_info, list_channels
from router.ops.route_view import dump_routes, explain_match, load_mirror, node_statuses, route_rows
from router.state.alias_store import RedisAliasTable
from router.state.subscriptions import SubscriptionStore

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


@click.command()
@target
@json_option
def nodes(target: Target, as_json: bool) -> None:
    """Registered nodes: alive or not, route count, heartbeat expiry."""

    async def main() -> None:
        async with redis_client(target) as redis:
            found = await node_statuses(redis, target.keys)
        if as_json:
            echo_json([status.as_dict() for status in found])
            return
        rows = [
            (
                s.node_id,
                "yes" if s.alive else "NO",
                "-" if s.routes is None else s.routes,
                s.incarnation[:12],
                f"{s.expires_in_ms / 1000:.1f}s",
            )
            for s in found
        ]
        print_table("nodes", ["node", "alive", "routes", "incarnation", "expires in"], rows)

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
def routes(target: Target, node_id: str | None, overlapping: str | None, as_json: bool) -> None:
    """The cluster route table (live nodes), sorted by filter."""
    if overlapping is not None:
        validate_filter(overlapping)

    async def main() -> None:
        async with redis_client(target) as redis:
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
        )

    run(main())


@click.command()
@target
@click.argument("topic")
@json_option
def match(target: Target, topic: str, as_json: bool) -> None:
    """Which nodes a publish to TOPIC would reach, and the routes that say so."""
    validate_topic(topic)

    async def main() -> None:
        async with redis_client(target) as redis:
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
        )
        for group, holders in report.shared.items():
            members = ", ".join(f"{n} ({c})" for n, c in holders.items())
            click.echo(f"{group}: one member of [{members}] gets each message")

    run(main())


@click.command()
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
def subs(target: Target, client_id: str, as_json: bool) -> None:
    """A client's subscriptions and their options, as stored in Redis."""

    async def main() -> None:
        async with redis_client(target) as redis:
            store = SubscriptionStore(redis, target.keys)
            found = await store.subscriptions(client_id)
            owner = await store.owner(client_id)
        items = [{"filter": f, **found[f].as_dict()} for f in sorted(found)]
        if as_json:
            echo_json(items)
            return
        where = f"owner {owner.node_id} (epoch {owner.epoch})" if owner else "no owner"
        print_table(
            f"client {client_id!r}: {where}",
            ["filter", "qos", "no_local", "retain_as_published", "retain_handling", "sub id"],
            [tuple(item.values()) for item in items],
        )

    run(main())


@click.command()
@target
@click.argument("client_id", metavar="CLIENT")
@json_option
def aliases(target: Target, client_id: str, as_json: bool) -> None:
    """A client's topic aliases in both namespaces (client: inbound, server: outbound)."""

    async def main() -> None:
        async with redis_client(target) as redis:
            table = RedisAliasTable(redis, target.keys)
            spaces: tuple[Namespace, ...] = ("client", "server")
            found = {ns: await table.aliases(client_id, ns) for ns in spaces}
        data = {
            ns: [{"alias": a, "topic": t} for a, t in sorted(bound.items())]
            for ns, bound in found.items()
        }
        if as_json:
            echo_json(data)
            return
        rows = [(ns, item["alias"], item["topic"]) for ns, items in data.items() for item in items]
        print_table(f"aliases of client {client_id!r}", ["namespace", "alias", "topic"], rows)

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
        async with redis_client(target) as redis:
            mirror = await load_mirror(redis, target.keys, node_id)
        click.echo(dump_routes(mirror), nl=False)

    run(main())


@click.group()
def channels() -> None:
    """Channel-clock channels: node inboxes and queues."""


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
def channels_list(target: Target, limit: int, as_json: bool) -> None:
    """Channels under the prefix (found by SCAN), with their clocks and TTLs."""

    async def main() -> None:
        async with redis_client(target) as redis:
            found, complete = await list_channels(redis, target.keys, limit)
        if not complete:
            note(f"only the first {limit} channels are shown (--limit)")
        if as_json:
            echo_json([info.as_dict() for info in found])
            return
        print_table(
            "channels",
            ["channel", "clock", "ttl (s)"],
            [(info.name, info.clock, info.ttl_s) for info in found],
        )

    run(main())


@channels.command("show")
@target
@click.argument("name")
@limit_option
@json_option
def channels_show(target: Target, name: str, limit: int, as_json: bool) -> None:
    """One channel: clock, TTL, and its subscribers' cursors (found by SCAN)."""

    async def main() -> None:
        async with redis_client(target) as redis:
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
            ["subscriber", "cursor", "pending", "ttl (s)"],
            [(s.subscriber, s.cursor, s.pending, s.ttl_s) for s in info.subscribers or []],
        )

    run(main())


COMMANDS = [nodes, routes, match, subs, aliases, trie, channels]
