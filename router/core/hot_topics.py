"""The hot-topic match cache: Selva-style automatic indexing of publish topics.

:class:`HotTopics` decides which publish topics are hot and keeps one *answer* per hot
topic (whatever its owner builds from a match: client ids, a route match, ...). Its owner
asks it first and matches by itself only when it has nothing::

    answer = hot.get(topic)          # a hit: the stored answer (built now if it has none)
    if answer is None:               # not a hot topic: match as without a cache ...
        version = hot.version        # (before the match: see Versions)
        result = full_match(topic)   # (which validates the topic) ...
        if hot.miss(topic):          # ... count the publish; True: it admitted the topic,
            hot.install(topic, answer_of(result), version, cost_ns)  # answered at once
    subscription change of F  ──►  hot.invalidate(F): exactly the hot topics F matches

Rules:

* Popularity (Selva): every publish of a topic adds 1 to its popularity: a hit adds to
  an int counter of its entry, the only work a hit does besides the dict lookup. Time is
  counted in *misses*: every ``period`` misses a *pass* multiplies all popularity by
  ``decay``. While everything hits, nothing needs to move in or out and the clock stands
  still; the more topics miss, the faster it turns, and a pass costs O(entries +
  candidates), at most ``capacity + candidate_limit``, so about one unit of work a miss.
* Admission: an uncached topic (a *candidate*) whose popularity reaches
  ``create_threshold`` becomes cached. The owner answers it from the match of the
  publish that admitted it (:meth:`HotTopics.install`, one match per admission), else it
  is built at its next publish. The first answer's match is timed: a topic cheaper to
  answer than ``min_cost_ns`` is not kept (it may try again after the next pass). At
  most ``capacity`` topics are cached; when full, admission waits for a pass, where a
  candidate replaces the least popular cached topic only if it is
  :data:`REPLACE_FACTOR` times as popular. At most ``candidate_limit``
  candidates are counted (new ones wait for the next pass to prune the cold ones).
* Dropping: a cached topic whose popularity falls below ``drop_threshold`` (strictly
  lower than create) at a pass is dropped; the gap keeps topics near a threshold from
  flapping in and out.
* Invalidation: :meth:`HotTopics.invalidate` of filter ``F`` drops the answers of exactly
  the cached topics that ``F`` matches (their popularity stays; each is rebuilt at its
  next publish), found in a small index of the cached topics: an exact ``F`` costs one
  dict lookup, a wildcard one a check of the cached topics that share ``F``'s rarest
  literal level at its position.
* Versions: every invalidation bumps :attr:`HotTopics.version`. An answer built (or
  installed from a match that began) while the version was ``v`` is installed only if the
  version is still ``v`` and the topic is still waiting for it, so a change that lands
  while an answer is built (a builder or share strategy calling back into its owner)
  never plants a stale answer; the built answer still serves its publish.

Owners: :class:`router.core.cached_trie.CachedMatcher` (a trie with this cache in front of its
matches; local sessions use it) and :class:`router.core.route_mirror.RouteMirror` (the route table).

Not thread-safe (like the trie): one owner calls it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Any, Final, Generic, NamedTuple, TypeVar

from router.core.topics import (
    MULTI_LEVEL,
    SEPARATOR,
    SINGLE_LEVEL,
    filter_matches_levels,
    has_wildcard,
    parse_shared,
)
from router.errors import InvalidSettingError

#: A candidate replaces a cached topic at a pass only when this many times as popular.
REPLACE_FACTOR: Final = 2.0
#: Invalidating more filters than this at once drops every answer instead (a node load).
BULK_LIMIT: Final = 256

Answer = TypeVar("Answer")


class CacheStats(NamedTuple):
    """Counters since the cache was made (``size``/``candidates``: now)."""

    size: int  # cached topics (answered or waiting for a build)
    candidates: int  # uncached topics being counted
    publishes: int  # hits + misses
    hits: int  # publishes answered from the cache
    misses: int  # publishes matched in full: uncached topics, and answers built
    builds: int  # answers built and installed
    refused: int  # answers not installed because the version moved meanwhile
    admissions: int
    drops: int  # cached topics dropped as cold
    evictions: int  # cached topics replaced by hotter ones
    invalidations: int  # answers dropped by subscription changes
    cheap: int  # admissions undone: cheaper to match than min_cost_ns
    passes: int
    version: int


def cache_counters(name: str, stats: CacheStats | None) -> dict[str, int]:
    """``{name}_hits``, ``{name}_misses`` and ``{name}_size`` (all 0 without a cache)."""
    hits, misses, size = (stats.hits, stats.misses, stats.size) if stats else (0, 0, 0)
    return {f"{name}_hits": hits, f"{name}_misses": misses, f"{name}_size": size}


class CacheEntry(Generic[Answer]):
    """A cached topic: its ``answer`` (None: build at the next publish), popularity
    ``score`` (at the last pass) ``+ hits`` (since), ``indexed``: in the topic index.

    An owner's inlined hit path (see :meth:`HotTopics.entries_get`) reads ``answer`` and
    adds 1 to ``hits``; nothing else may change an entry outside :class:`HotTopics`.
    """

    __slots__ = ("answer", "hits", "indexed", "score", "topic")

    def __init__(self, topic: str, score: float) -> None:
        self.topic = topic
        self.answer: Answer | None = None
        self.score = score
        self.hits = 0
        self.indexed = False


class TopicIndex:
    """Cached topic names by their levels, to find the ones a wildcard filter matches.

    Each level of an indexed topic, at its position, points to the set of topics that
    have that level there (``site/1/x`` is under "site" at 0, "1" at 1 and "x" at 2). A
    filter's matches all lie in the set of each of its literal levels, so only the
    smallest of those sets is checked, topic by topic: ``site/+/device/7/status`` looks
    at the few cached topics of device 7, whatever the number of sites. A filter without
    literal levels (``+/+``, ``#``) checks every topic of a length it can match.
    """

    def __init__(self) -> None:
        self._postings: list[dict[str, set[str]]] = []  # position -> level -> topics
        self._lengths: dict[int, set[str]] = {}  # level count -> topics

    def is_empty(self) -> bool:
        return not self._lengths

    def add(self, topic: str) -> None:
        levels = topic.split(SEPARATOR)
        postings = self._postings
        while len(postings) < len(levels):
            postings.append({})
        for at_position, level in zip(postings, levels, strict=False):
            topics = at_position.get(level)
            if topics is None:
                at_position[level] = {topic}
            else:
                topics.add(topic)
        topics = self._lengths.get(len(levels))
        if topics is None:
            self._lengths[len(levels)] = {topic}
        else:
            topics.add(topic)

    def remove(self, topic: str) -> None:
        levels = topic.split(SEPARATOR)
        for at_position, level in zip(self._postings, levels, strict=False):
            _discard(at_position, level, topic)
        _discard(self._lengths, len(levels), topic)

    def matching(self, plain_filter: str) -> list[str]:
        """The indexed topics that the valid, plain filter matches."""
        levels = plain_filter.split(SEPARATOR)
        multi = levels[-1] == MULTI_LEVEL
        fixed = len(levels) - 1 if multi else len(levels)
        pool: Collection[str] | None = None
        postings = self._postings
        if fixed > len(postings):
            return []
        for at_position, level in zip(postings, levels[:fixed], strict=False):
            if level == SINGLE_LEVEL:
                continue
            topics = at_position.get(level)
            if topics is None:
                return []
            if pool is None or len(topics) < len(pool):
                pool = topics
        if pool is None:
            if multi:
                pool = [t for n, ts in self._lengths.items() if n >= fixed for t in ts]
            else:
                pool = self._lengths.get(fixed, ())
        return [t for t in pool if filter_matches_levels(levels, t.split(SEPARATOR))]


def _discard(index: dict[Any, set[str]], key: Any, topic: str) -> None:
    topics = index[key]
    topics.discard(topic)
    if not topics:
        del index[key]


def _check_settings(settings: dict[str, Any]) -> None:
    def number(value: object) -> bool:
        return type(value) in (int, float)

    def count(value: object) -> bool:
        return type(value) is int and value >= 1

    drop = settings["drop_threshold"]
    for name, ok, rule in (
        ("capacity", count, "an int >= 1"),
        ("period", count, "an int >= 1"),
        ("candidate_limit", count, "an int >= 1"),
        ("decay", lambda v: number(v) and 0 < v < 1, "in (0, 1)"),
        ("min_cost_ns", lambda v: number(v) and v >= 0, ">= 0"),
        ("drop_threshold", lambda v: number(v) and v >= 0, ">= 0"),
        (
            "create_threshold",
            lambda v: number(v) and number(drop) and v > drop,
            f"greater than drop_threshold ({drop!r})",
        ),
    ):
        value = settings[name]
        if not ok(value):
            raise InvalidSettingError(f"{name} must be {rule}, not {value!r}")


@dataclass(frozen=True)
class CacheSettings:
    """Settings of a :class:`HotTopics` cache (see the module rules); checked on creation:
    :class:`InvalidSettingError` if one is out of range. ``period`` and
    ``candidate_limit`` default to 4 and 2 times ``capacity``."""

    capacity: int = 4096
    create_threshold: float = 2.0
    drop_threshold: float = 0.5
    min_cost_ns: float = 1000.0
    period: int | None = None
    decay: float = 0.5
    candidate_limit: int | None = None

    def __post_init__(self) -> None:
        _check_settings(self.resolved().__dict__)

    def resolved(self) -> CacheSettings:
        """These settings with ``period`` and ``candidate_limit`` filled in."""
        capacity = self.capacity
        if type(capacity) is not int or None not in (self.period, self.candidate_limit):
            return self
        return replace(
            self,
            period=4 * capacity if self.period is None else self.period,
            candidate_limit=2 * capacity if self.candidate_limit is None else self.candidate_limit,
        )

    def as_kwargs(self) -> dict[str, Any]:
        """The settings as keyword arguments of :class:`HotTopics`."""
        return dict(self.__dict__)


#: The settings a node uses unless told otherwise.
DEFAULT_CACHE: Final = CacheSettings()


class HotTopics(Generic[Answer]):
    """Hot publish topics and their answers, made by ``build(topic)`` (see the module rules).

    ``build`` gets a valid topic that its owner matched before (never None as an answer).
    Settings are described in the module rules; :class:`InvalidSettingError` if one is
    out of range. ``clock_ns`` measures build cost (injectable for tests).
    """

    def __init__(
        self,
        build: Callable[[str], Answer],
        *,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        **settings: Any,
    ) -> None:
        resolved = CacheSettings(**settings).resolved()
        capacity, period = resolved.capacity, resolved.period
        create_threshold, drop_threshold = resolved.create_threshold, resolved.drop_threshold
        min_cost_ns, decay = resolved.min_cost_ns, resolved.decay
        candidate_limit = resolved.candidate_limit
        assert period is not None and candidate_limit is not None
        self._build = build
        self._capacity = capacity
        self._create = float(create_threshold)
        self._drop = float(drop_threshold)
        self._min_cost = float(min_cost_ns)
        self._period = period
        self._decay = float(decay)
        self._candidate_limit = candidate_limit
        self._clock = clock_ns
        self._entries: dict[str, CacheEntry[Answer]] = {}
        self._candidates: dict[str, float] = {}  # uncached topic -> popularity
        self._cheap: set[str] = set()  # measured too cheap to cache, until the next pass
        self._index = TopicIndex()
        self._version = 0
        self._countdown = period  # misses until the next pass
        self._misses = 0
        self._hits_counted = 0  # entry hits folded in at passes or with removed entries
        self._built_on_hit = 0  # entry hits that were misses: an answer was built
        self._counts = dict.fromkeys(
            [
                "builds",
                "refused",
                "admissions",
                "drops",
                "evictions",
                "invalidations",
                "cheap",
                "passes",
            ],
            0,
        )

    # -- the publish path ------------------------------------------------------------

    @property
    def entries_get(self) -> Callable[[str], CacheEntry[Answer] | None]:
        """``get`` of the dict topic -> entry, for an owner that inlines the hit path to
        save a call per publish (raises TypeError for an unhashable topic)::

            entry = entries_get(topic)
            if entry is not None and entry.answer is not None:
                entry.hits += 1            # a hit: exactly what get() would do
                answer = entry.answer
            else:
                answer = hot.get(topic)    # everything else (None: match, then miss())
        """
        return self._entries.get

    def get(self, topic: str) -> Answer | None:
        """The answer for a cached ``topic`` (built now if it has none yet), else None.

        A cached topic's call counts as one publish of it. None counts nothing: the
        owner matches in full (which rejects an invalid or unhashable topic) and then
        reports the publish with :meth:`miss`. What ``build`` raises propagates (the
        topic is then no longer cached).
        """
        try:
            entry = self._entries.get(topic)
        except TypeError:  # unhashable: not a topic
            return None
        if entry is None:
            return None
        entry.hits += 1
        answer = entry.answer
        if answer is None:
            self._misses += 1
            self._built_on_hit += 1  # a miss, though counted in the entry's popularity
            return self._answer(entry)
        return answer

    def miss(self, topic: str) -> bool:
        """Count a publish of ``topic``, uncached and valid, that its owner matches in full;
        admit it when it is hot enough. True if this publish admitted it: the owner then
        hands the answer built from this very match to :meth:`install` (an owner that does
        not leaves it to be built at the topic's next publish)."""
        self._misses += 1
        candidates = self._candidates
        entries = self._entries
        score = candidates.get(topic, 0.0) + 1.0
        admitted = (
            score >= self._create and len(entries) < self._capacity and topic not in self._cheap
        )
        if admitted:
            candidates.pop(topic, None)
            entries[topic] = CacheEntry(topic, score)
            self._counts["admissions"] += 1
        elif score > 1.0 or len(candidates) < self._candidate_limit:
            candidates[topic] = score  # else not counted until a pass makes room
        self._countdown -= 1
        if self._countdown <= 0:
            self._pass()
        return admitted

    def install(self, topic: str, answer: Answer, version: int, cost_ns: float) -> None:
        """Install the answer of a topic that :meth:`miss` just admitted, built from the
        owner's own full match of that publish: ``version`` is :attr:`version` when that
        match began, ``cost_ns`` what it took by :attr:`clock_ns`. As for a build, a match
        cheaper than ``min_cost_ns`` is not kept, and the answer is refused if the version
        moved or the topic is no longer waiting for an answer."""
        entry = self._entries.get(topic)
        if entry is None or entry.answer is not None:
            self._counts["refused"] += 1
            return
        self._settle(entry, answer, version, cost_ns)

    def _answer(self, entry: CacheEntry[Answer]) -> Answer:
        """Build the entry's answer, install it if still current, return it."""
        version = self._version
        start = self._clock()
        try:
            answer = self._build(entry.topic)
        except BaseException:
            self._remove(entry)
            raise
        self._settle(entry, answer, version, self._clock() - start)
        return answer

    def _settle(self, entry: CacheEntry[Answer], answer: Answer, version: int, cost: float) -> None:
        """Install an answer built at ``version`` at a cost of ``cost`` ns, if still current.

        The first answer's cost decides: a topic cheaper than ``min_cost_ns`` to answer is
        not worth caching; it goes back to the candidates until the next pass.
        """
        counts = self._counts
        topic = entry.topic
        if not entry.indexed and cost < self._min_cost:
            self._candidates[topic] = entry.score + entry.hits
            self._remove(entry)
            self._cheap.add(topic)
            counts["cheap"] += 1
        elif version != self._version or self._entries.get(topic) is not entry:
            counts["refused"] += 1
        else:
            entry.answer = answer
            if not entry.indexed:
                self._index.add(topic)
                entry.indexed = True
            counts["builds"] += 1

    # -- subscription changes --------------------------------------------------------

    def invalidate(self, topic_filter: str) -> None:
        """Drop the answers of the cached topics that the valid filter ``topic_filter``
        (plain or shared) matches; bump the version."""
        self._version += 1
        if self._index.is_empty():
            return
        shared = parse_shared(topic_filter)
        plain = shared.filter if shared is not None else topic_filter
        entries = self._entries
        if has_wildcard(plain):
            topics = self._index.matching(plain)
        else:
            topics = [plain] if plain in entries else []
        dropped = 0
        for topic in topics:
            entry = entries[topic]
            if entry.answer is not None:
                entry.answer = None
                dropped += 1
        self._counts["invalidations"] += dropped

    def invalidate_many(self, filters: Collection[str]) -> None:
        """:meth:`invalidate` each filter; more than :data:`BULK_LIMIT`: every answer."""
        if len(filters) > BULK_LIMIT:
            self.invalidate_all()
            return
        for topic_filter in filters:
            self.invalidate(topic_filter)

    def invalidate_all(self) -> None:
        """Drop every answer (popularity stays); bump the version."""
        self._version += 1
        dropped = 0
        for entry in self._entries.values():
            if entry.answer is not None:
                entry.answer = None
                dropped += 1
        self._counts["invalidations"] += dropped

    # -- reading ---------------------------------------------------------------------

    @property
    def clock_ns(self) -> Callable[[], int]:
        """The clock that times matches for ``min_cost_ns`` (see :meth:`install`)."""
        return self._clock

    @property
    def version(self) -> int:
        """Bumped by every invalidation (every subscription change the owner reports)."""
        return self._version

    def is_cached(self, topic: str) -> bool:
        """True if ``topic`` has an answer ready."""
        entry = self._entries.get(topic)
        return entry is not None and entry.answer is not None

    def cached_topics(self) -> list[str]:
        """Every cached topic (with an answer ready or waiting for a build), sorted."""
        return sorted(self._entries)

    def stats(self) -> CacheStats:
        """The counters of :class:`CacheStats`."""
        counts = self._counts
        hits = sum(entry.hits for entry in self._entries.values())
        hits += self._hits_counted - self._built_on_hit
        return CacheStats(
            size=len(self._entries),
            candidates=len(self._candidates),
            publishes=hits + self._misses,
            hits=hits,
            misses=self._misses,
            version=self._version,
            **counts,
        )

    # -- popularity ------------------------------------------------------------------

    def _pass(self) -> None:
        """Decay popularity, drop cold entries, prune candidates, promote hot ones."""
        counts = self._counts
        counts["passes"] += 1
        self._countdown = self._period
        decay, drop = self._decay, self._drop
        entries = self._entries
        cold = []
        folded = 0
        for entry in entries.values():
            folded += entry.hits
            entry.score = score = (entry.score + entry.hits) * decay
            entry.hits = 0
            if score < drop:
                cold.append(entry)
        self._hits_counted += folded
        for entry in cold:
            self._remove(entry)
        counts["drops"] += len(cold)
        candidates = {t: s for t, v in self._candidates.items() if (s := v * decay) >= drop}
        self._candidates = candidates
        self._cheap.clear()  # measure again
        hot = sorted(
            ((score, topic) for topic, score in candidates.items() if score >= self._create),
            reverse=True,
        )
        free = max(self._capacity - len(entries), 0)
        for score, topic in hot[:free]:
            del candidates[topic]
            entries[topic] = CacheEntry(topic, score)
        counts["admissions"] += min(free, len(hot))
        rest = hot[free:]
        if rest:
            weakest = heapq.nsmallest(len(rest), entries.values(), key=lambda e: e.score)
            for (score, topic), victim in zip(rest, weakest, strict=False):
                if score < REPLACE_FACTOR * victim.score:
                    break
                self._remove(victim)
                candidates[victim.topic] = victim.score
                del candidates[topic]
                entries[topic] = CacheEntry(topic, score)
                counts["evictions"] += 1
                counts["admissions"] += 1

    def _remove(self, entry: CacheEntry[Answer]) -> None:
        del self._entries[entry.topic]
        self._hits_counted += entry.hits
        entry.hits = 0
        if entry.indexed:
            self._index.remove(entry.topic)
