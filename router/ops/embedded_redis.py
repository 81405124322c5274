"""An embedded Redis-compatible server for demos and benchmarks when no URL is given.

:func:`embedded_redis` starts a real ``redis-server`` on a free loopback port when one is
installed (nothing kept on disk), and otherwise fakeredis's TCP server (the ``embedded``
extra: ``pip install 'router[embedded]'``) in a thread. Either way it yields a URL and
stops the server on exit.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from typing import Final

import redis

from router.errors import EmbeddedServerError, ProcessStartError
from router.ops.processes import (
    Popen,
    answers_ping,
    free_port,
    redis_server_command,
    spawn,
    stop_process,
    wait_ready,
)

START_TIMEOUT: Final = 10.0
STOP_TIMEOUT: Final = 5.0
POLL: Final = 0.02


@contextlib.contextmanager
def _real_server(binary: str) -> Iterator[str]:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory(prefix="router-redis-") as directory:
        process = spawn(redis_server_command(binary, port, directory))
        try:
            _wait_answering(url, process)
            yield url
        finally:
            stop_process(process, STOP_TIMEOUT)


def _wait_answering(url: str, process: Popen | None = None) -> None:
    """Until the server at ``url`` answers PING; :class:`EmbeddedServerError` if its
    ``process`` (None: a thread of this one) exits first or START_TIMEOUT passes."""
    name = "redis-server" if process is not None else "fakeredis"
    try:
        wait_ready(
            process,
            lambda: answers_ping(url, timeout=0.2),
            name=name,
            timeout=START_TIMEOUT,
            poll=POLL,
        )
    except ProcessStartError as exc:
        if exc.returncode is None:
            raise EmbeddedServerError(f"the embedded Redis at {url} did not start") from None
        raise EmbeddedServerError(f"redis-server exited with {exc.returncode}") from None


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
        _wait_answering(url)
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
