"""Where a connection's client address comes from behind a load balancer, and the counts.

A listener in ``MqttSettings.proxy_protocol`` hands the first bytes of each connection to a
:class:`HeaderStage` (sans-I/O: bytes in, a decision out) before anything else reads them:
its sockets' :class:`~router.mqtt.tcp.ProxyFront` reads them before the TLS handshake
(``mqtts``, ``wss``) and before the WebSocket upgrade (``ws``, ``wss``:
:class:`~router.mqtt.websocket.BoundedServerConnection`). What the stage decides for a
connection from ``peer``::

    peer trusted (MqttSettings.proxy_trusted)   a PROXY header   the client is the header's
                                                                   source (LOCAL, UNKNOWN,
                                                                   AF_UNIX: the peer itself)
                                                  none            refused   (missing)
                                                  a bad one       refused   (malformed)
    peer not trusted                              a PROXY header  refused   (untrusted)
                                                  none            served as itself
    either, the header not whole within connect_timeout           refused   (timeout)

An untrusted peer of a TLS listener is not read before its handshake (a byte read there
is a byte TLS lacks): a PROXY header it sends fails the handshake instead. The header's
bytes are bounded by the reader (107 for v1, 16 + 2048 for v2). Then a WebSocket upgrade
from a trusted peer may name the client in ``X-Forwarded-For``/``Forwarded``
(:meth:`ProxyGate.forwarded`). Each outcome is counted (:meth:`ProxyGate.stats`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from router.core.proxy_header import NoHeader, ProxyHeader, ProxyHeaderReader
from router.core.trusted_proxies import TrustedProxies, normal_address
from router.errors import ProxyHeaderError

log = logging.getLogger(__name__)

Address = tuple[str, int]

#: The ways a connection's header is refused, each a count ``mqtt_proxy_refused_<way>``.
REFUSALS = ("malformed", "missing", "timeout", "untrusted")


class HeaderLists(Protocol):
    """HTTP headers that give every value of a header (websockets' ``Headers``)."""

    def get_all(self, key: str) -> list[str]: ...


def address_of(peer: object) -> Address | None:
    """A socket's peer name as (address, port), the address in its normal form; None
    for another kind of peer (a Unix socket's)."""
    if isinstance(peer, tuple) and len(peer) >= 2 and isinstance(peer[0], str):
        host = normal_address(peer[0])
        return (host if host is not None else peer[0], int(peer[1]))
    return None


class ProxyGate:
    """The trusted proxies of one server's listeners, and what they decided, counted."""

    def __init__(self, trusted: TrustedProxies) -> None:
        self.trusted = trusted
        self.pending = 0  # connections waiting for their header
        self.accepted = 0  # headers that named the client
        self.local = 0  # headers that named none (LOCAL, UNKNOWN...): the peer is the client
        self.refused = dict.fromkeys(REFUSALS, 0)
        self.forwarded_accepted = 0  # WebSocket upgrades whose forwarded header was taken
        self.forwarded_ignored = 0  # ... sent by a peer that is not trusted

    def trusts(self, peer: Address | None) -> bool:
        return peer is not None and self.trusted.trusts(peer[0])

    def stage(self, peer: Address | None) -> HeaderStage:
        """The header stage of a connection from ``peer`` (counted pending until it ends)."""
        self.pending += 1
        return HeaderStage(self, peer)

    def refuse(self, stage: HeaderStage, way: str, why: object) -> ProxyHeaderError:
        """Count ``stage``'s connection refused ``way`` (one of :data:`REFUSALS`); returns
        the error that says so."""
        stage.end()
        self.refused[way] += 1
        log.info("refusing a connection from %s: PROXY header %s (%s)", stage.peer, way, why)
        return ProxyHeaderError(way, f"PROXY header {way}: {why}")

    def forwarded(self, peer: Address | None, headers: HeaderLists | None) -> Address | None:
        """The client of a WebSocket upgrade from ``peer`` with these HTTP ``headers``: the
        right-most untrusted hop of ``Forwarded`` or ``X-Forwarded-For`` when ``peer`` is a
        trusted proxy (its port is the peer's: a hop names no port), else ``peer``."""
        if peer is None or headers is None:
            return peer
        forwarded, listed = headers.get_all("Forwarded"), headers.get_all("X-Forwarded-For")
        if not forwarded and not listed:
            return peer
        if not self.trusts(peer):
            self.forwarded_ignored += 1
            return peer
        self.forwarded_accepted += 1
        return self.trusted.client(peer[0], forwarded, listed), peer[1]

    def stats(self) -> dict[str, int]:
        return {
            "mqtt_proxy_pending": self.pending,
            "mqtt_proxy_accepted": self.accepted,
            "mqtt_proxy_local": self.local,
            **{f"mqtt_proxy_refused_{way}": count for way, count in self.refused.items()},
            "mqtt_forwarded_accepted": self.forwarded_accepted,
            "mqtt_forwarded_ignored": self.forwarded_ignored,
        }


class HeaderStage:
    """One connection's wait for its PROXY header (see the module docstring)."""

    __slots__ = ("_gate", "_open", "_reader", "peer", "trusted")

    def __init__(self, gate: ProxyGate, peer: Address | None) -> None:
        self._gate = gate
        self._reader = ProxyHeaderReader()
        self._open = True
        self.peer = peer
        self.trusted = gate.trusts(peer)

    def wanted(self) -> int:
        """Bytes to read next, none past the header (:meth:`ProxyHeaderReader.wanted`)."""
        return self._reader.wanted()

    def end(self) -> None:
        """The stage is over (decided, or the connection went): no longer pending."""
        if self._open:
            self._open = False
            self._gate.pending -= 1

    def timed_out(self) -> ProxyHeaderError:
        """The header was not whole in time: counted; the error to close with."""
        return self._gate.refuse(self, "timeout", "not whole within connect_timeout")

    def feed(self, data: bytes) -> tuple[Address | None, bytes] | None:
        """Take bytes read: None while undecided, then the client's address and the bytes
        after the header (``data`` may run past it). Raises :class:`ProxyHeaderError`
        (counted) when the connection is refused."""
        gate, offset = self._gate, 0
        while offset < len(data):
            chunk = data[offset : offset + self._reader.wanted()]
            offset += len(chunk)
            try:
                outcome = self._reader.feed(chunk)
            except ProxyHeaderError as error:
                raise gate.refuse(self, "malformed", error) from None
            if isinstance(outcome, NoHeader):
                if self.trusted:
                    raise gate.refuse(self, "missing", "a trusted proxy sent none")
                self.end()
                return self.peer, outcome.data + data[offset:]
            if isinstance(outcome, ProxyHeader):
                return self._decided(outcome), data[offset:]
        return None

    def _decided(self, header: ProxyHeader) -> Address | None:
        gate = self._gate
        if not self.trusted:
            raise gate.refuse(self, "untrusted", "the peer is not a trusted proxy")
        self.end()
        if header.source is None:
            gate.local += 1
            return self.peer
        gate.accepted += 1
        return header.source
