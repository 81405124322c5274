"""``router bench match``: the subscription trie beside paho-mqtt's MQTTMatcher.

Both structures get the same seeded subscriptions and answer the same publish topics with
the same result: the set of client ids that get the publish (a set: delivery needs no
order, so neither structure pays for a sort). The run checks that the answers agree, for
every topic, before it reports any rate.

Memory is what each structure keeps alive, as tracemalloc counts it: the structure is built
inside the traced region from fresh copies of every client id and filter (as if decoded
from the network, shared with nothing else), so the strings it keeps count for it.
Ratios are cut to two decimals, never rounded up.

Workloads: :mod:`router.bench.match_workloads`.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable, Iterable, Set
from functools import partial
from typing import Any, Protocol

from router.bench.broker_runs import cut
from router.bench.hot import run_hot
from router.bench.match_workloads import (
    DEFAULT_WORKLOADS,
    WORKLOADS,
    MatchWorkload,
    make_workload,
)
from router.core.filter_index import COMPILED
from router.core.trie import SubscriptionTrie
from router.errors import BenchDisagreementError, BenchSetupError


class PahoPeer:
    """paho-mqtt's MQTTMatcher holding a set of client ids per filter."""

    def __init__(self) -> None:
        from paho.mqtt.matcher import MQTTMatcher

        self._matcher = MQTTMatcher()  # type: ignore[no-untyped-call]

    def subscribe(self, client_id: str, topic_filter: str) -> None:
        try:
            clients = self._matcher[topic_filter]
        except KeyError:
            clients = self._matcher[topic_filter] = set()
        clients.add(client_id)

    def match(self, topic: str) -> Set[str]:
        clients: set[str] = set()
        for found in self._matcher.iter_match(topic):  # type: ignore[no-untyped-call]
            clients.update(found)
        return clients


class RouterSubject:
    """The router's trie behind the same two calls."""

    def __init__(self) -> None:
        self.trie = SubscriptionTrie()

    def subscribe(self, client_id: str, topic_filter: str) -> None:
        self.trie.subscribe(client_id, topic_filter)

    def match(self, topic: str) -> Set[str]:
        return self.trie.match(topic)


class Subject(Protocol):
    """What a measured structure offers: subscribe, and the set of clients of a topic."""

    def subscribe(self, client_id: str, topic_filter: str) -> Any: ...

    def match(self, topic: str) -> Set[str]: ...


def check_sizes(subscriptions: int, topics: int, rounds: int, hot_publishes: int) -> None:
    """Raise :class:`BenchSetupError` unless every size is an int >= 1 (``--NAME``)."""
    sizes = {
        "subscriptions": subscriptions,
        "topics": topics,
        "rounds": rounds,
        "hot_publishes": hot_publishes,
    }
    for name, value in sizes.items():
        if type(value) is not int or value < 1:
            raise BenchSetupError(f"--{name.replace('_', '-')} must be an int >= 1, not {value!r}")


def fresh(text: str) -> str:
    """A new string object equal to ``text`` (as a decoder makes one)."""
    return text.encode().decode()


def _build(make: Callable[[], Subject], subscriptions: Iterable[tuple[str, str]]) -> Subject:
    subject = make()
    for client_id, topic_filter in subscriptions:
        subject.subscribe(client_id, topic_filter)
    return subject


def _match_all(subject: Subject, topics: list[str]) -> None:
    match = subject.match
    for topic in topics:
        match(topic)


