"""The hot-topic match cache: Selva-style automatic indexing of publish topics.

Rules:

* A cached answer always equals a full trie match. :class:`CachedMatcher` owns its
  :class:`SubscriptionTrie` and every change goes through it, so it knows what changed.
* Admission (Selva): every publish adds 1 to its topic's *popularity*; every ``period``
  publishes (default 8 x ``capacity``) all popularity is multiplied by ``decay``, so a
  publish k periods ago counts ``decay ** k``. An uncached topic whose popularity reaches
  ``create_threshold`` is admitted and its answer computed; that first computation is
  timed (the match *cost*) and a topic cheaper than ``min_cost_ns`` is not kept (it may
  try again after the next pass). A cached topic whose popularity is below
  ``drop_threshold`` (strictly lower than create) at a pass is dropped: the gap keeps
  topics near a threshold from flapping. At most ``capacity`` topics are cached: when
  full, admission waits for a pass, where a topic replaces the least popular cached topic
  only if it is twice as popular.
* Invalidation: a subscribe, unsubscribe or client removal touching filter ``F`` changes
  exactly the cached topics that ``F`` matches, found in a small index of the cached
  topics (below). A plain subscriber is added to or removed from those answers in place;
  a shared-subscription change drops their answers (kept as entries, rebuilt at their
  next publish). Other cached topics are not touched.
* Versions: every change bumps :attr:`CachedMatcher.version`. An answer computed while
  the version was ``v`` is installed only if the version is still ``v`` (and the entry
  is still the same), so a change that lands between computing and installing (a strategy
  calling back, or later an answer computed across an ``await``) cannot plant a stale
  answer; the computed answer still serves the publish that asked for it.

Shared subscriptions. An answer is never a frozen choice of share-group members. An entry
holds the sorted plain subscribers and the trie's own live share-group objects; each
publish, hit or miss, asks the strategy to choose once per group, with the same group
object (and so the same round-robin cursor) the trie itself uses. The result therefore
equals a full trie match exactly for deterministic strategies (hash_topic, hash_client,
and round_robin too, since each publish advances each group's cursor once either way),
and in distribution for random ones. To get the live groups through the trie's public
API, the trie is built with a strategy wrapper: while an answer is computed (one ordinary
trie match) it records the groups the trie asks about and answers with the empty client
id, which no subscriber can have; no cursor moves and no member is chosen then.

Sketch::

    match(topic) ──► entries[topic] ──hit──► plain subscribers + one choice per group
                        │ miss                  (no answer yet? compute, install at v)
                        ▼
                  candidates[topic] += 1 ──► trie.match(topic)
                        └─ popular enough: admitted (entry), answer computed and timed
    subscribe/unsubscribe(F) ──► index.matching(F) ──► update/drop exactly those entries

The index of cached topics is a trie of their levels (literal keys only). An exact ``F``
costs one dict lookup; a wildcard ``F`` visits the index nodes under ``F``'s literal
levels (at most the whole index: ``capacity`` topics). A decay pass every ``period``
publishes costs O(entries + candidates); candidates are bounded by ``candidate_limit``
(default 2 x ``capacity``; new topics are not counted while it is full, until the next
pass prunes it). A hit costs one dict lookup and a copy of the answer list.

Not thread-safe (like the trie): one owner calls it.
"""

from __future__ import annotations

import heapq
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from router.errors import InvalidSettingError
from router.sharing import RandomStrategy, ShareGroup, ShareStrategy
from router.topics import (
    MULTI_LEVEL,
    SEPARATOR,
    SINGLE_LEVEL,
    filter_matches_levels,
    has_wildcard,
    parse_shared,
)
from router.trie import MatchedSubscription, SubscriptionTrie

#: A topic replaces a cached one only when this many times as popular.
REPLACE_FACTOR: Final = 2.0
#: Unsubscribing a client with more subscriptions than this drops answers instead of
#: re-checking the client's other filters against each cached topic.
MAX_RECHECK: Final = 64
_COUNTERS: Final = "builds refused admissions drops evictions updates invalidations cheap"


class CacheStats(NamedTuple):
    """Counters since the matcher was made (``size``/``candidates``: now)."""

    size: int  # cached topics (answered or waiting for a rebuild)
    candidates: int  # uncached topics being counted
    publishes: int
    hits: int  # publishes answered from the cache without a trie match
    misses: int
    builds: int  # answers computed and installed
    refused: int  # answers not installed because the version moved
    admissions: int
    drops: int  # cached topics dropped as cold
    evictions: int  # cached topics replaced by hotter ones
    updates: int  # answers changed in place by a subscription change
    invalidations: int  # answers dropped by a subscription change
    cheap: int  # admissions undone: the topic was cheaper to match than min_cost_ns
    version: int


