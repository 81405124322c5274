"""Each node's figures of the clients it holds, and its drops by reason, in Redis.

A node keeps its clients' figures in memory, on their sessions (a few ints each:
:mod:`router.cluster.client_stats`), and publishes them every telemetry interval, so
that any node, and the CLI, can show a client of any node. Two keys per node, under the
node's hash tag (one Redis Cluster slot), replaced in one MULTI/EXEC (DEL, HSET,
PEXPIRE) and expiring after a few intervals, so the figures of a node that died vanish
on their own (a node that stops gracefully deletes them)::

    rt:{n:ID}:clients   hash   client id -> msgpack [at_ms, received, received_bytes,
                                 sent, sent_bytes, queued, queued_bytes, inflight,
                                 takeovers, last_activity_ms (0: none), [drops by reason]]
    rt:{n:ID}:drops     hash   "at_ms" -> sample time (Unix ms)
                               "total:REASON" -> count since the node started
                               "rate:REASON" -> a second, over the last interval
                               "slowest" -> msgpack [[client id, packed figures], ...]
                               "busiest" -> msgpack [[topic filter, publishes/s], ...]

A client's drops have the reasons :data:`DROP_REASONS`; a node's those of
:data:`NODE_DROP_REASONS` (its counters of ``node.stats()`` and ``mqtt.stats()``).
Readers look only at the node that a client's session in Redis names, and only while
that node is alive, so a figure of a dead node or of a client that moved is never shown.

Cost: a node writes the field of each client whose figures changed since its last
write (about 60 bytes each), removes those of clients gone, and every 30th write
replaces them all (10,000 clients: 600 KB once a minute; an idle fleet costs nothing
else), and nothing per message. A figure's ``at_ms`` is when its node last wrote it:
it had not changed since.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.errors import CorruptStateError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import read_each
from router.state.scripts import RedisClient

MIN_TTL: Final = 0.001  # seconds; PEXPIRE takes whole milliseconds, at least one
CONCURRENCY: Final = 16  # per-node reads in flight at once
#: Why a client lost copies: its queue in memory was full, they expired before it took
#: them, they were larger than its Maximum Packet Size, its queue in Redis was full while
#: it was away, QoS 0 while it was away (not kept).
DROP_REASONS: Final = ("queue_full", "expired", "oversized", "session_queue_full", "offline_qos0")
#: A node's counters of copies lost (or, ``unrouted``, published to no subscriber).
NODE_DROP_REASONS: Final = (
    "queue_drops",  # a connected client's queue in memory was full
    "session_queue_drops",  # an away session's queue in Redis was full
    "offline_qos0_skipped",  # QoS 0 for an away session: not kept
    "expired_dropped",  # expired while an away session's queue held it
    "mqtt_expired_dropped",  # expired before its client could take it
    "mqtt_oversized_dropped",  # larger than its client's Maximum Packet Size
    "undeliverable",  # a share group with no member left on any node
    "unrouted",  # published to a topic no node subscribed to
    "acl_denied_deliveries",  # the ACL kept them from a subscriber
)
_COUNTS: Final = (
    "received",
    "received_bytes",
    "sent",
    "sent_bytes",
    "queued",
    "queued_bytes",
    "inflight",
    "takeovers",
)


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


@dataclass(frozen=True)
class ClientFigures:
    """One client's figures as the node holding its session counted them at ``at_ms``
    (Unix ms): PUBLISH packets (and payload bytes) ``received`` from it and ``sent`` to
    it, copies ``queued`` in the node's memory (and their bytes), ``inflight`` (sent,
    not acknowledged), ``takeovers`` of its id there, ``last_activity_ms`` (its last
    packet in or out, None: none) and ``drops`` by each of :data:`DROP_REASONS`. Counts
    since the session came to that node. Raises ``ValueError`` for a bad figure."""

    client_id: str
    node_id: str
    at_ms: int
    received: int = 0
    received_bytes: int = 0
    sent: int = 0
    sent_bytes: int = 0
    queued: int = 0
    queued_bytes: int = 0
    inflight: int = 0
    takeovers: int = 0
    last_activity_ms: int | None = None
    drops: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))

    def __post_init__(self) -> None:
        for name in (*_COUNTS, "at_ms"):
            if not _is_count(getattr(self, name)):
                raise ValueError(f"{name} must be a non-negative int, not {getattr(self, name)!r}")
        if self.last_activity_ms is not None and not _is_count(self.last_activity_ms):
            raise ValueError(f"last_activity_ms must be None or >= 0: {self.last_activity_ms!r}")
        if tuple(self.drops) != DROP_REASONS or not all(map(_is_count, self.drops.values())):
            raise ValueError(f"drops must count each of {DROP_REASONS}, not {self.drops!r}")

    @property
    def dropped(self) -> int:
        """Copies lost for any reason."""
        return sum(self.drops.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "at_ms": self.at_ms,
            "messages_in": self.received,
            "bytes_in": self.received_bytes,
            "messages_out": self.sent,
            "bytes_out": self.sent_bytes,
            "queued_memory": self.queued,
            "queued_memory_bytes": self.queued_bytes,
            "inflight": self.inflight,
            "takeovers": self.takeovers,
            "last_activity_ms": self.last_activity_ms,
            "dropped": self.dropped,
            "drops": dict(self.drops),
        }

    def pack(self) -> bytes:
        """The stored form (see the module docstring)."""
        packed: bytes = msgpack.packb(
            [
                self.at_ms,
                *(getattr(self, name) for name in _COUNTS),
                self.last_activity_ms or 0,
                [self.drops[reason] for reason in DROP_REASONS],
            ]
        )
        return packed

    @classmethod
    def unpack(cls, client_id: str, node_id: str, packed: Any) -> ClientFigures:
        """The figures of a stored entry; :class:`CorruptStateError` if it is not one
        (a stored entry with more drop reasons than known, from a newer node, keeps the
        known ones)."""
        try:
            at_ms, *counts, last, drops = msgpack.unpackb(packed)
            if len(counts) != len(_COUNTS):
                raise ValueError(f"{len(counts)} counts, not {len(_COUNTS)}")
            return cls(
                client_id,
                node_id,
                at_ms,
                **dict(zip(_COUNTS, counts, strict=True)),
                last_activity_ms=last or None,
                drops=dict(zip(DROP_REASONS, drops[: len(DROP_REASONS)], strict=True)),
            )
        except (ValueError, TypeError, msgpack.UnpackException):
            raise CorruptStateError(f"stored client figures are not valid: {packed!r}") from None


@dataclass(frozen=True)
class NodeDrops:
    """A node's drops at ``at_ms``: ``totals`` since it started and ``rates`` a second
    over its last interval, by each of :data:`NODE_DROP_REASONS`, its ``slowest``
    clients (those with most queued or dropped, see
    :func:`router.cluster.client_stats.slowest`) and its ``busiest`` topic filters over
    its last interval: (filter, publishes a second), most first
    (:mod:`router.cluster.filter_traffic`)."""

    at_ms: int
    totals: Mapping[str, int]
    rates: Mapping[str, float]
    slowest: Sequence[ClientFigures] = ()
    busiest: Sequence[tuple[str, float]] = ()


def _text(value: Any) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


class ClientFigureStore:
    """Writes a node's client figures and drops, reads them (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys if keys is not None else Keys()

    async def write(
        self,
        node_id: str,
        clients: Iterable[ClientFigures],
        drops: NodeDrops,
        ttl_s: float,
        *,
        gone: Iterable[str] = (),
        replace: bool = True,
    ) -> None:
        """Replace the node's figures with ``clients`` and ``drops`` (``replace``), or
        only write ``clients`` and remove the clients ``gone`` (the others kept), every
        key expiring ``ttl_s`` seconds from now, in one transaction. Raises
        :class:`InvalidIdError` for a bad node id, ``ValueError`` for a ttl below 1 ms."""
        if not ttl_s >= MIN_TTL:
            raise ValueError(f"ttl_s must be at least {MIN_TTL} seconds, not {ttl_s!r}")
        check_id(node_id, "node id")
        clients_key, drops_key = self._keys(node_id)
        ttl_ms = max(1, round(ttl_s * 1000))
        stored: dict[str | bytes, str | bytes] = {"at_ms": str(drops.at_ms)}
        for reason in NODE_DROP_REASONS:
            stored[f"total:{reason}"] = str(drops.totals.get(reason, 0))
            stored[f"rate:{reason}"] = repr(round(float(drops.rates.get(reason, 0.0)), 3))
        stored["slowest"] = msgpack.packb([[c.client_id, c.pack()] for c in drops.slowest])
        stored["busiest"] = msgpack.packb([[name, float(rate)] for name, rate in drops.busiest])
        mapping = {figures.client_id: figures.pack() for figures in clients}
        removed = [] if replace else list(gone)
        with translating:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.delete(*((clients_key, drops_key) if replace else (drops_key,)))
                if removed:
                    pipe.hdel(clients_key, *removed)
                if mapping:
                    pipe.hset(clients_key, mapping=mapping)  # type: ignore[arg-type]
                pipe.pexpire(clients_key, ttl_ms)
                pipe.hset(drops_key, mapping=stored)  # type: ignore[arg-type]
                pipe.pexpire(drops_key, ttl_ms)
                await pipe.execute()

    async def delete(self, node_id: str) -> None:
        """Remove the node's figures (a node leaving)."""
        check_id(node_id, "node id")
        with translating:
            await self.redis.delete(*self._keys(node_id))

    async def clients(self, wanted: Mapping[str, Sequence[str]]) -> dict[str, ClientFigures]:
        """client id -> figures, for each ``node id -> client ids`` of ``wanted`` (a
        client its node did not report is left out). One HMGET a node."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(node_id: str, client_ids: Sequence[str]) -> list[Any]:
            async with gate:
                found: list[Any] = await self.redis.hmget(self._keys(node_id)[0], client_ids)
                return found

        asked = [(check_id(node_id, "node id"), ids) for node_id, ids in wanted.items() if ids]
        with translating:
            replies = await asyncio.gather(*(one(node_id, ids) for node_id, ids in asked))
        return {
            client_id: ClientFigures.unpack(client_id, node_id, packed)
            for (node_id, ids), found in zip(asked, replies, strict=True)
            for client_id, packed in zip(ids, found, strict=True)
            if packed is not None
        }

    async def drops(self, node_ids: Iterable[str]) -> dict[str, NodeDrops]:
        """node id -> its drops, for each of ``node_ids`` that reported lately."""
        wanted = sorted({check_id(node_id, "node id") for node_id in node_ids})
        with translating:
            replies = await read_each(self.redis, "HGETALL", [self._keys(n)[1] for n in wanted])
        return {
            node_id: _drops_of(node_id, stored)
            for node_id, stored in zip(wanted, replies, strict=True)
            if stored
        }

    def _keys(self, node_id: str) -> tuple[str, str]:
        return self.keys.node_clients(node_id), self.keys.node_drops(node_id)


def _drops_of(node_id: str, stored: Mapping[Any, Any]) -> NodeDrops:
    text = {_text(name): value for name, value in stored.items()}
    try:
        slowest = [
            ClientFigures.unpack(_text(client_id), node_id, packed)
            for client_id, packed in msgpack.unpackb(text.get("slowest", b"\x90"))
        ]
        busiest = [
            (str(name), float(rate)) for name, rate in msgpack.unpackb(text.get("busiest", b"\x90"))
        ]
        return NodeDrops(
            int(text.get("at_ms", 0)),
            {r: int(text.get(f"total:{r}", 0)) for r in NODE_DROP_REASONS},
            {r: float(text.get(f"rate:{r}", 0)) for r in NODE_DROP_REASONS},
            slowest,
            busiest,
        )
    except (ValueError, TypeError, msgpack.UnpackException):
        raise CorruptStateError(f"the stored drops of node {node_id!r} are not valid") from None
