"""When a subscription takes effect: in arrival order on a node, everywhere once acknowledged.

Two guarantees, and the two mechanisms behind them:

1. **Arrival order on one node** (:class:`ArrivalOrder`). A SUBSCRIBE or UNSUBSCRIBE that
   the node received before a PUBLISH (from any connection) applies to it, as on
   mosquitto. A subscription changes local state only after Redis took it (the client's
   subscriptions, then the node's route set), so a change is *open* from the moment it is
   admitted (for an MQTT client, the moment the node read its bytes:
   :mod:`router.mqtt.subscribing`) until the node's own trie and route mirror hold it;
   a publish that arrives while changes are open waits for those (and only those)
   before it is matched. With no change open a publish pays one attribute read.
2. **SUBACK means subscribed, cluster-wide** (:class:`RouteVisibility`). Once a node
   acknowledges a subscription, every PUBLISH that any node receives afterwards is routed
   to it. Other nodes learn a node's route changes from its change stream; each of them
   acks how far its mirror holds the node's route set (:mod:`router.state.route_acks`),
   and a subscribe waits until every other live node acked the node's latest written
   route version before the SUBACK goes. The wait is bounded (the liveness TTL: a node
   silent for that long is about to be purged as dead); a wait that ends unconfirmed is
   counted (``subscribe_unconfirmed``) and logged with the nodes that lagged. A
   subscribe that changes no route waits too while an earlier change (another client's
   subscribe of the same filter) is not acked yet; in steady state nothing is pending
   and a subscribe does not wait at all. A mirror acks a change only once the publishes
   it matched before the change have their copies stored (:class:`ForwardsInFlight`),
   so an ack is also a fence: nothing routed by the old routes is still on its way.

The peers waited for are the nodes this node knows. It hears of a join by a hint; when
its hints connection failed (a Redis restart loses every hint in flight, and a join with
them), it lists the registry again before it relies on whom it knows
(:meth:`~router.cluster.mirror_sync.MirrorSync.ensure_current`).

What it does not cover: a node that joined the cluster a moment before the wait began,
while its join hint was still on its way to this node (it loads the route sets when it
starts, so it holds the route unless it read this node's routes before the change and
their hint was lost; the periodic refresh catches it up within an interval). An
UNSUBSCRIBE needs no cluster-wide wait: copies that still reach the node are matched
against its own trie, which no longer holds the subscription, and are counted as
unmatched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator

from router.errors import StateFailureError
from router.state.route_acks import RouteAck, RouteAcks

log = logging.getLogger(__name__)


class InFlight:
    """Work under way, each piece opened (:meth:`open`) and closed exactly once
    (:meth:`close`); :meth:`settled` waits for the pieces open when it is called, never
    for later ones."""

    def __init__(self) -> None:
        self._open: set[asyncio.Future[None]] = set()

    @property
    def pending(self) -> bool:
        """True while some piece is open."""
        return bool(self._open)

    def open(self) -> asyncio.Future[None]:
        """Open a piece; the returned handle is given back to :meth:`close`."""
        piece: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._open.add(piece)
        return piece

    def close(self, piece: asyncio.Future[None]) -> None:
        """The piece is done (or failed): :meth:`settled` stops waiting for it."""
        self._open.discard(piece)
        if not piece.done():
            piece.set_result(None)

    @contextlib.contextmanager
    def applying(self) -> Iterator[None]:
        """Open a piece for the duration of the block (closed however it ends)."""
        piece = self.open()
        try:
            yield
        finally:
            self.close(piece)

    def snapshot(self) -> list[asyncio.Future[None]]:
        """The pieces open now (each done once closed)."""
        return list(self._open)

    async def settled(self) -> None:
        """Return once every piece open now is closed (later ones are not waited for)."""
        if pieces := self.snapshot():
            await asyncio.wait(pieces)


class ArrivalOrder(InFlight):
    """The subscription changes a node has admitted and not yet applied locally.

    A change is opened when it is admitted (:meth:`open`; an MQTT listener opens one the
    moment it reads a SUBSCRIBE or UNSUBSCRIBE, :mod:`router.mqtt.subscribing`) and
    closed once the node's trie and route mirror hold it, or it failed (:meth:`close`,
    exactly once). Changes are numbered in the order they open (:meth:`number`). A
    publish waits for the changes open when it is handled (:meth:`settled`), or, given
    ``before``, only for those numbered below it: a connection passes the number of its
    own oldest change still open, so that its PUBLISH never waits for its own SUBSCRIBE
    read after it. Every wait then points at changes opened earlier, and no set of
    connections can wait on each other in a circle; whoever opens a change must still
    never wait for a publish before closing it.

    A change may say which topics it can concern: the first levels of its filters
    (:func:`first_levels`; None: any topic, a filter that starts with a wildcard). A
    publish given its topics waits only for the changes that can concern one of them: a
    client subscribing thousands of filters under ``hoard/`` holds up no publish to
    ``sensors/`` while the node writes them.
    """

    def __init__(self) -> None:
        super().__init__()
        self._numbers: dict[asyncio.Future[None], tuple[int, frozenset[str] | None]] = {}
        self._next = 0

    def open(self, scope: frozenset[str] | None = None) -> asyncio.Future[None]:
        """Open a change concerning the topics whose first level is in ``scope`` (None:
        any topic)."""
        piece = super().open()
        self._numbers[piece] = (self._next, scope)
        self._next += 1
        return piece

    def close(self, piece: asyncio.Future[None]) -> None:
        self._numbers.pop(piece, None)
        super().close(piece)

    def number(self, piece: asyncio.Future[None]) -> int:
        """The order in which the open ``piece`` was opened (KeyError once closed)."""
        return self._numbers[piece][0]

    async def settled(self, before: int | None = None, topics: Iterable[str] | None = None) -> None:
        """Return once every change open now (numbered below ``before``, if given; that
        can concern one of ``topics``, if given) is closed; later ones are not waited
        for."""
        if before is None and topics is None:
            await super().settled()
            return
        limit = self._next if before is None else before
        levels = None if topics is None else {topic.split("/", 1)[0] for topic in topics}
        if pieces := [
            piece
            for piece, (number, scope) in self._numbers.items()
            if number < limit and (scope is None or levels is None or not scope.isdisjoint(levels))
        ]:
            await asyncio.wait(pieces)


def first_levels(filters: Iterable[str]) -> frozenset[str] | None:
    """The first levels of the topics ``filters`` can match (a shared subscription's
    filter, after ``$share/GROUP/``), or None when one starts with a wildcard (any
    topic)."""
    levels = set()
    for given in filters:
        topic_filter = given
        if given.startswith("$share/"):
            topic_filter = given.split("/", 2)[2] if given.count("/") >= 2 else ""
        first = topic_filter.split("/", 1)[0]
        if first in ("+", "#"):
            return None
        levels.add(first)
    return frozenset(levels)


class ForwardsInFlight(InFlight):
    """The publishes a node matched against its route mirror whose copies are not yet in
    the other nodes' inboxes (each opened right after its match, closed once its copies
    are stored or its forward failed).

    A mirror that applied a change waits for those open then (:meth:`snapshot`) before
    it acks the change: an ack then also says that no copy matched against the routes before the
    change is still on its way. A node that adopts a dead node's sessions relies on
    this: once every mirror acked the adopted routes, the dead node's inbox holds every
    copy routed there for them, and it can be read without a grace.
    """


async def _known() -> None:
    """The peers a node knows are all there are (a writer without a membership view)."""


class RouteVisibility:
    """A writer node's view of how far the other nodes' mirrors hold its route set."""

    def __init__(
        self,
        acks: RouteAcks,
        node_id: str,
        peers: Callable[[], Iterable[str]],
        timeout: float,
        poll: float = 0.2,
        know_peers: Callable[[], Awaitable[None]] = _known,
    ) -> None:
        self._acks = acks
        self._node_id = node_id
        self._peers = peers
        self._know_peers = know_peers
        self.timeout = timeout
        self._poll = poll
        self._generations: dict[str, int] = {}  # generation -> its order here
        self._target: tuple[str, int] | None = None  # the latest written (generation, version)
        self._seen: dict[str, tuple[str, int]] = {}
        self._acked = asyncio.Event()
        self.waited = 0  # subscribes that waited for acks and got them
        self.unconfirmed = 0  # subscribes whose wait ended at the timeout

    def written(self, generation: str, version: int) -> None:
        """The node's route set is durable in Redis at ``version`` of ``generation``."""
        if generation not in self._generations:
            self._generations[generation] = len(self._generations)
            if len(self._generations) > 64:  # (only the latest few matter)
                oldest = min(self._generations, key=self._generations.__getitem__)
                del self._generations[oldest]
        target = self._target
        if target is None or target[0] != generation or target[1] < version:
            self._target = (generation, version)

    def on_ack(self, ack: RouteAck) -> None:
        """A reader said how far it holds this node's routes (from the acks channel)."""
        self._seen[ack.reader] = (ack.generation, ack.version)
        self._acked.set()

    def _holds(self, reader: str, target: tuple[str, int]) -> bool:
        seen = self._seen.get(reader)
        if seen is None:
            return False
        if seen[0] == target[0]:
            return seen[1] >= target[1]
        order = self._generations.get(seen[0])
        return order is not None and order > self._generations.get(target[0], -1)

    def lagging(self, target: tuple[str, int] | None = None) -> list[str]:
        """The live peers whose mirrors do not hold ``target`` (default: the latest)."""
        target = target or self._target
        if target is None:
            return []
        here = self._node_id
        return sorted(p for p in self._peers() if p != here and not self._holds(p, target))

    async def confirm(self) -> bool:
        """Wait until every other live node's mirror holds what this node has written so
        far; True when they do, False when ``timeout`` seconds passed first (counted).
        The peers waited for are those this node knows once ``know_peers`` returned
        (within the same timeout; a failure of Redis there leaves the peers known)."""
        target = self._target
        if target is None:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        await self._know_peers_within(self.timeout)
        if not self.lagging(target):
            return True
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                lagging = self.lagging(target)
                if not lagging:
                    break
                self.unconfirmed += 1
                log.warning(
                    "route change %s:%d of node %s not acked by %s within %.1f s",
                    target[0],
                    target[1],
                    self._node_id,
                    ", ".join(lagging),
                    self.timeout,
                )
                return False
            self._acked.clear()
            try:
                async with asyncio.timeout(min(self._poll, remaining)):
                    await self._acked.wait()
            except TimeoutError:
                await self._reread()
            if not self.lagging(target):
                break
        self.waited += 1
        return True

    async def _know_peers_within(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._know_peers()
        except (TimeoutError, StateFailureError) as exc:
            log.warning(
                "node %s could not list its peers (%r): waiting for those it knows",
                self._node_id,
                exc,
            )

    async def _reread(self) -> None:
        """Read the acks hash: an ack on the channel may have been lost."""
        try:
            stored = await self._acks.read(self._node_id)
        except StateFailureError as exc:
            log.debug("reading route acks of %s failed: %r", self._node_id, exc)
            return
        for reader, seen in stored.items():
            known = self._seen.get(reader)
            if known is None or self._newer(seen, known):
                self._seen[reader] = seen

    def _newer(self, one: tuple[str, int], other: tuple[str, int]) -> bool:
        if one[0] == other[0]:
            return one[1] > other[1]
        return self._generations.get(one[0], -1) > self._generations.get(other[0], -1)

    def stats(self) -> dict[str, int]:
        return {
            "subscribe_waited": self.waited,
            "subscribe_unconfirmed": self.unconfirmed,
        }
