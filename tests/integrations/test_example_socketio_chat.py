"""The worked example of docs/integrations.md: two python-socketio chat servers, two
processes on two router nodes and one Redis, with a real socket.io client on each."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.state.keys import Keys
from tests.support.cli import delete_namespace
from tests.support.socketio_servers import Client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "socketio_chat" / "server.py"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def chat_server(redis_url: str, prefix: str, node_id: str) -> AsyncIterator[str]:
    """The example as a process on a free loopback port; yields its URL; stopped (SIGTERM,
    then killed if need be) at the end."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, str(EXAMPLE), "--redis", redis_url, "--prefix", prefix),
        *("--node-id", node_id, "--port", "0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(START_TIMEOUT):
            line = (await process.stdout.readline()).decode()
        if not line.startswith("listening on "):
            assert process.stderr is not None
            error = (await process.stderr.read()).decode()
            pytest.fail(f"{node_id} did not start: {line!r} {error[-2000:]}")
        yield line.removeprefix("listening on ").strip()
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(STOP_TIMEOUT):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
    assert process.returncode == 0, f"{node_id} exited {process.returncode}"


def stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/stats", timeout=5) as reply:
        figures: dict[str, int] = json.load(reply)
    return figures


async def test_a_client_of_one_server_talks_to_a_client_of_another(
    redis_standalone_url: str, keys: Keys
) -> None:
    try:
        async with (
            chat_server(redis_standalone_url, keys.prefix, "east") as east,
            chat_server(redis_standalone_url, keys.prefix, "west") as west,
        ):
            alice, bob = Client(), Client()
            await alice.sio.connect(east, transports=["websocket"])
            await bob.sio.connect(west, transports=["websocket"])
            try:
                assert await bob.sio.call("join", "lobby", timeout=10) == "joined"
                await alice.sio.emit("say", {"room": "lobby", "text": "hello bob"})
                said = {"room": "lobby", "text": "hello bob", "from": alice.sid}
                await bob.wait_for("said", said)
                assert alice.got("said") == []  # (skip_sid: not back to its sender)
            finally:
                await alice.sio.disconnect()
                await bob.sio.disconnect()
            west_stats = await asyncio.to_thread(stats, west)
            assert west_stats["received"] == west_stats["handled"] == 1
            assert (await asyncio.to_thread(stats, east))["received"] == 0
    finally:
        delete_namespace(redis_standalone_url, keys)
