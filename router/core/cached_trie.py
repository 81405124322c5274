"""A subscription trie with the hot-topic match cache in front of its matches.

:class:`CachedMatcher` is a :class:`SubscriptionTrie`: every change goes through the trie's
own methods, which invalidate exactly the cached topics the changed filter matches, and
``match`` / ``match_subscriptions`` answer hot topics from a :class:`HotTopics` cache each
(a publish is counted by the one it asked). Cold topics take the trie's own match; the
publish that admits a topic builds its answer from that one match and installs it.

An answer is what a match gives before any share-group choice:

* ``match``: the plain subscribers as a frozenset (a hit returns it as it is), or
  :class:`_Grouped` with the trie's own live share-group objects;
* ``match_subscriptions``: the whole answer when no share group matches (a hit copies the
  dict; the lists inside are shared), or the matching terminals to assemble it from.

Share groups are chosen at every publish, by the same strategy calls in the same order as
a full match, so a cached answer always equals a full trie match (for a random strategy,
equal for the same random state).
"""

from __future__ import annotations

from collections.abc import Collection, Set
from typing import Any, final

from router.core.hot_topics import HotTopics
from router.core.options import SubscriptionOptions
from router.core.sharing import ShareGroup, ShareStrategy
from router.core.topics import TopicFilter, TopicName, validate_topic
from router.core.trie import MatchedSubscription, SubscriptionTrie


@final
class _Grouped:
    """A ``match`` answer with share groups: ``clients`` (plain subscribers) and
    ``groups`` (one member of each is chosen per publish, in this order)."""

    __slots__ = ("clients", "groups")

    def __init__(self, clients: frozenset[str], groups: tuple[ShareGroup, ...]) -> None:
        self.clients = clients
        self.groups = groups


@final
class _Found:
    """A ``match_subscriptions`` answer with share groups: the matching terminals."""

    __slots__ = ("terminals",)

    def __init__(self, terminals: list[Any]) -> None:
        self.terminals = terminals


_ClientsAnswer = frozenset[str] | _Grouped
_SubscriptionsAnswer = dict[str, list[MatchedSubscription]] | _Found


class CachedMatcher(SubscriptionTrie):
    """A :class:`SubscriptionTrie` whose matches answer hot topics from a cache.

    Answers equal the plain trie's. The lists inside a
    ``match_subscriptions`` answer are shared with the cache: read them, never change
    them. ``settings`` go to both :class:`HotTopics` caches: ``cache`` (for ``match``)
    and ``subscriptions_cache``.
    """

    def __init__(self, strategy: ShareStrategy | None = None, **settings: Any) -> None:
        super().__init__(strategy)
        self.cache: HotTopics[_ClientsAnswer] = HotTopics(self._clients_answer, **settings)
        self.subscriptions_cache: HotTopics[_SubscriptionsAnswer] = HotTopics(
            self._subscriptions_answer, **settings
        )
        self._entries_get = self.cache.entries_get

    # -- changes ---------------------------------------------------------------------

    def add(self, client_id: str, topic_filter: TopicFilter, options: SubscriptionOptions) -> bool:
        is_new = super().add(client_id, topic_filter, options)
        self._invalidate(topic_filter)  # new options change match_subscriptions answers
        return is_new

    def discard(self, client_id: str, topic_filter: TopicFilter) -> bool:
        if not super().discard(client_id, topic_filter):
            return False
        self._invalidate(topic_filter)
        return True

    def remove_client(self, client_id: str) -> int:
        filters = list(self._clients.get(client_id, ()))
        removed = super().remove_client(client_id)
        self.cache.invalidate_many(filters)
        self.subscriptions_cache.invalidate_many(filters)
        return removed

    def _invalidate(self, topic_filter: str) -> None:
        self.cache.invalidate(topic_filter)
        self.subscriptions_cache.invalidate(topic_filter)

    # -- matching --------------------------------------------------------------------

    def match(self, topic: str, publisher: str | None = None) -> Set[str]:
        try:
            entry = self._entries_get(topic)
        except TypeError:  # unhashable: the full match rejects it
            entry = None
        if entry is None:
            return self._match_uncached(topic, publisher)
        answer = entry.answer
        if answer is not None:
            entry.hits += 1  # HotTopics.get's hit, inlined (see HotTopics.entries_get)
        else:
            answer = self.cache.get(topic)  # admitted earlier, or invalidated: build now
            assert answer is not None  # (the topic has an entry)
        if type(answer) is _Grouped:
            return self._choose(answer, topic, publisher)
        return answer

    def _match_uncached(self, topic: str, publisher: str | None) -> Set[str]:
        """``match`` of a topic the cache has no entry for: a full match, counted as a
        miss; a publish that admits the topic installs the answer built by its match."""
        validate_topic(topic)
        cache = self.cache
        if not cache.miss(topic):
            return SubscriptionTrie.match(self, topic, publisher)
        version, clock = cache.version, cache.clock_ns
        start = clock()
        answer = self._clients_answer_at(self._terminals(topic))
        cost = clock() - start
        result = self._choose(answer, topic, publisher) if type(answer) is _Grouped else answer
        cache.install(topic, answer, version, cost)
        return result

    def _choose(self, answer: _Grouped, topic: str, publisher: str | None) -> frozenset[str]:
        """The plain subscribers plus one chosen member of each group."""
        choose = self._strategy.choose
        return answer.clients.union([choose(group, topic, publisher) for group in answer.groups])

    def subscriptions_for(
        self,
        topic: TopicName,
        publisher: str | None = None,
        only_groups: Collection[str] | None = None,
    ) -> dict[str, list[MatchedSubscription]]:
        cache = self.subscriptions_cache
        answer = cache.get(topic)
        if answer is None:  # a miss; a publish that admits the topic installs its answer
            if not cache.miss(topic):
                return SubscriptionTrie.subscriptions_for(self, topic, publisher, only_groups)
            version, clock = cache.version, cache.clock_ns
            start = clock()
            answer = self._subscriptions_answer_at(self._terminals(topic), topic)
            cost = clock() - start
            result = self._subscriptions_of(answer, topic, publisher, only_groups)
            cache.install(topic, answer, version, cost)
            return result
        return self._subscriptions_of(answer, topic, publisher, only_groups)

    def _subscriptions_of(
        self,
        answer: _SubscriptionsAnswer,
        topic: str,
        publisher: str | None,
        only_groups: Collection[str] | None,
    ) -> dict[str, list[MatchedSubscription]]:
        """``match_subscriptions`` from a cached answer."""
        if type(answer) is _Found:
            return self._subscriptions_at(answer.terminals, topic, publisher, only_groups)
        return answer.copy()

    # -- building answers ------------------------------------------------------------

    def _clients_answer(self, topic: str) -> _ClientsAnswer:
        return self._clients_answer_at(self._terminals(topic))

    def _clients_answer_at(self, found: list[Any]) -> _ClientsAnswer:
        """The ``match`` answer of the terminals ``found``."""
        clients, groups = self._plain_and_groups(found)
        return _Grouped(clients, tuple(groups)) if groups else clients

    def _subscriptions_answer(self, topic: str) -> _SubscriptionsAnswer:
        return self._subscriptions_answer_at(self._terminals(topic), topic)

    def _subscriptions_answer_at(self, found: list[Any], topic: str) -> _SubscriptionsAnswer:
        """The ``match_subscriptions`` answer of the terminals ``found`` for ``topic``."""
        if self._plain_and_groups(found)[1]:
            return _Found(found)
        return self._subscriptions_at(found, topic, None, None)
