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
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import redis

from router.bench.brokers import terminate
from router.errors import BenchSetupError
from router.ops.embedded_redis import free_port

START_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0
POLL: Final = 0.05


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:] if log.exists() else ""


class _Process:
    """A child process with its output appended to ``log``; SIGKILL and start again."""

    def __init__(self, name: str, log: Path) -> None:
        self.name = name
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def _spawn(self, args: list[str]) -> None:
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=self.log.parent,
            )
        self.starts += 1

    def _wait(self, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                code = self.process.returncode
                state = "was not ready in time" if code is None else f"exited with {code}"
                raise BenchSetupError(f"{self.name} {state}:\n{_log_tail(self.log)}")
            time.sleep(POLL)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """``kill -9``: no goodbye, nothing flushed."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT``."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        terminate(process)

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
        self._spawn(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--protected-mode",
                "no",
            ]
        )
        self._wait(self._answers)

    def _answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def restart(self) -> float:
        """``kill -9`` and start again from the append-only file; the seconds it took."""
        began = time.monotonic()
        self.kill()
        deadline = time.monotonic() + START_TIMEOUT
        while not _port_is_free(self.port):
            if time.monotonic() > deadline:
                raise BenchSetupError(f"port {self.port} of redis-server did not close")
            time.sleep(POLL)
        self.start()
        return time.monotonic() - began


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
        self._wait(lambda: self.log.read_text(errors="replace").count(marker) > seen)
        self.up, self.up_since = True, time.monotonic()
        return time.monotonic() - began

    def kill(self) -> None:
        self.up = False
        super().kill()

    def stop(self) -> None:
        self.up = False
        super().stop()
