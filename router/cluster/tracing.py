"""A node's side of the traces (:mod:`router.state.trace_store`): which clients and
topics it follows now, and the records it writes of them.

:meth:`Tracer.run` reads the traces in force every :data:`REFRESH` seconds and writes the
records gathered since, each trace's in one round trip. Nothing is traced and nothing is
checked on the publish path while no trace runs (:attr:`Tracer.active` is False: one
attribute read per batch of publishes). A trace that records faster than
:data:`RATE` a second on one node skips the rest until the next second and says how many
it skipped (a trace of ``#`` on a busy cluster must not become its load); what waits
for Redis is bounded too (:data:`PENDING`), counted when dropped.

The MQTT listener taps the connections of traced clients (:mod:`router.mqtt.trace_tap`),
told by :attr:`Tracer.changed` when the traced clients change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from router.core.messages import Message
from router.core.topics import matches
from router.errors import StateFailureError
from router.state.trace_store import TraceRecord, TraceSpec, TraceStore

log = logging.getLogger(__name__)

REFRESH: Final = 1.0
RATE: Final = 200
"""Records one trace may take on one node a second."""
PENDING: Final = 10_000


class Tracer:
    """What one node traces (see the module docstring); without a ``store`` it never
    traces anything (a dispatcher made on its own)."""

    def __init__(self, store: TraceStore | None, node_id: str) -> None:
        self._store = store
        self._node_id = node_id
        self.active = False
        self.clients: dict[str, list[TraceSpec]] = {}
        self._topics: list[TraceSpec] = []
        self._specs: dict[str, TraceSpec] = {}
        self._pending: dict[str, list[TraceRecord]] = {}
        self._pending_count = 0
        self._second = 0
        self._taken: dict[str, int] = {}  # trace id -> records this second
        self._skipped: dict[str, int] = {}
        self.changed: list[Callable[[], None]] = []  # (called when the traced clients change)
        self.dropped = 0

    async def run(self) -> None:
        """Read the traces and write their records, for ever (a supervised task)."""
        store = self._store
        if store is None:
            return
        while True:
            try:
                self.follow(await store.traces())
                await self.flush()
            except StateFailureError as error:
                log.warning("traces not read or written: %s", error)
            await asyncio.sleep(REFRESH)

    def follow(self, specs: Iterable[TraceSpec]) -> None:
        """Trace ``specs`` from now on (those no longer among them stop)."""
        specs = list(specs)
        clients: dict[str, list[TraceSpec]] = {}
        for spec in specs:
            if spec.kind == "client":
                clients.setdefault(spec.value, []).append(spec)
        had = {client: [s.id for s in found] for client, found in self.clients.items()}
        self._specs = {spec.id: spec for spec in specs}
        self.clients = clients
        self._topics = [spec for spec in specs if spec.kind == "topic"]
        self.active = bool(specs)
        if {client: [s.id for s in found] for client, found in clients.items()} != had:
            for callback in self.changed:
                callback()

    def record(self, spec: TraceSpec, what: str, client: str, topic: str, text: str) -> None:
        """Keep one record of ``spec`` (or count it skipped: see the module docstring)."""
        second = int(time.monotonic())
        if second != self._second:
            self._second = second
            self._taken.clear()
            for trace_id, count in self._skipped.items():
                if trace_id in self._specs:
                    note = f"{count} records skipped: over {RATE} a second on this node"
                    skipped = TraceRecord(self._node_id, "skipped", "", "", note)
                    self._keep(self._specs[trace_id], skipped)
            self._skipped.clear()
        taken = self._taken.get(spec.id, 0)
        if taken >= RATE:
            self._skipped[spec.id] = self._skipped.get(spec.id, 0) + 1
            return
        self._taken[spec.id] = taken + 1
        self._keep(spec, TraceRecord(self._node_id, what, client, topic, text))

    def _keep(self, spec: TraceSpec, record: TraceRecord) -> None:
        if self._pending_count >= PENDING:
            self.dropped += 1
            return
        self._pending.setdefault(spec.id, []).append(record)
        self._pending_count += 1

    def routed(self, message: Message, nodes: Mapping[str, object], queued: int) -> None:
        """A publish that entered here was matched: to ``nodes`` (``queued`` copies for
        this node's clients)."""
        for spec in self._about(message):
            others = sorted(n for n in nodes if n != self._node_id)
            where = f"forwarded to {', '.join(others)}" if others else "no other node"
            text = (
                f"qos {message.qos}{' retain' if message.retain else ''}, "
                f"{len(message.payload)} B: {queued} local copies, {where}"
                if nodes
                else f"qos {message.qos}, {len(message.payload)} B: no subscriber (unrouted)"
            )
            self.record(spec, "routed", message.publisher or "", message.topic, text)

    def arrived(self, message: Message, queued: int, dropped: int) -> None:
        """A copy forwarded by another node was delivered here."""
        for spec in self._about(message):
            text = f"from another node: {queued} local copies, {dropped} dropped"
            self.record(spec, "arrived", message.publisher or "", message.topic, text)

    def _about(self, message: Message) -> list[TraceSpec]:
        found = [spec for spec in self._topics if matches(spec.value, message.topic)]
        if message.publisher is not None and message.publisher in self.clients:
            found += self.clients[message.publisher]
        return found

    async def flush(self) -> None:
        """Write the records gathered so far (those of a trace that ended are dropped)."""
        pending, self._pending, self._pending_count = self._pending, {}, 0
        if self._store is None:
            return
        failed: StateFailureError | None = None
        for trace_id, records in pending.items():
            spec = self._specs.get(trace_id)
            if spec is None:
                continue
            try:
                await self._store.append(spec, records)
            except StateFailureError as error:
                self.dropped += len(records)
                failed = failed or error
        if failed is not None:
            raise failed

    def stats(self) -> dict[str, int]:
        return {"traces_followed": len(self._specs), "trace_records_dropped": self.dropped}
