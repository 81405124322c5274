"""Read-only views of the cluster's routing state in Redis, for operators and scripts.

Everything here reads Redis and writes nothing. The *cluster route table* is what every
node's mirror converges to: the route sets of the live registered nodes, each read with
one snapshot script and loaded into a :class:`RouteMirror`. A node that is registered
but whose heartbeat expired is left out, as every mirror drops it; route sets of nodes
that are not registered at all are stale leftovers that :mod:`router.ops.reconcile` reports.

Overlap of filters (``router routes --filter F``): two filters *overlap* when at least
one topic name matches both. For a topic name (no wildcard) that is "the filter matches
the topic"; for filters with wildcards it finds every route that can receive some of the
same messages::

    sport/+/score   overlaps   sport/tennis/#   (sport/tennis/score)
    sport/#         overlaps   sport            (# matches its parent level)
    +/news          does not overlap  $SYS/news (first-level wildcards skip $ topics)
    a/+             does not overlap  a/b/c

A shared filter ``$share/g/F`` is compared through its filter part ``F``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from router.core.route_mirror import RouteMirror
from router.core.topics import (
    MULTI_LEVEL,
    SEPARATOR,
    SINGLE_LEVEL,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import UnknownNodeError
from router.state.event_log import EventLog
from router.state.keys import Keys, check_id
from router.state.node_figures import NodeFigureStore
from router.state.node_history import NodeHistoryStore
from router.state.node_registry import NodeRegistry
from router.state.routes import RouteSnapshot, RouteStore
from router.state.scripts import RedisClient

# -- filters ---------------------------------------------------------------------------


def filters_overlap(first: str, second: str) -> bool:
    """True if some topic name matches both filters (see the module docstring).

    Both are validated first: :class:`InvalidTopicError` if either is not a valid filter.
    """
    validate_filter(first)
    validate_filter(second)
    a = _plain(first).split(SEPARATOR)
    b = _plain(second).split(SEPARATOR)
    wild = (SINGLE_LEVEL, MULTI_LEVEL)
    if (a[0] in wild and b[0].startswith("$")) or (b[0] in wild and a[0].startswith("$")):
        return False
    for index in range(max(len(a), len(b)) + 1):
        left = a[index] if index < len(a) else None
        right = b[index] if index < len(b) else None
        if MULTI_LEVEL in (left, right):
            # The other one matched so far, or ended here ('#' matches the parent level);
            # except that the one topic both match would then be "" ("/#" and "+"),
            # and a topic name is never empty.
            ended = left is None or right is None
            return not (ended and index == 1 and (a[0] == "" or b[0] == ""))
        if left is None or right is None:
            return left is None and right is None
        if SINGLE_LEVEL not in (left, right) and left != right:
            return False
    return True  # not reached: the loop ends with both filters exhausted


def _plain(topic_filter: str) -> str:
    shared = parse_shared(topic_filter)
    return shared.filter if shared is not None else topic_filter


# -- nodes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    """A registered node as an operator sees it.

    ``routes`` is the size of its route set, None when it has none (a registered node
    without a route set is a problem, see :mod:`router.ops.reconcile`). ``expires_in_ms`` is
    negative once the heartbeat expired. Times are Redis server milliseconds.
    ``routes_version`` counts the changes to its route set in this generation (its
    stream's last entry); ``version`` is the software the node runs (``"router 0.2.0"``,
    as ``/api/v1/nodes`` and ``$SYS/broker/version`` say it), None when the node
    published no figures (no MQTT listener with ``$SYS``, no HTTP listener: a tool node).
    ``down_since_ms`` (Unix ms) is when the cluster's event log told the node down, None
    for a live node or one no event tells of; ``registered`` is False for a dead node
    that its peers purged since (listed for an hour after it was told down, so that a
    death does not vanish from the list with the purge that follows it). ``retired``:
    the node left gracefully and a live node adopts its persistent sessions, then purges
    it (not alive, not down: :meth:`NodeRegistry.retire
    <router.state.node_registry.NodeRegistry.retire>`).
    """

    node_id: str
    alive: bool
    routes: int | None
    incarnation: str
    expires_ms: int
    expires_in_ms: int
    generation: str | None
    routes_version: int
    version: str | None = None
    down_since_ms: int | None = None
    registered: bool = True
    retired: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "alive": self.alive,
            "routes": self.routes,
            "incarnation": self.incarnation,
            "expires_ms": self.expires_ms,
            "expires_in_ms": self.expires_in_ms,
            "generation": self.generation,
            "routes_version": self.routes_version,
            "version": self.version,
            "down_since_ms": self.down_since_ms,
            "registered": self.registered,
            "retired": self.retired,
        }


async def node_versions(redis: RedisClient, keys: Keys, node_ids: list[str]) -> dict[str, str]:
    """node id -> the software version it last reported (``"router 0.2.0"``), for the
    nodes that did: in its ``$SYS`` figures, else in its dashboard telemetry."""
    found = {n: f.version for n, f in (await NodeFigureStore(redis, keys).read(node_ids)).items()}
    rest = [node_id for node_id in node_ids if not found.get(node_id)]
    if rest:
        for node_id, record in (await NodeHistoryStore(redis, keys).read(rest)).items():
            if record.telemetry is not None:
                found[node_id] = record.telemetry.version
    return {node_id: version for node_id, version in found.items() if version}


async def node_statuses(redis: RedisClient, keys: Keys) -> list[NodeStatus]:
    """Every registered node with its liveness, route count and software version, and
    every node told down in the last hour and purged since (``registered`` False),
    sorted by node id."""
    routes = RouteStore(redis, keys)
    registry = NodeRegistry(redis, keys, routes=routes)
    registered = await registry.nodes()
    versions = await node_versions(redis, keys, [info.node_id for info in registered])
    down = {
        node_id: event.at_ms
        for node_id, event in (await EventLog(redis, keys).lives()).items()
        if event.kind == "node_down"
    }
    result = []
    for info in registered:
        snapshot = await routes.snapshot(info.node_id)
        has_set = snapshot.generation is not None or bool(snapshot.routes)
        result.append(
            NodeStatus(
                node_id=info.node_id,
                alive=info.alive,
                routes=len(snapshot.routes) if has_set else None,
                incarnation=info.incarnation,
                expires_ms=info.expires_ms,
                expires_in_ms=info.expires_ms - info.now_ms,
                generation=snapshot.generation,
                routes_version=snapshot.version,
                version=versions.get(info.node_id),
                down_since_ms=None if info.alive else down.get(info.node_id),
                retired=info.retired,
            )
        )
    now_ms = registered[0].now_ms if registered else int(time.time() * 1000)
    names = {info.node_id for info in registered}
    for node_id, since in down.items():
        if node_id not in names:
            gone = NodeStatus(
                node_id=node_id,
                alive=False,
                routes=None,
                incarnation="",
                expires_ms=since,
                expires_in_ms=since - now_ms,
                generation=None,
                routes_version=0,
                down_since_ms=since,
                registered=False,
            )
            result.append(gone)
    return sorted(result, key=lambda status: status.node_id)


# -- the route table -------------------------------------------------------------------


async def load_mirror(redis: RedisClient, keys: Keys, node_id: str | None = None) -> RouteMirror:
    """The cluster route table (live nodes' route sets) in a fresh :class:`RouteMirror`.

    With ``node_id``, only that node's route set, whether it is alive, dead or not
    registered; raises :class:`UnknownNodeError` when the node is neither registered
    nor has a route set, :class:`InvalidIdError` for an id that cannot name a node.
    """
    routes = RouteStore(redis, keys)
    registry = NodeRegistry(redis, keys, routes=routes)
    mirror = RouteMirror()
    if node_id is not None:
        check_id(node_id, "node id")
        snapshot = await routes.snapshot(node_id)
        registered = {info.node_id for info in await registry.nodes()}
        if node_id not in registered and not _has_route_set(snapshot):
            raise UnknownNodeError(node_id)
        _load(mirror, snapshot)
        return mirror
    for info in await registry.live_nodes():
        _load(mirror, await routes.snapshot(info.node_id))
    return mirror


def _has_route_set(snapshot: RouteSnapshot) -> bool:
    return snapshot.generation is not None or bool(snapshot.routes)


def _load(mirror: RouteMirror, snapshot: RouteSnapshot) -> None:
    if _has_route_set(snapshot):
        mirror.load(snapshot.node_id, snapshot.generation, snapshot.version, snapshot.routes)


@dataclass(frozen=True)
class RouteRow:
    """One filter of the route table: the nodes holding it, and for a share group
    (``$share/g/F``) how many members each of them holds (None for a plain filter)."""

    filter: str
    nodes: list[str]
    members: dict[str, int] | None

    def as_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {"filter": self.filter, "nodes": self.nodes}
        if self.members is not None:
            row["members"] = self.members
        return row


def route_rows(mirror: RouteMirror, overlapping: str | None = None) -> list[RouteRow]:
    """The route table sorted by filter; with ``overlapping``, only the filters that
    overlap it (a topic name or a filter; :class:`InvalidTopicError` if it is neither)."""
    if overlapping is not None:
        validate_filter(overlapping)
    rows = []
    for route, holders in mirror.table().items():
        if overlapping is not None and not filters_overlap(route, overlapping):
            continue
        members = dict(sorted(holders.items())) if parse_shared(route) is not None else None
        rows.append(RouteRow(route, sorted(holders), members))
    return sorted(rows, key=lambda row: row.filter)


@dataclass(frozen=True)
class MatchReport:
    """Where a publish to ``topic`` would go, and why.

    ``nodes``: every node that may get a copy (sorted): the nodes with a matching plain
    filter, and the nodes holding members of a matching share group (each message goes
    to exactly one member of each group, so to one of that group's nodes).
    ``filters``: node -> its matching routes (plain filters and share groups).
    ``shared``: matching share group -> node -> member count.
    """

    topic: str
    nodes: list[str]
    filters: dict[str, list[str]]
    shared: dict[str, dict[str, int]]

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "nodes": self.nodes,
            "filters": self.filters,
            "shared": self.shared,
        }


def explain_match(mirror: RouteMirror, topic: str) -> MatchReport:
    """Match ``topic`` against the route table without choosing share-group members.

    Raises :class:`InvalidTopicError` for an invalid topic name.
    """
    found = mirror.match(validate_topic(topic))
    groups = sorted({group for chosen in found.nodes.values() for group in chosen})
    shared: dict[str, dict[str, int]] = {
        group: dict(sorted(mirror.group_nodes(group).items())) for group in groups
    }
    filters: dict[str, list[str]] = {node: list(f) for node, f in found.filters.items()}
    for group, holders in shared.items():
        for node in holders:
            filters.setdefault(node, []).append(group)
    filters = {node: sorted(filters[node]) for node in sorted(filters)}
    return MatchReport(topic, list(filters), filters, shared)


def dump_routes(mirror: RouteMirror) -> str:
    """The route table drawn as a trie (:meth:`SubscriptionTrie.dump`), followed by the
    member count of each node in each share group (the trie shows the nodes only)."""
    table = mirror.table()
    text = mirror.dump()
    shares = [
        f"  {route}: " + ", ".join(f"{node} x{count}" for node, count in holders.items())
        for route, holders in table.items()
        if parse_shared(route) is not None
    ]
    if shares:
        text += "share group members per node:\n" + "\n".join(shares) + "\n"
    return text
