"""The route mirror: this node's copy of the whole cluster's route table.

A *route* says that a node has interest in a filter: a plain filter (``sport/#``) whose
count is 1, or a shared filter (``$share/g/sport/#``) whose count is how many members of
the group that node holds. Each node is the only writer of its own route set in Redis and
logs every change in a stream with versions 1, 2, 3, ...; every node keeps this mirror of
all route sets, built from one snapshot per node and kept current by applying each node's
changes in version order.

The mirror never guesses: a change whose version is not exactly the next one, or a
snapshot from another *generation* (the route set was claimed again by a new incarnation),
is refused, and the caller takes a new snapshot of that node.

Matching a publish: plain routes give the set of interested nodes; each matching share
group gives its member nodes weighted by member count, and exactly one *slot* (one member,
wherever it is) is chosen per group, so every member gets an equal share of the messages
whichever node it is attached to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from router.sharing import RandomStrategy, ShareGroup, ShareStrategy
from router.topics import parse_shared
from router.trie import SubscriptionTrie


@dataclass
class _NodeRoutes:
    generation: str | None
    version: int
    routes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteMatch:
    """Where a publish must go: ``nodes`` that get a copy, and for each of them the share
    groups it was chosen to serve (a node may be listed for groups only). ``filters``
    explains the plain part: node -> its routes that matched."""

    nodes: dict[str, list[str]]
    filters: dict[str, list[str]]


class RouteMirror:
    """Route sets of every known node, matched together in one trie.

    ``strategy`` chooses the member slot of each share group (members are node ids,
    repeated once per member they hold).
    """

    def __init__(self, strategy: ShareStrategy | None = None) -> None:
        self._trie = SubscriptionTrie()
        self._nodes: dict[str, _NodeRoutes] = {}
        self._slots: dict[str, ShareGroup] = {}
        self._strategy: ShareStrategy = strategy if strategy is not None else RandomStrategy()
        #: Grows by one on every change of the table (for caches of match results).
        self.version = 0

    # -- loading ---------------------------------------------------------------------

    def load(
        self, node_id: str, generation: str | None, version: int, routes: Mapping[str, int]
    ) -> None:
        """Replace the node's routes with a snapshot taken at ``version``."""
        self._clear(node_id)
        self._nodes[node_id] = _NodeRoutes(generation, version)
        for route, count in routes.items():
            self._set(node_id, route, count)
        self.version += 1

    def apply(
        self, node_id: str, generation: str | None, changes: Iterable[tuple[int, str, int]]
    ) -> bool:
        """Apply (version, route, count) changes in order; count 0 removes the route.

        Returns False, and applies nothing more, when the node is unknown, the generation
        differs, or a version is not exactly the next one: the caller must reload the node.
        Changes at or below the applied version are skipped (already seen).
        """
        state = self._nodes.get(node_id)
        if state is None or state.generation != generation:
            return False
        for version, route, count in changes:
            if version <= state.version:
                continue
            if version != state.version + 1:
                return False
            self._set(node_id, route, count)
            state.version = version
            self.version += 1
        return True

    def drop(self, node_id: str) -> bool:
        """Forget a node and all its routes; True if it was known."""
        if node_id not in self._nodes:
            return False
        self._clear(node_id)
        self.version += 1
        return True

    def _clear(self, node_id: str) -> None:
        state = self._nodes.pop(node_id, None)
        if state is None:
            return
        for route in list(state.routes):
            self._set(node_id, route, 0, state)

    def _set(self, node_id: str, route: str, count: int, state: _NodeRoutes | None = None) -> None:
        state = state if state is not None else self._nodes[node_id]
        if count <= 0:
            if state.routes.pop(route, None) is not None:
                self._trie.unsubscribe(node_id, route)
        else:
            state.routes[route] = count
            self._trie.subscribe(node_id, route)
        if parse_shared(route) is not None:
            self._rebuild_slots(route)

    def _rebuild_slots(self, share_filter: str) -> None:
        slots = sorted(
            node_id
            for node_id, state in self._nodes.items()
            for _ in range(state.routes.get(share_filter, 0))
        )
        if slots:
            group = self._slots.get(share_filter)
            if group is None:
                self._slots[share_filter] = ShareGroup(share_filter, slots)
            else:
                group.members = slots
        else:
            self._slots.pop(share_filter, None)

    # -- reading ---------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """Every node whose routes are loaded, sorted."""
        return sorted(self._nodes)

    def position(self, node_id: str) -> tuple[str | None, int] | None:
        """(generation, applied version) of a loaded node, or None."""
        state = self._nodes.get(node_id)
        return None if state is None else (state.generation, state.version)

    def routes(self, node_id: str) -> dict[str, int]:
        """A copy of one node's routes: route -> count."""
        state = self._nodes.get(node_id)
        return dict(state.routes) if state is not None else {}

    def table(self) -> dict[str, dict[str, int]]:
        """route -> {node: count} for the whole cluster."""
        result: dict[str, dict[str, int]] = {}
        for node_id in sorted(self._nodes):
            for route, count in self._nodes[node_id].routes.items():
                result.setdefault(route, {})[node_id] = count
        return dict(sorted(result.items()))

    def match(self, topic: str, publisher: str | None = None) -> RouteMatch:
        """The nodes a publish to ``topic`` goes to (see :class:`RouteMatch`).

        Raises :class:`InvalidTopicError` for an invalid topic.
        """
        found = self._trie.candidates(topic)
        nodes: dict[str, list[str]] = {node_id: [] for node_id in found.plain}
        choose = self._strategy.choose
        for share_filter in found.groups:
            slots = self._slots.get(share_filter)
            if slots is None:
                continue
            chosen = choose(slots, topic, publisher)
            nodes.setdefault(chosen, []).append(share_filter)
        return RouteMatch(dict(sorted(nodes.items())), found.plain)

    def dump(self) -> str:
        """The cluster's routes as a tree (filters by level; node ids at the ends)."""
        return self._trie.dump()

    def group_nodes(self, share_filter: str) -> dict[str, int]:
        """Nodes holding members of a share group: node -> member count."""
        return {
            node_id: state.routes[share_filter]
            for node_id, state in self._nodes.items()
            if share_filter in state.routes
        }
