"""Overload protection, the driver: samples the node's pressure and applies what
:mod:`router.mqtt.overload` decides.

:class:`PressureWatch` (one task per MQTT server, started with its listeners) wakes
every :data:`TICK` seconds and measures how late it woke (the event loop's lag) and the
share of the time since the last tick that the loop worked
(:class:`~router.mqtt.loop_load.LoopLoad`); every
:data:`SLOW_EVERY` ticks also the payload bytes queued in the node's memory for its
clients, the process's resident memory and, in a task of its own so that a slow Redis
does not hold the watch up, the time one Redis PING takes. It hands the samples to the
:class:`~router.mqtt.overload.OverloadGovernor`, and while the node is overloaded:

- a CONNECT waits for relief before the node's work for it (:meth:`PressureWatch.admit`,
  at most until the connection's connect timeout: then CONNACK 0x89 Server busy, the
  client retries), counted ``mqtt_overload_deferred_connects`` and
  ``mqtt_overload_refused_connects``;
- each tick, while it is overloaded or only *busy* (its loop lags ``busy_lag`` or
  works ``busy_load`` of the time), the heaviest connections of the last tick (by the
  work they brought: :attr:`Throttleable.work`) stop reading for :data:`SLOW`
  seconds, twice as long each time one is chosen again within :data:`REMEMBERED`
  seconds of its last slowing (at most :data:`MAX_SLOW`: a flood that comes back is
  held back harder, across the short calms its own slowing makes; TCP pushes back on
  it, nothing it sent is lost), counted ``mqtt_overload_slowed``
  (``mqtt_overload_busy``: 1 while busy; ``mqtt_loop_busy_percent``: the loop's work
  share at the last tick), and told as the event ``clients_slowed`` (at most every
  :data:`EVENTS_EVERY` seconds: how many were slowed since the last one, and the
  heaviest of them). A connection slowed also stops holding the node's other
  publishers behind its SUBSCRIBEs not handled yet
  (:meth:`~router.mqtt.subscribing.Subscribing.let_go`).

Becoming overloaded and being relieved are events (``overload`` and
``overload_relieved``, with the signals over their limits; each told at most every
:data:`EVENTS_EVERY` seconds, the others counted as the event log's suppressed) and the gauge
``mqtt_overloaded`` (1 while overloaded); ``mqtt_overload_episodes`` counts them.

Cost while not busy: two clock readings a turn of the loop, a timer every 0.1 s, and
every second a sum over the node's sessions, a read of ``/proc/self/statm`` and a PING.
Per connection: a sum at each read, and one subtraction a tick only while busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import Final, Protocol

from router.cluster.node import RouterNode
from router.cluster.tasks import stop_task
from router.mqtt.loop_load import LoopLoad
from router.mqtt.overload import Change, OverloadGovernor, OverloadLimits, heaviest

log = logging.getLogger(__name__)

TICK: Final = 0.1  # seconds between samples of the loop's lag
SLOW_EVERY: Final = 10  # ticks between samples of queues, memory and Redis
SLOW: Final = 0.2  # seconds a heavy publisher stops reading, the first time it is chosen
MAX_SLOW: Final = 2.0  # seconds, at most: each time again doubles it
REMEMBERED: Final = 10.0  # seconds after its last slowing that a connection's streak is kept
PING_TIMEOUT: Final = 5.0  # seconds; a PING not answered by then counts as that long
STATM: Final = "/proc/self/statm"
EVENTS_EVERY: Final = 30.0  # seconds: a node at the edge tells its episodes this often at most


def resident_kib() -> int:
    """The process's resident memory in KiB: ``/proc/self/statm`` where there is one,
    else the peak resident size (``getrusage``; bytes on macOS, KiB elsewhere)."""
    try:
        with open(STATM, "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak // 1024 if sys.platform == "darwin" else peak


class Throttleable(Protocol):
    """A connection as overload protection sees it (an
    :class:`~router.mqtt.protocol.MqttConnection`)."""

    @property
    def work(self) -> int:
        """The work the client brought since the connection opened (its bytes and
        :data:`~router.mqtt.overload.PACKET_WORK` a packet)."""
        ...

    def slow(self, seconds: float) -> None: ...


class Watched(Protocol):
    """The server whose node and connections are watched (the
    :class:`~router.mqtt.server.MqttServer`)."""

    node: RouterNode

    def connections(self) -> Sequence[Throttleable]: ...


class PressureWatch:
    """The overload protection of one MQTT server (see the module docstring)."""

    def __init__(self, server: Watched, limits: OverloadLimits) -> None:
        self.server = server
        self.governor = OverloadGovernor(limits)
        self.busy = OverloadGovernor(limits.busy())
        self.deferred_connects = 0
        self.refused_connects = 0
        self.slowed = 0
        self._slowed_told = 0  # (self.slowed when clients_slowed was last told)
        self._relieved = asyncio.Event()
        self._relieved.set()
        self.loop_busy = 0.0  # (the loop's work share at the last tick)
        self._worked: dict[Throttleable, int] = {}  # (each one's work at the last tick)
        # (times slowed in a row, and the loop time of the last one)
        self._streaks: dict[Throttleable, tuple[int, float]] = {}
        self._redis_latency: float | None = None
        self._pinging: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wanted = False  # (started: a retune that watches a signal starts it)

    @property
    def overloaded(self) -> bool:
        return self.governor.overloaded

    def start(self) -> None:
        """Start watching (no-op when no signal is watched, or already watching)."""
        self._wanted = True
        if self._task is None and self.governor.limits.watched():
            self._task = asyncio.create_task(self._run(), name="mqtt-pressure")

    def retune(self, limits: OverloadLimits) -> None:
        """Judge by ``limits`` from the next sample on (a reload); a watch started
        with no signal watched starts now if one is."""
        self.governor.limits = limits
        self.busy.limits = limits.busy()
        if self._wanted:
            self.start()

    async def stop(self) -> None:
        for task in (self._task, self._pinging):
            if task is not None:
                await stop_task(task)
        self._task = self._pinging = None
        self._wanted = False
        self._relieved.set()

    async def admit(self, deadline: float) -> bool:
        """Wait, while the node is overloaded, for relief until ``deadline`` (loop time);
        False when it did not come (the CONNECT is then refused with 0x89)."""
        if not self.governor.overloaded:
            return True
        self.deferred_connects += 1
        try:
            async with asyncio.timeout_at(deadline):
                await self._relieved.wait()
        except TimeoutError:
            self.refused_connects += 1
            return False
        return True

    def observe(self, signals: dict[str, float]) -> None:
        """Judge one sample (the watch's own, or a test's) and apply what changed."""
        change = self.governor.observe(signals)
        if change is not None:
            self._announce(change)
        self.busy.observe(signals)
        if self.governor.overloaded or self.busy.overloaded:
            self._slow_heaviest()
        elif self._worked:
            self._worked = {}

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        load = LoopLoad()
        ticks = 0
        while True:
            due = loop.time() + TICK
            await asyncio.sleep(TICK)
            self.loop_busy = load.sample()
            signals = {"loop_lag": max(0.0, loop.time() - due), "loop_busy": self.loop_busy}
            ticks += 1
            if ticks % SLOW_EVERY == 0:
                signals.update(self._slow_signals())
            try:
                self.observe(signals)
            except Exception as error:  # (a watch that failed would leave the node unprotected)
                self.server.node.internal_error("overload protection's judgement", error)

    def _slow_signals(self) -> dict[str, float]:
        held = self.server.node.sessions.held()
        signals = {
            "queued_bytes": float(sum(session.queued_bytes for session in held)),
            "memory": float(resident_kib() * 1024),
        }
        if self._redis_latency is not None:
            signals["redis_latency"] = self._redis_latency
        if self.governor.limits.redis_latency and (self._pinging is None or self._pinging.done()):
            self._pinging = asyncio.create_task(self._ping(), name="mqtt-pressure-ping")
        return signals

    async def _ping(self) -> None:
        started = time.perf_counter()
        with contextlib.suppress(Exception):  # (unreachable: the node's liveness tells)
            async with asyncio.timeout(PING_TIMEOUT):
                await self.server.node.registry.redis.ping()
        self._redis_latency = time.perf_counter() - started

    def _slow_heaviest(self) -> None:
        worked: dict[Throttleable, int] = {}
        brought: dict[Throttleable, int] = {}
        for connection in self.server.connections():
            total = connection.work
            worked[connection] = total
            brought[connection] = total - self._worked.get(connection, total)
        self._worked = worked
        now = asyncio.get_running_loop().time()
        streaks = self._streaks
        chosen = heaviest(brought)
        if chosen:
            self._tell_slowed(chosen[0], brought[chosen[0]])
        for connection in chosen:
            streak, last = streaks.get(connection, (0, now))
            streak = streak + 1 if now - last <= REMEMBERED else 1
            streaks[connection] = (streak, now)
            connection.slow(min(SLOW * 2 ** (streak - 1), MAX_SLOW))
            self.slowed += 1
        if len(streaks) > len(worked):  # (forget the connections gone)
            self._streaks = {key: value for key, value in streaks.items() if key in worked}

    def _tell_slowed(self, heaviest: Throttleable, work: int) -> None:
        node = self.server.node
        who = getattr(heaviest, "client_id", None) or "a client not yet connected"
        since = self.slowed - self._slowed_told
        if node.events.due("clients_slowed", node.node_id, EVENTS_EVERY):
            node.events.tell(
                "clients_slowed",
                node.node_id,
                f"node {node.node_id} is busy (its loop works {self.loop_busy:.0%} of the "
                f"time): it slows its heaviest clients, {who} first ({work} bytes and "
                f"packets in 0.1 s); {since} slowed since the last report",
                "warning",
                every=EVENTS_EVERY,
            )
            self._slowed_told = self.slowed

    def _announce(self, change: Change) -> None:
        node = self.server.node
        said = ", ".join(f"{name} {value:.3g}" for name, value in change.reasons.items())
        if change.overloaded:
            self._relieved.clear()
            node.events.tell(
                "overload",
                node.node_id,
                f"node {node.node_id} is overloaded ({said}): new connections wait, "
                "the heaviest publishers are slowed",
                "warning",
                every=EVENTS_EVERY,
            )
        else:
            self._relieved.set()
            node.events.tell(
                "overload_relieved",
                node.node_id,
                f"node {node.node_id} is no longer overloaded",
                every=EVENTS_EVERY,
            )

    def stats(self) -> dict[str, int]:
        return {
            "mqtt_overloaded": int(self.governor.overloaded),
            "mqtt_overload_busy": int(self.busy.overloaded),
            "mqtt_overload_busy_episodes": self.busy.episodes,
            "mqtt_overload_episodes": self.governor.episodes,
            "mqtt_overload_deferred_connects": self.deferred_connects,
            "mqtt_overload_refused_connects": self.refused_connects,
            "mqtt_overload_slowed": self.slowed,
            "mqtt_loop_busy_percent": round(self.loop_busy * 100),
        }
