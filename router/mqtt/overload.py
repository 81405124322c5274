"""Overload protection, the decisions: when a node is overloaded, and whom it slows.

A node does not hold honest clients to fixed low rates (the per-client and per-address
limits of :mod:`router.mqtt.rates` are off by default); it watches its own pressure and
pushes back only while it is overloaded, as HiveMQ's overload protection does. The
signals, sampled by :mod:`router.mqtt.pressure` (the driver: this module does no I/O)::

    loop_lag        seconds the event loop was late waking a 0.1 s timer: the node's CPU
                    is saturated (a lag shows before anything else does). The default,
                    1 s, is a third of the default heartbeat TTL: a node lagging more
                    risks being taken for dead; a node busy below it is only busy
    queued_bytes    payload bytes waiting in the node's memory for its clients
    memory          the process's resident bytes
    redis_latency   seconds one Redis PING took

A signal is over when it reaches its limit (:class:`OverloadLimits`; a limit of 0 is
not watched). The node becomes overloaded after :data:`ENTER_AFTER` samples in a row
with a signal over, and is relieved after :data:`LEAVE_AFTER` samples in a row with
every signal under :data:`RELIEF` of its limit, so that it does not flap at the edge.

Two levels, each judged so (an :class:`OverloadGovernor` each): *busy*, when the loop
lags ``busy_lag`` (0.1 s by default: the other clients' round trips have started to
wait behind the work of a few), and *overloaded*. While busy or overloaded the heaviest
publishers are slowed; while overloaded, new CONNECTs also wait for relief (bounded by
the connect timeout, then CONNACK 0x89 Server busy). A storm of honest connections
publishes nothing and is slowed by nothing below the overload; a flood from a few
connections is slowed as soon as the others wait. The heaviest publishers
(:func:`heaviest`) are those that published in the last sample at least twice the
mean of the node's other connections, and at least :data:`MIN_HEAVY` messages, at most
:data:`MAX_HEAVY` of them, the heaviest first. The
others keep their latency: the flood is what waits.
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
#: A publisher slowed has published at least this many messages in the last sample.
MIN_HEAVY: Final = 10
#: At most this many publishers are slowed at each sample.
MAX_HEAVY: Final = 100
SIGNALS: Final = ("loop_lag", "queued_bytes", "memory", "redis_latency")

K = TypeVar("K")


@dataclass(frozen=True)
class OverloadLimits:
    """The level of each signal at which the node is overloaded (0: not watched):
    ``loop_lag`` and ``redis_latency`` in seconds, ``queued_bytes`` and ``memory`` in
    bytes; and ``busy_lag``, the loop lag at which it is *busy*: it slows its heaviest
    publishers then, and defers connections only once overloaded. Raises
    :class:`InvalidSettingError` for a negative limit."""

    loop_lag: float = 1.0
    queued_bytes: int = 1 << 30
    memory: int = 0
    redis_latency: float = 1.0
    busy_lag: float = 0.1

    def busy(self) -> OverloadLimits:
        """The limits that make the node busy (its loop lag only)."""
        return OverloadLimits(self.busy_lag, 0, 0, 0, 0)

    def __post_init__(self) -> None:
        for name in (*SIGNALS, "busy_lag"):
            value = getattr(self, name)
            if not 0 <= value < float("inf"):
                raise InvalidSettingError(f"overload limit {name} is out of range: {value!r}")

    def watched(self) -> bool:
        """Whether any signal is watched."""
        return any(getattr(self, name) for name in (*SIGNALS, "busy_lag"))


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


def heaviest(published: Mapping[K, int]) -> list[K]:
    """The publishers to slow, of ``published`` (each connection's messages in the last
    sample, idle ones with 0): those with at least :data:`MIN_HEAVY` and at least twice
    the mean of the others (a fleet that publishes alike has none), at most
    :data:`MAX_HEAVY`, the heaviest first."""
    total, others = sum(published.values()), max(len(published) - 1, 1)
    heavy = [
        (count, key)
        for key, count in published.items()
        if count >= MIN_HEAVY and count >= 2 * (total - count) / others
    ]
    heavy.sort(key=lambda item: -item[0])
    return [key for _, key in heavy[:MAX_HEAVY]]
