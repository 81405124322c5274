"""Overload protection, the decisions: when a node is overloaded, and whom it slows.

A node does not hold honest clients to fixed low rates (the per-client and per-address
limits of :mod:`router.mqtt.rates` are off by default); it watches its own pressure and
pushes back only while it is overloaded, as HiveMQ's overload protection does. The
signals, sampled by :mod:`router.mqtt.pressure` (the driver: this module does no I/O)::

    loop_lag        seconds the event loop was late waking a 0.1 s timer: the node is
                    held by long callbacks. The default, 1 s, is a third of the default
                    heartbeat TTL: a node lagging more risks being taken for dead
    loop_busy       the share of the time the event loop worked (0 to 1,
                    :mod:`router.mqtt.loop_load`): the node is saturated, even when every
                    turn of its loop is short (a flood of small packets lags no timer)
    queued_bytes    payload bytes waiting in the node's memory for its clients
    memory          the process's resident bytes
    redis_latency   seconds one Redis PING took

A signal is over when it reaches its limit (:class:`OverloadLimits`; a limit of 0 is
not watched). The node becomes overloaded after :data:`ENTER_AFTER` samples in a row
with a signal over, and is relieved after :data:`LEAVE_AFTER` samples in a row with
every signal under :data:`RELIEF` of its limit, so that it does not flap at the edge.

Two levels, each judged so (an :class:`OverloadGovernor` each): *busy*, when the loop
lags ``busy_lag`` (0.1 s) or works ``busy_load`` of the time (0.9 by default: the
other clients' packets have started to wait behind the work of a few), and
*overloaded*. While busy or overloaded the heaviest clients are slowed; while
overloaded, new CONNECTs also wait for relief (bounded by the connect timeout, then
CONNACK 0x89 Server busy). A storm of honest connections sends alike and is slowed by
nothing below the overload; a flood from a few connections is slowed as soon as the
others wait.

The heaviest (:func:`heaviest`) are judged by the work each connection brought in the
last sample (the bytes it sent and :data:`PACKET_WORK` for each packet, of every kind):
those that brought at least :data:`HEAVY_OVER` times the median of the other
connections that sent anything, and at least :data:`MIN_HEAVY` work, at most
:data:`MAX_HEAVY` of them, the heaviest first. So the few that do most of the work
wait, and the others keep their latency. Two cases choose nobody, on purpose: a
connection with fewer than :data:`MIN_OTHERS` others at work (a publisher alone with
the subscriber it feeds: slowing it would relieve nobody but its own reader), and a
node where most connections are heavy alike (a fleet: the overload level defers its
new connections instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from router.errors import InvalidSettingError

#: Samples in a row with a signal over its limit before the node is overloaded.
ENTER_AFTER: Final = 2
#: Samples in a row with every signal under RELIEF of its limit before it is relieved.
LEAVE_AFTER: Final = 10
#: The share of a limit under which a signal counts as relieved.
RELIEF: Final = 0.5
#: The work a packet brings besides its bytes (a 64-byte PUBLISH costs the node more
#: than its bytes: decoding, matching, acknowledging).
PACKET_WORK: Final = 64
#: A connection slowed brought at least this much work in the last sample (8 KiB or
#: 128 small packets in 0.1 s).
MIN_HEAVY: Final = 8192
#: ...and at least this many times the median work of the others at work.
HEAVY_OVER: Final = 2
#: ...and there were at least this many others at work.
MIN_OTHERS: Final = 2
#: At most this many connections are slowed at each sample.
MAX_HEAVY: Final = 100
SIGNALS: Final = ("loop_lag", "loop_busy", "queued_bytes", "memory", "redis_latency")
LIMITS: Final = (*SIGNALS, "busy_lag", "busy_load")

K = TypeVar("K")


@dataclass(frozen=True)
class OverloadLimits:
    """The level of each signal at which the node is overloaded (0: not watched):
    ``loop_lag`` and ``redis_latency`` in seconds, ``queued_bytes`` and ``memory`` in
    bytes, ``loop_busy`` a share of the time (not watched by default: a storm of honest
    connections keeps a loop at work without anyone waiting long); and the levels at
    which it is *busy*, ``busy_lag`` (loop lag) and ``busy_load`` (the loop's share of
    time at work): it slows its heaviest clients then, and defers connections only once
    overloaded. Raises :class:`InvalidSettingError` for a negative limit, or a share
    above 1."""

    loop_lag: float = 1.0
    queued_bytes: int = 1 << 30
    memory: int = 0
    redis_latency: float = 1.0
    busy_lag: float = 0.1
    loop_busy: float = 0.0
    busy_load: float = 0.9

    def busy(self) -> OverloadLimits:
        """The limits that make the node busy (its loop's lag and work share only)."""
        return OverloadLimits(self.busy_lag, 0, 0, 0, 0, loop_busy=self.busy_load, busy_load=0)

    def __post_init__(self) -> None:
        for name in LIMITS:
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise InvalidSettingError(f"overload limit {name} is out of range: {value!r}")
        for name in ("loop_busy", "busy_load"):
            if getattr(self, name) > 1:
                raise InvalidSettingError(
                    f"overload limit {name} is a share of the time, 0 to 1: {getattr(self, name)!r}"
                )

    def watched(self) -> bool:
        """Whether any signal is watched."""
        return any(getattr(self, name) for name in LIMITS)


@dataclass(frozen=True)
class Change:
    """The node became overloaded (``overloaded``) or was relieved; ``reasons``: the
    signals over their limits when it became overloaded (those of the last sample
    over, when relieved), with their values."""

    overloaded: bool
    reasons: Mapping[str, float]


class OverloadGovernor:
    """Decides from samples whether the node is overloaded (see the module docstring)."""

    def __init__(self, limits: OverloadLimits) -> None:
        self.limits = limits
        self.overloaded = False
        self.reasons: dict[str, float] = {}  # the signals over at the last sample
        self.episodes = 0  # times the node became overloaded
        self._over = 0  # samples in a row with a signal over
        self._under = 0  # samples in a row with every signal relieved

    def observe(self, signals: Mapping[str, float]) -> Change | None:
        """One sample of some of :data:`SIGNALS` (a signal not given is not judged);
        returns the change it makes, if any."""
        over: dict[str, float] = {}
        relieved = True
        for name in SIGNALS:
            limit = getattr(self.limits, name)
            value = signals.get(name)
            if not limit or value is None:
                continue
            if value >= limit:
                over[name] = value
            if value >= limit * RELIEF:
                relieved = False
        self.reasons = over
        self._over = self._over + 1 if over else 0
        self._under = self._under + 1 if relieved else 0
        if not self.overloaded and self._over >= ENTER_AFTER:
            self.overloaded = True
            self.episodes += 1
            self._under = 0
            return Change(True, over)
        if self.overloaded and self._under >= LEAVE_AFTER:
            self.overloaded = False
            self._over = 0
            return Change(False, over)
        return None


def heaviest(work: Mapping[K, int]) -> list[K]:
    """The connections to slow, of ``work`` (the work each brought in the last sample,
    idle ones with 0): those with at least :data:`MIN_HEAVY` and at least
    :data:`HEAVY_OVER` times the median of the others at work, when there are at least
    :data:`MIN_OTHERS` of those; at most :data:`MAX_HEAVY`, the heaviest first."""
    busy = sorted(count for count in work.values() if count > 0)
    if len(busy) <= MIN_OTHERS:
        return []
    # (The median of the others is that of all but the heaviest for every connection
    # above the median, and only those can be twice it.)
    others = busy[:-1]
    middle = len(others) // 2
    median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
    floor = max(MIN_HEAVY, HEAVY_OVER * median)
    heavy = [(count, key) for key, count in work.items() if count >= floor]
    heavy.sort(key=lambda item: -item[0])
    return [key for _, key in heavy[:MAX_HEAVY]]
