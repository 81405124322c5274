"""The ``hot`` workload: Zipf-skewed publishes with subscription churn, cached and uncached.

The subscriptions are the ``devices`` workload of :mod:`router.bench.match` (100k device
fleet subscriptions by default). Publish topics are drawn from every device topic
(``site/S/device/D/METRIC``, 500k of them) with Zipf-skewed popularity: the topic of rank
``k`` is published with probability proportional to ``1 / k ** zipf_exponent`` (default
1.3; ranks are spread over sites and devices by a fixed permutation). Every
``churn_every`` publishes one subscription changes, alternately a new subscription and a
removal (half of them undo churn, half remove an original subscription); half of the new
subscriptions aim at a topic just published (exact, ``+``, ``#``, a wildcard site, or
now and then a shared subscription), so that invalidation of cached topics is exercised.

Three subjects receive the same event stream, all with the deterministic ``hash_topic``
share strategy: a :class:`CachedMatcher` (default settings), a plain
:class:`SubscriptionTrie` (the peer), and :class:`Ceiling`, an instrument that bounds what
any cache of per-topic answers can reach here (see below). The stream is cut into segments
of ``segment`` publishes; each segment runs on one subject after the other, each timed as
a whole (changes included, garbage collector off as in ``timeit``), so that drift of a
shared machine hits all alike. The answers are compared outside the timed sections; every
difference from the plain trie is a wrong answer.
Each publish gets a fresh copy of its topic string per subject, as if decoded from the
network, so neither subject reuses a hash computed by the other. The first ``warmup``
publishes fill the cache: compared, not timed.

What bounds the speedup is the miss rate, not the hit path: a hit is several times
cheaper than a trie match, but a miss (a topic not yet seen twice, or dropped as cold)
costs a trie match of a topic whose data is cold in the CPU caches. The hit rate, and so
the speedup, rises steeply with ``zipf_exponent``. The ceiling measures that bound: it
answers from its first publish every topic it ever saw, with no popularity counting and no
size limit, so its only misses are first publishes, which no cache that learns its topics
from publishes can avoid.
"""

from __future__ import annotations

import gc
import math
import random
import time
from itertools import accumulate
from typing import Any

from router.bench.match import (
    DEVICES_PER_SITE,
    METRICS,
    SITES,
    _device_subscription,
    make_workload,
)
from router.core.cached_trie import CachedMatcher
from router.core.hot_topics import TopicIndex
from router.core.sharing import HashTopicStrategy, ShareStrategy
from router.core.topics import has_wildcard, parse_shared
from router.core.trie import SubscriptionTrie

UNIVERSE = SITES * DEVICES_PER_SITE * len(METRICS)
# rank -> topic number: a fixed permutation of the universe (multiplier coprime to 500k).
_SPREAD_MULTIPLIER = 104_729
_SPREAD_OFFSET = 12_345


def topic_of_rank(rank: int) -> str:
    """The device topic with popularity rank ``rank`` (0 is the most popular)."""
    number = (rank * _SPREAD_MULTIPLIER + _SPREAD_OFFSET) % UNIVERSE
    device_number, metric = divmod(number, len(METRICS))
    site, device = divmod(device_number, DEVICES_PER_SITE)
    return f"site/{site}/device/{device}/{METRICS[metric]}"


def zipf_topics(rng: random.Random, count: int, exponent: float) -> list[str]:
    """``count`` topics drawn with Zipf-skewed popularity over the whole universe."""
    weights = accumulate(1.0 / (rank + 1) ** exponent for rank in range(UNIVERSE))
    ranks = rng.choices(range(UNIVERSE), cum_weights=list(weights), k=count)
    names: dict[int, str] = {}
    return [names.get(rank) or names.setdefault(rank, topic_of_rank(rank)) for rank in ranks]


def _hot_filter(rng: random.Random, topic: str, index: int) -> tuple[str, str]:
    """A new subscription aimed at ``topic`` (site/S/device/D/M)."""
    _, site, _, device, metric = topic.split("/")
    roll = rng.random()
    if roll < 0.3:
        topic_filter = topic
    elif roll < 0.5:
        topic_filter = f"site/{site}/device/{device}/+"
    elif roll < 0.7:
        topic_filter = f"site/{site}/device/{device}/#"
    elif roll < 0.95:
        topic_filter = f"site/+/device/{device}/{metric}"
    else:
        topic_filter = f"$share/g{index % 3}/site/{site}/device/+/{metric}"
    return f"churn-{index % 500}", topic_filter


