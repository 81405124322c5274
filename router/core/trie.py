"""The subscription trie: which subscribers want a published topic.

Rules (MQTT 5.0, 4.7; see :mod:`router.core.topics`): ``+`` matches one level, ``#`` the parent
level and everything below, first-level wildcards never match ``$`` topics, and a shared
filter ``$share/g/f`` sends each message matching ``f`` to exactly one member of ``g``.

Layout. Every plain filter with at least one subscriber has a *terminal*: its plain
subscribers (client id -> options) and its share groups (shared filter -> group). A filter
index (:mod:`router.core.filter_index`: compiled in C when it was built, else in Python)
maps each plain filter to its terminal and finds the terminals that match a topic; this
module keeps who subscribed to what. ``$share/g/sport/#`` and ``sport/#`` share the
terminal of ``sport/#``.

Each client's own subscriptions are kept beside the index (client -> filter -> options), so
removing a client costs time in proportion to its subscriptions. A terminal whose last
subscription goes is removed from the index, which frees every node that became empty: a
trie whose subscriptions were all removed holds no nodes (:meth:`SubscriptionTrie.node_count`).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Collection, Iterator, Mapping, Set
from sys import intern
from typing import Any, NamedTuple

from router.core.filter_index import FilterIndex, PureTerminal, Terminal
from router.core.options import SubscriptionOptions, make_options
from router.core.sharing import RandomStrategy, ShareGroup, ShareStrategy
from router.core.topics import (
    SEPARATOR,
    TopicFilter,
    TopicName,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import InvalidIdError, InvalidOptionsError, InvalidTopicError


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


_NOBODY: frozenset[str] = frozenset()


def _check_client_id(client_id: str) -> None:
    if type(client_id) is not str or not client_id:
        raise InvalidIdError(f"a client id must be a non-empty str, not {client_id!r}")


class SubscriptionTrie:
    """Subscriptions of clients to topic filters, matched against published topics.

    ``strategy`` picks the member of each share group that gets a message (random by
    default, see :mod:`router.core.sharing`). ``index``: an empty filter index to use
    (default: a new :data:`~router.core.filter_index.FilterIndex`, compiled when built).
    """

    def __init__(self, strategy: ShareStrategy | None = None, *, index: Any = None) -> None:
        self._strategy: ShareStrategy = strategy if strategy is not None else RandomStrategy()
        self._index: Any = index if index is not None else FilterIndex()
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
        node: PureTerminal | None = self._index.get(plain)
        if node is None:
            node = Terminal(plain)
            self._index.add(plain, node)
        # One string object per client id and per filter, however many subscriptions
        # name them (each arrives as a fresh copy, decoded from its packet).
        client_id = intern(client_id)
        if shared is None:
            topic_filter = TopicFilter(node.filter)
            if node.subs is None:
                node.subs = {}
            node.subs[client_id] = options
        else:
            if node.groups is None:
                node.groups = {}
            group = node.groups.get(topic_filter)
            if group is None:
                group = node.groups[topic_filter] = _Group(topic_filter)
            topic_filter = TopicFilter(group.filter)
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
        """Remove the client from the filter's terminal; drop a terminal left empty."""
        shared = parse_shared(topic_filter)
        plain = shared.filter if shared is not None else topic_filter
        node: PureTerminal = self._index.get(plain)
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
        if node.subs is None and node.groups is None:
            self._index.remove(plain)

    def _terminals(self, topic: str) -> list[PureTerminal]:
        """Every terminal whose filter matches ``topic`` (:class:`InvalidTopicError` if
        it is not a valid topic name)."""
        found: list[PureTerminal] | None = self._index.terminals(topic)
        if found is None:
            validate_topic(topic)  # raises the error that names the broken rule
            raise InvalidTopicError(repr(topic), "not a valid topic name")
        return found

    # -- matching --------------------------------------------------------------------

    def match(self, topic: str, publisher: str | None = None) -> Set[str]:
        """The client ids that should receive a publish to ``topic``, as a set (read it,
        never change it: a cache may share it).

        Every plain subscriber of a matching filter is included, and exactly one member of
        each matching share group (chosen by the strategy; ``publisher`` is the publishing
        client, used by ``hash_client``). ``no_local`` is not applied here: the caller
        knows the publisher's session and uses :meth:`match_subscriptions` for it.
        A set has no order to pay for: sort it where order matters (a display).
        Raises :class:`InvalidTopicError` for an invalid topic name.
        """
        plain: set[str] | None = self._index.clients(topic)
        if plain is not None:
            return plain
        found = self._terminals(topic)  # raises for an invalid topic
        clients: set[str] = set()
        choose = self._strategy.choose
        for node in found:
            if node.subs is not None:
                clients.update(node.subs)
            if node.groups is not None:
                for group in node.groups.values():
                    clients.add(choose(group, topic, publisher))
        return clients

    def match_subscriptions(
        self,
        topic: str,
        publisher: str | None = None,
        only_groups: Collection[str] | None = None,
    ) -> dict[str, list[MatchedSubscription]]:
        """Like :meth:`match`, with each client's matching subscriptions.

        Returns client id -> its matching (filter, options), clients in no particular
        order. A client with overlapping subscriptions appears once with all of them (MQTT 5
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
        found: list[PureTerminal],
        topic: str,
        publisher: str | None,
        only_groups: Collection[str] | None,
    ) -> dict[str, list[MatchedSubscription]]:
        """:meth:`match_subscriptions` over the terminals ``found`` for ``topic``."""
        result: dict[str, list[MatchedSubscription]] = {}
        choose = self._strategy.choose
        for node in found:
            if node.subs is not None:
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
        return result

    def _plain_and_groups(
        self, found: list[PureTerminal]
    ) -> tuple[frozenset[str], list[ShareGroup]]:
        """The plain subscribers of the terminals ``found``, and their live share groups
        in match order (what :meth:`match` chooses from, in the order it does)."""
        clients = _NOBODY.union(*[node.subs for node in found if node.subs is not None])
        groups: list[ShareGroup] = [
            group for node in found if node.groups is not None for group in node.groups.values()
        ]
        return clients, groups

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
        node: PureTerminal | None = self._index.get(plain)
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
        """Nodes the filter index holds: trie levels plus exact-filter entries."""
        count: int = self._index.node_count()
        return count

    def dump(self) -> str:
        """The filters as a tree for humans, one level a line, with subscribers at the ends.

        Exact filters are drawn as if they were in the trie, so the picture shows every
        filter the way MQTT levels nest.
        """
        display: dict[str | None, Any] = {}
        for plain, node in self._index.items():
            place = display
            for level in plain.split(SEPARATOR):
                place = place.setdefault(level, {})
            place[None] = node  # None marks "a filter ends here"; "" is a real level
        lines = ["(root)"]
        _draw(display, "", lines)
        return "\n".join(lines) + "\n"


def _describe(node: PureTerminal) -> str:
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
