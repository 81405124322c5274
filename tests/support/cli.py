"""Helpers for testing the operator CLI against real Redis while nodes run beside it.

CliRunner runs a command synchronously in the test's thread, and every command runs its
own event loop (``asyncio.run``). Nodes the test needs meanwhile live on a
:class:`LoopThread` (an event loop in a thread of its own) or in a :class:`Process`
(``router ...`` as a child process). Both are always stopped by the fixtures; waits poll
a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from click.testing import CliRunner, Result

from router.cli import app
from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.state.blocking import BlockingRedisCluster, blocking_client
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.scripts import RedisClient

T = TypeVar("T")

ROUTER_SCRIPT = Path(sys.executable).parent / "router"
TIMEOUT = 30.0
STDERR_SHOWN = 40  # lines of a failed child's stderr printed beside the failure


def invoke(url: str, prefix: str, *args: str) -> Result:
    """Run ``router ARGS --redis URL --prefix PREFIX`` through CliRunner."""
    return CliRunner().invoke(app, [*args, "--redis", url, "--prefix", prefix])


def invoke_json(url: str, prefix: str, *args: str) -> Any:
    """Run a command with ``--json``; assert it succeeded; return the parsed stdout."""
    result = invoke(url, prefix, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def delete_namespace(url: str, keys: Keys) -> None:
    """Delete every key under the namespace (every primary of a cluster)."""
    client = blocking_client(url)
    try:
        options: dict[str, Any] = {"match": keys.pattern(), "count": 1000}
        if isinstance(client, BlockingRedisCluster):
            options["target_nodes"] = BlockingRedisCluster.PRIMARIES
        for key in list(client.scan_iter(**options)):
            client.delete(key)
    finally:
        client.close()


class LoopThread:
    """An asyncio event loop running in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="node-loop")
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = TIMEOUT) -> T:
        """Run a coroutine on the loop and return its result (or raise its error)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what is left on the loop, stop it, join the thread, close the loop."""

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            self.call(cancel_rest())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(TIMEOUT)
            self.loop.close()


class Cluster:
    """Router nodes running on a :class:`LoopThread`, each with its own Redis client."""

    def __init__(self, url: str, keys: Keys) -> None:
        self.url = url
        self.keys = keys
        self.thread = LoopThread()
        self.nodes: dict[str, RouterNode] = {}
        self._clients: list[RedisClient] = []

    async def _client(self) -> RedisClient:
        client = await open_redis(self.url)
        self._clients.append(client)
        return client

    def client(self) -> RedisClient:
        """A Redis client on the loop thread (use it only through :meth:`call`)."""
        return self.thread.call(self._client())

    def start(self, node_id: str, **config: Any) -> RouterNode:
        config.setdefault("heartbeat_interval", 0.2)
        config.setdefault("heartbeat_ttl", 2.0)

        async def start() -> RouterNode:
            node = RouterNode(
                await self._client(), NodeConfig(node_id, prefix=self.keys.prefix, **config)
            )
            return await node.start()

        self.nodes[node_id] = self.thread.call(start())
        return self.nodes[node_id]

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.thread.call(coroutine)

    def close(self) -> None:
        async def stop() -> None:
            for node in reversed(list(self.nodes.values())):
                with contextlib.suppress(Exception):
                    await node.stop()
            for client in self._clients:
                await client.aclose()

        try:
            self.thread.call(stop())
        finally:
            self.thread.close()


class Process:
    """``router ARGS`` as a child process; its output lines are collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.stdout: queue.Queue[str] = queue.Queue()
        self.stderr: queue.Queue[str] = queue.Queue()
        self.stderr_lines: list[str] = []
        self.process = subprocess.Popen(
            [str(ROUTER_SCRIPT), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
            text=True,
        )
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout)),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr)),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, lines: queue.Queue[str]) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = TIMEOUT) -> str:
        """The first stderr line containing ``text``; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {text!r} on stderr; saw {self.stderr_lines}")
            try:
                line = self.stderr.get(timeout=remaining)
            except queue.Empty:
                continue
            self.stderr_lines.append(line)
            if text in line:
                return line

    def logged(self) -> list[str]:
        """Every line the process wrote on stderr so far (``stderr_lines``, brought up to date)."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.stderr_lines.append(self.stderr.get_nowait())
        return self.stderr_lines

    def signal(self, signum: signal.Signals) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = TIMEOUT) -> tuple[int, list[str], list[str]]:
        """Wait for the exit; return (status, stdout lines, remaining stderr lines).

        Fails after ``timeout`` seconds, with what the process wrote on stderr."""
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)
            for reader in self._readers:
                reader.join(timeout)
            stderr = self.stderr_lines + _drain(self.stderr)
            raise AssertionError(f"no exit within {timeout} s; stderr: {stderr}") from None
        for reader in self._readers:
            reader.join(timeout)
        return status, _drain(self.stdout), self.stderr_lines + _drain(self.stderr)

    def kill(self) -> None:
        """Make sure the process is gone (for cleanup after a failure)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(TIMEOUT)
        for reader in self._readers:
            reader.join(TIMEOUT)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def _drain(lines: queue.Queue[str]) -> list[str]:
    found = []
    while True:
        try:
            found.append(lines.get_nowait())
        except queue.Empty:
            return found


@contextlib.contextmanager
def router_process(*args: str, env: dict[str, str] | None = None) -> Iterator[Process]:
    """A ``router`` child process that is killed (if still running) when the block ends.

    When the block fails, the process's state (running or its exit status) and the last
    lines it wrote on stderr are printed, so pytest shows them beside the failure: a
    refused connection then tells a node that died from one that never listened."""
    process = Process(*args, env=env)
    try:
        yield process
    except BaseException:
        status = process.process.poll()
        said = process.logged()[-STDERR_SHOWN:]
        state = "still running" if status is None else f"exited with {status}"
        heading = f"router {' '.join(args[:2])}: {state}; its stderr:"
        print(heading, *said, sep="\n", file=sys.stderr)
        raise
    finally:
        process.kill()
