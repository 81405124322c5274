"""An embedded Redis-compatible server for demos and benchmarks when no URL is given.

:func:`embedded_redis` starts a real ``redis-server`` on a free loopback port when one is
installed (nothing kept on disk), and otherwise fakeredis's TCP server (the ``embedded``
extra: ``pip install 'router[embedded]'``) in a thread. Either way it yields a URL and
stops the server on exit.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Final

import redis

from router.errors import EmbeddedServerError

START_TIMEOUT: Final = 10.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_ready(url: str, process: subprocess.Popen[bytes] | None = None) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.2)
    deadline = time.monotonic() + START_TIMEOUT
    try:
        while True:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                pass
            if process is not None and process.poll() is not None:
                raise EmbeddedServerError(f"redis-server exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the embedded Redis at {url} did not start")
            time.sleep(0.02)
    finally:
        client.close()


@contextlib.contextmanager
def _real_server(binary: str) -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="router-redis-") as directory:
        process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                directory,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            _wait_ready(url, process)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def _fake_server() -> Iterator[str]:
    try:
        from fakeredis import TcpFakeServer
    except ImportError:
        raise EmbeddedServerError(
            "no redis-server found and fakeredis is not installed: install redis-server, "
            "or pip install 'router[embedded]', or give --redis URL"
        ) from None
    port = free_port()
    server = TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, name="fakeredis", daemon=True)
    thread.start()
    try:
        url = f"redis://127.0.0.1:{port}/0"
        _wait_ready(url)
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def embedded_redis(prefer_real: bool = True) -> Iterator[str]:
    """Start an embedded Redis-compatible server; yield its URL; stop it on exit."""
    binary = shutil.which("redis-server") if prefer_real else None
    server = _real_server(binary) if binary else _fake_server()
    with server as url:
        yield url


def kind_of(url: str) -> str:
    """``redis-server`` or ``fakeredis``, for messages: what answers at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        version = str(client.info("server").get("redis_version", "?"))
    except redis.ResponseError:
        return "fakeredis (no INFO command)"
    finally:
        client.close()
    return f"Redis {version}"