class _Churn:
    """The subscription changes: alternately subscribe something new, unsubscribe one."""

    def __init__(self, rng: random.Random, live: list[tuple[str, str]]) -> None:
        self._rng = rng
        self._pools: tuple[list[tuple[str, str]], list[tuple[str, str]]] = (list(live), [])
        self._count = 0

    def next_change(self, recent: list[str]) -> tuple[str, str, str]:
        """The next change; ``recent`` are topics just published (for aimed subscriptions)."""
        rng = self._rng
        self._count += 1
        original, added = self._pools
        if self._count % 2 == 1:
            if rng.random() < 0.5:
                pair = _hot_filter(rng, rng.choice(recent), self._count)
            else:
                pair = _device_subscription(rng, 100_000 + self._count)
            added.append(pair)
            return ("subscribe", *pair)
        # Half the removals undo churn, half remove an original subscription, so the
        # subscription count and the fan-out of hot topics stay level.
        pool = added if added and rng.random() < 0.5 else original
        index = rng.randrange(len(pool))
        pool[index], pool[-1] = pool[-1], pool[index]
        client_id, topic_filter = pool.pop()
        return ("unsubscribe", client_id, topic_filter)


class Ceiling(SubscriptionTrie):
    """An instrument, not a cache to run: a trie that remembers the answer of every topic
    from its first publish on, forever, and drops exactly the answers a changed filter
    matches (found with the hot-topic cache's own :class:`TopicIndex`).

    It bounds any cache of per-topic answers from above: a real one cannot answer a topic
    before it has matched it once, and it also counts popularity and stays bounded. Its
    answers equal a full match only for a share strategy that picks by topic (as
    ``hash_topic`` does), since it keeps the member chosen at the first publish.
    """

    def __init__(self, strategy: ShareStrategy) -> None:
        super().__init__(strategy)
        self._answers: dict[str, tuple[str, ...]] = {}
        self._index = TopicIndex()
        self.misses = 0  # publishes matched in full

    def subscribe(self, client_id: str, topic_filter: str, **options: Any) -> bool:
        is_new = super().subscribe(client_id, topic_filter, **options)
        self._forget(topic_filter)
        return is_new

    def unsubscribe(self, client_id: str, topic_filter: str) -> bool:
        removed = super().unsubscribe(client_id, topic_filter)
        self._forget(topic_filter)
        return removed

    def _forget(self, topic_filter: str) -> None:
        shared = parse_shared(topic_filter)
        plain = shared.filter if shared is not None else topic_filter
        if has_wildcard(plain):
            topics = self._index.matching(plain)
        else:
            topics = [plain] if plain in self._answers else []
        for topic in topics:
            del self._answers[topic]
            self._index.remove(topic)

    def match(self, topic: str, publisher: str | None = None) -> list[str]:
        answer = self._answers.get(topic)
        if answer is not None:
            return [*answer]
        self.misses += 1
        result = super().match(topic, publisher)
        self._answers[topic] = tuple(result)
        self._index.add(topic)
        return result


Event = tuple[tuple[str, str, str], list[str]]  # a subscription change, then publishes


def _run_segment(subject: SubscriptionTrie, events: list[Event]) -> tuple[list[list[str]], float]:
    """Apply a segment's events to ``subject``: its answers and the seconds it took.

    Each publish gets a fresh copy of its topic string (made before the clock starts).
    The garbage collector is off while timing, as ``timeit`` does.
    """
    fresh = [(change, [topic.encode().decode() for topic in batch]) for change, batch in events]
    answers: list[list[str]] = []
    match, subscribe, unsubscribe = subject.match, subject.subscribe, subject.unsubscribe
    gc.disable()
    try:
        start = time.process_time()
        for (kind, client_id, topic_filter), batch in fresh:
            if kind == "subscribe":
                subscribe(client_id, topic_filter)
            else:
                unsubscribe(client_id, topic_filter)
            answers += [match(topic) for topic in batch]
        elapsed = time.process_time() - start
    finally:
        gc.enable()
    return answers, elapsed


def _floor(value: float, digits: int) -> float:
    """``value`` rounded down to ``digits`` decimals."""
    scale = float(10**digits)
    return math.floor(value * scale) / scale


def _ceil(value: float, digits: int) -> float:
    """``value`` rounded up to ``digits`` decimals."""
    scale = float(10**digits)
    return math.ceil(value * scale) / scale


