"""Operator views of the clients' figures: one client's, the slowest, the drops by reason.

Every node (:mod:`router.ops.telemetry`) publishes, each telemetry interval, the figures of
every client it holds and its drops by reason (:mod:`router.state.client_figures`), so
any node, and the CLI, reads them from Redis for the whole cluster: a client's figures
are those its node (the one its session in Redis names) published last, at most an
interval old; a node that is not alive, or publishes none (embedded without a sampler), has none
(None, shown as unknown).

* :func:`client_figures`: the figures of some sessions, one HMGET a node.
* :func:`busiest_filters`: the topic filters with most publishes a second.
* :func:`slow_subscribers`: the clients with most queued in memory and most dropped,
  over the live nodes' slowest (each node reports its
  :data:`~router.cluster.client_stats.SLOWEST` of each).
* :func:`cluster_drops`: each drop reason's total (since the live nodes started) and
  rate a second (over their last interval), summed over the live nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any, Final

from router.state.client_figures import NODE_DROP_REASONS, ClientFigures, ClientFigureStore
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient
from router.state.session_store import SessionInfo

#: Clients a slow-subscriber list shows, unless the caller says otherwise.
DEFAULT_SLOW: Final = 10
#: At most this many in a slow-subscriber list.
MAX_SLOW: Final = 100


async def client_figures(
    redis: RedisClient, keys: Keys, infos: Sequence[SessionInfo], alive: Collection[str]
) -> dict[str, ClientFigures]:
    """client id -> the figures its node published, for each of ``infos`` whose node is
    in ``alive`` and published some."""
    wanted: dict[str, list[str]] = defaultdict(list)
    for info in infos:
        if info.node_id in alive:
            wanted[info.node_id].append(info.client_id)
    if not wanted:
        return {}
    return await ClientFigureStore(redis, keys).clients(wanted)


def _row(figures: ClientFigures) -> dict[str, Any]:
    return {"client_id": figures.client_id, **figures.as_dict()}


async def slow_subscribers(
    redis: RedisClient, keys: Keys, count: int = DEFAULT_SLOW
) -> dict[str, Any]:
    """``by_queue``: the ``count`` clients with most copies queued in memory (most
    first), ``by_drops``: the ``count`` that dropped most (any reason), over every live
    node; each row a client's figures (:meth:`ClientFigures.as_dict`) with its
    ``client_id``. Raises ``ValueError`` for a count outside 1..:data:`MAX_SLOW`."""
    if not 1 <= count <= MAX_SLOW:
        raise ValueError(f"count is 1 to {MAX_SLOW}, not {count!r}")
    live = [node.node_id for node in await NodeRegistry(redis, keys).live_nodes()]
    reported = await ClientFigureStore(redis, keys).drops(live)
    every = [figures for drops in reported.values() for figures in drops.slowest]
    queued = sorted((f for f in every if f.queued), key=lambda f: (-f.queued, f.client_id))
    dropped = sorted((f for f in every if f.dropped), key=lambda f: (-f.dropped, f.client_id))
    return {
        "by_queue": [_row(f) for f in queued[:count]],
        "by_drops": [_row(f) for f in dropped[:count]],
    }


async def cluster_drops(redis: RedisClient, keys: Keys) -> dict[str, dict[str, float]]:
    """reason -> ``{"total", "per_s"}`` for each of
    :data:`~router.state.client_figures.NODE_DROP_REASONS`, summed over the live nodes
    that reported lately."""
    live = [node.node_id for node in await NodeRegistry(redis, keys).live_nodes()]
    reported = (await ClientFigureStore(redis, keys).drops(live)).values()
    return {
        reason: {
            "total": sum(drops.totals[reason] for drops in reported),
            "per_s": round(sum(drops.rates[reason] for drops in reported), 3),
        }
        for reason in NODE_DROP_REASONS
    }


async def busiest_filters(
    redis: RedisClient, keys: Keys, count: int = DEFAULT_SLOW
) -> list[dict[str, Any]]:
    """The ``count`` topic filters with most publishes a second over the live nodes'
    last intervals (each node reports its busiest:
    :mod:`router.cluster.filter_traffic`), most first: ``{"filter", "per_s", "nodes"}``
    (``nodes``: how many nodes counted publishes to it). A publish counts once, at the
    node where it entered the cluster. Raises ``ValueError`` for a count outside
    1..:data:`MAX_SLOW`."""
    if not 1 <= count <= MAX_SLOW:
        raise ValueError(f"count is 1 to {MAX_SLOW}, not {count!r}")
    live = [node.node_id for node in await NodeRegistry(redis, keys).live_nodes()]
    rates: dict[str, float] = defaultdict(float)
    nodes: dict[str, int] = defaultdict(int)
    for drops in (await ClientFigureStore(redis, keys).drops(live)).values():
        for name, per_s in drops.busiest:
            rates[name] += per_s
            nodes[name] += 1
    ranked = sorted(rates.items(), key=lambda item: (-item[1], item[0]))[:count]
    return [
        {"filter": name, "per_s": round(per_s, 3), "nodes": nodes[name]} for name, per_s in ranked
    ]
