"""The routing report computed in one plain Python process.

The same computation as the Spark job (:mod:`router.pipeline.report`): aggregate the log
(here once, by (node, topic, forwarded nodes)), match each distinct topic once with a
:class:`~router.pipeline.matching.TopicMatcher`, then derive every figure of
:class:`~router.pipeline.model.Report` from the aggregate. ``router bench pipeline``
measures it beside the Spark job, and the tests check that both agree.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from router.errors import PipelineInputError
from router.pipeline.matching import FilterCosts, TopicMatcher, add_filter_costs
from router.pipeline.model import (
    FilterCost,
    NodeTraffic,
    Report,
    TopicTraffic,
    broadcast_savings,
)

# (node, topic, forwarded nodes) -> [publishes, payload bytes, local deliveries, unrouted]
Aggregate = dict[tuple[str, str, tuple[str, ...]], list[int]]


def traffic_files(path: str | Path) -> list[Path]:
    """The traffic-log files at ``path``: the file itself, or a directory's visible files.

    Names starting with ``.`` or ``_`` are skipped, as Spark skips them (a log file still
    being written is hidden). Raises :class:`PipelineInputError` for a missing path or a
    directory without files.
    """
    where = Path(path)
    if where.is_file():
        return [where]
    if not where.is_dir():
        raise PipelineInputError(f"no traffic log at {path}: no such file or directory")
    files = sorted(p for p in where.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    if not files:
        raise PipelineInputError(f"no traffic log at {path}: the directory holds no files")
    return files


def aggregate(lines: Iterable[bytes]) -> Aggregate:
    """Sum the records of JSON lines by (node, topic, forwarded nodes)."""
    totals: Aggregate = {}
    loads = json.loads
    for line in lines:
        if not line.strip():
            continue
        record = loads(line)
        forwarded = tuple(record["forwarded"] or ())
        local = record["local_deliveries"] or 0
        key = (record["node"], record["topic"], forwarded)
        entry = totals.get(key)
        if entry is None:
            entry = totals[key] = [0, 0, 0, 0]
        entry[0] += 1
        entry[1] += record["payload_bytes"] or 0
        entry[2] += local
        if not forwarded and not local:
            entry[3] += 1
    return totals


def _lines(files: Iterable[Path]) -> Iterator[bytes]:
    for file in files:
        with file.open("rb") as stream:
            yield from stream


def _ranked_topics(items: Iterable[TopicTraffic], top: int) -> tuple[TopicTraffic, ...]:
    return tuple(sorted(items, key=lambda t: (-t.messages, t.topic))[:top])


def plain_report(
    path: str | Path,
    subscriptions: Iterable[tuple[str, str]],
    *,
    nodes: int | None = None,
    top: int = 20,
) -> Report:
    """The :class:`Report` of the traffic log at ``path`` against ``subscriptions``
    (``(client_id, filter)`` pairs); ``nodes`` overrides the cluster size for the savings."""
    totals = aggregate(_lines(traffic_files(path)))
    matcher = TopicMatcher(subscriptions)
    return derive_report(totals, matcher, nodes=nodes, top=top)


def derive_report(
    totals: Aggregate, matcher: TopicMatcher, *, nodes: int | None = None, top: int = 20
) -> Report:
    """Every figure of the report from the aggregated log and the matcher."""
    per_node: dict[str, list[int]] = defaultdict(lambda: [0] * 7)
    node_fanout: Counter[int] = Counter()
    topics: dict[str, list[int]] = {}
    unrouted = copies = copy_bytes = 0
    for (node, topic, forwarded), (count, size, local, dark) in totals.items():
        mine = per_node[node]
        mine[0] += count
        mine[1] += size
        mine[2] += count * len(forwarded)
        mine[3] += size * len(forwarded)
        mine[6] += local
        for target in forwarded:
            theirs = per_node[target]
            theirs[4] += count
            theirs[5] += size
        node_fanout[len(forwarded)] += count
        copies += count * len(forwarded)
        copy_bytes += size * len(forwarded)
        unrouted += dark
        entry = topics.get(topic)
        if entry is None:
            topics[topic] = [count, size]
        else:
            entry[0] += count
            entry[1] += size
    fanout: Counter[int] = Counter()
    costs: FilterCosts = {}
    traffic = []
    for topic, (count, size) in topics.items():
        found = matcher.match(topic)
        fanout[found.subscribers] += count
        traffic.append(TopicTraffic(topic, count, size, found.subscribers))
        add_filter_costs(costs, found, count, size)
    messages = sum(t.messages for t in traffic)
    total_bytes = sum(t.bytes for t in traffic)
    silent = [t for t in traffic if t.subscribers == 0]
    filter_cost = sorted(
        (FilterCost(f, *numbers) for f, numbers in costs.items()),
        key=lambda c: (-c.deliveries, c.filter),
    )
    return Report(
        messages=messages,
        bytes=total_bytes,
        topics=len(traffic),
        subscriptions=len(matcher),
        ignored_subscriptions=matcher.ignored,
        per_node=tuple(NodeTraffic(node, *per_node[node]) for node in sorted(per_node)),
        fanout=dict(sorted(fanout.items())),
        node_fanout=dict(sorted(node_fanout.items())),
        savings=broadcast_savings(
            cluster_size(len(per_node), nodes), messages, total_bytes, copies, copy_bytes
        ),
        hot_topics=_ranked_topics(traffic, top),
        filter_cost=tuple(filter_cost[:top]),
        no_subscriber_messages=sum(t.messages for t in silent),
        no_subscriber_topics=_ranked_topics(silent, top),
        unrouted_messages=unrouted,
    )


def cluster_size(seen: int, given: int | None) -> int:
    """The cluster size for the savings: ``given``, else the nodes seen in the log.

    Raises :class:`PipelineInputError` when ``given`` is below the nodes seen.
    """
    if given is None:
        return seen
    if given < seen:
        raise PipelineInputError(f"--nodes {given} is below the {seen} nodes in the traffic log")
    return given