def timed(action: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``action`` after a garbage collection; its result and the seconds it took."""
    gc.collect()
    start = time.perf_counter()
    result = action()
    return result, time.perf_counter() - start


def check_answers(name: str, subjects: dict[str, Subject], topics: list[str]) -> int:
    """Compare every subject's answer for every topic with the first subject's; returns
    the number of clients matched over all topics (by the first).

    Raises BenchDisagreementError naming the first topic on which two subjects disagree.
    """
    (reference, expected_of), *others = [(n, s.match) for n, s in subjects.items()]
    matched = 0
    for topic in topics:
        expected = expected_of(topic)
        matched += len(expected)
        for other, answer_of in others:
            answer = answer_of(topic)
            if answer != expected:
                raise BenchDisagreementError(
                    f"{name}: {other} and {reference} disagree on {topic!r}: "
                    f"{sorted(answer)[:10]} against {sorted(expected)[:10]}"
                )
    return matched


def structure_memory(
    make: Callable[[], Subject],
    subscriptions: list[tuple[str, str]],
    remove_client: Callable[[Subject, str], Any] | None = None,
) -> tuple[float, float | None]:
    """Bytes per subscription that the structure made by ``make`` keeps alive once it
    holds ``subscriptions``, and, with ``remove_client``, bytes per former subscription
    it keeps after every client was removed again (else None).

    Built inside the traced region from fresh copies of every string (:func:`fresh`), so
    the strings the structure keeps are counted, and nothing is shared with the caller's.
    """
    count = len(subscriptions)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        subject = _build(make, ((fresh(c), fresh(f)) for c, f in subscriptions))
        gc.collect()
        built = tracemalloc.get_traced_memory()[0]
        residual = None
        if remove_client is not None:
            for client_id in {client_id for client_id, _ in subscriptions}:
                remove_client(subject, client_id)
            gc.collect()
            residual = (tracemalloc.get_traced_memory()[0] - before) / count
        del subject
    finally:
        tracemalloc.stop()
    return (built - before) / count, residual


def _remove_router_client(subject: Subject, client_id: str) -> None:
    assert isinstance(subject, RouterSubject)
    subject.trie.remove_client(client_id)


def run_workload(
    workload: MatchWorkload,
    rounds: int = 3,
    timer: Callable[[Callable[[], Any]], tuple[Any, float]] = timed,
) -> dict[str, Any]:
    """Measure both structures on one workload; best of ``rounds`` for each rate. Each
    build and each round of matches is measured by ``timer`` (:func:`timed`: its result
    and the seconds it took).

    Raises BenchDisagreementError if the two answer any topic differently.
    """
    makers: dict[str, Callable[[], Subject]] = {"router": RouterSubject, "paho": PahoPeer}
    built: dict[str, Subject] = {}
    insert_s: dict[str, float] = {}
    for name, make in makers.items():
        built[name], insert_s[name] = timer(partial(_build, make, workload.subscriptions))
    fanout = check_answers(workload.name, built, workload.topics) / len(workload.topics)
    match_s = {name: float("inf") for name in makers}
    for _ in range(rounds):
        for name, subject in built.items():
            _, seconds = timer(partial(_match_all, subject, workload.topics))
            match_s[name] = min(match_s[name], seconds)
    built.clear()
    router_memory, residual = structure_memory(
        makers["router"], workload.subscriptions, _remove_router_client
    )
    paho_memory, _ = structure_memory(makers["paho"], workload.subscriptions)
    subs, topics = len(workload.subscriptions), len(workload.topics)
    router_rate = topics / match_s["router"]
    paho_rate = topics / match_s["paho"]
    return {
        "subscriptions": subs,
        "topics": topics,
        "average_fanout": cut(fanout),
        "router_inserts_per_s": round(subs / insert_s["router"]),
        "paho_inserts_per_s": round(subs / insert_s["paho"]),
        "router_matches_per_s": round(router_rate),
        "paho_matches_per_s": round(paho_rate),
        "match_ratio": cut(router_rate / paho_rate),
        "router_bytes_per_sub": round(router_memory, 1),
        "paho_bytes_per_sub": round(paho_memory, 1),
        "memory_ratio": cut(router_memory / paho_memory),
        "router_bytes_per_sub_after_removing_all": round(residual or 0.0, 2),
    }


def run(
    subscriptions: int = 100_000,
    topics: int = 50_000,
    seed: int = 7,
    rounds: int = 3,
    hot_publishes: int = 300_000,
    workloads: tuple[str, ...] = DEFAULT_WORKLOADS,
) -> dict[str, Any]:
    """The ``workloads`` asked for (default :data:`DEFAULT_WORKLOADS`); the object
    ``router bench match --json`` prints: each of :data:`WORKLOADS` beside paho, and
    ``hot`` (:func:`router.bench.hot.run_hot`: the trie with and without its hot-topic
    match cache, and paho, on one stream of publishes and subscription changes;
    ``hot_publishes`` timed publishes after a warmup of a third as many); ``core``: the
    filter index that ran, ``compiled`` or ``pure`` (``ROUTER_PURE_CORE=1``).

    Raises :class:`BenchSetupError` for a size below 1 or an unknown workload before any
    work."""
    check_sizes(subscriptions, topics, rounds, hot_publishes)
    unknown = sorted(set(workloads) - {*WORKLOADS, "hot"})
    if unknown or not workloads:
        raise BenchSetupError(
            f"unknown workload {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join((*WORKLOADS, 'hot'))}"
        )
    results: dict[str, Any] = {}
    for name in dict.fromkeys(workloads):
        if name == "hot":
            results[name] = run_hot(
                subscriptions,
                hot_publishes,
                seed,
                warmup=hot_publishes // 3,
                segment=hot_publishes // 12,
            )
        else:
            workload = make_workload(name, subscriptions, topics, seed)
            results[name] = run_workload(workload, rounds)
    return {"seed": seed, "core": "compiled" if COMPILED else "pure", "workloads": results}
