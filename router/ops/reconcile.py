"""Reconcile: find route-table problems visible from Redis, and repair the safe ones.

Each node is the single writer of its own route set (:mod:`router.cluster.route_writer`),
so a tool outside the node may only *delete* route sets that no live process owns;
everything else is reported for the owning node to fix. The report is a list of
:class:`Problem` values, each with a ``kind``; new checks add new kinds without changing
the shape.

Kinds, and who may fix them:

``stale_route_set``  (repair: ``purge``)
    A route set (routes, stream or meta keys) of a node that is not registered: left
    behind by a purge interrupted halfway, or by a crash of a node that was then
    unregistered. No mirror loads it. ``repair=True`` deletes it, guarded by the route
    set's incarnation, so a node that claims it meanwhile is never touched.
``dead_node``  (repair: ``purge``, or ``node`` while it owns persistent sessions)
    A registered node whose heartbeat expired (by Redis server time), or that retired
    (stopped gracefully, leaving its persistent sessions to a live node). Live nodes purge
    these themselves; with no live node left, nobody does. ``repair=True`` purges it
    like a live node would (route set, then registry), guarded by its incarnation. A
    dead node that still owns persistent sessions (or whose sessions were not all
    scanned) is left for a node to adopt them first: its registration is what tells a
    node to adopt them (:mod:`router.cluster.sessions.adoption`), so purging it here
    would leave them to nobody.
``ghost_client``  (repair: ``purge``)
    A client whose session owner is a dead or unregistered node, and whose session ends
    with its connection (Session Expiry 0, or no session description: the embedding
    API's clean sessions): it is listed as connected and holds subscriptions for a node
    that will never serve it. A live node removes these when it adopts the dead node's
    sessions; ``repair=True`` removes the client's state (subscriptions, aliases, claim,
    description) fenced by the dead claim, so a client that came back meanwhile keeps
    its new session (``absent``).
``orphan_session``  (repair: ``node``)
    A persistent session whose owner node is not registered any more (purged before
    its sessions were adopted): no node adopts it. Its client resumes it on any node;
    a node started under the owner's id adopts it at start.
``missing_route_set``  (repair: ``node``)
    A live node without a route set (Redis lost it, or it is still starting). Only the
    node may create it again: it does so on its next route write.
``foreign_route_set``  (repair: ``node``)
    A live node whose route set was claimed by another incarnation than the registered
    one (two processes with one node id, or a restart still in progress).
``missing_route``  (repair: ``node``)
    A client whose session owner is a live node subscribes to a filter that is not in
    that node's route set: publishes on other nodes would not reach it.
``extra_route``  (repair: ``node``)
    A live node's route set holds a route that none of the clients it owns subscribes
    to (or a share group with another member count than its clients): other nodes
    forward messages it drops. Reported only when every client was scanned.

Client checks scan the clients' owner keys (bounded: ``max_clients``). A subscribe or
unsubscribe in flight changes client state and the route set one after the other, so a
``missing_route`` or ``extra_route`` may show for a moment: run reconcile again to confirm.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Final

from router.core.topics import TopicFilter, parse_shared
from router.state.keys import Keys
from router.state.node_registry import NodeInfo, NodeRegistry
from router.state.route_hints import RouteHints
from router.state.routes import RouteSnapshot, RouteStore
from router.state.scan import scan_keys
from router.state.scripts import RedisClient
from router.state.session_store import SessionStore
from router.state.subscriptions import Owner, SubscriptionStore

DEFAULT_MAX_CLIENTS: Final = 10_000
REPAIRABLE: Final = frozenset({"stale_route_set", "dead_node", "ghost_client"})
REPAIRED: Final = frozenset({"purged", "absent", "removed"})
"""Repair statuses after which nothing is left to fix."""


@dataclass(frozen=True)
class Problem:
    """One problem found. ``repair`` says who can fix it: ``purge`` (``reconcile
    --repair``) or ``node`` (only a node); ``repaired`` holds the repair's status
    (``purged``, ``removed``, ``absent``, ``skipped``) once a repair ran, else None.
    ``epoch`` is the claim a ghost client's dead owner holds."""

    kind: str
    node_id: str
    detail: str
    repair: str
    routes: int | None = None
    incarnation: str | None = None
    client_id: str | None = None
    route: str | None = None
    epoch: int | None = None
    repaired: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node_id": self.node_id,
            "detail": self.detail,
            "repair": self.repair,
            "routes": self.routes,
            "incarnation": self.incarnation,
            "client_id": self.client_id,
            "route": self.route,
            "epoch": self.epoch,
            "repaired": self.repaired,
        }


