"""Node route sets in Redis: which filters each node is interested in, and a log of changes.

Each node is the single writer of its own route set (like EMQX's per-node route tables);
every other node reads it to mirror the cluster-wide route table. All keys of one node carry
its hash tag, so every script below runs on one slot::

    rt:{n:ID}:routes   hash    route -> member count
    rt:{n:ID}:stream   stream  one entry per effective change, id VERSION-0, fields r, n
    rt:{n:ID}:meta     hash    incarnation, generation, version

A *route* is a plain filter (count 1 while the node has a local subscriber) or a share
group ``$share/g/F`` whose count is the node's number of members in the group. Count 0
removes a route.

Writer's life (one node process, identified by an *incarnation* id):

* :meth:`RouteStore.claim` when it starts: drops the routes of a previous incarnation and
  stores its initial routes, under a new *generation* with version 0;
* :meth:`RouteStore.apply` for each batch of local refcount changes (0->1, 1->0, member
  count changes). A batch is coalesced (last change of a route wins); each change that
  alters the route set increments the version by exactly one and is appended to the stream,
  which is trimmed to an exact maximum length so memory stays bounded. A write by an older
  incarnation raises :class:`StaleIncarnationError`; a write after the route set vanished
  (purged as dead, Redis restarted) raises :class:`RouteSetMissingError`: claim again and
  republish every route.

Reader's life: :meth:`RouteStore.snapshot` (routes + generation + version: one script for a
small set; a large one in HSCAN pages, caught up with the stream to one version), then
:meth:`RouteStore.changes` after that version, in order. When the reader cannot continue (it
fell behind the trim point, the stream vanished, the route set was claimed again or purged)
:meth:`~RouteStore.changes` raises :class:`ResyncRequiredError`: take a new snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from router.core.topics import TopicFilter, parse_shared, validate_filter
from router.errors import CorruptStateError, InvalidIdError, InvalidTopicError, ResyncRequiredError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.scripts import RedisClient, Scripts

log = logging.getLogger(__name__)

DEFAULT_STREAM_LENGTH: Final = 10_000
SNAPSHOT_PAGE: Final = 1_000  # routes one call reads (inline, or one HSCAN page)
SNAPSHOT_ATTEMPTS: Final = 5
MAX_ROUTE_COUNT: Final = 10**15 - 1  # Lua numbers stay exact far beyond this


class RouteChange(NamedTuple):
    """One effective change of a route set: the route's count became ``members`` (0: removed)."""

    version: int
    route: TopicFilter
    members: int


class RouteSnapshot(NamedTuple):
    """A node's whole route set and the stream position it corresponds to.

    ``generation`` and ``incarnation`` are None when the node has no route set; follow it
    with ``changes(node, snapshot.generation, snapshot.version)``. ``first_version`` is the
    oldest change still in the stream (0 when the stream is empty).
    """

    node_id: str
    incarnation: str | None
    generation: str | None
    version: int
    first_version: int
    routes: dict[TopicFilter, int]


class RouteChanges(NamedTuple):
    """Changes after a reader's version, in order; ``version`` is the route set's current one."""

    version: int
    changes: list[RouteChange]


class Claim(NamedTuple):
    """A claimed route set: its new generation and how many routes of the old one were dropped."""

    generation: str
    dropped: int


class PurgeResult(NamedTuple):
    """What a purge did: ``status`` is ``purged``, ``absent`` or ``skipped`` (newer owner)."""

    node_id: str
    status: str
    routes: int


def check_route(route: str, count: int) -> tuple[TopicFilter, int]:
    """Return ``(route, count)`` if they can be stored, else raise.

    A plain filter takes count 0 or 1, a share group ``$share/g/F`` any count
    0..MAX_ROUTE_COUNT. Raises :class:`InvalidTopicError` for an invalid filter and
    :class:`InvalidIdError` for a bad count.
    """
    checked = validate_filter(route)
    if type(count) is not int or not 0 <= count <= MAX_ROUTE_COUNT:
        raise InvalidIdError(f"a route count is an int 0..{MAX_ROUTE_COUNT}, not {count!r}")
    if count > 1 and parse_shared(route) is None:
        raise InvalidIdError(f"a plain filter route has count 0 or 1, not {count}")
    return checked, count


