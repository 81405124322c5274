"""The processes ``router bench soak`` starts, kills with SIGKILL and starts again.

:class:`RedisProcess` is a ``redis-server`` that keeps an append-only file with
``appendfsync always`` (a restart keeps every write it acknowledged), so a Redis restart
is a fault the router must survive without losing anything. :class:`NodeProcess` is one
``router node run`` with an MQTT listener; :meth:`NodeProcess.kill` is ``kill -9`` and
:meth:`NodeProcess.start` starts it again under the same node id and port.

Every wait has a deadline; each process's output goes to a log file in the run's
temporary directory, whose tail is quoted when a process does not come up.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from router.errors import BenchSetupError, ProcessStartError
from router.ops.processes import (
    Popen,
    answers_ping,
    free_port,
    kill_process,
    logged,
    port_is_free,
    redis_server_command,
    spawn,
    stop_process,
    wait_ready,
)

START_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0
POLL: Final = 0.05


class _Process:
    """A child process with its output appended to ``log``; SIGKILL and start again."""

    def __init__(self, name: str, log: Path) -> None:
        self.name = name
        self.log = log
        self.process: Popen | None = None
        self.starts = 0

    def _spawn(self, args: list[str]) -> None:
        self.process = spawn(args, log=self.log, cwd=self.log.parent)
        self.starts += 1

    def _wait(self, ready: Callable[[], bool]) -> None:
        assert self.process is not None
        try:
            wait_ready(self.process, ready, name=self.name, timeout=START_TIMEOUT, log=self.log)
        except ProcessStartError as exc:
            raise BenchSetupError(str(exc)) from None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """``kill -9``: no goodbye, nothing flushed."""
        process, self.process = self.process, None
        if process is not None:
            kill_process(process)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT``."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, STOP_TIMEOUT)

    def rss_mib(self) -> float | None:
        """Resident set size from ``/proc`` (None if the process is not running)."""
        process = self.process
        if process is None or process.poll() is not None:
            return None
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return None


class RedisProcess(_Process):
    """``redis-server`` on a free loopback port, append-only with ``appendfsync always``."""

    def __init__(self, directory: Path) -> None:
        super().__init__("redis-server", directory / "redis.log")
        binary = shutil.which("redis-server")
        if binary is None:
            raise BenchSetupError(
                "router bench soak restarts Redis: it needs redis-server installed "
                "(or give --redis URL, and Redis restarts are left out)"
            )
        self.binary = binary
        self.directory = directory / "redis"
        self.directory.mkdir()
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self._spawn(redis_server_command(self.binary, self.port, self.directory, append_only=True))
        self._wait(lambda: answers_ping(self.url))

    def restart(self) -> float:
        """``kill -9`` and start again from the append-only file; the seconds it took."""
        began = time.monotonic()
        self.kill()
        try:
            closed = functools.partial(port_is_free, self.port)
            wait_ready(None, closed, name=f"port {self.port}", timeout=START_TIMEOUT, poll=POLL)
        except ProcessStartError:
            raise BenchSetupError(f"port {self.port} of redis-server did not close") from None
        self.start()
        return time.monotonic() - began


class NodeProcess(_Process):
    """``router node run`` with an MQTT listener on a fixed loopback port."""

    def __init__(self, node_id: str, url: str, prefix: str, directory: Path) -> None:
        super().__init__(node_id, directory / f"{node_id}.log")
        self.node_id = node_id
        self.url = url
        self.prefix = prefix
        self.port = free_port()
        self.up = False
        self.up_since = 0.0

    def up_for(self) -> float:
        """Seconds since it was last ready (0 while down)."""
        return time.monotonic() - self.up_since if self.up else 0.0

    def start(self) -> float:
        """Start (again) under the same id and port; wait until it logged that it is
        ready and takes connections; the seconds it took."""
        began = time.monotonic()
        marker = f"node {self.node_id} ready"
        seen = self.log.read_text(errors="replace").count(marker) if self.log.exists() else 0
        self._spawn(
            [
                sys.executable,
                "-c",
                "from router.cli import main; main()",
                "node",
                "run",
                "--redis",
                self.url,
                "--prefix",
                self.prefix,
                "--node-id",
                self.node_id,
                "--mqtt",
                f"127.0.0.1:{self.port}",
            ]
        )
        self._wait(lambda: logged(self.log, marker, seen + 1))
        self.up, self.up_since = True, time.monotonic()
        return time.monotonic() - began

    def kill(self) -> None:
        self.up = False
        super().kill()

    def stop(self) -> None:
        self.up = False
        super().stop()