class _Entry:
    """A cached topic: ``clients`` (sorted plain subscribers; None: compute at the next
    publish), ``groups`` (live share groups; None if none match), popularity ``score +
    hits``, ``indexed`` (in the topic index: it had an answer once)."""

    __slots__ = ("clients", "groups", "hits", "indexed", "score", "topic")

    def __init__(self, topic: str, score: float) -> None:
        self.topic = topic
        self.clients: list[str] | None = None
        self.groups: tuple[ShareGroup, ...] | None = None
        self.score = score  # popularity at the last pass (or admission)
        self.hits = 0  # publishes since then: an int, so counting allocates nothing
        self.indexed = False


#: What the recording strategy answers: no client has the empty id (the trie refuses it).
_NOBODY: Final = ""


class _Recorder:
    """The trie's strategy: the real one, or (while recording) a list of the groups the
    trie asks about, answered with :data:`_NOBODY` (no cursor moves, no member is chosen)."""

    __slots__ = ("recording", "strategy")

    def __init__(self, strategy: ShareStrategy) -> None:
        self.strategy = strategy
        self.recording: list[ShareGroup] | None = None

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        if self.recording is not None:
            self.recording.append(group)
            return _NOBODY
        return self.strategy.choose(group, topic, publisher)


# An index node: level -> child node, and under the key None the topic that ends here.
_Node = dict[str | None, Any]


class _TopicIndex:
    """Cached topic names in a trie of their levels, to find those a filter matches."""

    def __init__(self) -> None:
        self._root: _Node = {}

    def add(self, topic: str) -> None:
        node = self._root
        for level in topic.split(SEPARATOR):
            child = node.get(level)
            if child is None:
                child = node[level] = {}
            node = child
        node[None] = topic

    def remove(self, topic: str) -> None:
        path = [self._root]
        levels = topic.split(SEPARATOR)
        for level in levels:
            path.append(path[-1][level])
        del path[-1][None]
        for index in range(len(levels), 0, -1):
            if path[index]:
                return
            del path[index - 1][levels[index - 1]]

    def matching(self, plain_filter: str) -> list[str]:
        """The indexed topics that the valid, plain, wildcard filter matches."""
        found: list[str] = []
        current = [self._root]
        for index, level in enumerate(plain_filter.split(SEPARATOR)):
            if level == MULTI_LEVEL:
                stack: list[_Node] = []
                for node in current:
                    for name, child in node.items():
                        if name is None:
                            if index > 0:
                                found.append(child)  # '#' also matches the parent level
                        elif index > 0 or not name.startswith("$"):
                            stack.append(child)
                while stack:
                    for name, child in stack.pop().items():
                        if name is None:
                            found.append(child)
                        else:
                            stack.append(child)
                return found
            following: list[_Node] = []
            if level == SINGLE_LEVEL:
                for node in current:
                    following.extend(
                        child
                        for name, child in node.items()
                        if name is not None and (index > 0 or not name.startswith("$"))
                    )
            else:
                for node in current:
                    child = node.get(level)
                    if child is not None:
                        following.append(child)
            if not following:
                return found
            current = following
        for node in current:
            topic = node.get(None)
            if topic is not None:
                found.append(topic)
        return found


def _number(value: object) -> bool:
    return type(value) in (int, float)


def _count(value: object) -> bool:
    return type(value) is int and value >= 1


