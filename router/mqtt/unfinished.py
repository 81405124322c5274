"""The bytes of packets begun and not yet whole, for a whole node: a slow loris's hold.

A client that sends the start of a large packet and stops (or sends it a byte at a
time) costs the node what it sent for as long as the packet stays unfinished: 10,000
connections each holding most of a 1 MiB PUBLISH are 10 GiB, though every one is within
the largest packet a client may send. Two bounds end that:

* ``max_bytes``: the unfinished bytes of every connection of the node together. A
  connection whose unfinished packet would take them past it ends (the caller sends
  DISCONNECT 0x97 Quota exceeded); the others keep what they hold.
* ``timeout``: a packet must be whole within this many seconds of the read that began
  it; a connection whose packet is overdue ends (the caller sends 0x8D).

:class:`UnfinishedPackets` decides without I/O; :class:`Unfinished` adds the one timer
of the node that looks for overdue packets. The packets begun are kept in the order
they began, so the overdue ones are always the first::

    held: 70 KiB of max_bytes 256 MiB
    begun: {conn A: t=3.0, conn B: t=4.5, conn C: t=9.1}     (oldest first)
            ^ overdue at 3.0 + timeout: the timer is set for it alone

A connection that begins a new packet moves to the end (its new start is the latest);
one that has none left unfinished leaves. Costs: a dict operation per read that begins
or finishes a packet, nothing for a read within one, and one timer for the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

K = TypeVar("K", bound=Hashable)


class UnfinishedPackets(Generic[K]):
    """The node's count of unfinished bytes and the start of each unfinished packet,
    by connection (a key: any hashable object); see the module docstring."""

    __slots__ = ("_begun", "held", "max_bytes", "peak", "timeout")

    def __init__(self, max_bytes: int, timeout: float) -> None:
        self.max_bytes = max_bytes  # (0: no bound)
        self.timeout = timeout  # (0: none)
        self.held = 0
        self.peak = 0  # (the most ever held)
        self._begun: dict[K, float] = {}  # key -> when its packet began, oldest first

    def __len__(self) -> int:
        """Connections with a packet begun and not yet whole."""
        return len(self._begun)

    def take(self, size: int) -> bool:
        """Count ``size`` more unfinished bytes; False, counting nothing, when that would
        hold more than ``max_bytes``."""
        held = self.held + size
        if self.max_bytes and held > self.max_bytes:
            return False
        self.held = held
        self.peak = max(self.peak, held)
        return True

    def give(self, size: int) -> None:
        """``size`` unfinished bytes are gone (their packet is whole, or its connection ended)."""
        self.held -= size

    def begin(self, key: K, now: float) -> None:
        """``key``'s unfinished packet (a new one) began at ``now``, the latest start."""
        self._begun.pop(key, None)
        self._begun[key] = now

    def end(self, key: K) -> None:
        """``key`` has no unfinished packet (any more)."""
        self._begun.pop(key, None)

    def next_due(self) -> float | None:
        """When the oldest unfinished packet is overdue (None: none is, or no timeout)."""
        if not self.timeout:
            return None
        for began in self._begun.values():
            return began + self.timeout
        return None

    def overdue(self, now: float) -> list[K]:
        """The keys whose packet began ``timeout`` or more before ``now``, oldest first;
        they leave (the caller ends them, or begins them again)."""
        if not self.timeout:
            return []
        late = []
        for key, began in self._begun.items():
            if began + self.timeout > now:
                break
            late.append(key)
        for key in late:
            del self._begun[key]
        return late


class Late(Hashable, Protocol):
    """A connection as :class:`Unfinished` knows it: told when its packet is overdue."""

    def packet_overdue(self, now: float) -> None:
        """The packet begun ``timeout`` ago is not whole at ``now`` (it is no longer
        counted as begun: the connection ends, or begins it again)."""


class Unfinished(UnfinishedPackets[Late]):
    """:class:`UnfinishedPackets` with the node's timer, which tells each connection
    whose packet is overdue (:meth:`Late.packet_overdue`, from the event loop)."""

    __slots__ = ("_timer",)

    def __init__(self, max_bytes: int, timeout: float) -> None:
        super().__init__(max_bytes, timeout)
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, key: Late, now: float) -> None:
        super().begin(key, now)
        if self._timer is None and self.timeout:
            self._timer = asyncio.get_running_loop().call_at(now + self.timeout, self._expired)

    def stop(self) -> None:
        """No more timer (the server closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = None
        now = loop.time()
        for key in self.overdue(now):
            key.packet_overdue(now)
        self.stop()  # (one a connection's new start set: the oldest start decides)
        due = self.next_due()
        if due is not None:
            self._timer = loop.call_at(due, self._expired)
