"""The ``hot`` workload: Zipf-skewed publishes with subscription churn, cached, uncached
and paho.

The subscriptions are the ``devices`` workload of :mod:`router.bench.match` (100k device
fleet subscriptions by default). Publish topics are drawn from every device topic
(``site/S/device/D/METRIC``, 500k of them) with Zipf-skewed popularity: the topic of rank
``k`` is published with probability proportional to ``1 / k ** zipf_exponent`` (default
1.3; ranks are spread over sites and devices by a fixed permutation). Every
``churn_every`` publishes one subscription changes, alternately a new subscription and a
removal (half of them undo churn, half remove an original subscription); half of the new
subscriptions aim at a topic just published (exact, ``+``, ``#``, a wildcard site, or
now and then a shared subscription), so that invalidation of cached topics is exercised.

Three subjects receive the same event stream (the same publishes, the same subscription
changes), all choosing share-group members with the deterministic ``hash_topic``
strategy: a :class:`CachedMatcher` (default settings), a plain :class:`SubscriptionTrie`
(the reference), and :class:`SharingPahoPeer`, paho-mqtt's ``MQTTMatcher`` with share
groups kept beside each filter (the peer of ``vs_paho``). The stream is cut into
segments of ``segment`` publishes; each segment runs on one subject after the other,
each timed as a whole (changes included, garbage collector off as in ``timeit``), so
that drift of a shared machine hits all alike. Every answer is compared with the plain
trie's outside the timed sections: a cached answer that differs is a wrong answer
(counted), a paho answer that differs makes the run fail (the peer would not be
answering the same question). Each publish gets a fresh copy of its topic string per
subject, as if decoded from the network, so no subject reuses a hash computed by
another. The first ``warmup`` publishes fill the cache: compared, not timed.

What bounds the speedup is the miss rate, not the hit path: a hit is several times
cheaper than a trie match, but a miss (a topic not yet seen twice, or dropped as cold)
costs a trie match of a topic whose data is cold in the CPU caches. ``hit_rate_bound``
is the share of timed publishes that are not the first publish of their topic: no cache
that learns its topics from publishes can answer a first publish, so none hits more
often. (An earlier timed "ceiling", a trie remembering every answer forever, was dropped:
it paid costs the cache does not, an index of every topic ever seen and invalidation
across all of them, so its speed bounded nothing.)
"""

from __future__ import annotations

import gc
import math
import random
import time
from bisect import insort
from collections.abc import Set
from itertools import accumulate
from typing import Any, Protocol

from router.bench.broker_runs import cut
from router.bench.match_workloads import (
    DEVICES_PER_SITE,
    METRICS,
    SITES,
    device_subscription,
    make_workload,
)
from router.core.cached_trie import CachedMatcher
from router.core.sharing import HashTopicStrategy, ShareGroup, ShareStrategy
from router.core.topics import parse_shared
from router.core.trie import SubscriptionTrie
from router.errors import BenchDisagreementError, BenchSetupError

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
                pair = device_subscription(rng, 100_000 + self._count)
            added.append(pair)
            return ("subscribe", *pair)
        # Half the removals undo churn, half remove an original subscription, so the
        # subscription count and the fan-out of hot topics stay level.
        use_added = bool(added) and rng.random() < 0.5
        pool = added if use_added or not original else original
        index = rng.randrange(len(pool))
        pool[index], pool[-1] = pool[-1], pool[index]
        client_id, topic_filter = pool.pop()
        return ("unsubscribe", client_id, topic_filter)


class SharingPahoPeer:
    """paho-mqtt's ``MQTTMatcher`` answering like the trie, share groups included.

    Each filter's value is ``[plain client ids, share groups or None]``: a ``$share/g/f``
    subscription is kept under ``f`` in the group ``$share/g/f`` (members sorted, as the
    trie keeps them), and a match adds the member ``strategy`` chooses, as the trie does.
    A filter with neither is deleted from the matcher.
    """

    def __init__(self, strategy: ShareStrategy) -> None:
        from paho.mqtt.matcher import MQTTMatcher

        self._matcher = MQTTMatcher()  # type: ignore[no-untyped-call]
        self._strategy = strategy

    def _entry(self, plain: str) -> list[Any] | None:
        try:
            entry: list[Any] = self._matcher[plain]
        except KeyError:
            return None
        return entry

    def subscribe(self, client_id: str, topic_filter: str) -> None:
        shared = parse_shared(topic_filter)
        plain = shared.filter if shared is not None else topic_filter
        entry = self._entry(plain)
        if entry is None:
            entry = self._matcher[plain] = [set(), None]
        if shared is None:
            entry[0].add(client_id)
            return
        groups = entry[1] if entry[1] is not None else {}
        entry[1] = groups
        group = groups.setdefault(topic_filter, ShareGroup(topic_filter, []))
        if client_id not in group.members:
            insort(group.members, client_id)

    def unsubscribe(self, client_id: str, topic_filter: str) -> None:
        shared = parse_shared(topic_filter)
        plain = shared.filter if shared is not None else topic_filter
        entry = self._entry(plain)
        if entry is None:
            return
        clients, groups = entry
        if shared is None:
            clients.discard(client_id)
        elif groups is not None and topic_filter in groups:
            members = groups[topic_filter].members
            if client_id in members:
                members.remove(client_id)
            if not members:
                del groups[topic_filter]
            if not groups:
                entry[1] = None
        if not clients and entry[1] is None:
            del self._matcher[plain]  # type: ignore[no-untyped-call]

    def match(self, topic: str) -> Set[str]:
        result: set[str] = set()
        choose = self._strategy.choose
        for clients, groups in self._matcher.iter_match(topic):  # type: ignore[no-untyped-call]
            result.update(clients)
            if groups is not None:
                for group in groups.values():
                    result.add(choose(group, topic, None))
        return result


