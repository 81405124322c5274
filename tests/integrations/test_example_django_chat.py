"""The worked example of docs/integrations.md: examples/django_chat, two real workers.

One worker runs on Daphne, the other on Uvicorn, both against one Redis on free loopback
ports; a WebSocket client on each joins the same room, and a line sent to the first
worker reaches the client of the second (and the sender itself).
"""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
from pathlib import Path
from typing import Final

import websockets

from router.ops.processes import free_port, listening, spawn, stop_process, wait_ready
from router.state.keys import Keys
from tests.support import cli as cli_support
from tests.support.framework_suites import REPOSITORY

EXAMPLE: Final = REPOSITORY / "examples" / "django_chat"
START_TIMEOUT: Final = 30.0
DEADLINE: Final = 10.0


def worker_commands(ports: tuple[int, int]) -> list[list[str]]:
    application = "chat.asgi:application"
    return [
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(ports[0]), application],
        [
            *(sys.executable, "-m", "uvicorn", "--host", "127.0.0.1"),
            *("--port", str(ports[1]), "--log-level", "warning", application),
        ],
    ]


async def chat(ports: tuple[int, int]) -> tuple[str, str]:
    """What the two members of room ``lobby`` get after the first one said hello."""
    async with (
        websockets.connect(f"ws://127.0.0.1:{ports[0]}/ws/chat/lobby/") as first,
        websockets.connect(f"ws://127.0.0.1:{ports[1]}/ws/chat/lobby/") as second,
    ):
        await first.send("hello from worker 1")
        async with asyncio.timeout(DEADLINE):
            heard = str(await second.recv())
            echoed = str(await first.recv())
    return heard, echoed


def test_a_line_sent_to_one_worker_reaches_a_member_on_the_other(
    redis_standalone_url: str, keys: Keys, tmp_path: Path
) -> None:
    ports = (free_port(), free_port())
    env = {
        **os.environ,
        "ROUTER_REDIS_URL": redis_standalone_url,
        "CHAT_PREFIX": keys.prefix,
        "PYTHONPATH": str(EXAMPLE),
    }
    logs = [tmp_path / "daphne.log", tmp_path / "uvicorn.log"]
    workers = [
        spawn(command, log=log, env=env, cwd=EXAMPLE)
        for command, log in zip(worker_commands(ports), logs, strict=True)
    ]
    try:
        for worker, port, log in zip(workers, ports, logs, strict=True):
            wait_ready(
                worker,
                lambda port=port: listening(port),
                name=log.stem,
                log=log,
                timeout=START_TIMEOUT,
            )
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/", timeout=DEADLINE) as page:
            assert "new WebSocket" in page.read().decode()

        heard, echoed = asyncio.run(chat(ports))

        assert heard == echoed == "hello from worker 1"
    finally:
        for worker in workers:
            stop_process(worker)
        cli_support.delete_namespace(redis_standalone_url, keys)