def run_hot(
    subscriptions: int = 100_000,
    publishes: int = 300_000,
    seed: int = 7,
    *,
    zipf_exponent: float = 1.3,
    churn_every: int = 1000,
    warmup: int = 100_000,
    segment: int = 25_000,
    capacity: int = 4096,
    **cache_settings: Any,
) -> dict[str, Any]:
    """Run the ``hot`` workload; the object ``router bench match --json`` reports as
    ``workloads.hot``.

    Returns ``cached_matches_per_s`` and ``uncached_matches_per_s`` (publishes per second
    of the timed segments, subscription changes included), ``cache_speedup`` (their ratio),
    ``wrong_answers`` (cached answers that differ from the uncached trie's), the
    ``ceiling_*`` figures of :class:`Ceiling` (its speedup rounded up, so that it never
    understates what a cache could reach), and details: ``hit_rate`` (timed publishes
    answered from the cache), ``cache_size``, cache counters, ``subscription_changes``
    and the parameters.
    """
    rng = random.Random(seed)
    workload = make_workload("devices", subscriptions, 0, seed)
    topics = zipf_topics(rng, warmup + publishes, zipf_exponent)
    cached = CachedMatcher(HashTopicStrategy(), capacity=capacity, **cache_settings)
    plain = SubscriptionTrie(HashTopicStrategy())
    ceiling = Ceiling(HashTopicStrategy())
    subjects = {"cached": cached, "uncached": plain, "ceiling": ceiling}
    for client_id, topic_filter in workload.subscriptions:
        for subject in subjects.values():
            subject.subscribe(client_id, topic_filter)
    churn = _Churn(rng, workload.subscriptions)
    events: list[Event] = []
    for start in range(0, len(topics), churn_every):
        recent = topics[max(0, start - churn_every) : start] or topics[:churn_every]
        events.append((churn.next_change(recent), topics[start : start + churn_every]))
    per_segment = max(1, segment // churn_every)
    seconds = dict.fromkeys(subjects, 0.0)
    wrong = {"cached": 0, "ceiling": 0}
    fanout = 0
    hits_before: int | None = None
    ceiling_misses_before = 0
    gc.collect()
    for first in range(0, len(events), per_segment):
        is_timed = first * churn_every >= warmup
        if is_timed and hits_before is None:
            hits_before = cached.cache.stats().hits
            ceiling_misses_before = ceiling.misses
        part = events[first : first + per_segment]
        answers = {}
        for name, subject in subjects.items():
            answers[name], elapsed = _run_segment(subject, part)
            if is_timed:
                seconds[name] += elapsed
        if is_timed:
            fanout += sum(len(answer) for answer in answers["uncached"])
        for name in wrong:
            pairs = zip(answers[name], answers["uncached"], strict=True)
            wrong[name] += sum(a != b for a, b in pairs)
    changes = len(events)
    stats = cached.cache.stats()
    timed = len(topics) - warmup
    if hits_before is None or timed <= 0:
        raise ValueError("the hot workload needs more publishes than its warmup")
    rates = {name: timed / elapsed for name, elapsed in seconds.items()}
    uncached_rate = rates["uncached"]
    return {  # figures rounded down, never up (the ceiling's speedup: up)
        "cached_matches_per_s": math.floor(rates["cached"]),
        "uncached_matches_per_s": math.floor(uncached_rate),
        "cache_speedup": _floor(rates["cached"] / uncached_rate, 2),
        "wrong_answers": wrong["cached"],
        "hit_rate": _floor((stats.hits - hits_before) / timed, 4),
        "ceiling_matches_per_s": math.ceil(rates["ceiling"]),
        "ceiling_speedup": _ceil(rates["ceiling"] / uncached_rate, 2),
        "ceiling_hit_rate": _ceil(1 - (ceiling.misses - ceiling_misses_before) / timed, 4),
        "ceiling_wrong_answers": wrong["ceiling"],
        "cache_size": stats.size,
        "cache_capacity": capacity,
        "admissions": stats.admissions,
        "evictions": stats.evictions,
        "drops": stats.drops,
        "answer_invalidations": stats.invalidations,
        "subscriptions": subscriptions,
        "publishes": timed,
        "warmup_publishes": warmup,
        "subscription_changes": changes,
        "average_fanout": _floor(fanout / timed, 2),
        "zipf_exponent": zipf_exponent,
        "distinct_topics": len(set(topics)),
        "seed": seed,
    }