@dataclass
class ReconcileReport:
    """What reconcile checked and found. ``clients_complete`` is False when the client
    scan stopped at its bound (then ``extra_route`` was not checked)."""

    problems: list[Problem] = field(default_factory=list)
    nodes: int = 0
    route_sets: int = 0
    clients: int = 0
    clients_complete: bool = True
    repaired: bool = False

    @property
    def ok(self) -> bool:
        """True when nothing is left to fix (every problem found was repaired)."""
        return all(p.repaired in REPAIRED for p in self.problems)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": [problem.as_dict() for problem in self.problems],
            "checked": {
                "nodes": self.nodes,
                "route_sets": self.route_sets,
                "clients": self.clients,
                "clients_complete": self.clients_complete,
            },
            "repaired": self.repaired,
        }


async def reconcile(
    redis: RedisClient,
    keys: Keys,
    *,
    repair: bool = False,
    max_clients: int = DEFAULT_MAX_CLIENTS,
) -> ReconcileReport:
    """Check the route table against the registry and client state; see the module doc.

    With ``repair``, purge every ``stale_route_set`` and ``dead_node`` problem found (and
    announce it on the route-hints channel so mirrors drop the node at once).
    """
    routes = RouteStore(redis, keys)
    registry = NodeRegistry(redis, keys, routes=routes)
    # Scan the route sets before reading the registry: a node registers before it
    # claims its route set, so a route set of an unregistered node is a leftover.
    scanned = await scan_keys(redis, keys.node_keys_pattern())
    holders = {n for key in scanned.keys if (n := keys.node_of_key(key)) is not None}
    registered = {info.node_id: info for info in await registry.nodes()}
    snapshots = {
        node_id: await routes.snapshot(node_id) for node_id in sorted(holders | set(registered))
    }
    report = ReconcileReport(nodes=len(registered))
    report.route_sets = sum(1 for s in snapshots.values() if _exists(s))
    for node_id, snapshot in snapshots.items():
        report.problems += _node_problems(registered.get(node_id), snapshot)
    live = {
        node_id: snapshots[node_id].routes
        for node_id, info in registered.items()
        if info.alive and _exists(snapshots[node_id])
    }
    alive = {node_id for node_id, info in registered.items() if info.alive}
    clients = await _client_problems(redis, keys, live, alive, set(registered), max_clients, report)
    report.problems = [_kept_for_adoption(p, clients, report) for p in report.problems]
    report.problems += clients.problems
    if repair:
        report.repaired = True
        report.problems = [await _repair(redis, keys, registry, p) for p in report.problems]
    return report


def _kept_for_adoption(problem: Problem, clients: ClientScan, report: ReconcileReport) -> Problem:
    """A ``dead_node`` problem left to a node when the node owns persistent sessions (or
    the scan could not tell): see the module docstring."""
    if problem.kind != "dead_node":
        return problem
    persistent = clients.persistent_of_dead[problem.node_id]
    if persistent:
        why = f"{persistent} persistent sessions wait for a live node to adopt them"
    elif not report.clients_complete:
        why = "its sessions were not all scanned (--max-clients): not purged"
    else:
        return problem
    return replace(problem, detail=f"{problem.detail}; {why}", repair="node")


def _exists(snapshot: RouteSnapshot) -> bool:
    return snapshot.generation is not None or bool(snapshot.routes)


def _node_problems(info: NodeInfo | None, snapshot: RouteSnapshot) -> list[Problem]:
    node_id, count = snapshot.node_id, len(snapshot.routes)
    if info is None:
        if not _exists(snapshot) and snapshot.first_version == 0:
            return []  # only a stray stream entry or nothing at all: purge-safe, not worth a line
        return [
            Problem(
                "stale_route_set",
                node_id,
                f"route set of unregistered node ({count} routes)",
                "purge",
                routes=count,
                incarnation=snapshot.incarnation,
            )
        ]
    if not info.alive:
        ago = info.now_ms - info.expires_ms
        how = "retired (stopped gracefully)" if info.retired else "heartbeat expired"
        return [
            Problem(
                "dead_node",
                node_id,
                f"{how} {ago} ms ago ({count} routes)",
                "purge",
                routes=count,
                incarnation=info.incarnation,
            )
        ]
    if not _exists(snapshot):
        return [Problem("missing_route_set", node_id, "live node without a route set", "node")]
    if snapshot.incarnation is not None and snapshot.incarnation != info.incarnation:
        return [
            Problem(
                "foreign_route_set",
                node_id,
                f"route set claimed by incarnation {snapshot.incarnation}, "
                f"registered incarnation is {info.incarnation}",
                "node",
                routes=count,
                incarnation=snapshot.incarnation,
            )
        ]
    return []


