"""The cluster's events: what happened to its nodes, its Redis, its clients and its bans,
when and where, each told once, kept for a day.

Two kinds of key, under one hash tag (one Redis Cluster slot)::

    rt:{events}:log           stream   ID -> kind, severity, node, subject, text
                                       about MAX_EVENTS entries, PEXPIRE a day at each add
    rt:{events}:once:TOKEN    string   "1", PX a day: an event that many nodes see
                                       (a peer's death) is told by the first that adds it

    [SET once NX PX]  XADD log MAXLEN ~ MAX_EVENTS * ...  PEXPIRE log

The stream's IDs are Redis server time, so the events of every node are in one order on
one clock, and ``at_ms`` is the ID's time. The stream is bounded by count (an attacker
who makes a client flap cannot grow it) and the whole log goes a day after its last
event; readers hide what is older than :data:`KEEP_MS`. An event is what an operator acts
on: a node down, Redis unreachable, queues overflowing, a takeover storm, a ban; it
carries its words (``text``) and the names an operator filters by (``kind``,
``subject``: the node, client or ban it is about).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from redis.typing import EncodableT, FieldT

from router.errors import CorruptStateError, InvalidSettingError
from router.state.failures import translating
from router.state.keys import Keys
from router.state.reads import command
from router.state.scripts import RedisClient

Severity = Literal["info", "warning", "critical"]
SEVERITIES: Final[tuple[Severity, ...]] = ("info", "warning", "critical")
KINDS: Final = frozenset(
    {
        "node_up",  # a node started (told by itself)
        "node_stopped",  # a node left gracefully (told by itself)
        "node_down",  # a node's heartbeat expired (told once, by the first peer that saw it)
        "node_purged",  # a dead node's sessions were adopted and its routes removed
        "node_draining",  # a node stopped accepting clients and ends their connections
        "node_drained",  # a draining node ended its connections and handed on its sessions
        "redis_unreachable",  # a node could not reach Redis (told when it could again)
        "redis_slow",  # a node's Redis answered slowly
        "queue_overflow",  # messages dropped: clients' queues full
        "takeover_storm",  # many sessions taken over in a short time
        "overload",  # a node is overloaded: it defers connections, slows heavy publishers
        "overload_relieved",  # a node overloaded is no longer
        "clients_slowed",  # a busy node slowed its heaviest clients (who, how many)
        "ban_added",
        "ban_removed",
        "config_reloaded",  # a node reread its files (SIGHUP, router node reload)
        "config_reload_failed",  # a node kept its configuration: a file it could not use
    }
)
MAX_EVENTS: Final = 10_000
KEEP_MS: Final = 86_400_000
"""A day: what the log keeps."""
MAX_TEXT: Final = 1_000
"""Characters of an event's text kept (a client id in it may be long)."""


@dataclass(frozen=True)
class Event:
    """One event. ``node`` is the node that told it (or the tool: ``cli``, ``api``);
    ``subject`` what it is about; ``at_ms`` (Redis server time) and ``id`` are set
    once it is in the log."""

    kind: str
    severity: Severity
    node: str
    subject: str
    text: str
    at_ms: int = 0
    id: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidSettingError(f"not an event kind: {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise InvalidSettingError(f"an event's severity is one of {SEVERITIES}")

    def fields(self) -> dict[FieldT, EncodableT]:
        """The stream entry's fields."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "node": self.node,
            "subject": self.subject,
            "text": self.text[:MAX_TEXT],
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at_ms": self.at_ms,
            "kind": self.kind,
            "severity": self.severity,
            "node": self.node,
            "subject": self.subject,
            "text": self.text,
        }


def parse_event(entry_id: Any, stored: Mapping[Any, Any]) -> Event:
    """The event of one stream entry (bytes or str); :class:`CorruptStateError` for an
    entry that is not one."""
    text = {_text(k): _text(v) for k, v in stored.items()}
    ident = _text(entry_id)
    millis, _, _ = ident.partition("-")
    try:
        return Event(
            text["kind"],
            text["severity"],  # type: ignore[arg-type]
            text["node"],
            text["subject"],
            text["text"],
            int(millis),
            ident,
        )
    except (KeyError, ValueError, InvalidSettingError) as error:
        raise CorruptStateError(f"event {ident!r} is not an event: {error}") from None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8", errors="replace")
    except TypeError:
        raise CorruptStateError(f"an event field is not text: {value!r}") from None


class EventLog:
    """Adds events to the cluster's log and reads them (raises
    :class:`~router.errors.StateFailureError` when Redis fails)."""

    def __init__(self, redis: RedisClient, keys: Keys, *, keep: int = MAX_EVENTS) -> None:
        self._redis = redis
        self._keys = keys
        self._log = keys.events_log()
        self._keep = keep

    async def add(self, event: Event, *, once: str | None = None) -> bool:
        """Add ``event``; with ``once``, only if no event was added with that token in
        the last day (False then: another node told it)."""
        if once is not None:
            with translating:
                first = await command(
                    self._redis, "SET", self._keys.event_once(once), "1", "NX", "PX", KEEP_MS
                )
            if not first:
                return False
        await self.add_many([event])
        return True

    async def add_many(self, events: Iterable[Event]) -> None:
        """Add ``events`` in one round trip."""
        with translating:
            async with self._redis.pipeline(transaction=False) as pipe:
                for event in events:
                    pipe.xadd(self._log, event.fields(), maxlen=self._keep, approximate=True)
                pipe.pexpire(self._log, KEEP_MS)
                await pipe.execute()

    async def recent(
        self,
        limit: int = 100,
        *,
        since_ms: int = 0,
        kinds: Iterable[str] | None = None,
        subject: str | None = None,
        within_ms: int = KEEP_MS,
    ) -> list[Event]:
        """The newest ``limit`` events of the last ``within_ms`` (a day at most; newest
        first), later than ``since_ms`` (server milliseconds), of ``kinds`` and about
        ``subject`` if given."""
        wanted = None if kinds is None else frozenset(kinds)
        with translating:
            now_s, now_us = await self._redis.time()
        within = min(within_ms, KEEP_MS)
        horizon = max(since_ms + 1, int(now_s) * 1000 + int(now_us) // 1000 - within)
        found: list[Event] = []
        end = "+"
        while len(found) < limit:
            page = await command(
                self._redis, "XREVRANGE", self._log, end, horizon, "COUNT", max(limit, 100)
            )
            for entry_id, stored in page:
                event = parse_event(entry_id, stored)
                if (wanted is None or event.kind in wanted) and (
                    subject is None or event.subject == subject
                ):
                    found.append(event)
            if len(page) < max(limit, 100):
                break
            end = "(" + _text(page[-1][0])
        return found[:limit]

    async def lives(self, within_ms: int = 3_600_000) -> dict[str, Event]:
        """The latest ``node_up``, ``node_stopped`` or ``node_down`` event of each node
        told of in the last ``within_ms``: node id -> that event (a node whose latest is
        ``node_down`` is down: what the registry forgets once a dead node is purged, an
        operator still needs to see)."""
        latest: dict[str, Event] = {}
        for event in await self.recent(1_000, kinds=_LIFE, within_ms=within_ms):
            latest.setdefault(event.subject, event)  # (newest first)
        return latest


_LIFE: Final = ("node_up", "node_stopped", "node_down")
