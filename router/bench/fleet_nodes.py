"""What ``router bench fleet`` runs and reads besides its load: its options, the router
nodes it starts, and the figures of a broker process read from ``/proc`` and ``/metrics``.

:class:`FleetConfig` checks every option when it is made, before any process starts.
:func:`fleet_node` starts ``router node run`` with an MQTT listener (and, with
``metrics``, Prometheus ``/metrics``) for as many connections as the run needs.

A broker process can hold no more connections than its open-file limit allows, less the
files it has open already (its listener, Redis connections, logs): :func:`capacity`
reads both from ``/proc`` and gives the fleet size the run can have, with
:data:`FD_RESERVE` files kept free for what the broker opens later.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from router.errors import BenchSetupError
from router.ops.processes import free_port

from .brokers import ROUTER_OPTIONS, broker_process, logged, node_run
from .checks import check_positive

MAX_PROCESSES: Final = 64
PER_PROCESS: Final = 18_000
"""Connections one load process holds at most (its open-file limit is 20,000 here)."""
FD_RESERVE: Final = 200
"""Files a broker keeps free beside its connections (Redis, logs, the publisher)."""
DEFAULT_SESSIONS: Final = 10_000
ROLLING_SESSIONS: Final = 2_000
SETTLE_TIMEOUT: Final = 5.0
"""Seconds the RSS of a broker has to settle before it is read anyway."""
POLL: Final = 0.1


@dataclass(frozen=True)
class FleetConfig:
    """The sizes of one ``router bench fleet`` run. ``sessions``: persistent sessions
    (default: min(connections, 10,000) for Redis memory, 10,000 with ``kill``, 2,000 with
    ``rolling``: the rolling upgrade of :mod:`router.bench.fleet_rolling`);
    ``in_flight``: CONNECTs outstanding per load process; ``rate`` (msg/s), ``ttl``
    (the nodes' heartbeat TTL, seconds) are the kill and rolling scenarios', and
    ``clean_sessions`` (clean sessions beside the persistent ones on the node killed;
    default: half as many) the kill scenario's."""

    connections: int = 10_000
    sessions: int | None = None
    kill: bool = False
    rolling: bool = False
    clean_sessions: int | None = None
    processes: int = 2
    in_flight: int = 500
    rate: float = 2_000.0
    ttl: float = 2.0
    skip_mosquitto: bool = False

    def __post_init__(self) -> None:
        check_positive(
            connections=self.connections,
            processes=self.processes,
            in_flight=self.in_flight,
            rate=self.rate,
            ttl=self.ttl,
        )
        if self.sessions is not None:
            check_positive(sessions=self.sessions)
        if self.clean_sessions is not None and self.clean_sessions < 0:
            raise BenchSetupError(f"--clean-sessions must be >= 0, not {self.clean_sessions}")
        if self.processes > MAX_PROCESSES:
            raise BenchSetupError(f"--processes must be <= {MAX_PROCESSES}, not {self.processes}")
        if self.kill and self.rolling:
            raise BenchSetupError("--kill and --rolling are two runs: choose one")
        if self.ttl > 600:
            raise BenchSetupError(f"--ttl must be <= 600 seconds, not {self.ttl}")

    @property
    def session_count(self) -> int:
        if self.sessions is not None:
            return self.sessions
        if self.rolling:
            return ROLLING_SESSIONS
        return DEFAULT_SESSIONS if self.kill else min(self.connections, DEFAULT_SESSIONS)

    @property
    def clean_session_count(self) -> int:
        """Clean sessions on the node the kill scenario kills (none without ``kill``)."""
        if not self.kill:
            return 0
        if self.clean_sessions is not None:
            return self.clean_sessions
        return self.session_count // 2

    @property
    def heartbeat_interval(self) -> float:
        return self.ttl / 4

    @property
    def node_options(self) -> tuple[str, ...]:
        """The options of the kill and rolling runs' nodes: the heartbeat of ``ttl``, and
        room in Redis for every copy queued while clients are away."""
        return (
            "--heartbeat-ttl",
            str(self.ttl),
            "--heartbeat-interval",
            str(self.heartbeat_interval),
            "--mqtt-max-queued",
            "1000000",
        )

    def load_processes(self, largest: int, limit: int) -> int:
        """Processes for a fleet of ``largest`` clients, each process allowed ``limit``
        open files: ``processes``, or more so that none holds over :data:`PER_PROCESS`
        nor comes within :data:`FD_RESERVE` of its limit."""
        each = max(1, min(PER_PROCESS, limit - FD_RESERVE))
        return max(self.processes, math.ceil(largest / each))


# -- processes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningNode:
    """A started node: its process, MQTT address and ``/metrics`` address (or None)."""

    node_id: str
    process: subprocess.Popen[bytes]
    address: tuple[str, int]
    metrics: str | None


@contextlib.contextmanager
def fleet_node(
    url: str, prefix: str, node_id: str, connections: int, options: tuple[str, ...] = ()
) -> Iterator[RunningNode]:
    """``router node run`` on ``url`` under ``prefix`` with room for ``connections``
    MQTT clients, the options of ``bench mqtt`` (unbounded queues) and ``options``;
    with metrics on a free port. Stopped (SIGTERM, then SIGKILL) on exit."""
    port, metrics = free_port(), f"127.0.0.1:{free_port()}"
    limits = ("--mqtt-max-connections", str(connections), "--metrics", metrics)
    args, env = node_run(url, prefix, node_id, port, *limits, *ROUTER_OPTIONS, *options)
    with broker_process(node_id, args, logged(f"node {node_id} ready"), env) as process:
        yield RunningNode(node_id, process, ("127.0.0.1", port), metrics)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile (in the main thread), so that every
    process the run started is stopped on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- figures of a process --------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """VmRSS of process ``pid`` in KiB; :class:`BenchSetupError` if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    raise BenchSetupError(f"cannot read the memory of process {pid} (did it exit?)")


def settled_rss_kib(pid: int) -> int:
    """VmRSS once two readings :data:`POLL` * 5 apart differ by under 0.5 % (at most
    :data:`SETTLE_TIMEOUT` seconds of waiting)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    last = rss_kib(pid)
    while True:
        time.sleep(POLL * 5)
        now = rss_kib(pid)
        if abs(now - last) <= last * 0.005 or time.monotonic() > deadline:
            return now
        last = now


def open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        raise BenchSetupError(f"cannot list the files of process {pid}") from None


def open_file_limit(pid: int) -> int:
    """The soft open-file limit of process ``pid`` (from /proc/PID/limits)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return 1 << 30 if soft == "unlimited" else int(soft)
    raise BenchSetupError(f"no open-file limit for process {pid}")


def capacity(pid: int, asked: int) -> tuple[int, int, int]:
    """(connections the run can have, the broker's open-file limit, files it has open):
    ``asked``, or fewer if the broker's limit cannot hold them."""
    limit, used = open_file_limit(pid), open_files(pid)
    return max(1, min(asked, limit - used - FD_RESERVE)), limit, used


def cap_reason(count: int, asked: int, limit: int, used: int) -> str | None:
    """Why a run holds ``count`` connections where ``asked`` were asked (None if not)."""
    if count >= asked:
        return None
    return (
        f"the router node's open-file limit is {limit} ({used} open before the fleet, "
        f"{FD_RESERVE} kept free): at most {count} connections, not {asked}"
    )


def scrape(address: str, timeout: float = 10.0) -> dict[str, float]:
    """A node's Prometheus samples by name (labels dropped); empty if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except OSError:
        return {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            samples[name.split("{", 1)[0]] = float(value)
    return samples
