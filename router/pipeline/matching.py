"""Fan-out and matched filters of publish topics, with the project's own trie.

A :class:`TopicMatcher` is built once from a subscription snapshot (in the Spark job: once
per partition, inside the executor) and then answers every topic of that partition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from router.core.topics import validate_filter
from router.core.trie import SubscriptionTrie
from router.errors import InvalidIdError, InvalidOptionsError, InvalidTopicError


class MatchedFilter(NamedTuple):
    """A filter a topic matched: its subscribers, and the copies each publish gets from it
    (all its subscribers for a plain filter, one member for a share group)."""

    filter: str
    subscribers: int
    deliveries: int


class TopicMatch(NamedTuple):
    """What one publish to a topic reaches: ``subscribers`` (distinct plain subscribers plus
    one per matching share group) and the filters that matched, sorted."""

    subscribers: int
    filters: tuple[MatchedFilter, ...]


NO_MATCH = TopicMatch(0, ())

#: Filter -> [subscribers, messages, deliveries, bytes delivered], as
#: :func:`add_filter_costs` sums them.
FilterCosts = dict[str, list[int]]


def add_filter_costs(costs: FilterCosts, found: TopicMatch, messages: int, size: int) -> None:
    """Add what ``messages`` publishes of ``size`` bytes in all, to a topic that matched
    ``found``, cost each matched filter: messages, copies delivered and bytes delivered."""
    for matched in found.filters:
        cost = costs.get(matched.filter)
        if cost is None:
            cost = costs[matched.filter] = [matched.subscribers, 0, 0, 0]
        cost[1] += messages
        cost[2] += messages * matched.deliveries
        cost[3] += size * matched.deliveries


class TopicMatcher:
    """Subscriptions ``(client_id, filter)`` in a :class:`SubscriptionTrie`.

    Subscriptions that cannot be stored (an invalid filter or client id) are not matched
    and are counted in :attr:`ignored`; a repeated pair counts once.
    """

    def __init__(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        self.trie = SubscriptionTrie()
        self.ignored = 0
        for client_id, topic_filter in subscriptions:
            try:
                self.trie.subscribe(client_id, topic_filter)
            except (InvalidTopicError, InvalidIdError, InvalidOptionsError, TypeError):
                self.ignored += 1

    def __len__(self) -> int:
        """The subscriptions held."""
        return len(self.trie)

    def match(self, topic: str) -> TopicMatch:
        """The fan-out of ``topic`` and its matched filters (:data:`NO_MATCH` for a topic
        that matches nothing or is not a valid topic name)."""
        try:
            plain, groups = self.trie.candidates(topic)
        except InvalidTopicError:
            return NO_MATCH
        if not plain and not groups:
            return NO_MATCH
        counts = Counter(f for filters in plain.values() for f in filters)
        matched = [MatchedFilter(f, n, n) for f, n in counts.items()]
        matched += [MatchedFilter(g, len(members), 1) for g, members in groups.items()]
        matched.sort()
        return TopicMatch(len(plain) + len(groups), tuple(matched))


def count_subscriptions(subscriptions: Iterable[tuple[str, str]]) -> tuple[int, int]:
    """``(held, ignored)`` as a :class:`TopicMatcher` of the same pairs would count them,
    without building its trie."""
    held: set[tuple[str, str]] = set()
    ignored = 0
    for client_id, topic_filter in subscriptions:
        try:
            validate_filter(topic_filter)
        except (InvalidTopicError, TypeError):
            ignored += 1
            continue
        if type(client_id) is not str or not client_id:
            ignored += 1
            continue
        held.add((client_id, topic_filter))
    return len(held), ignored
