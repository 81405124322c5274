"""Child processes that serve something: start one, wait until it is ready, stop it.

Every server the router's tools and tests start (``redis-server`` for a demo, a bench or a
test, mosquitto, amqtt, ``router node run``) goes the same way::

    port = free_port()                    a free loopback port (and its bus port, asked)
    process = spawn(args, log=LOG)        stdin /dev/null, stdout and stderr into LOG
    wait_ready(process, ready, ...)       poll ready() until the deadline:
        │                                   listening(port), logged(LOG, "node n1 ready"),
        │                                   answers_ping(url)
        └─ ProcessStartError                it exited first (returncode), or the deadline
                                            passed (returncode None); the end of LOG quoted
    stop_process(process)                 SIGTERM, SIGKILL after a timeout, reaped

:func:`running` does the four in one ``with`` block. Every wait has a deadline and polls
(nothing sleeps a guessed time), and a process stopped here is always reaped (no zombie
left). A port found free may be taken by someone else before the server binds it: the
server then exits at once (a :class:`ProcessStartError` with a return code), and a caller
that can may try another port (``tests/support/servers.py`` does).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final

import redis

from router.errors import ListenerError, ProcessStartError

LOOPBACK: Final = "127.0.0.1"
START_TIMEOUT: Final = 30.0  # seconds a server has to become ready, unless told
STOP_TIMEOUT: Final = 10.0  # seconds between SIGTERM and SIGKILL, unless told
POLL: Final = 0.05  # seconds between two looks at a server that is not ready yet
LOG_TAIL: Final = 2000  # characters of a log a ProcessStartError quotes
PORT_TRIES: Final = 200  # kernel picks tried for a port whose companion port is free too

Popen = subprocess.Popen[bytes]


# -- ports ------------------------------------------------------------------------------------


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """True if a server could listen on ``host:port`` now. It binds with SO_REUSEADDR, as
    ``redis-server`` and asyncio do, so connections in TIME_WAIT of a server that was on
    the port before do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(*, bus_offset: int = 0) -> int:
    """A free TCP port on 127.0.0.1, picked by the kernel. With ``bus_offset``, one whose
    port + ``bus_offset`` is free too (a Redis Cluster node listens on both). Raises
    :class:`ListenerError` if no such pair turned up in :data:`PORT_TRIES` picks."""
    for _ in range(PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, 0))
            port: int = sock.getsockname()[1]
        if not bus_offset:
            return port
        if port + bus_offset < 65536 and port_is_free(port + bus_offset):
            return port
    raise ListenerError(f"no free loopback port whose port + {bus_offset} is free too")


def listening(port: int, host: str = LOOPBACK) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex((host, port)) == 0


def answers_ping(url: str, timeout: float = 1.0) -> bool:
    """True if the Redis at ``url`` answers PING within ``timeout`` seconds."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


# -- logs ---------------------------------------------------------------------------------------


def log_tail(log: Path | None, chars: int = LOG_TAIL) -> str:
    """The last ``chars`` characters of ``log`` ("" without one)."""
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-chars:]


def logged(log: Path, text: str, times: int = 1) -> bool:
    """True if ``text`` appears at least ``times`` times in ``log`` (a missing log: no)."""
    return log.exists() and log.read_text(errors="replace").count(text) >= times


# -- processes ----------------------------------------------------------------------------------


def redis_server_command(
    binary: str, port: int, directory: Path | str, *, append_only: bool = False
) -> list[str]:
    """``redis-server`` on ``127.0.0.1:port`` with its files in ``directory``: no RDB
    snapshot; with ``append_only`` an append-only file synced on every write (a restart
    keeps every write it acknowledged), else nothing on disk. Append more options to it."""
    options = {
        "--bind": LOOPBACK,
        "--port": str(port),
        "--dir": str(directory),
        "--save": "",
        "--appendonly": "yes" if append_only else "no",
        "--protected-mode": "no",
    }
    command = [binary, *(part for pair in options.items() for part in pair)]
    if append_only:
        command += ["--appendfsync", "always"]
    return command


def spawn(
    args: Sequence[str],
    *,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    die_with_parent: bool = False,
) -> Popen:
    """Start ``args``: stdin from /dev/null, stdout and stderr appended to ``log`` (None:
    discarded). ``die_with_parent``: the child gets SIGTERM when this process dies, even
    by SIGKILL (util-linux ``setpriv --pdeathsig``; where it is missing, as without)."""
    prefix: list[str] = []
    if die_with_parent and (setpriv := shutil.which("setpriv")) is not None:
        prefix = [setpriv, "--pdeathsig", "TERM"]
    command = [*prefix, *args]
    environment = None if env is None else dict(env)
    if log is None:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=environment,
            cwd=cwd,
        )
    with log.open("ab") as output:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            cwd=cwd,
        )


def wait_ready(
    process: Popen | None,
    ready: Callable[[], bool],
    *,
    name: str,
    timeout: float = START_TIMEOUT,
    log: Path | None = None,
    poll: float = POLL,
) -> float:
    """Poll ``ready()`` every ``poll`` seconds until it holds; the seconds it took.

    Raises :class:`ProcessStartError` (named ``name``, quoting the end of ``log``) if the
    process exits first, or is still not ready after ``timeout`` seconds; the process is
    left as it is (the caller stops it). Its exit is looked at before ``ready()``: a
    server that lost its port to another one exited, even though the port answers.
    ``process`` None: a server in this process (a thread), with no exit to watch.
    """
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise ProcessStartError(name, process.returncode, log_tail(log))
        if ready():
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise ProcessStartError(name, None, log_tail(log))
        time.sleep(poll)


def stop_process(process: Popen, timeout: float = STOP_TIMEOUT) -> int:
    """SIGTERM, then SIGKILL if it is still running after ``timeout`` seconds; returns its
    exit status once reaped (a process that already exited is only reaped)."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def kill_process(process: Popen) -> int:
    """``kill -9`` (no goodbye, nothing flushed); returns its exit status once reaped."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    return process.wait()


@contextlib.contextmanager
def running(
    args: Sequence[str],
    ready: Callable[[], bool],
    *,
    name: str,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = START_TIMEOUT,
    stop_timeout: float = STOP_TIMEOUT,
    poll: float = POLL,
) -> Iterator[Popen]:
    """:func:`spawn` ``args``, :func:`wait_ready` for ``ready()``, yield the process;
    :func:`stop_process` it on exit, and also when it did not become ready (then the
    :class:`ProcessStartError` goes on)."""
    process = spawn(args, log=log, env=env, cwd=cwd)
    try:
        wait_ready(process, ready, name=name, timeout=timeout, log=log, poll=poll)
        yield process
    finally:
        stop_process(process, stop_timeout)
