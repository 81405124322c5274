"""A python-socketio chat server whose servers share rooms through the router.

Run two (or more) against one Redis; a client of one talks to the clients of the others::

    python examples/socketio_chat/server.py --port 8001 --node-id east
    python examples/socketio_chat/server.py --port 8002 --node-id west

A client emits ``join`` with a room name (the answer is ``"joined"``) and ``say`` with
``{"room": ..., "text": ...}``; every other member of the room, on any server, gets
``said`` with ``{"room": ..., "text": ..., "from": sid}``. Each server gets only the
messages of rooms it has a member of: ``GET /stats`` shows its manager's counts
(``received``, ``handled``, ...). ``--port 0`` takes a free port; the server prints
``listening on http://HOST:PORT`` once it accepts connections, and stops on SIGINT or
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

import socketio
from aiohttp import web

from router.integrations.socketio_manager import RouterManager


def make_app(manager: RouterManager) -> web.Application:
    """The chat's aiohttp application on ``manager``; the caller closes the manager."""
    sio = socketio.AsyncServer(async_mode="aiohttp", client_manager=manager)

    @sio.on("join")
    async def join(sid: str, room: str) -> str:
        await sio.enter_room(sid, room)
        return "joined"

    @sio.on("say")
    async def say(sid: str, message: dict[str, Any]) -> None:
        room = message["room"]
        said = {"room": room, "text": message["text"], "from": sid}
        await sio.emit("said", said, room=room, skip_sid=sid)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(manager.stats())

    app = web.Application()
    sio.attach(app)
    app.router.add_get("/stats", stats)
    return app


async def serve(redis: str | None, node_id: str | None, prefix: str, host: str, port: int) -> None:
    manager = RouterManager(redis, node_id=node_id, node_options={"prefix": prefix})
    runner = web.AppRunner(make_app(manager), handle_signals=False)
    await runner.setup()
    try:
        await manager.start()  # (Redis is reached before the first client, not by it)
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        print(f"listening on http://{bound_host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await manager.close()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description="a python-socketio chat on the router")
    parser.add_argument("--redis", default=None, help="Redis URL (default $ROUTER_REDIS_URL)")
    parser.add_argument("--node-id", default=None)
    parser.add_argument("--prefix", default="rt", help="the router's key prefix in Redis")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    asyncio.run(serve(args.redis, args.node_id, args.prefix, args.host, args.port))


if __name__ == "__main__":
    main()
