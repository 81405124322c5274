"""The subscription trie: which subscribers want a published topic.

Rules (MQTT 5.0, 4.7; see :mod:`router.core.topics`): ``+`` matches one level, ``#`` the parent
level and everything below, first-level wildcards never match ``$`` topics, and a shared
filter ``$share/g/f`` sends each message matching ``f`` to exactly one member of ``g``.

Layout. Filters without wildcards (most of them, in practice) are kept in a hash map from
the whole filter to its entry: one lookup answers them all. Filters with a wildcard live in
a trie with one node per level; each node keeps its literal children in a dict and its
``+`` and ``#`` children in their own slots, so a level boundary is always a node boundary
(``a/b`` and ``ab`` never collide)::

    filters: sport/+/score   sport/#   +/news   $SYS/#   sport/tennis (exact map)

    (root) ── "sport" ── "+" ── "score" *
      │          └── "#" *
      ├── "+" ── "news" *
      └── "$SYS" ── "#" *
    (* = a terminal: subscribers by client id, and share groups by shared filter)

Matching walks the topic's levels with an explicit stack; at each node it takes the
``#`` child (a terminal), the ``+`` child and the literal child. At the root, ``+`` and
``#`` are skipped for topics that start with ``$``. No recursion, no level limit.

Each client's own subscriptions are kept beside the trie (client -> filter -> options), so
removing a client costs time in proportion to its subscriptions. Removing the last
subscription under a node removes every node that became empty: a trie whose
subscriptions were all removed holds no nodes (:meth:`SubscriptionTrie.node_count`).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Collection, Iterator, Mapping
from typing import Any, NamedTuple

from router.core.options import SubscriptionOptions, make_options
from router.core.shapes import ShapeIndex
from router.core.sharing import RandomStrategy, ShareGroup, ShareStrategy
from router.core.topics import (
    MULTI_LEVEL,
    SEPARATOR,
    SINGLE_LEVEL,
    TopicFilter,
    TopicName,
    has_wildcard,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import InvalidIdError, InvalidOptionsError


class MatchedSubscription(NamedTuple):
    """One subscription of a client that matched a topic: its filter and options."""

    filter: str
    options: SubscriptionOptions


class Candidates(NamedTuple):
    """What matches a topic before any share-group choice (see ``candidates``)."""

    plain: dict[str, list[str]]
    groups: dict[TopicFilter, list[str]]


class _Group(ShareGroup):
    """A share group with each member's options; ``members`` stays sorted."""

    __slots__ = ("options",)

    def __init__(self, share_filter: str) -> None:
        super().__init__(share_filter, [])
        self.options: dict[str, SubscriptionOptions] = {}

    def put(self, client_id: str, options: SubscriptionOptions) -> None:
        if client_id not in self.options:
            insort(self.members, client_id)
        self.options[client_id] = options

    def discard(self, client_id: str) -> None:
        del self.options[client_id]
        self.members.remove(client_id)


class _Node:
    """One level of a filter, or an exact filter's entry.

    ``children``: literal level -> node (None while empty); ``plus``/``hash``: the ``+`` and
    ``#`` children; ``subs``: client id -> options of plain subscriptions ending here;
    ``groups``: shared filter -> group for shared subscriptions ending here; ``filter``: the
    plain filter that ends here (set on terminals only); ``level``: this node's level, the
    one string object that the shape index shares for it.
    """

    __slots__ = ("children", "filter", "groups", "hash", "level", "plus", "subs")

    def __init__(self, level: str = "") -> None:
        self.level = level
        self.children: dict[str, _Node] | None = None
        self.plus: _Node | None = None
        self.hash: _Node | None = None
        self.subs: dict[str, SubscriptionOptions] | None = None
        self.groups: dict[TopicFilter, _Group] | None = None
        self.filter: str | None = None

    def is_empty(self) -> bool:
        return not (self.children or self.plus or self.hash or self.subs or self.groups)


def _check_client_id(client_id: str) -> None:
    if type(client_id) is not str or not client_id:
        raise InvalidIdError(f"a client id must be a non-empty str, not {client_id!r}")


