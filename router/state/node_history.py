"""Each node's health figures and its last hour of traffic in Redis, for the dashboard.

Two keys per node under the node's hash tag (one Redis Cluster slot), rewritten by the
node every sampling interval in one MULTI/EXEC, so that a node that dies between two
commands never leaves a key without an expiry::

    rt:{n:ID}:telemetry   hash   field -> text (NodeTelemetry)      expires after a few intervals
    rt:{n:ID}:history     list   msgpack [t, in, out, dropped]      newest first, at most `keep`,
                                                                     expires after the last hour

    HSET telemetry ...; PEXPIRE telemetry; LPUSH history; LTRIM history 0 keep-1; PEXPIRE history

A node that stops gracefully deletes both keys at once. Readers look only at live nodes
(:class:`~router.state.node_registry.NodeRegistry`) that reported lately (their telemetry
hash exists), so the figures of a dead node never count, even before its keys expire.

A history sample holds *cumulative* counters (messages in, out, dropped since the node
started) and the node's wall clock ``t`` (unix seconds). Rates come from two consecutive
samples: ``(newer - older) / (newer.t - older.t)``. A counter that went down means the
node restarted between the two (a node that crashed leaves its history behind, and its
next incarnation pushes onto it): that pair gives no rate rather than a negative one.

Merging the nodes' histories (:func:`merge_histories`) puts each rate on a grid of
``interval_s`` buckets by the time of its newer sample, ``floor(t / interval_s)``::

    node a   samples  10.3    12.3    14.3
    node b   samples     11.9    13.9
    bucket (2 s)        5 | 6     | 7
                a: rate 10.3->12.3 in 6, 12.3->14.3 in 7;  b: rate 11.9->13.9 in 6

A node's rates within one bucket are averaged over their time, then summed across nodes.
The newest bucket is left out until every node reached it (b has not reached 7 yet: the
sum would dip only because b's sample is still due).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import pairwise
from typing import Any, Final, NamedTuple

import msgpack  # type: ignore[import-untyped,unused-ignore]
from redis.asyncio.cluster import RedisCluster
from redis.typing import EncodableT, FieldT

from router.errors import CorruptStateError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient

MIN_TTL: Final = 0.001  # seconds; PEXPIRE takes whole milliseconds, at least one
DEFAULT_INTERVAL: Final = 2.0  # seconds between samples, when a node does not say
MAX_GAP_INTERVALS: Final = 5  # two samples further apart span a gap: no rate over it
CONCURRENCY: Final = 16  # per-node reads in flight at once on a cluster
RATE_DIGITS: Final = 3  # rates are rounded to a thousandth of a message a second
SHARED_AUTH: Final = "redis"
"""A node's ``auth`` when it takes its users and rules from Redis (``--auth-redis``): the
users and ACL rules ``router users|acl`` and the dashboard edit. The other words a node
says: ``files`` (a password or ACL file), ``emqx`` (EMQX's records), ``jwt`` (tokens
only), ``none`` (no source: every client admitted as the settings say); "" when the node
did not say (an older version, or a listener started without it)."""

_INTS: Final = (
    "heartbeat_ttl_ms",
    "connections",
    "sessions",
    "subscriptions",
    "routes",
    "rss_kib",
    "messages_in",
    "messages_out",
    "dropped",
    "reloads",
    "reload_failures",
    "reload_last_ms",
    "draining",
)
_TEXTS: Final = ("version", "auth", "loaded", "reload_error", "advertised")
_FLOATS: Final = ("started_at", "cpu_percent", "loop_lag_ms")


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _is_amount(value: object) -> bool:
    """A finite, non-negative int or float (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class NodeTelemetry:
    """One node's health figures at one sample. Counts are non-negative ints; times and
    percentages finite non-negative numbers; ``redis_latency_ms`` is None when the
    node's PING failed. ``messages_in``, ``messages_out`` and ``dropped`` count since the
    node started (the sample the rates come from, see :class:`TrafficSample`)."""

    listeners: tuple[str, ...] = ()  # "scheme://host:port" of each MQTT and HTTP listener
    started_at: float = 0.0  # unix seconds
    version: str = ""  # "router 0.2.0"
    interval_s: float = DEFAULT_INTERVAL  # seconds between the node's samples
    heartbeat_ttl_ms: int = 0  # the node's heartbeat TTL (0: not known)
    connections: int = 0  # open MQTT connections
    sessions: int = 0  # held: its connected clients' and persistent ones whose client is away
    subscriptions: int = 0  # subscriptions of the node's clients
    routes: int = 0  # the node's route set (filters its clients subscribed to)
    rss_kib: int = 0  # resident memory of the process
    cpu_percent: float = 0.0  # CPU time over wall time since the previous sample, x100
    loop_lag_ms: float = 0.0  # how late the sampling sleep woke
    redis_latency_ms: float | None = None  # one PING
    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0
    auth: str = ""  # where its users and rules come from (SHARED_AUTH, ...; "": not told)
    reloads: int = 0  # reloads applied (router.cluster.reloads)
    reload_failures: int = 0  # reloads refused: a file it could not use
    reload_last_ms: int = 0  # the last reload's Unix time (0: none)
    loaded: str = ""  # the words of what it runs with (its files)
    reload_error: str = ""  # the words of the last reload when it failed ("" otherwise)
    advertised: str = ""  # the MQTT address its clients use (--mqtt-advertise; "": none)
    draining: int = 0  # 1 while it drains: it accepts no new client, and is leaving

    def __post_init__(self) -> None:
        if not isinstance(self.auth, str) or any(c.isspace() for c in self.auth):
            raise TypeError(f"auth must be a str without spaces, not {self.auth!r}")
        if type(self.listeners) is not tuple or not all(
            isinstance(item, str) and item and not any(c.isspace() for c in item)
            for item in self.listeners
        ):
            raise TypeError(f"listeners must be a tuple of non-blank str, not {self.listeners!r}")
        for name in ("version", "loaded", "reload_error", "advertised"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a str, not {getattr(self, name)!r}")
        for name in _INTS:
            if not _is_count(getattr(self, name)):
                raise ValueError(f"{name} must be a non-negative int, not {getattr(self, name)!r}")
        for name in _FLOATS:
            if not _is_amount(getattr(self, name)):
                raise ValueError(
                    f"{name} must be a finite number >= 0, not {getattr(self, name)!r}"
                )
        if not _is_amount(self.interval_s) or self.interval_s <= 0:
            raise ValueError(f"interval_s must be a finite number > 0, not {self.interval_s!r}")
        if self.redis_latency_ms is not None and not _is_amount(self.redis_latency_ms):
            raise ValueError(
                f"redis_latency_ms must be None or >= 0, not {self.redis_latency_ms!r}"
            )

    def as_hash(self) -> dict[FieldT, EncodableT]:
        """The stored form: field name -> text (listeners space-separated, None as "")."""
        stored: dict[FieldT, EncodableT] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "listeners":
                stored[field.name] = " ".join(value)
            elif isinstance(value, str):
                stored[field.name] = value
            else:
                stored[field.name] = "" if value is None else repr(value)
        return stored

    @classmethod
    def from_hash(cls, stored: Mapping[Any, Any]) -> NodeTelemetry:
        """The figures of a stored hash (bytes or str). A missing field takes its default
        and an unknown one is ignored, so nodes of neighbouring versions read each
        other's; a value that is not what its field holds raises :class:`CorruptStateError`."""
        text = {_text(name): _text(value) for name, value in stored.items()}
        found: dict[str, Any] = {}
        if "listeners" in text:
            found["listeners"] = tuple(text["listeners"].split())
        for name in _TEXTS:
            if name in text:
                found[name] = text[name]
        for name in _INTS:
            if name in text:
                raw = text[name]
                if not raw.isascii() or not raw.isdigit():
                    raise CorruptStateError(f"a stored telemetry {name} is not a count: {raw!r}")
                found[name] = int(raw)
        for name in (*_FLOATS, "interval_s", "redis_latency_ms"):
            if name in text and not (name == "redis_latency_ms" and text[name] == ""):
                found[name] = _number(text[name], name)
        try:
            return cls(**found)
        except (TypeError, ValueError) as exc:
            raise CorruptStateError(f"a stored telemetry hash is not valid: {exc}") from None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored telemetry field is not UTF-8 text: {value!r}") from None


def _number(raw: str, name: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise CorruptStateError(f"a stored telemetry {name} is not a number: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise CorruptStateError(f"a stored telemetry {name} is out of range: {raw!r}")
    return value


@dataclass(frozen=True)
class TrafficSample:
    """A node's cumulative counters at wall-clock time ``t`` (unix seconds)."""

    t: float
    messages_in: int
    messages_out: int
    dropped: int

    def __post_init__(self) -> None:
        if not _is_amount(self.t):
            raise ValueError(f"a sample's t must be a finite number >= 0, not {self.t!r}")
        for name in ("messages_in", "messages_out", "dropped"):
            if not _is_count(getattr(self, name)):
                raise ValueError(f"{name} must be a non-negative int, not {getattr(self, name)!r}")

    def pack(self) -> bytes:
        """The stored form: msgpack ``[t, in, out, dropped]``."""
        packed: bytes = msgpack.packb([self.t, self.messages_in, self.messages_out, self.dropped])
        return packed

    @classmethod
    def unpack(cls, packed: Any) -> TrafficSample:
        """The sample of a stored entry; :class:`CorruptStateError` if it is not one."""
        try:
            t, messages_in, messages_out, dropped = msgpack.unpackb(packed)
            return cls(t, messages_in, messages_out, dropped)
        except (ValueError, TypeError, msgpack.UnpackException):
            raise CorruptStateError(f"a stored traffic sample is not valid: {packed!r}") from None


class Rates(NamedTuple):
    """Messages a second."""

    messages_in: float = 0.0
    messages_out: float = 0.0
    dropped: float = 0.0

    def plus(self, other: Rates) -> Rates:
        """The sum of both, figure by figure."""
        return Rates(*(a + b for a, b in zip(self, other, strict=True)))

    def as_dict(self) -> dict[str, float]:
        """``{"in", "out", "dropped"}``, rounded to :data:`RATE_DIGITS` decimals."""
        return {
            "in": round(self.messages_in, RATE_DIGITS),
            "out": round(self.messages_out, RATE_DIGITS),
            "dropped": round(self.dropped, RATE_DIGITS),
        }


def _deltas(older: TrafficSample, newer: TrafficSample) -> tuple[int, int, int, float] | None:
    """The counters' growth and the seconds between two samples; None when the time does
    not move forward or a counter went down (the node restarted in between)."""
    dt = newer.t - older.t
    grown = (
        newer.messages_in - older.messages_in,
        newer.messages_out - older.messages_out,
        newer.dropped - older.dropped,
    )
    if dt <= 0 or min(grown) < 0:
        return None
    return (*grown, dt)


def rates_between(older: TrafficSample, newer: TrafficSample) -> Rates | None:
    """The rates from ``older`` to ``newer``; None when there are none (see :func:`_deltas`)."""
    found = _deltas(older, newer)
    if found is None:
        return None
    grown_in, grown_out, grown_dropped, dt = found
    return Rates(grown_in / dt, grown_out / dt, grown_dropped / dt)


def latest_rates(history: Sequence[TrafficSample]) -> Rates | None:
    """The rates of a node's last two samples (``history`` oldest first); None with fewer
    than two, or when the node restarted between them."""
    if len(history) < 2:
        return None
    return rates_between(history[-2], history[-1])


@dataclass(frozen=True)
class MergedHistory:
    """The cluster's rates on a grid of ``interval_s`` buckets, oldest first: ``t[i]`` is
    the start of bucket i (unix seconds), the other lists its rates (messages a second)."""

    interval_s: float
    t: tuple[float, ...] = ()
    messages_in: tuple[float, ...] = ()
    messages_out: tuple[float, ...] = ()
    dropped: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """``{"interval_s", "t", "in", "out", "dropped"}`` with lists."""
        return {
            "interval_s": self.interval_s,
            "t": list(self.t),
            "in": list(self.messages_in),
            "out": list(self.messages_out),
            "dropped": list(self.dropped),
        }


def merge_histories(
    histories: Iterable[Sequence[TrafficSample]],
    interval_s: float,
    ended: Iterable[Sequence[TrafficSample]] = (),
) -> MergedHistory:
    """Sum the rates of many nodes' histories (each oldest first) on a grid of
    ``interval_s`` seconds (see the module docstring). Pairs of samples that give no rate
    (a restart, time not moving forward) or span a gap of more than
    :data:`MAX_GAP_INTERVALS` intervals are skipped. The histories of nodes that ended
    (died, or left) count for the past they cover, and no newest bucket waits for them,
    so a node's death does not rewrite the traffic before it. Raises ``ValueError`` for
    an interval that is not a finite number > 0."""
    if not _is_amount(interval_s) or interval_s <= 0:
        raise ValueError(f"interval_s must be a finite number > 0, not {interval_s!r}")
    totals: dict[int, Rates] = {}
    newest: list[int] = []
    finished = [(history, False) for history in ended]
    for history, live in [*((h, True) for h in histories), *finished]:
        grown: dict[int, list[float]] = {}  # bucket -> [in, out, dropped, seconds]
        for older, newer in pairwise(history):
            found = _deltas(older, newer)
            if found is None or found[3] > MAX_GAP_INTERVALS * interval_s:
                continue
            sums = grown.setdefault(math.floor(newer.t / interval_s), [0.0, 0.0, 0.0, 0.0])
            for index, value in enumerate(found):
                sums[index] += value
        for bucket, (grown_in, grown_out, grown_dropped, seconds) in grown.items():
            rates = Rates(grown_in / seconds, grown_out / seconds, grown_dropped / seconds)
            totals[bucket] = totals.get(bucket, Rates()).plus(rates)
        if grown and live:
            newest.append(max(grown))
    if newest and min(newest) < max(newest):
        del totals[max(newest)]  # (still filling: some node's sample in it is due)
    buckets = sorted(totals)
    return MergedHistory(
        interval_s,
        tuple(round(bucket * interval_s, RATE_DIGITS) for bucket in buckets),
        tuple(round(totals[b].messages_in, RATE_DIGITS) for b in buckets),
        tuple(round(totals[b].messages_out, RATE_DIGITS) for b in buckets),
        tuple(round(totals[b].dropped, RATE_DIGITS) for b in buckets),
    )


class NodeRecord(NamedTuple):
    """What a node stored: its telemetry (None if it wrote none lately) and its history
    (oldest first, empty if none)."""

    telemetry: NodeTelemetry | None
    history: list[TrafficSample]


class NodeHistoryStore:
    """Writes a node's telemetry and history, reads those of many nodes (see the module
    docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys if keys is not None else Keys()
        self._seen = self.keys.telemetry_seen()

    async def write(
        self,
        node_id: str,
        telemetry: NodeTelemetry,
        sample: TrafficSample,
        ttl_s: float,
        keep: int,
        *,
        history_ttl_s: float | None = None,
    ) -> None:
        """Replace the node's telemetry and push ``sample`` onto its history, keeping the
        newest ``keep`` samples, in one transaction. The telemetry expires ``ttl_s``
        seconds from now, the history ``history_ttl_s`` (default ``ttl_s``) from now.

        Raises :class:`InvalidIdError` for a bad node id, ``ValueError`` for a ttl below
        1 ms or ``keep`` below 1."""
        history_ttl_s = ttl_s if history_ttl_s is None else history_ttl_s
        for name, ttl in (("ttl_s", ttl_s), ("history_ttl_s", history_ttl_s)):
            if not _is_amount(ttl) or ttl < MIN_TTL:
                raise ValueError(f"{name} must be at least {MIN_TTL} seconds, not {ttl!r}")
        if not _is_count(keep) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, not {keep!r}")
        hash_key, list_key = self._keys(node_id)
        with translating:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(hash_key, mapping=telemetry.as_hash())
                pipe.pexpire(hash_key, max(1, round(ttl_s * 1000)))
                pipe.lpush(list_key, sample.pack())
                pipe.ltrim(list_key, 0, keep - 1)
                pipe.pexpire(list_key, max(1, round(history_ttl_s * 1000)))
                await pipe.execute()

    async def delete(self, node_id: str) -> bool:
        """Remove the node's telemetry and history and forget it was seen (a node
        leaving); True if there were any."""
        check_id(node_id, "node id")
        with translating:
            await self.redis.zrem(self._seen, node_id)
            return int(await self.redis.delete(*self._keys(node_id))) > 0

    async def mark_seen(self, node_id: str, when: float, forget_before: float) -> None:
        """Record that ``node_id`` wrote its telemetry at ``when`` (Unix seconds), and
        forget every node not seen since ``forget_before``."""
        check_id(node_id, "node id")
        with translating:
            await self.redis.zadd(self._seen, {node_id: when})
            await self.redis.zremrangebyscore(self._seen, "-inf", f"({forget_before}")

    async def seen_since(self, since: float) -> dict[str, float]:
        """The nodes that wrote telemetry since ``since``: node id -> when, last."""
        with translating:
            found: Any = await self.redis.zrangebyscore(self._seen, since, "+inf", withscores=True)
        return {_text(node_id): float(when) for node_id, when in found}

    async def read(self, node_ids: Iterable[str]) -> dict[str, NodeRecord]:
        """node id -> record, for each of ``node_ids`` (sorted; a node that stored nothing
        has ``(None, [])``). One pipeline on a standalone Redis; on a cluster one
        transaction per node (its keys share a slot), :data:`CONCURRENCY` at a time.

        Raises :class:`CorruptStateError` for a bad hash or sample, :class:`InvalidIdError`
        for a bad id, and the first failure of Redis met (after every read ended), as
        :mod:`router.state.failures` tells it."""
        wanted = sorted({check_id(node_id, "node id") for node_id in node_ids})
        if not wanted:
            return {}
        with translating:
            if isinstance(self.redis, RedisCluster):
                replies = await self._read_cluster(wanted)
            else:
                pipe = self.redis.pipeline(transaction=False)
                for node_id in wanted:
                    hash_key, list_key = self._keys(node_id)
                    pipe.hgetall(hash_key)
                    pipe.lrange(list_key, 0, -1)
                flat = await pipe.execute()
                replies = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        return {
            node_id: NodeRecord(
                NodeTelemetry.from_hash(stored) if stored else None,
                [TrafficSample.unpack(entry) for entry in reversed(entries)],
            )
            for node_id, (stored, entries) in zip(wanted, replies, strict=True)
        }

    async def _read_cluster(self, node_ids: list[str]) -> list[tuple[Any, Any]]:
        """A transaction per node: a cluster pipeline without one closes the whole
        client on a connection error (see :mod:`router.state.reads`)."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(node_id: str) -> tuple[Any, Any]:
            hash_key, list_key = self._keys(node_id)
            async with gate, self.redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(hash_key)
                pipe.lrange(list_key, 0, -1)
                stored, entries = await pipe.execute()
                return stored, entries

        results = await asyncio.gather(
            *(one(node_id) for node_id in node_ids), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [result for result in results if not isinstance(result, BaseException)]

    async def live(self, registry: NodeRegistry) -> dict[str, NodeRecord]:
        """The records of the live nodes that reported lately (their telemetry exists),
        by node id (sorted): what the cluster's figures add up."""
        records = await self.read(node.node_id for node in await registry.live_nodes())
        return {
            node_id: record for node_id, record in records.items() if record.telemetry is not None
        }

    def _keys(self, node_id: str) -> tuple[str, str]:
        return self.keys.node_telemetry(node_id), self.keys.node_history(node_id)
