"""The workload of ``router bench backends`` and what one worker of it received.

Groups (Django Channels groups, python-socketio rooms) are numbered ``0 .. G-1``; each has
one member on each of K of the N workers, the K that follow the group's number::

    G = 6 groups, N = 3 workers, K = 2 members a group

    group    0    1    2    3    4    5          message seq -> group seq % G
    worker0  m    .    m    m    .    m          worker w holds the groups g with
    worker1  m    m    .    m    m    .          (w - g) % N < K
    worker2  .    m    m    .    m    m

Messages are numbered: ``0 .. M-1`` go out as fast as the senders can (the throughput
phase), ``M .. M+L-1`` at a fixed rate (the latency phase), each to group ``seq % G``.
Two kinds of messages go to every group besides, each identified by a negative number:

* :data:`PROBE`, before either phase, in rounds until every member got one: the
  members' subscriptions are in effect;
* a *fence* (:func:`fence_of`: one per sender) after both: each backend carries one
  sender's messages to one worker in order, so once a member has every sender's fence,
  its worker took in everything sent before, whoever it was addressed to (what a
  worker *processed* is only read then).

A worker holds at most one member a group, so a message it *needs* is one addressed to a
group it holds: what a backend that routes by interest processes, where a backend that
broadcasts processes every message.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Final

from router.bench.checks import check_positive
from router.errors import BenchSetupError

PROBE: Final = -1
"""The sequence number of a probe (a message sent only to learn that a member gets them)."""
FIRST_FENCE: Final = -2
"""The sequence number of sender 0's fence; sender ``k``'s is ``-2 - k``."""
BACKENDS: Final = ("router_channels", "channels_redis", "router_socketio", "socketio_redis")
"""Every backend measured, in the order of a run: each router backend before its peer."""
MAX_WORKERS: Final = 32
MAX_GROUPS: Final = 100_000
MAX_PAYLOAD_BYTES: Final = 1_000_000
MAX_MESSAGES: Final = 10_000_000
"""At most this many messages in either phase (``--messages``; ``--rate`` x ``--seconds``)."""


@dataclass(frozen=True)
class BackendsConfig:
    """The sizes of one ``router bench backends`` run; checks itself on creation
    (:class:`BenchSetupError` names the option)."""

    workers: int = 4
    senders: int = 1
    groups: int = 100
    members_per_group: int = 2
    messages: int = 20_000
    payload_bytes: int = 256
    rate: float = 1_000.0
    seconds: float = 3.0

    def __post_init__(self) -> None:
        limits = {
            "workers": (1, MAX_WORKERS),
            "senders": (1, MAX_WORKERS),
            "groups": (1, MAX_GROUPS),
            "members_per_group": (1, self.workers),
            "messages": (1, MAX_MESSAGES),
            "payload_bytes": (0, MAX_PAYLOAD_BYTES),
        }
        for name, (least, most) in limits.items():
            value = getattr(self, name)
            if type(value) is not int or not least <= value <= most:
                option = f"--{name.replace('_', '-')}"
                raise BenchSetupError(f"{option} must be an int from {least} to {most:,}")
        check_positive(rate=self.rate, seconds=self.seconds)
        if not 1 <= self.latency_messages <= MAX_MESSAGES:
            raise BenchSetupError(f"--rate x --seconds must be 1 to {MAX_MESSAGES:,} messages")

    @property
    def latency_messages(self) -> int:
        """Messages of the latency phase."""
        return math.floor(self.rate * self.seconds)

    def workers_of(self, group: int) -> list[int]:
        """The workers holding a member of ``group``."""
        return [(group + j) % self.workers for j in range(self.members_per_group)]

    def groups_of(self, worker: int) -> list[int]:
        """The groups ``worker`` holds a member of (its members, in order)."""
        return [
            g for g in range(self.groups) if (worker - g) % self.workers < self.members_per_group
        ]

    def group_of(self, seq: int) -> int:
        return seq % self.groups

    def sends_to(self, group: int, first: int, count: int) -> int:
        """How many of the messages ``first .. first+count-1`` go to ``group``."""

        def below(end: int) -> int:  # (messages 0 .. end-1 to the group)
            return max(0, (end - group + self.groups - 1) // self.groups)

        return below(first + count) - below(first)

    def needed(self, worker: int, probes: int) -> int:
        """The messages addressed to ``worker``'s members over a run: both phases,
        ``probes`` probes and a fence from each sender to each group."""
        every = self.messages + self.latency_messages
        extra = probes + self.senders
        return sum(self.sends_to(g, 0, every) + extra for g in self.groups_of(worker))

    def expected(self, worker: int, first: int, count: int) -> int:
        """Deliveries to ``worker``'s members of the messages ``first .. first+count-1``."""
        return sum(self.sends_to(g, first, count) for g in self.groups_of(worker))


def fence_of(sender: int) -> int:
    """The sequence number of sender ``sender``'s fence."""
    return FIRST_FENCE - sender


class Receipts:
    """What one worker's members received (each member stands for one client: a channel,
    a socket.io sid), checked against the plan as it arrives.

    ``record(member, seq, sent_at)`` is called for every message a member gets:
    a probe marks the member probed, a fence the member fenced by its sender; a message
    for a group the member is not in is
    ``misdelivered``; a second copy of a message to the same member is a ``duplicate``;
    any other counts once, with its arrival time, and in the latency phase its latency
    (now - ``sent_at``, ``time.monotonic()``: one clock for every process of a Linux
    machine)."""

    def __init__(self, config: BackendsConfig, worker: int) -> None:
        self.config = config
        self.groups = config.groups_of(worker)
        self.probed = [False] * len(self.groups)
        self.fenced: list[set[int]] = [set() for _ in self.groups]  # senders' fences seen
        self.seen: list[set[int]] = [set() for _ in self.groups]
        self.counts = [0, 0]  # distinct deliveries: throughput phase, latency phase
        self.last = [0.0, 0.0]  # the last of them (time.monotonic())
        self.duplicates = 0
        self.misdelivered = 0
        self.latencies: list[float] = []

    def record(self, member: int, seq: int, sent_at: float) -> None:
        now = time.monotonic()
        if seq == PROBE:
            self.probed[member] = True
            return
        if FIRST_FENCE - self.config.senders < seq <= FIRST_FENCE:
            self.fenced[member].add(FIRST_FENCE - seq)
            return
        if seq < 0 or self.config.group_of(seq) != self.groups[member]:
            self.misdelivered += 1
            return
        seen = self.seen[member]
        if seq in seen:
            self.duplicates += 1
            return
        seen.add(seq)
        phase = 0 if seq < self.config.messages else 1
        self.counts[phase] += 1
        self.last[phase] = now
        if phase:
            self.latencies.append(now - sent_at)

    def status(self) -> dict[str, Any]:
        """Cheap, for polling: every member probed? fenced by every sender? The distinct
        deliveries so far."""
        return {
            "probed": all(self.probed),
            "fenced": all(len(seen) == self.config.senders for seen in self.fenced),
            "counts": list(self.counts),
        }

    def report(self) -> dict[str, Any]:
        return {
            "counts": list(self.counts),
            "last": list(self.last),
            "duplicates": self.duplicates,
            "misdelivered": self.misdelivered,
            "latencies": self.latencies,
        }