class HotSubject(Protocol):
    """What the hot workload drives: subscription changes and matches."""

    def subscribe(self, client_id: str, topic_filter: str) -> Any: ...

    def unsubscribe(self, client_id: str, topic_filter: str) -> Any: ...

    def match(self, topic: str) -> Set[str]: ...


Event = tuple[tuple[str, str, str], list[str]]  # a subscription change, then publishes


def _run_segment(subject: HotSubject, events: list[Event]) -> tuple[list[Set[str]], float]:
    """Apply a segment's events to ``subject``: its answers and the seconds it took.

    Each publish gets a fresh copy of its topic string (made before the clock starts).
    The garbage collector is off while timing, as ``timeit`` does.
    """
    fresh = [(change, [topic.encode().decode() for topic in batch]) for change, batch in events]
    answers: list[Set[str]] = []
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

    Returns ``cached_matches_per_s``, ``uncached_matches_per_s`` and
    ``paho_matches_per_s`` (publishes per second of the timed segments, subscription
    changes included), ``cache_speedup`` (cached over uncached), ``vs_paho`` (cached
    over paho) and ``uncached_vs_paho``, all cut to two decimals; ``wrong_answers``
    (cached answers that differ from the uncached trie's); ``hit_rate`` (timed publishes
    answered from the cache) and ``hit_rate_bound`` (timed publishes that are not their
    topic's first: no such cache hits more often), cut to four decimals; and details:
    ``cache_size``, cache counters, ``subscription_changes`` and the parameters.

    Raises :class:`BenchSetupError` for sizes that leave nothing to time, and
    BenchDisagreementError if paho answers a publish differently from the trie.
    """
    if min(subscriptions, publishes, churn_every) < 1 or warmup < 0:
        raise BenchSetupError("the hot workload needs subscriptions and publishes >= 1")
    rng = random.Random(seed)
    workload = make_workload("devices", subscriptions, 0, seed)
    topics = zipf_topics(rng, warmup + publishes, zipf_exponent)
    cached = CachedMatcher(HashTopicStrategy(), capacity=capacity, **cache_settings)
    plain = SubscriptionTrie(HashTopicStrategy())
    subjects: dict[str, HotSubject] = {
        "cached": cached,
        "uncached": plain,
        "paho": SharingPahoPeer(HashTopicStrategy()),
    }
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
    wrong = 0
    fanout = 0
    hits_before: int | None = None
    timed = first_publishes = 0
    seen: set[str] = set()
    gc.collect()
    for first in range(0, len(events), per_segment):
        is_timed = first * churn_every >= warmup
        if is_timed and hits_before is None:
            hits_before = cached.cache.stats().hits
        part = events[first : first + per_segment]
        answers = {}
        for name, subject in subjects.items():
            answers[name], elapsed = _run_segment(subject, part)
            if is_timed:
                seconds[name] += elapsed
        expected = answers["uncached"]
        wrong += sum(a != b for a, b in zip(answers["cached"], expected, strict=True))
        for index, (a, b) in enumerate(zip(answers["paho"], expected, strict=True)):
            if a != b:
                raise BenchDisagreementError(
                    f"hot: paho and the trie disagree on publish {first * churn_every + index}"
                    f": {sorted(a)[:10]} against {sorted(b)[:10]}"
                )
        batch = [topic for _, publishes_ in part for topic in publishes_]
        if is_timed:
            fanout += sum(len(answer) for answer in expected)
            timed += len(batch)
            first_publishes += sum(topic not in seen for topic in dict.fromkeys(batch))
        seen.update(batch)
    changes = len(events)
    stats = cached.cache.stats()
    if hits_before is None or timed <= 0:
        raise BenchSetupError("the hot workload needs more publishes than its warmup")
    rates = {name: timed / elapsed for name, elapsed in seconds.items()}
    return {  # rates rounded down, ratios cut: never up
        "cached_matches_per_s": math.floor(rates["cached"]),
        "uncached_matches_per_s": math.floor(rates["uncached"]),
        "paho_matches_per_s": math.floor(rates["paho"]),
        "cache_speedup": cut(rates["cached"] / rates["uncached"]),
        "vs_paho": cut(rates["cached"] / rates["paho"]),
        "uncached_vs_paho": cut(rates["uncached"] / rates["paho"]),
        "wrong_answers": wrong,
        "hit_rate": cut((stats.hits - hits_before) / timed, 4),
        "hit_rate_bound": cut(1 - first_publishes / timed, 4),
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
        "average_fanout": cut(fanout / timed),
        "zipf_exponent": zipf_exponent,
        "distinct_topics": len(set(topics)),
        "seed": seed,
    }
