"""Which topic filters carry the traffic: publishes counted per matching route.

Every publish that enters the cluster at a node is matched once against the node's route
mirror (:mod:`router.cluster.dispatcher`); :meth:`FilterTraffic.count` adds one to each
route that matched (each once, however many nodes or subscribers hold it: see
:attr:`~router.core.route_mirror.RouteMatch.matched`). A copy forwarded from another node
is not counted again, so the sums over the nodes are the cluster's publishes per filter.

The node's telemetry turns the counts into rates every interval
(:meth:`FilterTraffic.rates`): publishes a second, averaged over about a minute
(exponentially, as a load average is: :data:`WINDOW`), so that a burst stays in sight
for a while and a steady flow reads steady; the counting starts afresh each interval and
a filter whose rate fell under :data:`FLOOR` is forgotten, so what is kept is bounded by
the filters published to in the last minutes. The telemetry publishes the busiest
(:func:`busiest`) with the node's drops (:mod:`router.state.client_figures`), and
:func:`router.ops.figures_view.busiest_filters` adds them up for the cluster.

Cost: one dict update per matching route per publish; nothing per subscriber.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

#: The filters a node reports each interval, the busiest first.
BUSIEST: Final = 10
#: Seconds the rates average over (the time constant of the exponential average).
WINDOW: Final = 60.0
#: A rate under this many publishes a second is forgotten.
FLOOR: Final = 0.001


class FilterTraffic:
    """Publishes per matching route since the last :meth:`rates`, and the averaged
    rates (see the module docstring)."""

    __slots__ = ("_counts", "_rates")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._rates: dict[str, float] = {}

    def count(self, routes: Iterable[str]) -> None:
        """One publish matched ``routes`` (each once)."""
        counts = self._counts
        for route in routes:
            counts[route] = counts.get(route, 0) + 1

    def rates(self, seconds: float) -> dict[str, float]:
        """route -> publishes a second averaged over about :data:`WINDOW` seconds, after
        the ``seconds`` (> 0) since the last call; the counting starts afresh."""
        counted, self._counts = self._counts, {}
        keep = math.exp(-seconds / WINDOW)
        rates = {route: rate * keep for route, rate in self._rates.items()}
        for route, published in counted.items():
            rates[route] = rates.get(route, 0.0) + (1.0 - keep) * published / seconds
        self._rates = {route: rate for route, rate in rates.items() if rate >= FLOOR}
        return dict(self._rates)


def busiest(rates: Mapping[str, float], count: int = BUSIEST) -> list[tuple[str, float]]:
    """The ``count`` routes of ``rates`` with most publishes a second, as (route, rate
    rounded to 3 places), most first, ties by route."""
    ranked = sorted(rates.items(), key=lambda item: (-item[1], item[0]))[:count]
    return [(route, round(rate, 3)) for route, rate in ranked]
