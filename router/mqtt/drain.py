"""Draining the MQTT front end of a node: accept no one more, then end every connection,
paced, telling each MQTT 5.0 client where to go.

A drain (``router node drain``, or SIGTERM to ``router node run``: :mod:`router.ops.draining`
runs it, then the node leaves) first stops the listeners
(:meth:`~router.mqtt.server.MqttServer.stop_listening`: ``/healthz`` answers 503 from
then on, so a load balancer's health check takes the node out), then ends the
connections ``rate`` a second, with at most ``window`` persistent sessions on their way
to other nodes at a time, so that their reconnects reach the other nodes as fast as those
take them in rather than as one storm:

* an MQTT 5.0 client gets DISCONNECT 0x9C *Use another server* with a Server Reference
  when live peers advertise the address their clients use (``--mqtt-advertise``; the
  references go round the peers in turn), else 0x8B *Server shutting down*;
* a 3.1/3.1.1 client's connection is closed (those versions have no DISCONNECT from the
  server), as is one whose CONNECT has not come.

Each session then goes as after any disconnect: a persistent one keeps its subscriptions,
its in-flight copies and its queue in Redis (:mod:`router.cluster.sessions.keeper`), and
its client resumes it on any node. What is still open when ``grace`` ran out is ended at
once. :class:`DrainPlan` decides who is ended when and how (no I/O); :func:`drain` does it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from router.errors import InvalidSettingError
from router.mqtt.packets import MQTT_5
from router.mqtt.protocol import MqttConnection
from router.mqtt.reason_codes import ReasonCode
from router.mqtt.server import MqttServer

log = logging.getLogger(__name__)

TICK: Final = 0.05
"""Seconds between two rounds of a paced drain (at 1,000 a second: 50 a round)."""
STALE: Final = 5.0
"""Seconds after which a persistent session ended by the drain and not resumed elsewhere
no longer counts as on its way (its client may never come back)."""
MOVE_TIME: Final = 2.0
"""Seconds a session ended by the drain should take to resume on another node: the window
is what the other nodes took in over the last such span (see :meth:`DrainPlan.window`)."""
MIN_WINDOW: Final = 32


@dataclass(frozen=True)
class DrainSettings:
    """How a node drains: ``grace`` seconds at most for the whole drain (then the node
    leaves all the same), ``rate`` connections ended a second at most (0: no bound),
    and at most ``window`` persistent sessions ended and on their way to another node
    at a time (resumed there, or :data:`STALE`; 0: no bound). The window adapts the pace
    to how fast the other nodes take the sessions in: a node that resumes 200 a second
    gets no more, rather than a queue of CONNECTs that outlasts their connect timeout
    (:meth:`DrainPlan.window`)."""

    grace: float = 30.0
    rate: int = 1_000
    window: int = 256

    def __post_init__(self) -> None:
        if not (isinstance(self.grace, int | float) and math.isfinite(self.grace)):
            raise InvalidSettingError(f"the drain grace must be a number, not {self.grace!r}")
        if self.grace < 0:
            raise InvalidSettingError(f"the drain grace must be >= 0 seconds, not {self.grace}")
        if type(self.rate) is not int or self.rate < 0:
            raise InvalidSettingError(f"the drain rate must be an int >= 0, not {self.rate!r}")
        if type(self.window) is not int or self.window < 0:
            raise InvalidSettingError(f"the drain window must be an int >= 0, not {self.window!r}")


@dataclass(frozen=True)
class DrainReport:
    """What a drain of the front end did: the connections it ended (``redirected`` got
    0x9C with a Server Reference, ``shut_down`` 0x8B, ``closed`` no DISCONNECT: 3.1.1 or
    before their CONNECT), those that had not let go of their session when the grace
    ran out (``unfinished``), and how long it took."""

    redirected: int = 0
    shut_down: int = 0
    closed: int = 0
    unfinished: int = 0
    seconds: float = 0.0

    @property
    def ended(self) -> int:
        return self.redirected + self.shut_down + self.closed

    def as_dict(self) -> dict[str, float]:
        return {
            "ended": self.ended,
            "redirected": self.redirected,
            "shut_down": self.shut_down,
            "closed": self.closed,
            "unfinished": self.unfinished,
            "seconds": round(self.seconds, 3),
        }


class DrainPlan:
    """Who is ended when, and with what (pure: the caller reads the clock and ends).

    ``rate`` connections a second (0: every one at once) from the drain's start, while
    fewer than ``window`` persistent sessions are on their way; after the ``grace``
    every one left. ``references``: the addresses of live peers an MQTT 5.0 client is
    sent to, in turn (none: 0x8B)."""

    def __init__(self, settings: DrainSettings, references: Sequence[str] = ()) -> None:
        self.settings = settings
        self.references = tuple(references)
        self._next: Iterator[str] | None = (
            itertools.cycle(self.references) if self.references else None
        )
        self.ended = 0

    def window(self, moved_lately: int) -> int:
        """Persistent sessions that may be on their way now, when ``moved_lately`` resumed
        elsewhere over the last :data:`MOVE_TIME` seconds: as many as the other nodes
        take in over that span (so each waits about that long), at least
        :data:`MIN_WINDOW`, at most ``settings.window``; 0: no bound. Like a congestion
        window it opens while the sessions move quicker, and closes when they slow."""
        if not self.settings.window:
            return 0
        return max(MIN_WINDOW, min(self.settings.window, moved_lately))

    def due(
        self, elapsed: float, waiting: int, on_their_way: int = 0, moved_lately: int = 0
    ) -> int:
        """How many of the ``waiting`` connections to end now, ``elapsed`` seconds into
        the drain, with ``on_their_way`` persistent sessions ended and not yet resumed
        elsewhere and ``moved_lately`` resumed over the last :data:`MOVE_TIME` seconds
        (counted as ended)."""
        settings = self.settings
        allowed = waiting
        if elapsed < settings.grace:
            if settings.rate:
                allowed = min(allowed, int(elapsed * settings.rate) + 1 - self.ended)
            if settings.window:
                allowed = min(allowed, self.window(moved_lately) - on_their_way)
        allowed = max(0, allowed)
        self.ended += allowed
        return allowed

    def disconnect(self, level: int, connected: bool) -> tuple[int | None, str | None]:
        """(reason code, server reference) for a client of MQTT ``level`` (``connected``:
        it got its CONNACK); (None, None) for a close without DISCONNECT."""
        if level < MQTT_5 or not connected:
            return None, None
        if self._next is None:
            return ReasonCode.SERVER_SHUTTING_DOWN, None
        return ReasonCode.USE_ANOTHER_SERVER, next(self._next)


async def drain(
    server: MqttServer, settings: DrainSettings, references: Sequence[str] = ()
) -> DrainReport:
    """Drain ``server`` (see the module docstring) and return what it did, once every
    connection ended and let go of its session, or the grace ran out."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    plan = DrainPlan(settings, references)
    server.stop_listening()
    ended: list[MqttConnection] = []
    told = {"redirected": 0, "shut_down": 0, "closed": 0}
    waiting = deque(server.open_connections())  # (no new one comes: the listeners closed)
    on_their_way: dict[str, float] = {}  # persistent sessions ended -> when
    moved: deque[float] = deque()  # when each of them resumed elsewhere, lately
    while waiting:
        now = loop.time()
        _follow(server, on_their_way, moved, now)
        due = plan.due(now - began, len(waiting), len(on_their_way), len(moved))
        for _ in range(due):
            connection = waiting.popleft()
            if not server.holds(connection):  # (it ended meanwhile)
                continue
            code, reference = plan.disconnect(connection.level, connection.client_id is not None)
            told[_told(code)] += 1
            ended.append(connection)
            if connection.persistent and connection.client_id is not None:
                on_their_way[connection.client_id] = now
            connection.end(ReasonCode.SERVER_SHUTTING_DOWN if code is None else code, reference)
        await asyncio.sleep(TICK)
    remaining = max(0.0, began + settings.grace - loop.time())
    waits = [asyncio.ensure_future(c.finished()) for c in ended]
    unfinished = 0
    if waits:
        _, pending = await asyncio.wait(waits, timeout=remaining)
        unfinished = len(pending)
        for task in pending:
            task.cancel()
    return DrainReport(**told, unfinished=unfinished, seconds=loop.time() - began)


def _follow(
    server: MqttServer, on_their_way: dict[str, float], moved: deque[float], now: float
) -> None:
    """Forget the sessions on their way that resumed elsewhere (this node no longer holds
    their claim: noted in ``moved``) or went :data:`STALE`, and the moves older than
    :data:`MOVE_TIME`."""
    for client_id, ended_at in list(on_their_way.items()):
        if not server.node.serves(client_id):
            del on_their_way[client_id]
            moved.append(now)
        elif ended_at <= now - STALE:
            del on_their_way[client_id]
    while moved and moved[0] <= now - MOVE_TIME:
        moved.popleft()


def _told(code: int | None) -> str:
    if code == ReasonCode.USE_ANOTHER_SERVER:
        return "redirected"
    return "closed" if code is None else "shut_down"
