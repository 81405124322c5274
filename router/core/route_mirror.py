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

Hot topics are answered from a :class:`~router.core.hot_topics.HotTopics` cache of what the trie
matched (see :mod:`router.core.hot_topics`): every route change of filter ``F`` drops the answers of
exactly the cached topics ``F`` matches, and a node's load or drop those of all its routes
(every answer, when they are many). Share-group slots are still chosen at every publish.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from router.core.hot_topics import DEFAULT_CACHE, CacheSettings, CacheStats, HotTopics
from router.core.options import DEFAULT_OPTIONS
from router.core.sharing import RandomStrategy, ShareGroup, ShareStrategy
from router.core.topics import TopicFilter, TopicName, parse_shared
from router.core.trie import Candidates, SubscriptionTrie


@dataclass
class _NodeRoutes:
    generation: str | None
    version: int
    routes: dict[TopicFilter, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteMatch:
    """Where a publish must go: ``nodes`` that get a copy, and for each of them the share
    groups it was chosen to serve (a node may be listed for groups only). ``filters``
    explains the plain part: node -> its routes that matched. ``matched``: every route
    that matched, each once however many nodes hold it (plain filters and the share
    filters a node was chosen for)."""

    nodes: dict[str, list[TopicFilter]]
    filters: dict[str, list[str]]
    matched: tuple[str, ...] = ()


#: A cached route answer: the whole match when no share group matches, else what to
#: choose the group slots from.
_RouteAnswer = RouteMatch | Candidates


class RouteMirror:
    """Route sets of every known node, matched together in one trie.

    ``strategy`` chooses the member slot of each share group (members are node ids,
    repeated once per member they hold). ``cache``: the settings of the
    :class:`HotTopics` cache that answers hot topics; None matches every publish in the
    trie.
    """

    def __init__(
        self,
        strategy: ShareStrategy | None = None,
        *,
        cache: CacheSettings | None = DEFAULT_CACHE,
    ) -> None:
        self._trie = SubscriptionTrie()
        self._nodes: dict[str, _NodeRoutes] = {}
        self._slots: dict[TopicFilter, ShareGroup] = {}
        self._strategy: ShareStrategy = strategy if strategy is not None else RandomStrategy()
        self._hot: HotTopics[_RouteAnswer] | None = (
            HotTopics(self._answer, **cache.as_kwargs()) if cache is not None else None
        )
        #: Grows by one on every change of the table (for caches of match results).
        self.version = 0

    # -- loading ---------------------------------------------------------------------

    def load(
        self, node_id: str, generation: str | None, version: int, routes: Mapping[TopicFilter, int]
    ) -> None:
        """Replace the node's routes with a snapshot taken at ``version``."""
        changed = self._clear(node_id)
        self._nodes[node_id] = _NodeRoutes(generation, version)
        for route, count in routes.items():
            self._set(node_id, route, count, invalidate=False)
        self.version += 1
        self._invalidate_many(changed | routes.keys())

    def apply(
        self, node_id: str, generation: str | None, changes: Iterable[tuple[int, TopicFilter, int]]
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
        self._invalidate_many(self._clear(node_id))
        self.version += 1
        return True

    def _clear(self, node_id: str) -> set[TopicFilter]:
        """Remove the node's routes (without invalidating); the routes it had."""
        state = self._nodes.pop(node_id, None)
        if state is None:
            return set()
        routes = set(state.routes)
        for route in routes:
            self._set(node_id, route, 0, state, invalidate=False)
        return routes

    def _set(
        self,
        node_id: str,
        route: TopicFilter,
        count: int,
        state: _NodeRoutes | None = None,
        *,
        invalidate: bool = True,
    ) -> None:
        """Set one route of a node; ``invalidate``: drop the cached answers it touches
        (else the caller invalidates every route it set)."""
        state = state if state is not None else self._nodes[node_id]
        if count <= 0:
            if state.routes.pop(route, None) is not None:
                self._trie.discard(node_id, route)
        else:
            state.routes[route] = count
            self._trie.add(node_id, route, DEFAULT_OPTIONS)
        if parse_shared(route) is not None:
            self._rebuild_slots(route)
        if invalidate and self._hot is not None:
            self._hot.invalidate(route)

    def _invalidate_many(self, routes: set[TopicFilter]) -> None:
        if self._hot is not None:
            self._hot.invalidate_many(routes)

    def _rebuild_slots(self, share_filter: TopicFilter) -> None:
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

    def route_count(self, node_id: str) -> int:
        """How many routes a loaded node has (0: none, or not loaded)."""
        state = self._nodes.get(node_id)
        return len(state.routes) if state is not None else 0

    def routes(self, node_id: str) -> dict[TopicFilter, int]:
        """A copy of one node's routes: route -> count."""
        state = self._nodes.get(node_id)
        return dict(state.routes) if state is not None else {}

    def table(self) -> dict[TopicFilter, dict[str, int]]:
        """route -> {node: count} for the whole cluster."""
        result: dict[TopicFilter, dict[str, int]] = {}
        for node_id in sorted(self._nodes):
            for route, count in self._nodes[node_id].routes.items():
                result.setdefault(route, {})[node_id] = count
        return dict(sorted(result.items()))

    def match(self, topic: TopicName, publisher: str | None = None) -> RouteMatch:
        """The nodes a publish to ``topic`` goes to (see :class:`RouteMatch`).

        The result may be shared with the cache (the same object for the next publish to
        a hot topic without share groups): read it, never change it. ``topic`` was
        validated where the publish entered (:func:`~router.core.topics.validate_topic`).
        """
        hot = self._hot
        if hot is None:
            return self._choose(self._trie.candidates_for(topic), topic, publisher)
        answer = hot.get(topic)
        if answer is None:  # a miss; a publish that admits the topic installs its answer
            version, clock = hot.version, hot.clock_ns
            start = clock()
            found = self._trie.candidates_for(topic)
            cost = clock() - start
            result = self._choose(found, topic, publisher)
            if hot.miss(topic):
                hot.install(topic, found if found.groups else result, version, cost)
            return result
        if type(answer) is RouteMatch:
            return answer
        assert type(answer) is Candidates
        return self._choose(answer, topic, publisher)

    def _answer(self, topic: str) -> _RouteAnswer:
        """What the cache keeps for ``topic``: the match itself when no group matches.
        (The cache holds topics that were matched before: validated ones.)"""
        found = self._trie.candidates_for(TopicName(topic))
        if found.groups:
            return found
        return self._choose(found, topic, None)

    def _choose(self, found: Candidates, topic: str, publisher: str | None) -> RouteMatch:
        """The route match of ``found``: one slot chosen for each share group."""
        nodes: dict[str, list[TopicFilter]] = {node_id: [] for node_id in found.plain}
        matched = {route for routes in found.plain.values() for route in routes}
        choose = self._strategy.choose
        for share_filter in found.groups:
            slots = self._slots.get(share_filter)
            if slots is None:
                continue
            chosen = choose(slots, topic, publisher)
            nodes.setdefault(chosen, []).append(share_filter)
            matched.add(share_filter)
        return RouteMatch(dict(sorted(nodes.items())), found.plain, tuple(matched))

    def cache_stats(self) -> CacheStats | None:
        """The match cache's counters, or None without a cache."""
        return self._hot.stats() if self._hot is not None else None

    def dump(self) -> str:
        """The cluster's routes as a tree (filters by level; node ids at the ends)."""
        return self._trie.dump()

    def group_nodes(self, share_filter: TopicFilter) -> dict[str, int]:
        """Nodes holding members of a share group: node -> member count."""
        return {
            node_id: state.routes[share_filter]
            for node_id, state in self._nodes.items()
            if share_filter in state.routes
        }
