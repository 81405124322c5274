"""MQTT over WebSocket (MQTT 5.0 section 6): the listener that browsers and MQTT.js use.

Built on the ``websockets`` library (RFC 6455 handshakes, framing, fragmentation and
close codes are a protocol of their own; a well-kept library beats writing them). The
listener serves one ``path`` (default ``/mqtt``; any other gets HTTP 404), selects the
``mqtt`` subprotocol, and carries MQTT bytes in binary messages: a text message ends the
connection (MQTT-6.0.0-1). Messages are a byte stream to the MQTT side: a packet may
span messages and a message may hold several packets (MQTT-6.0.0-2/3). When the MQTT
connection ends the server sends a Close frame and closes the socket once the client
answers it, or after ``CLOSE_TIMEOUT`` (as promptly as TCP, for a client that does not).

Behind a load balancer, a listener in ``MqttSettings.proxy_protocol`` (``ws``, ``wss``)
reads each connection's PROXY header before the HTTP upgrade, and before the TLS
handshake of ``wss`` (a balancer in TCP mode passes TLS through: the header comes
first); an upgrade from a trusted proxy may name the client in ``X-Forwarded-For`` or
``Forwarded`` (nginx): the client's address is then that one
(:mod:`router.mqtt.proxy_gate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Final, cast

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from router.errors import ListenerError
from router.mqtt.connection_host import ConnectionHost
from router.mqtt.protocol import MqttConnection
from router.mqtt.proxy_gate import Address, address_of
from router.mqtt.settings import BACKLOG
from router.mqtt.tcp import Proxied, ProxyFront, acknowledge_now
from router.mqtt.trace_tap import ClientTap

SUBPROTOCOL: Final = Subprotocol("mqtt")
DEFAULT_PATH: Final = "/mqtt"
#: Frames a connection buffers before it stops reading its socket (each up to the
#: maximum packet size; the library's default of 16 let a client park 16 MiB a socket).
QUEUED_FRAMES: Final = 2
#: Seconds the server waits for the client's answer to its Close frame before it closes
#: the socket: once the MQTT connection ended (its DISCONNECT sent) nothing more is owed,
#: and clients that never answer (paho) held the socket for the library's default, 10 s.
CLOSE_TIMEOUT: Final = 0.5
WebSocketServer = Server


class WebSocketTransport:
    """A connection's :class:`~router.mqtt.protocol.Transport` over one WebSocket: each
    write goes out as one binary message, in order, through a writer task."""

    def __init__(self, websocket: ServerConnection, client: Address | None) -> None:
        self._websocket = websocket
        self._outbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._queued = 0  # bytes in the outbox
        self._writer = asyncio.create_task(self._write_all())
        self.peer = "?" if client is None else f"{client[0]}:{client[1]}"
        self.tap: ClientTap | None = None  # (its client is traced: router.mqtt.trace_tap)

    def write(self, data: bytes) -> None:
        if not self._writer.done():
            self._queued += len(data)
            self._outbox.put_nowait(data)
            if self.tap is not None:
                self.tap.outbound(data)

    def backlog(self) -> int:
        return self._queued

    def acknowledge(self) -> None:
        transport = self._websocket.transport
        acknowledge_now(None if transport is None else transport.get_extra_info("socket"))

    async def drain(self) -> None:
        await self._outbox.join()

    def close(self) -> None:
        if not self._writer.done():
            self._outbox.put_nowait(None)

    async def _write_all(self) -> None:
        try:
            while (data := await self._outbox.get()) is not None:
                await self._websocket.send(data)
                self._queued -= len(data)
                self._outbox.task_done()
        except ConnectionClosed:
            pass
        finally:
            await self._websocket.close()
            while not self._outbox.empty():  # (nothing more can go out: release drains)
                self._outbox.get_nowait()
                self._outbox.task_done()

    async def closed(self) -> None:
        """Wait until every write went out (or the socket closed) and the socket is closed."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer


def unfinished_bytes(protocol: object) -> int:
    """Bytes of a message ``protocol`` (a websockets Protocol) holds not whole yet: those
    of a frame still arriving (its reader's buffer) and the fragments of a message not
    ended (its current size). websockets has no public count of them; the attributes are
    read defensively, and tests/mqtt/test_websocket.py pins what they give."""
    reader = getattr(protocol, "reader", None)
    buffered = getattr(reader, "buffer", b"")
    fragments = getattr(protocol, "current_size", None)
    return len(buffered) + (fragments if isinstance(fragments, int) else 0)


