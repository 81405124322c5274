"""The worked example of docs/integrations.md (examples/starlette_broadcast): two uvicorn
processes on one Redis, a WebSocket client on each; what one sends reaches the other."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from router.ops.processes import listening
from router.state.keys import Keys
from tests.support.cli import delete_namespace
from tests.support.servers import free_port
from tests.support.waiting import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "starlette_broadcast"
DEADLINE = 15.0  # seconds for a worker to start (it imports Starlette and the router) or stop


@contextlib.contextmanager
def worker(broadcast_url: str, log: Path) -> Iterator[int]:
    """A uvicorn process serving the example on a free loopback port (yielded once it
    listens, which it does once its node joined); stopped with SIGTERM, as uvicorn is,
    and expected to leave cleanly (its node too: the lifespan's shutdown)."""
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLE), "app:app"),
                *("--host", "127.0.0.1", "--port", str(port), "--ws", "websockets-sansio"),
            ],
            env={**os.environ, "BROADCAST_URL": broadcast_url},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: process.poll() is not None or listening(port),
            DEADLINE,
            log.read_text,
        )
        assert process.poll() is None, log.read_text()
        yield port
        process.terminate()
        # (uvicorn shuts down, then ends by the signal it caught: -SIGTERM)
        assert process.wait(DEADLINE) in (0, -signal.SIGTERM), log.read_text()
        shown = log.read_text()
        assert "Application shutdown complete" in shown and "Traceback" not in shown, shown
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(DEADLINE)


async def receive(client: ClientConnection) -> Any:
    async with asyncio.timeout(DEADLINE):
        return json.loads(await client.recv(decode=True))


async def join(port: int, path: str) -> ClientConnection:
    client = await connect(f"ws://127.0.0.1:{port}{path}", open_timeout=DEADLINE)
    assert "joined" in await receive(client)  # (subscribed on every worker from now on)
    return client


async def test_a_message_sent_to_one_worker_reaches_the_clients_of_the_other(
    redis_standalone_url: str, keys: Keys, tmp_path: Path
) -> None:
    url = f"router+{redis_standalone_url}?prefix={keys.prefix}"
    try:
        with (
            worker(f"{url}&node_id=web-1", tmp_path / "web-1.log") as one,
            worker(f"{url}&node_id=web-2", tmp_path / "web-2.log") as two,
        ):
            alice = await join(one, "/rooms/lobby")
            bob = await join(two, "/rooms/lobby")
            watcher = await join(two, "/watch/chat/+")
            async with alice, bob, watcher:
                await alice.send("hello from web-1")
                said = {"topic": "chat/lobby", "message": "hello from web-1"}
                assert [await receive(c) for c in (bob, watcher, alice)] == [said] * 3
                await bob.send("hi from web-2")
                assert (await receive(alice))["message"] == "hi from web-2"
    finally:
        delete_namespace(redis_standalone_url, keys)