def coalesce(changes: Iterable[tuple[str, int]]) -> dict[TopicFilter, int]:
    """Validate a batch of (route, count) changes and keep the last one of each route."""
    last: dict[TopicFilter, int] = {}
    for change in changes:
        route, count = check_route(*change)
        last.pop(route, None)  # keep the order of the last changes
        last[route] = count
    return last


def _route(value: Any) -> TopicFilter:
    """A route read from Redis: validated as it enters the process (another node wrote
    it, or someone else did); :class:`CorruptStateError` if it is not a filter."""
    text = _text(value, "route")
    try:
        return validate_filter(text)
    except InvalidTopicError as exc:
        raise CorruptStateError(f"a stored route is not a topic filter: {exc}") from None


def _text(value: Any, what: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored {what} is not UTF-8 text: {value!r}") from None


def _count(value: Any) -> int:
    text = _text(value, "route count")
    if not text.isascii() or not text.isdigit():
        raise CorruptStateError(f"a stored route count is not an integer: {value!r}")
    return int(text)


class RouteStore:
    """Route sets of all nodes in one Redis (or Redis Cluster)."""

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys | None = None,
        *,
        stream_length: int = DEFAULT_STREAM_LENGTH,
    ) -> None:
        if type(stream_length) is not int or stream_length < 1:
            raise ValueError(f"stream_length must be a positive int, not {stream_length!r}")
        self.redis = redis
        self.keys = keys if keys is not None else Keys()
        self.stream_length = stream_length
        self._scripts = Scripts(redis)

    def node_keys(self, node_id: str) -> list[str]:
        """The node's routes, stream and meta keys (the KEYS of most route scripts)."""
        return [
            self.keys.node_routes(node_id),
            self.keys.node_stream(node_id),
            self.keys.node_meta(node_id),
        ]

    # -- the writer (the node itself) ------------------------------------------------

    async def claim(
        self,
        node_id: str,
        incarnation: str,
        routes: Mapping[TopicFilter, int] | Mapping[str, int] | None = None,
    ) -> Claim:
        """Start the node's route set afresh for ``incarnation`` with ``routes`` (count >= 1).

        Whatever was stored before (a previous incarnation's routes) is dropped; readers
        see a new generation and resync. Raises on invalid routes; nothing changes then.
        """
        check_id(incarnation, "incarnation")
        args: list[Any] = [incarnation]
        for route, count in (routes or {}).items():
            check_route(route, count)
            if count < 1:
                raise InvalidIdError(f"a claimed route needs a count >= 1, not {count}")
            args += [route, count]
        generation, dropped = await self._scripts.run("route_claim", self.node_keys(node_id), args)
        return Claim(_text(generation, "generation"), int(dropped))

    async def apply(
        self, node_id: str, incarnation: str, changes: Iterable[tuple[str, int]]
    ) -> list[RouteChange]:
        """Apply a batch of (route, count) changes in one script; return the effective ones.

        The batch is coalesced first (last change of a route wins). Changes that leave a
        route as it was are not logged. Raises :class:`StaleIncarnationError`,
        :class:`RouteSetMissingError`, or an input error; nothing changes then.
        """
        return await self.write(node_id, incarnation, coalesce(changes))

    async def write(
        self, node_id: str, incarnation: str, batch: Mapping[TopicFilter, int]
    ) -> list[RouteChange]:
        """:meth:`apply` for a coalesced batch of routes validated where they entered
        (the node's subscriptions) with counts that fit them (the node's own counts)."""
        check_id(incarnation, "incarnation")
        if not batch:
            check_id(node_id, "node id")
            return []
        args: list[Any] = [incarnation, self.stream_length]
        for route, count in batch.items():
            args += [route, count]
        _version, *versions = await self._scripts.run("route_apply", self.node_keys(node_id), args)
        return [
            RouteChange(int(version), route, count)
            for (route, count), version in zip(batch.items(), versions, strict=True)
            if int(version)
        ]

    async def add(self, node_id: str, incarnation: str, route: str, count: int = 1) -> bool:
        """Set one route (a filter, or a share group with its member count); True if it changed."""
        return bool(await self.apply(node_id, incarnation, [(route, count)]))

    async def remove(self, node_id: str, incarnation: str, route: str) -> bool:
        """Remove one route; True if it was there."""
        return bool(await self.apply(node_id, incarnation, [(route, 0)]))

    # -- readers (every node) --------------------------------------------------------

    async def snapshot(self, node_id: str, *, page: int = SNAPSHOT_PAGE) -> RouteSnapshot:
        """The node's routes with the generation and version they correspond to.

        A set of at most ``page`` routes is read by one script. A larger one is read in
        pages (HSCAN, ``page`` routes a call: Redis is never busy with all of it at once),
        then brought to one version with the changes written meanwhile from the stream: a
        route unchanged since the first read was seen as it is, a changed one takes its
        last change. Should the set be claimed again or the stream trimmed past the read
        in the meantime, the read starts over (at most :data:`SNAPSHOT_ATTEMPTS` times,
        then :class:`ResyncRequiredError` with reason ``"churn"``).
        """
        if type(page) is not int or page < 1:
            raise InvalidIdError(f"a snapshot page is a positive int, not {page!r}")
        for _ in range(SNAPSHOT_ATTEMPTS):
            reply = await self._scripts.run("route_snapshot", self.node_keys(node_id), [page])
            incarnation, generation, version, first, size, *flat = reply
            version = int(version)
            routes = {_route(flat[i]): _count(flat[i + 1]) for i in range(0, len(flat), 2)}
            generation = None if generation is None else _text(generation, "generation")
            if int(size) > page and generation is not None:
                try:
                    version, routes = await self._read_paged(node_id, generation, version, page)
                except ResyncRequiredError as exc:
                    log.info("paged route snapshot of node %s starts over: %s", node_id, exc)
                    continue
            return RouteSnapshot(
                node_id=node_id,
                incarnation=None if incarnation is None else _text(incarnation, "incarnation"),
                generation=generation,
                version=version,
                first_version=int(first),
                routes=routes,
            )
        raise ResyncRequiredError("churn")

    async def _read_paged(
        self, node_id: str, generation: str, version: int, page: int
    ) -> tuple[int, dict[TopicFilter, int]]:
        """The routes read by HSCAN after ``version``, caught up with the stream; the
        version they then correspond to (raises ResyncRequiredError like :meth:`changes`)."""
        routes: dict[TopicFilter, int] = {}
        with translating:
            async for route, count in self.redis.hscan_iter(
                self.keys.node_routes(node_id), count=page
            ):
                routes[_route(route)] = _count(count)
        while True:
            caught = await self.changes(node_id, generation, version, limit=page)
            if not caught.changes:
                return version, routes
            for change in caught.changes:
                if change.members:
                    routes[change.route] = change.members
                else:
                    routes.pop(change.route, None)
            version = caught.changes[-1].version

    async def changes(
        self, node_id: str, generation: str | None, version: int, *, limit: int = 1000
    ) -> RouteChanges:
        """The node's changes after ``version`` of ``generation``, oldest first, at most ``limit``.

        An empty list means the reader is up to date. Raises :class:`ResyncRequiredError`
        (with ``reason``) when the reader must take a new snapshot instead.
        """
        if type(version) is not int or version < 0:
            raise InvalidIdError(f"a route version is an int >= 0, not {version!r}")
        if type(limit) is not int or limit < 1:
            raise InvalidIdError(f"a change limit is a positive int, not {limit!r}")
        if generation is not None:
            check_id(generation, "generation")
        keys = [self.keys.node_stream(node_id), self.keys.node_meta(node_id)]
        args = [generation or "", version, limit]
        status, *rest = await self._scripts.run("route_changes", keys, args)
        if status == b"resync":
            raise ResyncRequiredError(_text(rest[0], "reason"))
        current, *flat = rest
        changes = [
            RouteChange(int(flat[i]), _route(flat[i + 1]), _count(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]
        return RouteChanges(int(current), changes)

    # -- cleanup (any node) ----------------------------------------------------------

    async def purge(self, node_id: str, incarnation: str | None = None) -> PurgeResult:
        """Delete the node's routes, stream and meta in one script (idempotent).

        With ``incarnation``, a route set claimed by another incarnation is left alone
        (status ``skipped``). The registry is separate: see :mod:`router.state.node_registry`.
        """
        if incarnation is not None:
            check_id(incarnation, "incarnation")
        status, routes = await self._scripts.run(
            "route_purge", self.node_keys(node_id), [incarnation or ""]
        )
        return PurgeResult(node_id, _text(status, "status"), int(routes))