class BoundedServerConnection(ServerConnection, Proxied):
    """A WebSocket that tells its MQTT connection, after each read, the bytes of a message
    it holds not whole yet (:meth:`~router.mqtt.intake.Intake.held_outside`): a slow loris
    over WebSocket meets the node's bounds on unfinished packets as one over TCP does.
    With a ``front`` (its listener's server, behind a load balancer) its socket is first
    a :class:`~router.mqtt.tcp.ProxyFront`'s, which reads the PROXY header, starts the TLS
    of ``tls`` (wss) and then opens the WebSocket; ``client`` is the address it named."""

    holder: MqttConnection | None = None
    front: ConnectionHost | None = None
    tls: ssl.SSLContext | None = None  # (wss behind a load balancer: TLS after the header)
    client: Address | None = None
    _open = False
    _early: bytes = b""  # (read over TLS before open(): see below)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.front is None:
            self.open(
                cast(asyncio.Transport, transport),
                address_of(transport.get_extra_info("peername")),
            )
            return
        front = ProxyFront(self.front, self, self.tls, shutdown_timeout=CLOSE_TIMEOUT)
        transport.set_protocol(front)  # (the front reads until it opens the WebSocket)
        front.connection_made(transport)

    def open(
        self, transport: asyncio.Transport, client: Address | None, first: bytes = b""
    ) -> None:
        self.client = client
        self._open = True
        super().connection_made(transport)
        first, self._early = self._early + first, b""
        if first:
            self.data_received(first)

    def data_received(self, data: bytes) -> None:
        if not self._open:  # (TLS after a PROXY header: the client's first bytes may
            # come with its Finished, before start_tls() returned and open() ran)
            self._early += data
            return
        super().data_received(data)
        holder = self.holder
        if holder is not None:
            holder.held_outside(unfinished_bytes(self.protocol))


async def _messages(websocket: ServerConnection) -> AsyncIterator[bytes]:
    with contextlib.suppress(ConnectionClosed):
        async for message in websocket:
            if isinstance(message, str):
                return  # MQTT-6.0.0-1: MQTT travels in binary messages only
            yield message


async def listen_websocket(
    server: ConnectionHost,
    address: tuple[str, int],
    path: str,
    tls: ssl.SSLContext | None,
    *,
    proxied: bool = False,
) -> tuple[str, int, Server]:
    """Serve MQTT over WebSocket at ``ws://HOST:PORT{path}`` (``wss://`` with ``tls``;
    ``proxied``: each connection opens with a PROXY header, before the TLS handshake);
    returns the bound host and port and the server (closed by :class:`MqttServer`)."""

    after_header = tls if proxied else None  # (behind PROXY: TLS starts after the header)

    class Connection(BoundedServerConnection):
        front = server if proxied else None
        tls = after_header

    def only_the_path(connection: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != path:
            return connection.respond(HTTPStatus.NOT_FOUND, f"MQTT is served at {path}\n")
        return None

    async def handle(websocket: ServerConnection) -> None:
        direct = websocket.client if isinstance(websocket, BoundedServerConnection) else None
        request = websocket.request
        client = server.proxy.forwarded(direct, None if request is None else request.headers)
        if server.banned_peer(client) or server.too_fast(client):
            await websocket.close()
            return
        transport = WebSocketTransport(websocket, client)
        connection = MqttConnection(server, transport)
        if isinstance(websocket, BoundedServerConnection):
            websocket.holder = connection
        await server.run_connection(connection, _messages(websocket))
        await transport.closed()

    host, port = address
    try:
        listener = await serve(
            handle,
            host,
            port,
            subprotocols=[SUBPROTOCOL],
            process_request=only_the_path,
            ssl=None if proxied else tls,
            open_timeout=server.settings.connect_timeout,
            ping_interval=None,
            close_timeout=CLOSE_TIMEOUT,
            max_size=server.settings.max_packet_size + 8,
            max_queue=QUEUED_FRAMES,
            compression=None,
            backlog=BACKLOG,
            create_connection=Connection,
        )
    except OSError as error:
        raise ListenerError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    bound = next(iter(listener.sockets)).getsockname()
    return bound[0], bound[1], listener