class SubscriptionTrie:
    """Subscriptions of clients to topic filters, matched against published topics.

    ``strategy`` picks the member of each share group that gets a message (random by
    default, see :mod:`router.core.sharing`).
    """

    #: Above this many wildcard shapes, matching walks the trie instead of the shape index.
    max_shapes = 64

    def __init__(self, strategy: ShareStrategy | None = None) -> None:
        self._strategy: ShareStrategy = strategy if strategy is not None else RandomStrategy()
        self._root = _Node()
        self._exact: dict[str, _Node] = {}
        self._shapes: ShapeIndex[_Node] = ShapeIndex()
        self._clients: dict[str, dict[TopicFilter, SubscriptionOptions]] = {}
        self._count = 0

    # -- changes ---------------------------------------------------------------------

    def subscribe(self, client_id: str, topic_filter: str, **options: Any) -> bool:
        """Subscribe ``client_id`` to ``topic_filter`` with MQTT subscription options.

        Returns True for a new subscription, False when it replaced the options of an
        existing one. Raises :class:`InvalidTopicError`, :class:`InvalidIdError` or
        :class:`InvalidOptionsError` (a shared subscription cannot be ``no_local``) and
        then changes nothing.
        """
        _check_client_id(client_id)
        return self.add(client_id, validate_filter(topic_filter), make_options(**options))

    def add(self, client_id: str, topic_filter: TopicFilter, options: SubscriptionOptions) -> bool:
        """:meth:`subscribe` for a filter and options validated where they entered (the
        node's ``subscribe``, the route mirror's reads): nothing is checked again but
        ``no_local`` on a shared filter (:class:`InvalidOptionsError`, nothing changed)."""
        shared = parse_shared(topic_filter)
        if shared is not None and options.no_local:
            raise InvalidOptionsError("a shared subscription cannot set no_local (MQTT-3.8.3-4)")
        plain = shared.filter if shared is not None else topic_filter
        node = self._terminal(plain, create=True)
        assert node is not None
        if node.filter is None:
            node.filter = plain
            if has_wildcard(plain):
                self._shapes.add([level for level, _ in self._path(plain)[1:]], node)
        if shared is None:
            if node.subs is None:
                node.subs = {}
            node.subs[client_id] = options
        else:
            if node.groups is None:
                node.groups = {}
            group = node.groups.get(topic_filter)
            if group is None:
                group = node.groups[topic_filter] = _Group(topic_filter)
            group.put(client_id, options)
        mine = self._clients.get(client_id)
        if mine is None:
            mine = self._clients[client_id] = {}
        is_new = topic_filter not in mine
        mine[topic_filter] = options
        if is_new:
            self._count += 1
        return is_new

    def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        """Remove one subscription; True if it existed. Invalid filters raise."""
        _check_client_id(client_id)
        return self.discard(client_id, validate_filter(topic_filter))

    def discard(self, client_id: str, topic_filter: TopicFilter) -> bool:
        """:meth:`unsubscribe` for a filter validated where it entered."""
        mine = self._clients.get(client_id)
        if mine is None or topic_filter not in mine:
            return False
        del mine[topic_filter]
        if not mine:
            del self._clients[client_id]
            if not self._clients:
                self._clients = {}
        self._detach(client_id, topic_filter)
        return True

    def remove_client(self, client_id: str) -> int:
        """Remove every subscription of ``client_id``; return how many there were."""
        mine = self._clients.pop(client_id, None)
        if mine is None:
            return 0
        if not self._clients:
            self._clients = {}  # a dict never shrinks its table: start a new one
        for topic_filter in mine:
            self._detach(client_id, topic_filter)
        return len(mine)

    def _detach(self, client_id: str, topic_filter: TopicFilter) -> None:
        """Remove the client from the filter's terminal and trim emptied nodes."""
        shared = parse_shared(topic_filter)
        plain = shared.filter if shared is not None else topic_filter
        path = self._path(plain)
        node = path[-1][1]
        if shared is None:
            assert node.subs is not None
            del node.subs[client_id]
            if not node.subs:
                node.subs = None
        else:
            assert node.groups is not None
            group = node.groups[topic_filter]
            group.discard(client_id)
            if not group.members:
                del node.groups[topic_filter]
                if not node.groups:
                    node.groups = None
        self._count -= 1
        ended = node.subs is None and node.groups is None
        if ended:
            node.filter = None
        if not has_wildcard(plain):
            if ended:
                del self._exact[plain]
                if not self._exact:
                    self._exact = {}  # a dict never shrinks its table: start a new one
            return
        if ended:
            self._shapes.remove(plain)
        self._trim(path)

    def _trim(self, path: list[tuple[str, _Node]]) -> None:
        # path[0] is ("", root); each later item is (level, node) under the one before.
        for index in range(len(path) - 1, 0, -1):
            level, node = path[index]
            if not node.is_empty():
                return
            parent = path[index - 1][1]
            if level == SINGLE_LEVEL:
                parent.plus = None
            elif level == MULTI_LEVEL:
                parent.hash = None
            else:
                assert parent.children is not None
                del parent.children[level]
                if not parent.children:
                    parent.children = None

    # -- finding nodes ---------------------------------------------------------------

    def _terminal(self, plain: str, *, create: bool) -> _Node | None:
        """The node where ``plain`` ends (created on demand), or None if absent."""
        if not has_wildcard(plain):
            node = self._exact.get(plain)
            if node is None and create:
                node = self._exact[plain] = _Node()
            return node
        node = self._root
        for level in plain.split(SEPARATOR):
            if level == SINGLE_LEVEL:
                child = node.plus
                if child is None and create:
                    child = node.plus = _Node(SINGLE_LEVEL)
            elif level == MULTI_LEVEL:
                child = node.hash
                if child is None and create:
                    child = node.hash = _Node(MULTI_LEVEL)
            else:
                child = node.children.get(level) if node.children is not None else None
                if child is None and create:
                    if node.children is None:
                        node.children = {}
                    child = node.children[level] = _Node(level)
            if child is None:
                return None
            node = child
        return node

    def _path(self, plain: str) -> list[tuple[str, _Node]]:
        """The nodes from the root to an existing terminal (wildcard filters only)."""
        if not has_wildcard(plain):
            return [("", self._exact[plain])]
        node = self._root
        path = [("", node)]
        for level in plain.split(SEPARATOR):
            if level == SINGLE_LEVEL:
                child = node.plus
            elif level == MULTI_LEVEL:
                child = node.hash
            else:
                child = node.children[level] if node.children is not None else None
            assert child is not None
            path.append((child.level, child))
            node = child
        return path

    def _terminals(self, topic: str) -> list[_Node]:
        """Every terminal whose filter matches the (valid) topic name.

        Exact filters take one lookup; wildcard filters one lookup per shape while there
        are at most ``MAX_SHAPES`` shapes (see :mod:`router.core.shapes`), else a trie walk.
        """
        found: list[_Node] = []
        exact = self._exact.get(topic)
        if exact is not None:
            found.append(exact)
        if not self._shapes:
            return found
        levels = topic.split(SEPARATOR)
        plan = self._shapes.plan(len(levels), topic[0] == "$")
        if len(plan) > self.max_shapes:
            self._walk(topic, found)
            return found
        for key, lookup in plan:
            node = lookup(key(levels))
            if node is not None:
                found.append(node)
        return found

    def _walk(self, topic: str, found: list[_Node]) -> None:
        """Append the terminals of matching wildcard filters, walking the trie.

        Walks level by level, keeping the nodes whose path matches the levels so far.
        A lone surviving node (the common case) is followed without building a list.
        """
        root = self._root
        levels = topic.split(SEPARATOR)
        # Level 0: first-level wildcards never match a topic that starts with '$'.
        current: list[_Node] = []
        if topic[0] != "$":
            if root.hash is not None:
                found.append(root.hash)
            if root.plus is not None:
                current.append(root.plus)
        if root.children is not None:
            child = root.children.get(levels[0])
            if child is not None:
                current.append(child)
        for index in range(1, len(levels)):
            if not current:
                return
            level = levels[index]
            if len(current) == 1:
                node = current[0]
                if node.hash is not None:
                    found.append(node.hash)
                children = node.children
                child = children.get(level) if children is not None else None
                if node.plus is None:
                    current = [child] if child is not None else []
                else:
                    current = [node.plus, child] if child is not None else [node.plus]
                continue
            following: list[_Node] = []
            for node in current:
                if node.hash is not None:
                    found.append(node.hash)
                if node.plus is not None:
                    following.append(node.plus)
                children = node.children
                if children is not None:
                    child = children.get(level)
                    if child is not None:
                        following.append(child)
            current = following
        for node in current:
            if node.hash is not None:
                found.append(node.hash)
            if node.subs is not None or node.groups is not None:
                found.append(node)

    # -- matching --------------------------------------------------------------------

    def match(self, topic: str, publisher: str | None = None) -> list[str]:
        """Client ids that should receive a publish to ``topic``, sorted, without repeats.

        Every plain subscriber of a matching filter is included, and exactly one member of
        each matching share group (chosen by the strategy; ``publisher`` is the publishing
        client, used by ``hash_client``). ``no_local`` is not applied here: the caller
        knows the publisher's session and uses :meth:`match_subscriptions` for it.
        Raises :class:`InvalidTopicError` for an invalid topic name.
        """
        validate_topic(topic)
        found = self._terminals(topic)
        if not found:
            return []
        if len(found) == 1 and found[0].groups is None:
            subs = found[0].subs
            assert subs is not None
            return sorted(subs)
        clients: set[str] = set()
        choose = self._strategy.choose
        for node in found:
            if node.subs is not None:
                clients.update(node.subs)
            if node.groups is not None:
                for group in node.groups.values():
                    clients.add(choose(group, topic, publisher))
        return sorted(clients)

    def match_subscriptions(
        self,
        topic: str,
        publisher: str | None = None,
        only_groups: Collection[str] | None = None,
    ) -> dict[str, list[MatchedSubscription]]:
        """Like :meth:`match`, with each client's matching subscriptions.

        Returns client id -> its matching (filter, options), clients in sorted order. A
        client with overlapping subscriptions appears once with all of them (MQTT 5
        delivers one copy with the highest QoS and every subscription identifier).
        ``only_groups``, when given, limits the share groups served to those shared
        filters (a node serves the groups the cluster chose it for).
        """
        return self.subscriptions_for(validate_topic(topic), publisher, only_groups)

    def subscriptions_for(
        self,
        topic: TopicName,
        publisher: str | None = None,
        only_groups: Collection[str] | None = None,
    ) -> dict[str, list[MatchedSubscription]]:
        """:meth:`match_subscriptions` of a topic validated where it entered."""
        return self._subscriptions_at(self._terminals(topic), topic, publisher, only_groups)

    def _subscriptions_at(
        self,
        found: list[_Node],
        topic: str,
        publisher: str | None,
        only_groups: Collection[str] | None,
    ) -> dict[str, list[MatchedSubscription]]:
        """:meth:`match_subscriptions` over the terminals ``found`` for ``topic``."""
        result: dict[str, list[MatchedSubscription]] = {}
        choose = self._strategy.choose
        for node in found:
            if node.subs is not None:
                assert node.filter is not None
                for client_id, opts in node.subs.items():
                    result.setdefault(client_id, []).append(MatchedSubscription(node.filter, opts))
            if node.groups is not None:
                for share_filter, group in node.groups.items():
                    if only_groups is not None and share_filter not in only_groups:
                        continue
                    member = choose(group, topic, publisher)
                    result.setdefault(member, []).append(
                        MatchedSubscription(share_filter, group.options[member])
                    )
        return {client_id: result[client_id] for client_id in sorted(result)}

    def _plain_and_groups(self, found: list[_Node]) -> tuple[list[str], list[ShareGroup]]:
        """The sorted plain subscribers of the terminals ``found``, and their live share
        groups in match order (what :meth:`match` chooses from, in the order it does)."""
        clients: set[str] = set()
        groups: list[ShareGroup] = []
        for node in found:
            if node.subs is not None:
                clients.update(node.subs)
            if node.groups is not None:
                groups.extend(node.groups.values())
        return sorted(clients), groups

    def candidates(self, topic: str) -> Candidates:
        """Everything that matches ``topic``, without choosing share-group members.

        ``plain``: client id -> its matching plain filters; ``groups``: shared filter ->
        its members (sorted). For callers that choose members themselves (the route
        mirror weighs nodes by member count) or that explain a match.
        """
        return self.candidates_for(validate_topic(topic))

    def candidates_for(self, topic: TopicName) -> Candidates:
        """:meth:`candidates` of a topic validated where it entered."""
        plain: dict[str, list[str]] = {}
        groups: dict[TopicFilter, list[str]] = {}
        for node in self._terminals(topic):
            if node.subs is not None:
                assert node.filter is not None
                for client_id in node.subs:
                    plain.setdefault(client_id, []).append(node.filter)
            if node.groups is not None:
                for share_filter, group in node.groups.items():
                    groups[share_filter] = list(group.members)
        return Candidates(plain, groups)

    # -- reading ---------------------------------------------------------------------

    def subscriptions(self, client_id: str) -> Mapping[TopicFilter, SubscriptionOptions]:
        """A copy of the client's subscriptions: filter -> options (empty if none)."""
        return dict(self._clients.get(client_id, {}))

    def subscribers(self, topic_filter: str) -> dict[str, SubscriptionOptions]:
        """Who subscribed to exactly this filter (shared or plain): client id -> options."""
        checked = validate_filter(topic_filter)
        shared = parse_shared(checked)
        plain = shared.filter if shared is not None else checked
        node = self._terminal(plain, create=False)
        if node is None:
            return {}
        if shared is None:
            return dict(node.subs or {})
        group = (node.groups or {}).get(checked)
        return dict(group.options) if group is not None else {}

    def clients(self) -> Iterator[str]:
        """Every client id with at least one subscription."""
        return iter(list(self._clients))

    def filters(self) -> list[str]:
        """Every filter with at least one subscriber, sorted."""
        return sorted({f for mine in self._clients.values() for f in mine})

    def __len__(self) -> int:
        """The number of subscriptions (client, filter pairs)."""
        return self._count

    def node_count(self) -> int:
        """Nodes held besides the root: trie levels plus exact-filter entries."""
        count = len(self._exact)
        stack = [self._root]
        while stack:
            node = stack.pop()
            for child in (node.plus, node.hash, *(node.children or {}).values()):
                if child is not None:
                    count += 1
                    stack.append(child)
        return count

    def dump(self) -> str:
        """The filters as a tree for humans, one level a line, with subscribers at the ends.

        Exact filters are drawn as if they were in the trie, so the picture shows every
        filter the way MQTT levels nest.
        """
        display: dict[str | None, Any] = {}
        for plain, node in self._terminal_items():
            place = display
            for level in plain.split(SEPARATOR):
                place = place.setdefault(level, {})
            place[None] = node  # None marks "a filter ends here"; "" is a real level
        lines = ["(root)"]
        _draw(display, "", lines)
        return "\n".join(lines) + "\n"

    def _terminal_items(self) -> Iterator[tuple[str, _Node]]:
        yield from self._exact.items()
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.filter is not None and (node.subs or node.groups):
                yield node.filter, node
            for child in (node.plus, node.hash, *(node.children or {}).values()):
                if child is not None:
                    stack.append(child)


def _describe(node: _Node) -> str:
    def one(client_id: str, opts: SubscriptionOptions) -> str:
        return client_id if opts.qos == 0 else f"{client_id} (qos {opts.qos})"

    parts = [one(c, o) for c, o in sorted((node.subs or {}).items())]
    for share_filter, group in sorted((node.groups or {}).items()):
        members = ", ".join(one(m, group.options[m]) for m in group.members)
        share_name = share_filter.split(SEPARATOR, 2)[1]
        parts.append(f"$share/{share_name}: [{members}]")
    return "  <- " + ", ".join(parts)


def _draw(level: dict[str | None, Any], prefix: str, lines: list[str]) -> None:
    names = sorted(name for name in level if name is not None)
    for position, name in enumerate(names):
        last = position == len(names) - 1
        below = level[name]
        shown = repr(name) if name == "" or name != name.strip() else name
        terminal = below.get(None)
        suffix = _describe(terminal) if terminal is not None else ""
        lines.append(f"{prefix}{'└── ' if last else '├── '}{shown}{suffix}")
        _draw(below, prefix + ("    " if last else "│   "), lines)
