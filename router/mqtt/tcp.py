"""MQTT over TCP and TLS: each accepted socket is an asyncio protocol, not a stream.

A :class:`TcpStream` is both the asyncio protocol of one accepted socket and the
:class:`~router.mqtt.intake.Transport` of its :class:`~router.mqtt.protocol.MqttConnection`:
asyncio reads into one buffer that the listener's sockets share (a read is handed to the
connection's packet reader, which copies what it keeps, before the next read), pushes the
bytes to the connection and tells it of the end of the stream; the connection writes,
waits for the client to read (:meth:`TcpStream.drain`) and pauses reading through it. No
stream reader, writer or task per socket: an idle connection costs its socket, asyncio's
transport, this object and the connection's own state.

Sockets beyond ``max_connections`` are closed as they are accepted, before a byte is read
(:meth:`~router.mqtt.server.MqttServer.refuses`). A client that closes its sending side
(EOF) still gets the answers to what it sent before (plain TCP: TLS has no half-close).

Behind a load balancer (``MqttSettings.proxy_protocol``) each socket is first a
:class:`ProxyFront`, which reads the PROXY header exactly (no byte past it), then starts
TLS on the rest of the stream if the listener has it and hands the socket and the
client's address to its :class:`Proxied` protocol: a :class:`TcpStream`, or the
WebSocket listeners' connection (:mod:`router.mqtt.websocket`; see
:mod:`router.mqtt.proxy_gate`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Final, cast

from router.errors import ProxyHeaderError
from router.mqtt.connection_host import ConnectionHost
from router.mqtt.protocol import MqttConnection
from router.mqtt.proxy_gate import Address, HeaderStage, address_of
from router.mqtt.trace_tap import ClientTap

#: Bytes asyncio reads from a socket at once (into the buffer a listener's sockets share).
READ_SIZE: Final = 65536

#: TCP keepalive of a client socket: probes after this many idle seconds, this far
#: apart, this many unanswered before the kernel closes it. A client that vanished
#: (power cut, NAT timeout) frees its connection even with MQTT keepalive 0.
KEEPALIVE_IDLE: Final = 300
KEEPALIVE_INTERVAL: Final = 30
KEEPALIVE_PROBES: Final = 4


def keep_alive(sock: socket.socket) -> None:
    """Turn TCP keepalive on for ``sock`` (the timings where the platform has them)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


#: Linux's option to send a pending TCP ACK at once (None where the platform has none).
_QUICKACK: Final = getattr(socket, "TCP_QUICKACK", None)


def acknowledge_now(sock: socket.socket | None) -> None:
    """Send the TCP ACK of what ``sock`` received now, not up to 40 ms later (Linux
    delays it to carry it on our answer). A client's TCP holds its next small packet
    until the last is acknowledged (Nagle's algorithm, on in most client libraries:
    paho-mqtt sets no TCP_NODELAY), so an answer that waits (a SUBACK waits for the
    peers' acks) would hold back the client's next packet behind other clients' later
    ones. No-op without the option, or once the socket is closed."""
    if _QUICKACK is not None and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


def stream_factory(
    server: ConnectionHost, *, proxied: bool = False, tls: ssl.SSLContext | None = None
) -> Callable[[], asyncio.BufferedProtocol]:
    """The protocol factory of one listener of ``server`` (one read buffer for all its
    sockets: the loop reads one socket at a time); ``proxied``: each socket opens with a
    PROXY header, before the TLS of ``tls`` (the listener itself is then plain TCP)."""
    buffer = memoryview(bytearray(READ_SIZE))
    if proxied:
        return lambda: ProxyFront(server, TcpStream(server, buffer), tls)
    return lambda: TcpStream(server, buffer)


class Proxied(asyncio.BaseProtocol, metaclass=abc.ABCMeta):
    """A protocol that a :class:`ProxyFront` hands its socket to once the PROXY header
    is read (and TLS started, on a TLS listener)."""

    __slots__ = ()

    @abc.abstractmethod
    def open(
        self, transport: asyncio.Transport, client: Address | None, first: bytes = b""
    ) -> None:
        """Serve the client at ``client`` on ``transport``, whose stream so far is
        ``first``; bytes the protocol is given before (those that come with the end of
        a TLS handshake, before the front's call) come first."""


