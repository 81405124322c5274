"""python-socketio servers on the router's manager, in the test's process, and their clients.

``socketio_servers(urls, prefix)`` starts one aiohttp server per Redis URL on a free
loopback port, each a ``socketio.AsyncServer`` whose client manager is a :class:`RouterManager` on
a node of its own (``server-1``, ``server-2``...), and stops them (managers, nodes, web
servers) when the block ends. Each server handles ``join`` and ``leave`` (a room, for the
calling sid). A :class:`Client` is a real ``socketio.AsyncClient`` on the websocket
transport that records every event it gets.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import socketio
from aiohttp import web

from router.integrations.socketio_manager import RouterManager
from tests.support.waiting import eventually

TIMEOUT = 10.0
# A fast heartbeat (the tests of tests/cluster use the same): a node is seen within 1 s.
FAST = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}


@dataclass
class Server:
    manager: RouterManager
    sio: socketio.AsyncServer
    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.manager.close()
        await self.sio.shutdown()
        await self.runner.cleanup()


async def start_server(manager: RouterManager) -> Server:
    sio = socketio.AsyncServer(async_mode="aiohttp", client_manager=manager)

    @sio.on("join")
    async def join(sid: str, room: Any) -> str:
        await sio.enter_room(sid, room)
        return "joined"

    @sio.on("leave")
    async def leave(sid: str, room: Any) -> str:
        await sio.leave_room(sid, room)
        return "left"

    app = web.Application()
    sio.attach(app)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return Server(manager, sio, runner, f"http://127.0.0.1:{port}")


@contextlib.asynccontextmanager
async def socketio_servers(
    urls: list[str], prefix: str, **node_options: Any
) -> AsyncIterator[list[Server]]:
    """One server per Redis URL (the same Redis, or a proxy to it) under ``prefix`` (node
    options: FAST unless given), stopped at the end."""
    options = {"prefix": prefix, **FAST, **node_options}
    servers: list[Server] = []
    try:
        for number, url in enumerate(urls, 1):
            manager = RouterManager(url, node_id=f"server-{number}", node_options=options)
            servers.append(await start_server(manager))
        yield servers
    finally:
        for server in reversed(servers):
            await server.close()


@dataclass
class Client:
    """A socket.io client that records ``(event, data)`` for every event it gets."""

    sio: socketio.AsyncClient = field(
        default_factory=lambda: socketio.AsyncClient(reconnection=False)
    )
    events: list[tuple[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        async def record(event: str, *data: Any) -> Any:
            self.events.append((event, data[0] if len(data) == 1 else data))
            if event == "ask":  # (a question from a server: answer it)
                return f"answer to {data[0]}"
            return None

        self.sio.on("*", record)

    @property
    def sid(self) -> str:
        sid = self.sio.get_sid()
        assert sid is not None
        return str(sid)

    def got(self, event: str) -> list[Any]:
        return [data for name, data in self.events if name == event]

    async def wait_for(self, event: str, data: Any, timeout: float = TIMEOUT) -> None:
        await eventually(lambda: data in self.got(event), timeout, f"{event} {data!r}")


@contextlib.asynccontextmanager
async def clients(*servers: Server) -> AsyncIterator[list[Client]]:
    """One connected client per server (in that order), disconnected at the end."""
    connected: list[Client] = []
    try:
        for server in servers:
            client = Client()
            await client.sio.connect(server.url, transports=["websocket"], wait_timeout=TIMEOUT)
            connected.append(client)
        yield connected
    finally:
        for client in connected:
            await client.sio.disconnect()