@dataclass
class ClientScan:
    """What the clients' scan found: the problems, and per dead registered node the
    persistent sessions it still owns (adopted by a live node before it is purged)."""

    problems: list[Problem] = field(default_factory=list)
    persistent_of_dead: Counter[str] = field(default_factory=Counter)


async def _client_problems(
    redis: RedisClient,
    keys: Keys,
    live: dict[str, dict[TopicFilter, int]],
    alive: set[str],
    registered: set[str],
    max_clients: int,
    report: ReconcileReport,
) -> ClientScan:
    """The client problems, for the ``live`` nodes' route sets, the ``alive`` nodes
    (with a route set or not: one still starting) and every ``registered`` one."""
    store = SubscriptionStore(redis, keys)
    sessions = SessionStore(redis, keys, store)
    scanned = await scan_keys(redis, keys.client_owners_pattern(), limit=max_clients)
    report.clients_complete = scanned.complete
    expected: dict[str, Counter[str]] = {node_id: Counter() for node_id in live}
    found = ClientScan()
    for key in sorted(scanned.keys):
        client_id = keys.client_of_owner_key(key)
        if client_id is None:
            continue
        report.clients += 1
        owner = await store.owner(client_id)
        if owner is None:
            continue
        if owner.node_id not in alive:
            info = await sessions.describe(client_id)
            if info is not None and info.expiry > 0:
                if owner.node_id in registered:
                    found.persistent_of_dead[owner.node_id] += 1
                else:
                    found.problems.append(_orphan(client_id, owner))
            else:
                found.problems.append(_ghost(client_id, owner, owner.node_id in registered))
            continue
        if owner.node_id not in live:
            continue
        node_routes = live[owner.node_id]
        for topic_filter in sorted(await store.subscriptions(client_id)):
            expected[owner.node_id][topic_filter] += 1
            if topic_filter not in node_routes:
                found.problems.append(
                    Problem(
                        "missing_route",
                        owner.node_id,
                        f"client {client_id!r} subscribes to {topic_filter!r}, "
                        "which is not in its node's route set",
                        "node",
                        client_id=client_id,
                        route=topic_filter,
                    )
                )
    if scanned.complete:
        for node_id, node_routes in live.items():
            for route, count in sorted(node_routes.items()):
                want = expected[node_id][route]
                if parse_shared(route) is None:
                    want = min(want, 1)
                if want != count:
                    found.problems.append(
                        Problem(
                            "extra_route",
                            node_id,
                            f"route {route!r} has count {count}, its clients account for {want}",
                            "node",
                            route=route,
                        )
                    )
    return found


def _ghost(client_id: str, owner: Owner, registered: bool) -> Problem:
    node = "dead" if registered else "unregistered"
    return Problem(
        "ghost_client",
        owner.node_id,
        f"client {client_id!r} of {node} node {owner.node_id!r} ended with it "
        "(Session Expiry 0) but is still listed",
        "purge",
        client_id=client_id,
        epoch=owner.epoch,
    )


def _orphan(client_id: str, owner: Owner) -> Problem:
    return Problem(
        "orphan_session",
        owner.node_id,
        f"persistent session {client_id!r} of unregistered node {owner.node_id!r}: "
        "resumed when its client comes back, or adopted by a node started under that id",
        "node",
        client_id=client_id,
        epoch=owner.epoch,
    )


async def _repair(
    redis: RedisClient, keys: Keys, registry: NodeRegistry, problem: Problem
) -> Problem:
    if problem.kind not in REPAIRABLE or problem.repair != "purge":
        return problem
    if problem.kind == "ghost_client":
        if problem.client_id is None or problem.epoch is None:
            return problem
        owner = Owner(problem.node_id, problem.epoch)
        [removed] = await SubscriptionStore(redis, keys).remove_clients(
            [(problem.client_id, owner)]
        )
        return replace(problem, repaired="removed" if removed else "absent")
    # Guarded by the incarnation found: a process that claimed the node id since (a
    # restart) is never touched; its purge answers "skipped".
    if problem.kind == "dead_node":
        result = await registry.purge(problem.node_id, problem.incarnation)
    else:
        result = await registry.routes.purge(problem.node_id, problem.incarnation)
    if result.status == "purged":
        await RouteHints(redis, keys).announce(problem.node_id)
    return replace(problem, repaired=result.status)