class TcpStream(asyncio.BufferedProtocol, Proxied):
    """One accepted TCP (or TLS) socket (see the module docstring)."""

    __slots__ = (
        "_blocked",
        "_buffer",
        "_connection",
        "_drains",
        "_early",
        "_peer",
        "_server",
        "_transport",
        "tap",
    )

    def __init__(self, server: ConnectionHost, buffer: memoryview) -> None:
        self._server = server
        self._peer = "?"
        self._buffer = buffer
        self._transport: asyncio.Transport | None = None
        self._connection: MqttConnection | None = None
        self._blocked = False  # the transport's write buffer is above its high-water mark
        self._drains: list[asyncio.Future[None]] | None = None  # drain() waiting
        self._early: bytearray | None = None  # (read over TLS before open(): see below)
        self.tap: ClientTap | None = None  # (its client is traced: router.mqtt.trace_tap)

    # -- the asyncio protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._server.refuses():
            transport.close()
            return
        self.open(
            cast(asyncio.Transport, transport), address_of(transport.get_extra_info("peername"))
        )

    def open(
        self, transport: asyncio.Transport, client: Address | None, first: bytes = b""
    ) -> None:
        """Serve the client at ``client`` (the socket's peer, or the one its PROXY header
        named) on ``transport``, whose stream so far is ``first``; closed at once when
        the address is banned or too fast."""
        self._transport = transport
        server = self._server
        self._peer = "?" if client is None else f"{client[0]}:{client[1]}"
        if self._early is not None:
            first, self._early = bytes(self._early) + first, None
        if server.banned_peer(client) or server.too_fast(client):
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)
        connection = self._connection = MqttConnection(self._server, self)
        self._server.admit(connection)
        connection.start(self)
        if first:
            connection.feed(memoryview(first))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._connection is not None:
            self._connection.feed(self._buffer[:nbytes])
        elif self._transport is None:  # (TLS after a PROXY header: the client's first
            # bytes may come with its Finished, before start_tls() returned and open() ran)
            self._early = (self._early or bytearray()) + self._buffer[:nbytes]

    def eof_received(self) -> bool:
        if self._connection is not None:
            self._connection.lost()
        # (plain TCP stays open for the answers to what came before; TLS cannot)
        return self._transport is not None and self._transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        drains, self._drains = self._drains, None
        for waiter in drains or ():
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("Connection lost"))
        if self._connection is not None:
            self._connection.lost()

    def pause_writing(self) -> None:
        self._blocked = True

    def resume_writing(self) -> None:
        self._blocked = False
        drains, self._drains = self._drains, None
        for waiter in drains or ():
            if not waiter.done():
                waiter.set_result(None)

    # -- the connection's transport --------------------------------------------------------

    @property
    def peer(self) -> str:
        """The client's ``HOST:PORT`` (behind a load balancer: the one it named)."""
        return self._peer

    def write(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            if self.tap is not None:
                self.tap.outbound(data)

    def backlog(self) -> int:
        return 0 if self._transport is None else self._transport.get_write_buffer_size()

    def acknowledge(self) -> None:
        if self._transport is not None:
            acknowledge_now(self._transport.get_extra_info("socket"))

    async def drain(self) -> None:
        """Return once the client has read enough of what it was sent (asyncio's
        low-water mark); ConnectionResetError once the socket is closing."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Connection lost")
        if not self._blocked:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._drains is None:
            self._drains = [waiter]
        else:
            self._drains.append(waiter)
        await waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pause_reading(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()


class ProxyFront(asyncio.BufferedProtocol):
    """A socket of a listener behind a load balancer until its PROXY header is read: then
    its ``stream``'s, over TLS when the listener has it (``tls``; ``shutdown_timeout``:
    seconds its closing handshake may take, asyncio's default without), see the module
    docstring and :mod:`router.mqtt.proxy_gate`. Reads exactly what the header still
    needs."""

    __slots__ = (
        "_buffer",
        "_server",
        "_shutdown_timeout",
        "_stage",
        "_stream",
        "_timer",
        "_tls",
        "_transport",
    )

    def __init__(
        self,
        server: ConnectionHost,
        stream: Proxied,
        tls: ssl.SSLContext | None,
        *,
        shutdown_timeout: float | None = None,
    ) -> None:
        self._server = server
        self._stream = stream
        self._tls = tls
        self._shutdown_timeout = shutdown_timeout
        self._transport: asyncio.Transport | None = None
        self._stage: HeaderStage | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._buffer = memoryview(bytearray(0))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self._server
        if server.refuses():
            transport.close()
            return
        self._transport = cast(asyncio.Transport, transport)
        peer = address_of(transport.get_extra_info("peername"))
        if self._tls is not None and not server.proxy.trusts(peer):
            self._hand_on(peer)  # (not read before TLS: see router.mqtt.proxy_gate)
            return
        self._stage = server.proxy.stage(peer)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(server.settings.connect_timeout, self._timed_out)

    def get_buffer(self, sizehint: int) -> memoryview:
        wanted = 1 if self._stage is None else self._stage.wanted()
        if len(self._buffer) != wanted:
            self._buffer = memoryview(bytearray(wanted))
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        stage = self._stage
        if stage is None:
            return
        try:
            decided = stage.feed(bytes(self._buffer[:nbytes]))
        except ProxyHeaderError:
            self._close()
            return
        if decided is not None:
            client, rest = decided
            self._hand_on(client, rest)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._close()

    def _timed_out(self) -> None:
        if self._stage is not None:
            self._stage.timed_out()
        self._close()

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stage is not None:
            self._stage.end()
            self._stage = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def _hand_on(self, client: Address | None, rest: bytes = b"") -> None:
        transport = self._transport
        assert transport is not None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stage = None
        if self._tls is None:
            transport.set_protocol(self._stream)
            self._stream.open(transport, client, rest)
            return
        handshake = asyncio.ensure_future(self._start_tls(transport, client, self._tls))
        _handshakes.add(handshake)
        handshake.add_done_callback(_handshakes.discard)

    async def _start_tls(
        self, transport: asyncio.Transport, client: Address | None, tls: ssl.SSLContext
    ) -> None:
        loop = asyncio.get_running_loop()
        timeout = self._server.settings.connect_timeout
        self._transport = None  # (the TLS transport's from now on)
        try:
            secure = await loop.start_tls(
                transport,
                self._stream,
                tls,
                server_side=True,
                ssl_handshake_timeout=timeout,
                ssl_shutdown_timeout=self._shutdown_timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError):
            transport.close()
            return
        if secure is None:
            transport.close()
            return
        self._stream.open(secure, client)


#: TLS handshakes begun after a PROXY header (held here: the loop keeps only weak refs).
_handshakes: set[asyncio.Future[None]] = set()
