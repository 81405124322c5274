"""A chat on Starlette and broadcaster, with a router node as broadcaster's backend.

Each worker process embeds one node (``router.integrations.broadcast_backend``); run two
against one Redis and the clients of one talk to the clients of the other::

    export BROADCAST_URL='router+redis://127.0.0.1:6379/0?prefix=chat'
    uvicorn --app-dir examples/starlette_broadcast app:app --port 8001
    uvicorn --app-dir examples/starlette_broadcast app:app --port 8002

WebSocket endpoints (text frames in, JSON frames out):

* ``/rooms/{room}``: joins the channel ``chat/{room}``; the first frame is
  ``{"joined": "chat/ROOM"}`` (from then on a message sent on any worker reaches it), then
  every message of the room comes as ``{"topic": ..., "message": ...}``; every text the
  client sends is published to the room.
* ``/watch/{filter}``: the same for an MQTT filter, read only: ``/watch/chat/+`` follows
  every room (``#`` is ``%23`` in a URL).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from broadcaster import Broadcast
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

import router
from router.integrations.broadcast_backend import RouterBackend

broadcast = Broadcast(
    backend=RouterBackend(os.environ.get("BROADCAST_URL", "router+redis://127.0.0.1:6379/0"))
)


async def forward(subscriber: Any, websocket: WebSocket) -> None:
    """Send every event of ``subscriber`` to the client."""
    async for event in subscriber:
        await websocket.send_json({"topic": event.topic, "message": event.message})


async def follow(websocket: WebSocket, channel: str, *, talks: bool) -> None:
    """Serve one client on ``channel`` until it leaves; with ``talks`` its texts are
    published there."""
    await websocket.accept()
    try:
        (router.validate_topic if talks else router.validate_filter)(channel)
    except router.InvalidTopicError as bad:
        await websocket.close(code=1008, reason=bad.reason)
        return
    async with broadcast.subscribe(channel) as subscriber:
        await websocket.send_json({"joined": channel})
        forwarding = asyncio.create_task(forward(subscriber, websocket))
        try:
            async for text in websocket.iter_text():
                if talks:
                    await broadcast.publish(channel, text)
        finally:
            forwarding.cancel()
            await asyncio.gather(forwarding, return_exceptions=True)


async def room(websocket: WebSocket) -> None:
    await follow(websocket, f"chat/{websocket.path_params['room']}", talks=True)


async def watch(websocket: WebSocket) -> None:
    await follow(websocket, websocket.path_params["filter"], talks=False)


@asynccontextmanager
async def lifespan(_app: Starlette) -> AsyncIterator[None]:
    async with broadcast:  # (the node joins the cluster here, and leaves on shutdown)
        yield


app = Starlette(
    routes=[
        WebSocketRoute("/rooms/{room}", room),
        WebSocketRoute("/watch/{filter:path}", watch),
    ],
    lifespan=lifespan,
)
