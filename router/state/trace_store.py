"""Traces: follow one client id or one topic filter on every node for a bounded time.

An operator starts a trace (``router trace start``, ``POST /api/v1/traces``); every node
reads the traces in force every :data:`REFRESH` seconds or so (:mod:`router.cluster.
tracing`) and appends what it sees of them, packets in and out of a traced client and
the routing of a publish whose topic a traced filter matches, to the trace's records::

    rt:{traces}:specs        hash     ID -> packed [kind, value, until, by]
    rt:{trace:ID}:records    stream   ID -> node, what, client, topic, text
                                      at most MAX_RECORDS entries, PEXPIREAT until + KEEP

``kind`` is ``client`` or ``topic``; ``until`` is when the trace stops, in Unix seconds
of the Redis server's clock. A trace that ended stops being followed at once and is
removed from the specs by the next :meth:`TraceStore.traces`; its records stay
:data:`KEEP_S` seconds after its end, to be read.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgpack  # type: ignore[import-untyped,unused-ignore]
from redis.typing import EncodableT, FieldT

from router.core.topics import validate_filter
from router.errors import InvalidSettingError, TraceNotFoundError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.reads import command
from router.state.scripts import RedisClient

TraceKind = Literal["client", "topic"]
KINDS: Final[tuple[TraceKind, ...]] = ("client", "topic")
MAX_SECONDS: Final = 3_600.0
"""The longest a trace follows (an hour): a trace left running costs every node."""
MAX_TRACES: Final = 16
"""Traces in force at once."""
MAX_RECORDS: Final = 10_000
KEEP_S: Final = 3_600
"""Seconds a trace's records are kept after it ended."""


@dataclass(frozen=True)
class TraceSpec:
    """A trace: what it follows (``kind`` ``client``: a client id; ``topic``: a topic
    filter), until when (Unix seconds), and who started it."""

    id: str
    kind: TraceKind
    value: str
    until: float
    by: str = ""

    def live(self, now: float) -> bool:
        return self.until > now

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "value": self.value,
            "until": self.until,
            "by": self.by,
        }


@dataclass(frozen=True)
class TraceRecord:
    """One thing a node saw of a trace: ``what`` (``in``/``out``: a packet of the
    traced client; ``routed``: a publish matched on the node it entered; ``arrived``: a
    copy another node forwarded; ``connected``, ``closed``), at ``at_ms`` (Redis server
    time: the stream's ID)."""

    node: str
    what: str
    client: str
    topic: str
    text: str
    at_ms: int = 0
    id: str = ""

    def fields(self) -> dict[FieldT, EncodableT]:
        return {
            "node": self.node,
            "what": self.what,
            "client": self.client,
            "topic": self.topic,
            "text": self.text,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at_ms": self.at_ms,
            "node": self.node,
            "what": self.what,
            "client": self.client,
            "topic": self.topic,
            "text": self.text,
        }


def check_spec(kind: str, value: object, seconds: object) -> tuple[TraceKind, str, float]:
    """``kind``, ``value`` and ``seconds`` of a new trace, checked
    (:class:`InvalidSettingError` for what cannot be one)."""
    if kind not in KINDS:
        raise InvalidSettingError(f"a trace follows a client or a topic, not {kind!r}")
    text = check_id(value, f"traced {kind}")
    if kind == "topic":
        text = validate_filter(text)
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 < seconds <= MAX_SECONDS
        or not math.isfinite(seconds)
    ):
        raise InvalidSettingError(f"a trace lasts more than 0 and at most {MAX_SECONDS:.0f} s")
    return kind, text, float(seconds)


class TraceStore:
    """The traces of one namespace (raises :class:`~router.errors.StateFailureError`
    when Redis fails)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self._keys = keys
        self._specs = keys.trace_specs()

    async def _now(self) -> float:
        with translating:
            seconds, micros = await self.redis.time()
        return float(seconds) + micros / 1e6

    async def start(self, kind: str, value: str, seconds: float, *, by: str = "") -> TraceSpec:
        """Start a trace of ``value`` (a client id or a topic filter) for ``seconds``;
        :class:`InvalidSettingError` for a bad one or when :data:`MAX_TRACES` run."""
        checked_kind, checked, length = check_spec(kind, value, seconds)
        if len(await self.traces()) >= MAX_TRACES:
            raise InvalidSettingError(f"{MAX_TRACES} traces run already: stop one first")
        spec = TraceSpec(
            secrets.token_hex(6), checked_kind, checked, await self._now() + length, by
        )
        packed = msgpack.packb([spec.kind, spec.value, spec.until, spec.by])
        with translating:
            await self.redis.hset(self._specs, spec.id, packed)
        return spec

    async def stop(self, trace_id: str) -> bool:
        """Stop a trace (its records stay :data:`KEEP_S` s); False if none runs."""
        with translating:
            return bool(await self.redis.hdel(self._specs, check_id(trace_id, "trace id")))

    async def traces(self) -> list[TraceSpec]:
        """The traces in force, by when they end (ended ones are removed)."""
        now = await self._now()
        with translating:
            stored = await self.redis.hgetall(self._specs)
        found = [spec for key, packed in stored.items() if (spec := _parse(key, packed))]
        ended = [spec.id for spec in found if not spec.live(now)]
        if ended:
            with translating:
                await self.redis.hdel(self._specs, *ended)
        return sorted((s for s in found if s.live(now)), key=lambda s: (s.until, s.id))

    async def append(self, trace: TraceSpec, records: list[TraceRecord]) -> None:
        """Append ``records`` to ``trace``'s, in one round trip."""
        key = self._keys.trace_records(trace.id)
        with translating:
            async with self.redis.pipeline(transaction=False) as pipe:
                for record in records:
                    pipe.xadd(key, record.fields(), maxlen=MAX_RECORDS, approximate=True)
                pipe.expireat(key, int(trace.until) + KEEP_S)
                await pipe.execute()

    async def records(
        self, trace_id: str, *, after: str = "-", limit: int = 1_000
    ) -> list[TraceRecord]:
        """The records of a trace, oldest first, after the record id ``after``
        (``-``: from the first); :class:`TraceNotFoundError` when it has none and does
        not run."""
        key = self._keys.trace_records(check_id(trace_id, "trace id"))
        start = after if after == "-" else f"({after}"
        found = await command(self.redis, "XRANGE", key, start, "+", "COUNT", limit)
        if not found and after == "-" and trace_id not in {s.id for s in await self.traces()}:
            raise TraceNotFoundError(trace_id)
        return [_record(entry_id, fields) for entry_id, fields in found]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8", errors="replace")


def _parse(key: Any, packed: Any) -> TraceSpec | None:
    """The spec of a stored field, None for one that is not (never raises)."""
    try:
        kind, value, until, by = msgpack.unpackb(packed)
        if kind not in KINDS or not isinstance(value, str) or not isinstance(by, str):
            return None
        return TraceSpec(_text(key), kind, value, float(until), by)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def _record(entry_id: Any, fields: Any) -> TraceRecord:
    text = {_text(k): _text(v) for k, v in (fields or {}).items()}
    ident = _text(entry_id)
    return TraceRecord(
        text.get("node", ""),
        text.get("what", ""),
        text.get("client", ""),
        text.get("topic", ""),
        text.get("text", ""),
        int(ident.partition("-")[0]),
        ident,
    )
