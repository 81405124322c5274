"""Per-client figures: what a node counts on each session it holds, and its slowest.

Each :class:`~router.cluster.sessions.local_sessions.ClientSession` keeps a few ints that its
connection and the node move as they go, never anything allocated per message:

    received, received_bytes   PUBLISH packets (and payload bytes) from the client
    sent, sent_bytes           PUBLISH packets to it (a resend counts again)
    active_at                  wall-clock time of its last packet in or out
    takeovers                  connections of its id that took it over on this node (a
                               takeover from another node counts 1 there: the figures
                               of a session start afresh on the node it moves to)
    dropped                    copies its full queue in memory dropped
    losses                     [expired, oversized, session_queue_full, offline_qos0],
                               made at the first such loss (most sessions never have one)

:func:`figures_of` reads them with the queue's depth and what is in flight as a
:class:`~router.state.client_figures.ClientFigures`; :func:`slowest` picks the clients
an operator should look at first; :class:`DropRates` turns a node's drop counters into
rates between two samples. The node's telemetry publishes all of them every interval
(:mod:`router.ops.telemetry`, :mod:`router.state.client_figures`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Final

from router.cluster.sessions.local_sessions import ClientSession
from router.cluster.sessions.states import SessionState
from router.state.client_figures import DROP_REASONS, NODE_DROP_REASONS, ClientFigures

#: Clients a node reports as its slowest, by queue depth and by drops each.
SLOWEST: Final = 10


def figures_of(session: ClientSession, node_id: str, at_ms: int) -> ClientFigures:
    """``session``'s figures now (``at_ms``: now, Unix ms)."""
    losses = session.losses or (0,) * (len(DROP_REASONS) - 1)
    active = session.active_at
    return ClientFigures(
        session.client_id,
        node_id,
        at_ms,
        session.received,
        session.received_bytes,
        session.sent,
        session.sent_bytes,
        session.pending(),
        max(0, session.queued_bytes),
        len(session.inflight),
        session.takeovers,
        int(active * 1000) if active else None,
        dict(zip(DROP_REASONS, (session.dropped, *losses), strict=True)),
    )


def signature(session: ClientSession) -> tuple[object, ...]:
    """What ``session``'s figures are made of, cheaply: equal signatures, equal figures
    (so that a node writes only the figures that changed)."""
    return (
        session.received,
        session.received_bytes,
        session.sent,
        session.sent_bytes,
        session.pending(),
        session.queued_bytes,
        len(session.inflight),
        session.takeovers,
        session.active_at,
        session.dropped,
        None if session.losses is None else tuple(session.losses),
    )


class FigureChanges:
    """Which clients' figures a node must write: those that changed since its last
    write (:meth:`since`), the clients gone since, and every figure again at the first
    write, at each :data:`FULL_EVERY`-th and after a write that failed (:meth:`lost`), so
    that what Redis holds is never wrong for long. The slowest are picked from every
    open session (their figures made only for those that queue or drop)."""

    def __init__(self, full_every: int = 30) -> None:
        self.full_every = full_every
        self._written: dict[str, tuple[object, ...]] = {}
        self._pending: dict[str, tuple[object, ...]] = {}
        self._writes = 0

    def since(
        self, sessions: Iterable[ClientSession], node_id: str, at_ms: int
    ) -> tuple[list[ClientFigures], list[str], list[ClientFigures], bool]:
        """(figures to write, client ids gone, the slowest clients, whether the write
        replaces every figure) for the open sessions of ``sessions`` now; call
        :meth:`written` once the write succeeded, :meth:`lost` if it failed."""
        full = not self._writes % self.full_every or not self._written
        now: dict[str, tuple[object, ...]] = {}
        changed, busy = [], []
        for session in list(sessions):
            if session.state is SessionState.CLOSED:
                continue
            mark = now[session.client_id] = signature(session)
            if full or self._written.get(session.client_id) != mark:
                figures = figures_of(session, node_id, at_ms)
                changed.append(figures)
                if figures.queued or figures.dropped:
                    busy.append(figures)
            elif session.pending() or session.dropped or session.losses:  # (a candidate)
                busy.append(figures_of(session, node_id, at_ms))
        gone = [] if full else [client for client in self._written if client not in now]
        self._pending = now
        return changed, gone, slowest(busy), full

    def written(self) -> None:
        self._written, self._pending = self._pending, {}
        self._writes += 1

    def lost(self) -> None:
        self._written, self._pending, self._writes = {}, {}, 0


def slowest(figures: Iterable[ClientFigures], count: int = SLOWEST) -> list[ClientFigures]:
    """The ``count`` clients with most queued (copies, in memory) and the ``count`` with
    most dropped that dropped any, each once, most queued first."""
    every = list(figures)
    queued = heapq.nlargest(count, (f for f in every if f.queued), key=lambda f: f.queued)
    dropped = heapq.nlargest(count, (f for f in every if f.dropped), key=lambda f: f.dropped)
    chosen = {f.client_id: f for f in (*queued, *dropped)}
    return sorted(chosen.values(), key=lambda f: (-f.queued, -f.dropped, f.client_id))


class DropRates:
    """A node's drop counters between two samples, as rates a second."""

    def __init__(self) -> None:
        self._last: tuple[float, dict[str, int]] | None = None

    def sample(
        self, now: float, stats: Mapping[str, int]
    ) -> tuple[dict[str, int], dict[str, float]]:
        """The totals of :data:`NODE_DROP_REASONS` in ``stats`` and their rates since the
        previous sample (0 at the first, and for a counter that went down)."""
        totals = {reason: int(stats.get(reason, 0)) for reason in NODE_DROP_REASONS}
        rates = dict.fromkeys(NODE_DROP_REASONS, 0.0)
        if self._last is not None and now > self._last[0]:
            then, before = self._last
            for reason, total in totals.items():
                rates[reason] = max(0, total - before[reason]) / (now - then)
        self._last = (now, totals)
        return totals, rates
