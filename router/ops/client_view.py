"""Operator views of clients (``router clients``): their sessions, and the kick.

Every client attached to a node (MQTT or the embedding API) has a session hash in Redis,
and so has every persistent session whose client is away, until it expires
(:mod:`router.state.session_store`). Clients have no index: :func:`client_rows` finds
their session hashes by SCAN (every primary of a cluster), bounded by ``limit``. For each
session a row says::

    client   node   protocol  state      since (UTC)           keepalive  subs  queued  expires in
    sensor1  a      5.0       connected  2025-05-01T10:00:00Z  60         2     0       -
    logger   b      3.1.1     away       2025-05-01T09:58:12Z  30         1     17      184
    forever  a      5.0       away       2025-05-01T09:00:00Z  60         1     3       never

``queued`` is what waits for the client: in its node's memory (``queued_memory``, from
the figures its node publishes each telemetry interval, :mod:`router.ops.figures_view`;
None when unknown) and in its Redis queue while it is away (``queued_redis``).
``expires in`` is the seconds an away session has left, ``expiry - (now - since)``, where
``since`` is the server time it went away and ``now`` the registry's server time, read
once for all rows.

A kick (:func:`kick_client`) leaves a :class:`~router.cluster.inbox.Kick` notice in the
inbox of the node that serves the client; that node ends the connection (MQTT 5:
DISCONNECT 0x98, administrative action) and a persistent session stays, as after any
disconnect. Only a connected client on a live node is kicked: a notice for a dead node
would wait in its inbox and end a later connection of the same client after a restart.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from router.cluster.config import NodeConfig
from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Kick
from router.cluster.node import RouterNode
from router.core.options import SubscriptionOptions
from router.errors import ClientNotFoundError, SessionInUseError
from router.ops.figures_view import client_figures
from router.state.client_figures import ClientFigures
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.reads import server_ms
from router.state.scripts import RedisClient
from router.state.session_queue import SessionQueue
from router.state.session_store import NEVER, SessionInfo, SessionStore
from router.state.subscriptions import SubscriptionStore

#: Sessions found by SCAN at most, unless the caller says otherwise.
DEFAULT_LIMIT: Final = 10_000
#: How a session's protocol level is shown (0: a client of the embedding API).
PROTOCOLS: Final = {0: "api", 3: "3.1", 4: "3.1.1", 5: "5.0"}
#: What :class:`ClientFilter` takes as a state, and as a protocol.
STATE_NAMES: Final = ("connected", "away")
PROTOCOL_NAMES: Final = tuple(PROTOCOLS.values())
#: Seconds a kick notice may wait in an inbox: the nodes' default inbox expiry.
KICK_EXPIRE: Final = NodeConfig.inbox_expire
#: Away sessions whose queues are read at once.
_CONCURRENT: Final = 64

ExpiresIn = int | Literal["never"] | None


def protocol_name(level: int) -> str:
    """``"5.0"``, ``"3.1.1"``, ``"3.1"`` or ``"api"`` (level 0); other levels as a number."""
    return PROTOCOLS.get(level, str(level))


def iso_time(ms: int) -> str:
    """Server milliseconds as an ISO 8601 UTC time to the second (``...T10:00:00Z``)."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def expires_in(info: SessionInfo, now_ms: int) -> ExpiresIn:
    """The seconds an away session has left (rounded up, at least 0), ``"never"`` for a
    session that never expires, None for a connected one (it does not count down)."""
    if info.connected:
        return None
    if info.expiry >= NEVER:
        return "never"
    left_ms = info.expiry * 1000 - (now_ms - info.since)
    return max(0, -(-left_ms // 1000))


@dataclass(frozen=True)
class ClientRow:
    """One session as ``router clients`` lists it (see the module docstring).

    ``node_alive`` is False when the node named in the session no longer heartbeats (a
    connected session there is stale: it ends when its keys expire or a node takes the
    client over). ``expiry`` is the Session Expiry Interval (:data:`NEVER`: never).
    """

    client_id: str
    node_id: str
    node_alive: bool
    protocol: str
    connected: bool
    since_ms: int
    keepalive: int
    subscriptions: int
    queued: int
    expiry: int
    expires_in: ExpiresIn
    username: str | None = None
    queued_redis: int = 0
    queued_memory: int | None = None  # (None: its node published no figures)

    @property
    def state(self) -> str:
        return "connected" if self.connected else "away"

    @property
    def since(self) -> str:
        return iso_time(self.since_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "node": self.node_id,
            "node_alive": self.node_alive,
            "protocol": self.protocol,
            "state": self.state,
            "since": self.since,
            "since_ms": self.since_ms,
            "keepalive": self.keepalive,
            "subscriptions": self.subscriptions,
            "queued": self.queued,
            "queued_memory": self.queued_memory,
            "queued_redis": self.queued_redis,
            "expiry": self.expiry,
            "expires_in": self.expires_in,
            "user": self.username,
        }


@dataclass(frozen=True)
class ClientDetail:
    """One session with its filters (sorted) and their options, the username it
    connected with (None: none), the inbound QoS 2 packet ids awaiting PUBREL and the
    figures its node published last (None: none, :mod:`router.ops.figures_view`)."""

    row: ClientRow
    username: str | None
    filters: dict[str, SubscriptionOptions]
    awaiting_release: tuple[int, ...]
    figures: ClientFigures | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.row.as_dict(),
            "username": self.username,
            "awaiting_release": list(self.awaiting_release),
            "filters": [{"filter": f, **o.as_dict()} for f, o in self.filters.items()],
            "figures": None if self.figures is None else self.figures.as_dict(),
        }


@dataclass(frozen=True)
class KickSent:
    """A kick notice stored in ``node_id``'s inbox for ``client_id`` (``protocol`` as
    :func:`protocol_name` shows it)."""

    client_id: str
    node_id: str
    protocol: str

    def as_dict(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "node": self.node_id, "protocol": self.protocol}


# -- reading -----------------------------------------------------------------------------


async def _clock(redis: RedisClient, keys: Keys) -> tuple[int, set[str]]:
    """The registry's server time (ms) and the ids of the live nodes."""
    found = await NodeRegistry(redis, keys).nodes()
    if not found:
        return await server_ms(redis), set()
    return found[0].now_ms, {info.node_id for info in found if info.alive}


async def _backlog(redis: RedisClient, keys: Keys, info: SessionInfo) -> int:
    if info.connected:
        return 0
    queue = SessionQueue(redis, keys, info.client_id, info.expiry)
    try:
        return await queue.backlog()
    finally:
        await queue.aclose()


async def _backlogs(redis: RedisClient, keys: Keys, infos: Sequence[SessionInfo]) -> list[int]:
    found: list[int] = []
    for start in range(0, len(infos), _CONCURRENT):
        chunk = infos[start : start + _CONCURRENT]
        found += await asyncio.gather(*(_backlog(redis, keys, info) for info in chunk))
    return found


async def _rows(
    redis: RedisClient,
    keys: Keys,
    infos: Sequence[SessionInfo],
    now_ms: int,
    alive: set[str],
    figures: dict[str, ClientFigures] | None = None,
) -> list[ClientRow]:
    store = SubscriptionStore(redis, keys)
    counts = await store.subscription_counts([info.client_id for info in infos])
    queued = await _backlogs(redis, keys, infos)
    if figures is None:
        figures = await client_figures(redis, keys, infos, alive)
    memory = {client_id: f.queued for client_id, f in figures.items()}
    return [
        ClientRow(
            info.client_id,
            info.node_id,
            info.node_id in alive,
            protocol_name(info.protocol),
            info.connected,
            info.since,
            info.keepalive,
            count,
            waiting + memory.get(info.client_id, 0),
            info.expiry,
            expires_in(info, now_ms),
            info.username,
            waiting,
            memory.get(info.client_id),
        )
        for info, count, waiting in zip(infos, counts, queued, strict=True)
    ]


@dataclass(frozen=True)
class ClientFilter:
    """Which sessions a :func:`client_page` shows (None: any)."""

    prefix: str | None = None  # of the client id
    user: str | None = None  # the user name it connected with, exactly
    node_id: str | None = None
    state: Literal["connected", "away"] | None = None
    protocol: str | None = None  # as :func:`protocol_name` shows it

    @property
    def reads_sessions(self) -> bool:
        """Whether a session must be read to know (more than the id's prefix is asked)."""
        return any(v is not None for v in (self.user, self.node_id, self.state, self.protocol))

    def by_id(self, client_id: str, after: str | None) -> bool:
        return (after is None or client_id > after) and (
            self.prefix is None or client_id.startswith(self.prefix)
        )

    def by_session(self, info: SessionInfo) -> bool:
        return (
            (self.user is None or info.username == self.user)
            and (self.node_id is None or info.node_id == self.node_id)
            and (self.state is None or (info.connected == (self.state == "connected")))
            and (self.protocol is None or protocol_name(info.protocol) == self.protocol)
        )


async def client_rows(
    redis: RedisClient,
    keys: Keys,
    which: ClientFilter = ClientFilter(),
    *,
    limit: int = DEFAULT_LIMIT,
    page: int = 1,
) -> tuple[list[ClientRow], bool]:
    """Page ``page`` of the sessions (connected and away) that ``which`` shows, in
    client-id order, ``limit`` a page. Every session is read with a paged SCAN (no cap on
    their number, no command that blocks Redis on a large keyspace; each session is read
    too when ``which`` asks more than an id prefix); only the ids up to the page's end
    are kept. Returns the page's rows and whether no session follows them. Raises
    :class:`InvalidIdError` for an unusable node id, :class:`CorruptStateError` for a
    session hash the router did not write, ``ValueError`` for a limit or page below 1."""
    if limit < 1 or page < 1:
        raise ValueError(f"limit and page are at least 1, not {limit!r} and {page!r}")
    if which.node_id is not None:
        check_id(which.node_id, "node id")
    store = SessionStore(redis, keys, SubscriptionStore(redis, keys))
    keep = page * limit + 1  # (one more than the page's end: whether any follows)
    kept: set[str] = set()  # (a set: SCAN may return a key twice)
    async for found in store.client_id_pages():
        ids = [client_id for client_id in found if which.by_id(client_id, None)]
        if not which.reads_sessions:
            kept.update(ids)
        elif ids:
            each = await store.describe_many(ids)
            kept.update(i.client_id for i in each if i is not None and which.by_session(i))
        if len(kept) > 2 * keep:  # (bounded memory, whatever the number of sessions)
            kept = set(heapq.nsmallest(keep, kept))
    ordered = heapq.nsmallest(keep, kept)
    described = await store.describe_many(ordered[(page - 1) * limit : page * limit])
    # (ended, or changed to pass the filters no more, since the scan: left out)
    shown = [i for i in described if i is not None and which.by_session(i)]
    now_ms, alive = await _clock(redis, keys)
    return await _rows(redis, keys, shown, now_ms, alive), len(ordered) <= page * limit


async def client_page(
    redis: RedisClient,
    keys: Keys,
    which: ClientFilter = ClientFilter(),
    *,
    after: str | None = None,
    limit: int = 100,
) -> tuple[list[ClientRow], str | None]:
    """Up to ``limit`` sessions that ``which`` shows, in client-id order after ``after``;
    and the id to go on after (None: no more). Each round reads every session id with a
    paged SCAN and keeps only the smallest few past ``after`` (bounded memory, no command
    that blocks Redis); sessions are then read in that order until the page is full.
    Raises ``ValueError`` for a limit below 1."""
    if limit < 1:
        raise ValueError(f"limit is at least 1, not {limit!r}")
    store = SessionStore(redis, keys, SubscriptionStore(redis, keys))
    wanted = 4 * limit  # (ids kept a round: some may not pass the session filters)
    shown: list[SessionInfo] = []
    while True:
        kept: set[str] = set()
        async for found in store.client_id_pages():
            kept.update(c for c in found if which.by_id(c, after))
            if len(kept) > 2 * wanted:
                kept = set(heapq.nsmallest(wanted + 1, kept))
        ordered = heapq.nsmallest(wanted + 1, kept)
        candidates, more = ordered[:wanted], len(ordered) > wanted
        for info in await store.describe_many(candidates):
            if info is not None and which.by_session(info):
                shown.append(info)
                if len(shown) == limit + 1:
                    break
        if len(shown) > limit or not more:
            break
        after = candidates[-1]
    now_ms, alive = await _clock(redis, keys)
    rows = await _rows(redis, keys, shown[:limit], now_ms, alive)
    following = rows[-1].client_id if len(shown) > limit else None
    return rows, following


def unknown_client(client_id: str, keys: Keys) -> ClientNotFoundError:
    """The error for a client without a session under ``keys``' prefix (to raise)."""
    return ClientNotFoundError(
        client_id, f"has no session under prefix {keys.prefix!r} (never, or not anymore)"
    )


async def _describe(redis: RedisClient, keys: Keys, client_id: str) -> SessionInfo:
    check_id(client_id, "client id")
    store = SessionStore(redis, keys, SubscriptionStore(redis, keys))
    info = await store.describe(client_id)
    if info is None:
        raise unknown_client(client_id, keys)
    return info


async def client_detail(redis: RedisClient, keys: Keys, client_id: str) -> ClientDetail:
    """One client's session, subscriptions included.

    Raises :class:`ClientNotFoundError` when it has no session (never had, ended or
    expired), :class:`InvalidIdError` for an id that cannot name a client.
    """
    info = await _describe(redis, keys, client_id)
    now_ms, alive = await _clock(redis, keys)
    figures = await client_figures(redis, keys, [info], alive)
    [row] = await _rows(redis, keys, [info], now_ms, alive, figures)
    found = await SubscriptionStore(redis, keys).subscriptions(client_id)
    filters = {f: found[f] for f in sorted(found)}
    return ClientDetail(row, info.username, filters, info.awaiting_release, figures.get(client_id))


# -- the kick ----------------------------------------------------------------------------


async def kick_client(
    redis: RedisClient, keys: Keys, client_id: str, *, expire: float = KICK_EXPIRE
) -> KickSent:
    """Ask the node serving ``client_id`` to end its connection (see the module
    docstring); returns once the notice is in that node's inbox, not when it acted.

    Raises :class:`ClientNotFoundError` when the client has no session, is away, or its
    node is not alive; :class:`InvalidIdError` for an id that cannot name a client.
    """
    info = await _describe(redis, keys, client_id)
    if not info.connected:
        away = iso_time(info.since)
        raise ClientNotFoundError(
            client_id, f"is not connected (its session is away since {away}): nothing to kick"
        )
    _, alive = await _clock(redis, keys)
    if info.node_id not in alive:
        raise ClientNotFoundError(
            client_id,
            f"is not connected: node {info.node_id!r}, which served it, is not alive",
        )
    forwarder = Forwarder(redis, keys, expire)
    try:
        await forwarder.notify(info.node_id, Kick(client_id))
    finally:
        await forwarder.stop()
    return KickSent(client_id, info.node_id, protocol_name(info.protocol))


async def clear_session(node: RouterNode, client_id: str) -> bool:
    """End the session of ``client_id`` wherever it is kept, as a clean start without
    expiry followed by a disconnect on ``node`` would: its subscriptions, queue and
    routes go, on every node. Returns False when it had no session. Raises
    :class:`SessionInUseError` while the client is connected to a live node (kick it
    first), :class:`InvalidIdError` for an id that cannot name a client."""
    check_id(client_id, "client id")
    redis, keys = node.registry.redis, node.keys
    info = await SessionStore(redis, keys, SubscriptionStore(redis, keys)).describe(client_id)
    if info is None:
        return False
    _, alive = await _clock(redis, keys)
    if info.connected and info.node_id in alive:
        raise SessionInUseError(
            f"client {client_id!r} is connected to node {info.node_id!r}: kick it first"
        )
    # (as the user that made it: the session is bound to that user)
    await node.connect(client_id, info.username, clean_start=True, authenticate=False)
    await node.disconnect(client_id)
    return True
