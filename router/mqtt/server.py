"""The MQTT front end of one node: listeners that move bytes, and the connections on them.

:func:`serve` starts listeners around a running :class:`~router.cluster.node.RouterNode`
(embedded, or the one ``router node run`` starts)::

    async with router.connect(url, node_id="n1") as node:
        async with router.mqtt.serve(node, tcp=["127.0.0.1:1883"]) as server:
            await server.serve_forever()

Each accepted socket becomes an :class:`~router.mqtt.protocol.MqttConnection`; the
server knows which connection holds which client id on this node (a second CONNECT with
the same id closes the first, MQTT-3.1.4-3). Sockets above ``max_connections`` are
closed at accept. Closing the server ends every connection with DISCONNECT 0x8B.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Final

from router.cluster.node import RouterNode
from router.errors import InvalidSettingError
from router.mqtt.protocol import MqttConnection
from router.mqtt.reason_codes import ReasonCode
from router.mqtt.settings import DEFAULT_SETTINGS, MqttSettings

log = logging.getLogger(__name__)

READ_SIZE: Final = 65536


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); :class:`InvalidSettingError`."""
    host, colon, port = address.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidSettingError(f"a listener address is HOST:PORT, not {address!r}")
    return host, int(port)


class StreamTransport:
    """A connection's :class:`~router.mqtt.protocol.Transport` over asyncio streams."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def write(self, data: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    while data := await reader.read(READ_SIZE):
        yield data


class MqttServer:
    """The listeners and connections of one node (see the module docstring)."""

    def __init__(self, node: RouterNode, settings: MqttSettings = DEFAULT_SETTINGS) -> None:
        self.node = node
        self.settings = settings
        self.addresses: list[tuple[str, int]] = []
        self._servers: list[asyncio.Server] = []
        self._connections: set[MqttConnection] = set()
        self._clients: dict[str, MqttConnection] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0
        self.refused = 0

    # -- the registry of connections -------------------------------------------------------

    def owner(self, client_id: str) -> MqttConnection | None:
        """The connection that holds ``client_id`` on this node, if any."""
        return self._clients.get(client_id)

    def attach(self, connection: MqttConnection) -> None:
        assert connection.client_id is not None
        self._clients[connection.client_id] = connection

    def forget(self, connection: MqttConnection) -> None:
        self._connections.discard(connection)
        client_id = connection.client_id
        if client_id is not None and self._clients.get(client_id) is connection:
            del self._clients[client_id]

    def clients(self) -> list[str]:
        """Client ids connected to this node through MQTT, sorted."""
        return sorted(self._clients)

    # -- listeners -------------------------------------------------------------------------

    async def listen_tcp(self, address: str) -> tuple[str, int]:
        """Listen on ``HOST:PORT`` (port 0: any free one); returns the bound address."""
        host, port = parse_address(address)
        server = await asyncio.start_server(self._accept, host, port)
        self._servers.append(server)
        bound = server.sockets[0].getsockname()
        self.addresses.append((bound[0], bound[1]))
        return bound[0], bound[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self._connections) >= self.settings.max_connections:
            self.refused += 1
            writer.close()
            return
        self.accepted += 1
        connection = MqttConnection(self, StreamTransport(writer))
        self._connections.add(connection)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.run(_chunks(reader))
        finally:
            if task is not None:
                self._tasks.discard(task)
            self._connections.discard(connection)

    async def serve_forever(self) -> None:
        """Wait until the server is closed (or the awaiting task is cancelled)."""
        await asyncio.gather(*(server.serve_forever() for server in self._servers))

    async def close(self) -> None:
        """Stop listening and end every connection with DISCONNECT 0x8B."""
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.end(ReasonCode.SERVER_SHUTTING_DOWN)
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.connect_timeout):
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def stats(self) -> dict[str, int]:
        """Counters of the MQTT front end."""
        return {
            "mqtt_connections": len(self._connections),
            "mqtt_clients": len(self._clients),
            "mqtt_accepted": self.accepted,
            "mqtt_refused": self.refused,
        }


@asynccontextmanager
async def serve(
    node: RouterNode, tcp: Iterable[str] = (), settings: MqttSettings = DEFAULT_SETTINGS
) -> AsyncIterator[MqttServer]:
    """Start MQTT listeners on ``tcp`` addresses (``HOST:PORT``) around a running node;
    closed (every connection ended with 0x8B) on exit."""
    server = MqttServer(node, settings)
    try:
        for address in tcp:
            await server.listen_tcp(address)
        yield server
    finally:
        await server.close()
