"""Rate limits: the rates of one MQTT connection, token buckets that push back, and the
connection rate of each source address.

A client may publish ``max_publish_rate`` messages and ``max_publish_bytes_rate`` bytes a
second, and subscribe or unsubscribe ``max_subscribe_rate`` filters a second
(:class:`~router.mqtt.settings.MqttSettings`), each with a burst of one second's worth.
A client past any does not lose what it sent and is not disconnected: once the
packets read so far are handled, the connection stops reading its socket until the
buckets are out of debt (TCP then pushes back on the client), counted as
``mqtt_publish_throttled``. This is how EMQX's rate limiter treats a connection; a
disconnect (MQTT 5's 0x96 Message rate too high) would make a bursty device reconnect
and send again, more work for the node than the wait, and lose its QoS 0 messages.
The wait is not silence: the keepalive does not count it.

A source address may open ``max_connect_rate`` connections a second (a burst of one
second's worth, :class:`AddressRates`); more are closed at accept, before a byte is read,
and counted (``mqtt_refused``, ``mqtt_connect_rate_refused``): a flood from one host
costs the node no TLS handshake nor CONNECT work.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """Up to ``rate`` tokens (one second's worth), refilled at ``rate`` a second. A take
    may overdraw; :meth:`debt` says how long until the bucket is back to zero."""

    __slots__ = ("_clock", "_level", "_stamp", "rate")

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._level = rate
        self._stamp = clock()

    def take(self, amount: float) -> None:
        now = self._clock()
        self._level = min(self.rate, self._level + (now - self._stamp) * self.rate) - amount
        self._stamp = now

    def full(self, now: float) -> bool:
        """Whether the bucket is full again at ``now`` (one second after its last take)."""
        return now - self._stamp >= 1.0 and self._level >= 0

    def debt(self) -> float:
        """Seconds until the bucket holds no debt (0 when it holds none now)."""
        if self._level >= 0:
            return 0.0
        refilled = self._level + (self._clock() - self._stamp) * self.rate
        return 0.0 if refilled >= 0 else -refilled / self.rate


class ClientRates:
    """The buckets of one connection: PUBLISH packets, their payload bytes, and
    SUBSCRIBE / UNSUBSCRIBE filters; a rate of 0 is no limit."""

    __slots__ = ("_bytes", "_filters", "_messages")

    def __init__(
        self,
        messages: float,
        size: float,
        filters: float = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._messages = TokenBucket(messages, clock) if messages else None
        self._bytes = TokenBucket(size, clock) if size else None
        self._filters = TokenBucket(filters, clock) if filters else None

    def published(self, count: int, size: int) -> None:
        """``count`` PUBLISH packets of ``size`` payload bytes in all were read."""
        if self._messages is not None:
            self._messages.take(count)
        if self._bytes is not None:
            self._bytes.take(size)

    def subscribed(self, count: int) -> None:
        """``count`` filters were read in SUBSCRIBE and UNSUBSCRIBE packets."""
        if self._filters is not None:
            self._filters.take(count)

    def wait(self) -> float:
        """Seconds the connection should stop reading (0: none)."""
        buckets = (self._messages, self._bytes, self._filters)
        return max((b.debt() for b in buckets if b is not None), default=0.0)


class AddressRates:
    """New connections a second per source address (``rate``, a burst of one second's
    worth; 0: no limit): a bucket per address, made at its first connection and forgotten
    once full again, when more than ``keep`` addresses are held."""

    __slots__ = ("_buckets", "_clock", "keep", "rate")

    def __init__(
        self, rate: float, clock: Callable[[], float] = time.monotonic, keep: int = 10_000
    ) -> None:
        self.rate = rate
        self.keep = keep
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def allows(self, address: str) -> bool:
        """Whether one more connection from ``address`` is within its rate (it counts)."""
        if not self.rate:
            return True
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) >= self.keep:
                now = self._clock()
                self._buckets = {a: b for a, b in self._buckets.items() if not b.full(now)}
            bucket = self._buckets[address] = TokenBucket(self.rate, self._clock)
        if bucket.debt() > 0:
            return False
        bucket.take(1)
        return True

    def __len__(self) -> int:
        return len(self._buckets)
