"""Verdicts on the nodes of the cluster, without I/O: the registry's view in, what to do out.

Each round (:mod:`router.cluster.membership`, the driver, lists the registry and does what
is decided here) hands :meth:`PeerVerdicts.judge` every registered node as the registry
saw it at one reading of Redis's clock (``now_ms``): its heartbeat expiry and whether it
*retired* (left gracefully, its persistent sessions left for a live node). Nothing here
reads a clock: a node is judged on Redis server time alone, the one clock every node
shares. The verdicts (:class:`Round`)::

    alive       its heartbeat expires after now_ms and it did not retire
    dead        the rest: its heartbeat expired, or it retired
    told_down   the dead peers found dead for the first time under this incarnation
                (a retired node is never down: it told that it stopped itself)
    purge       the dead to purge now, without adopting anything (this node adopts no
                sessions)
    adopt       the dead whose sessions this node asks the lease to adopt; having won
                it, it adopts them, then purges the node (see :meth:`PeerVerdicts.
                lease_won`); one it holds the lease for already is not asked again

A dead node is taken (purged, or adopted then purged) only when this node may judge:
one that retired whenever ``may_adopt_retired`` (the node runs: a node restarted a
moment ago in a rolling upgrade adopts the next one), any other only while
``may_purge`` (this node is steady: after a stall of Redis every node looks expired for
a moment; :mod:`router.cluster.liveness`). Another node may hold the lease on a dead
node: the driver's ask then fails, and the next round asks again (a lease that ran out,
its holder dead, is taken over).

Between rounds the driver waits :meth:`PeerVerdicts.pause`: an interval, or less when a
live peer's heartbeat would expire sooner (then a dead node's sessions are adopted
without waiting for the next interval).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

#: Refresh intervals an adoption lease lasts unless renewed (the holder renews it each
#: interval).
LEASE_INTERVALS: Final = 10
#: Seconds after a peer's heartbeat would expire that the next round looks at it
#: (Redis's clock and this node's may tick a little apart).
EXPIRY_MARGIN: Final = 0.01
#: The (node, incarnation) pairs told down that are remembered; past it they are
#: forgotten at once (the event's cluster-wide token still tells each once).
TOLD_DOWN_BOUND: Final = 1_000


class Beat(Protocol):
    """A registered node as the registry saw it at Redis time ``now_ms`` (what
    :class:`~router.state.node_registry.NodeInfo` holds)."""

    @property
    def node_id(self) -> str: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def expires_ms(self) -> int: ...
    @property
    def now_ms(self) -> int: ...
    @property
    def retired(self) -> bool: ...


def is_alive(node: Beat) -> bool:
    """True while ``node``'s heartbeat has not expired at Redis time and it did not retire."""
    return node.expires_ms > node.now_ms and not node.retired


@dataclass(frozen=True, slots=True)
class Round:
    """One round's verdicts (see the module docstring); the tuples keep the registry's order."""

    alive: frozenset[str]
    dead: frozenset[str]
    retired: frozenset[str]
    told_down: tuple[Beat, ...]
    purge: tuple[Beat, ...]
    adopt: tuple[Beat, ...]
    #: Seconds until the first other live node's heartbeat expires unless renewed (None:
    #: no other live node).
    next_expiry: float | None


class PeerVerdicts:
    """The verdicts of node ``node_id`` on the nodes of the cluster, round after round.

    ``adopts``: this node adopts the sessions of the dead before it purges them;
    ``interval``: seconds between rounds. It remembers the peers it found dead (told
    down once per incarnation) and the dead whose adoption lease it holds."""

    def __init__(self, node_id: str, interval: float, *, adopts: bool) -> None:
        self.node_id = node_id
        self.interval = interval
        self.adopts = adopts
        #: Seconds an adoption lease lasts unless renewed.
        self.lease = LEASE_INTERVALS * interval
        self._told_down: set[tuple[str, str]] = set()
        self._adopting: set[str] = set()
        self._next_expiry: float | None = None

    def judge(self, nodes: Iterable[Beat], *, may_purge: bool, may_adopt_retired: bool) -> Round:
        """The verdicts on ``nodes`` (one listing of the registry, every node judged at
        the same Redis time); ``may_purge`` and ``may_adopt_retired`` say what this node
        may take now (see the module docstring)."""
        listed = list(nodes)
        dead = [node for node in listed if not is_alive(node)]
        self._next_expiry = min(
            (
                (node.expires_ms - node.now_ms) / 1000
                for node in listed
                if is_alive(node) and node.node_id != self.node_id
            ),
            default=None,
        )
        taken = [
            node
            for node in dead
            if self.may_take(node, may_purge=may_purge, may_adopt_retired=may_adopt_retired)
        ]
        return Round(
            alive=frozenset(node.node_id for node in listed if is_alive(node)),
            dead=frozenset(node.node_id for node in dead),
            retired=frozenset(node.node_id for node in dead if node.retired),
            told_down=tuple(self._newly_down(dead)),
            purge=() if self.adopts else tuple(taken),
            adopt=tuple(n for n in taken if n.node_id not in self._adopting) if self.adopts else (),
            next_expiry=self._next_expiry,
        )

    @staticmethod
    def may_take(node: Beat, *, may_purge: bool, may_adopt_retired: bool) -> bool:
        """Whether this node may adopt and purge ``node``, found not alive: a retired
        node when ``may_adopt_retired``, any other when ``may_purge``. The driver asks
        again once an adoption ended, before its purge."""
        return may_adopt_retired if node.retired else may_purge

    def _newly_down(self, dead: list[Beat]) -> list[Beat]:
        found = []
        for node in dead:
            seen = (node.node_id, node.incarnation)
            if node.node_id == self.node_id or node.retired or seen in self._told_down:
                continue
            if len(self._told_down) > TOLD_DOWN_BOUND:
                self._told_down.clear()
            self._told_down.add(seen)
            found.append(node)
        return found

    def lease_won(self, dead: str) -> None:
        """This node won the lease on adopting ``dead``'s sessions: no round offers it
        again until :meth:`adoption_ended`."""
        self._adopting.add(dead)

    def adoption_ended(self, dead: str) -> None:
        """The adoption of ``dead``'s sessions ended (done, failed or stopped): a round
        that finds it dead again offers it again."""
        self._adopting.discard(dead)

    @property
    def adopting(self) -> frozenset[str]:
        """The dead nodes whose sessions this node adopts now, under its lease."""
        return frozenset(self._adopting)

    def pause(self) -> float:
        """Seconds to wait before the next round: an interval, or until just after the
        first other live node's heartbeat would expire, if sooner (as the last round
        saw it)."""
        expiry = self._next_expiry
        if expiry is not None and expiry < self.interval:
            return max(expiry, 0) + EXPIRY_MARGIN
        return self.interval