class CachedMatcher:
    """A :class:`SubscriptionTrie` with a hot-topic cache in front of :meth:`match`.

    Change subscriptions only through this object (``trie`` is for reading). Settings
    are described in the module rules; :class:`InvalidSettingError` if one is out of range.
    ``clock_ns`` measures match cost (injectable for tests).
    """

    def __init__(
        self,
        strategy: ShareStrategy | None = None,
        *,
        capacity: int = 4096,
        create_threshold: float = 2.0,
        drop_threshold: float = 0.5,
        min_cost_ns: float = 1000.0,
        period: int | None = None,
        decay: float = 0.5,
        candidate_limit: int | None = None,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if type(capacity) is int:
            period = 8 * capacity if period is None else period
            candidate_limit = 2 * capacity if candidate_limit is None else candidate_limit
        for name, value, ok, rule in (
            ("capacity", capacity, _count(capacity), "an int >= 1"),
            ("period", period, _count(period), "an int >= 1"),
            ("candidate_limit", candidate_limit, _count(candidate_limit), "an int >= 1"),
            ("decay", decay, _number(decay) and 0 < decay < 1, "in (0, 1)"),
            ("min_cost_ns", min_cost_ns, _number(min_cost_ns) and min_cost_ns >= 0, ">= 0"),
            (
                "drop_threshold",
                drop_threshold,
                _number(drop_threshold) and drop_threshold >= 0,
                ">= 0",
            ),
            (
                "create_threshold",
                create_threshold,
                _number(create_threshold) and create_threshold > drop_threshold,
                f"greater than drop_threshold ({drop_threshold!r})",
            ),
        ):
            if not ok:
                raise InvalidSettingError(f"{name} must be {rule}, not {value!r}")
        self._strategy: ShareStrategy = strategy if strategy is not None else RandomStrategy()
        self._recorder = _Recorder(self._strategy)
        self._trie = SubscriptionTrie(strategy=self._recorder)
        self._capacity = capacity
        self._create = float(create_threshold)
        self._drop = float(drop_threshold)
        self._min_cost = float(min_cost_ns)
        assert period is not None and candidate_limit is not None
        self._period = period
        self._decay = float(decay)
        self._candidate_limit = candidate_limit
        self._clock = clock_ns
        self._entries: dict[str, _Entry] = {}
        self._candidates: dict[str, float] = {}  # uncached topic -> popularity
        self._cheap: set[str] = set()  # measured too cheap to cache, until the next pass
        self._index = _TopicIndex()
        self._version = 0
        self._countdown = period
        self._counted = 0  # publishes in finished periods
        self._misses = 0
        self._counts = dict.fromkeys(_COUNTERS.split(), 0)

    # -- reading ---------------------------------------------------------------------

    @property
    def trie(self) -> SubscriptionTrie:
        """The trie behind the cache, for reading (changing it directly skips invalidation)."""
        return self._trie

    @property
    def strategy(self) -> ShareStrategy:
        """The strategy that chooses share-group members."""
        return self._strategy

    @property
    def version(self) -> int:
        """The route version: bumped by every change made through this matcher."""
        return self._version

    def is_cached(self, topic: str) -> bool:
        """True if ``topic`` has an answer ready in the cache."""
        entry = self._entries.get(topic)
        return entry is not None and entry.clients is not None

    def cached_topics(self) -> list[str]:
        """Every cached topic (with an answer ready or waiting for a rebuild), sorted."""
        return sorted(self._entries)

    def stats(self) -> CacheStats:
        """The counters of :class:`CacheStats`."""
        publishes = self._counted + self._period - self._countdown
        counts = self._counts
        return CacheStats(
            size=len(self._entries),
            candidates=len(self._candidates),
            publishes=publishes,
            hits=publishes - self._misses,
            misses=self._misses,
            version=self._version,
            **counts,
        )

    # -- changes ---------------------------------------------------------------------

    def subscribe(self, client_id: str, topic_filter: str, **options: Any) -> bool:
        """:meth:`SubscriptionTrie.subscribe`, then update the cached topics it matches.

        Returns True for a new subscription; raises like the trie (nothing changes then).
        """
        is_new = self._trie.subscribe(client_id, topic_filter, **options)
        self._version += 1
        if self._entries and is_new:
            shared = parse_shared(topic_filter)
            if shared is not None:
                self._drop_answers(shared.filter)
            else:
                for entry in self._affected(topic_filter):
                    clients = entry.clients
                    assert clients is not None
                    position = bisect_left(clients, client_id)
                    if position == len(clients) or clients[position] != client_id:
                        clients.insert(position, client_id)
                        self._counts["updates"] += 1
        return is_new

    def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        """:meth:`SubscriptionTrie.unsubscribe`, then update the cached topics it matched.

        Returns True if the subscription existed; raises for an invalid filter.
        """
        if not self._trie.unsubscribe(client_id, topic_filter):
            return False
        self._version += 1
        if self._entries:
            shared = parse_shared(topic_filter)
            if shared is not None:
                self._drop_answers(shared.filter)
            else:
                self._forget_client(client_id, [topic_filter], recheck=True)
        return True

    def remove_client(self, client_id: str) -> int:
        """:meth:`SubscriptionTrie.remove_client`, updating the cached topics it touched.

        Returns how many subscriptions the client had.
        """
        filters = list(self._trie.subscriptions(client_id)) if self._entries else []
        removed = self._trie.remove_client(client_id)
        if not removed:
            return 0
        self._version += 1
        plain = []
        for topic_filter in filters:
            shared = parse_shared(topic_filter)
            if shared is not None:
                self._drop_answers(shared.filter)
            else:
                plain.append(topic_filter)
        if plain:
            self._forget_client(client_id, plain, recheck=False)
        return removed

    def _affected(self, plain_filter: str) -> list[_Entry]:
        """The entries with an answer whose topic ``plain_filter`` matches."""
        entries = self._entries
        if not has_wildcard(plain_filter):
            entry = entries.get(plain_filter)
            return [entry] if entry is not None and entry.clients is not None else []
        found = (entries[topic] for topic in self._index.matching(plain_filter))
        return [entry for entry in found if entry.clients is not None]

    def _drop_answers(self, plain_filter: str) -> None:
        for entry in self._affected(plain_filter):
            entry.clients = entry.groups = None
            self._counts["invalidations"] += 1

    def _forget_client(self, client_id: str, filters: list[str], *, recheck: bool) -> None:
        """Take ``client_id`` out of the answers of the topics ``filters`` matched, unless
        (``recheck``) another of its plain filters still matches that topic."""
        remaining: list[list[str]] | None = None
        for topic_filter in filters:
            for entry in self._affected(topic_filter):
                clients = entry.clients
                assert clients is not None
                position = bisect_left(clients, client_id)
                if position == len(clients) or clients[position] != client_id:
                    continue
                if recheck:
                    if remaining is None:
                        mine = self._trie.subscriptions(client_id)
                        remaining = [f.split(SEPARATOR) for f in mine if parse_shared(f) is None]
                    if len(remaining) > MAX_RECHECK:
                        entry.clients = entry.groups = None
                        self._counts["invalidations"] += 1
                        continue
                    levels = entry.topic.split(SEPARATOR)
                    if any(filter_matches_levels(f, levels) for f in remaining):
                        continue
                del clients[position]
                self._counts["updates"] += 1

    # -- matching --------------------------------------------------------------------

    def match(self, topic: str, publisher: str | None = None) -> list[str]:
        """Client ids that should receive a publish to ``topic``: what the trie's
        :meth:`~SubscriptionTrie.match` returns, from the cache when the topic is hot.

        Raises :class:`InvalidTopicError` for an invalid topic name.
        """
        self._countdown -= 1
        if self._countdown <= 0:
            self._decay_pass()
        try:
            entry = self._entries.get(topic)
        except TypeError:  # unhashable: not a topic; the trie raises the right error
            self._misses += 1
            return self._trie.match(topic, publisher)
        if entry is not None:
            entry.hits += 1
            clients = entry.clients
            if clients is not None:
                if entry.groups is None:
                    return clients[:]
                return self._answer(clients, entry.groups, topic, publisher)
            self._misses += 1
            return self._build(entry, publisher)
        return self._miss(topic, publisher)

    def match_subscriptions(
        self, topic: str, publisher: str | None = None
    ) -> dict[str, list[MatchedSubscription]]:
        """The trie's :meth:`~SubscriptionTrie.match_subscriptions` (not cached)."""
        return self._trie.match_subscriptions(topic, publisher)

    def _answer(
        self, clients: list[str], groups: tuple[ShareGroup, ...] | None, topic: str, who: str | None
    ) -> list[str]:
        answer = clients[:]
        if groups is None:
            return answer
        choose = self._strategy.choose
        if len(groups) > 1:
            answer.extend(choose(group, topic, who) for group in groups)
            return sorted(set(answer))
        member = choose(groups[0], topic, who)
        position = bisect_left(answer, member)
        if position == len(answer) or answer[position] != member:
            answer.insert(position, member)
        return answer

    def _miss(self, topic: str, publisher: str | None) -> list[str]:
        self._misses += 1
        candidates = self._candidates
        score = candidates.get(topic)
        if score is None:
            if len(candidates) >= self._candidate_limit:
                return self._trie.match(topic, publisher)  # not tracked until the next pass
            result = self._trie.match(topic, publisher)  # validates: raises before tracking
            candidates[topic] = 1.0
            if self._create <= 1.0 and self._admissible(topic):
                self._admit(topic)  # answered from its next publish on
            return result
        score += 1.0
        candidates[topic] = score
        if score >= self._create and self._admissible(topic):
            return self._build(self._admit(topic), publisher)
        return self._trie.match(topic, publisher)

    def _admissible(self, topic: str) -> bool:
        return len(self._entries) < self._capacity and topic not in self._cheap

    def _admit(self, topic: str) -> _Entry:
        """Turn the candidate ``topic`` into a cached topic without an answer yet."""
        entry = self._entries[topic] = _Entry(topic, self._candidates.pop(topic))
        self._counts["admissions"] += 1
        return entry

    def _build(self, entry: _Entry, publisher: str | None) -> list[str]:
        """Compute the entry's answer, install it if still current, answer this publish.

        The first computation is timed: a topic cheaper than ``min_cost_ns`` to match is
        not worth caching; it goes back to the candidates until the next decay pass.
        """
        topic = entry.topic
        version = self._version
        start = self._clock()
        clients, groups = self._compute(topic)
        if not entry.indexed and self._clock() - start < self._min_cost:
            del self._entries[topic]
            self._candidates[topic] = entry.score + entry.hits
            self._cheap.add(topic)
            self._counts["cheap"] += 1
        else:
            self._install(entry, clients, groups, version)
        return self._answer(clients, groups, topic, publisher)

    def _compute(self, topic: str) -> tuple[list[str], tuple[ShareGroup, ...] | None]:
        """The sorted plain subscribers of ``topic`` and the live groups that match it.

        One trie match with the recording strategy: every group answers ``""``, which
        sorts first and is no client, so the rest of the answer are the plain subscribers.
        """
        recorder = self._recorder
        groups: list[ShareGroup] = []
        recorder.recording = groups
        try:
            clients = self._trie.match(topic)
        finally:
            recorder.recording = None
        if groups:
            del clients[0]
            return clients, tuple(groups)
        return clients, None

    def _install(
        self,
        entry: _Entry,
        clients: list[str],
        groups: tuple[ShareGroup, ...] | None,
        version: int,
    ) -> bool:
        """Store an answer computed at ``version``; False (and nothing stored) if the
        version moved or the entry was dropped meanwhile."""
        if version != self._version or self._entries.get(entry.topic) is not entry:
            self._counts["refused"] += 1
            return False
        entry.clients = clients
        entry.groups = groups
        if not entry.indexed:
            self._index.add(entry.topic)
            entry.indexed = True
        self._counts["builds"] += 1
        return True

    # -- popularity ------------------------------------------------------------------

    def _decay_pass(self) -> None:
        """Decay popularity, drop cold entries, prune candidates, promote hot ones."""
        self._countdown = self._period
        self._counted += self._period
        decay, drop = self._decay, self._drop
        entries = self._entries
        cold = []
        for entry in entries.values():
            entry.score = (entry.score + entry.hits) * decay
            entry.hits = 0
            if entry.score < drop:
                cold.append(entry)
        for entry in cold:
            self._remove_entry(entry)
        self._counts["drops"] += len(cold)
        candidates = {t: s for t, v in self._candidates.items() if (s := v * decay) >= drop}
        if len(candidates) > self._candidate_limit:
            kept = heapq.nlargest(self._candidate_limit, candidates.items(), key=lambda i: i[1])
            candidates = dict(kept)
        self._candidates = candidates
        self._cheap.clear()  # measure again
        hot = sorted(
            ((score, topic) for topic, score in candidates.items() if score >= self._create),
            reverse=True,
        )
        free = max(self._capacity - len(entries), 0)
        for _, topic in hot[:free]:
            self._admit(topic)
        rest = hot[free:]
        if rest:
            weakest = heapq.nsmallest(len(rest), entries.values(), key=lambda e: e.score)
            for (score, topic), victim in zip(rest, weakest, strict=False):
                if score < REPLACE_FACTOR * victim.score:
                    break
                self._remove_entry(victim)
                self._counts["evictions"] += 1
                self._admit(topic)
                candidates[victim.topic] = victim.score

    def _remove_entry(self, entry: _Entry) -> None:
        del self._entries[entry.topic]
        if entry.indexed:
            self._index.remove(entry.topic)

    def clear(self) -> None:
        """Forget every cached topic and candidate (subscriptions stay)."""
        self._entries = {}
        self._candidates = {}
        self._cheap = set()
        self._index = _TopicIndex()
        self._version += 1
