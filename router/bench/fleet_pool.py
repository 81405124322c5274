"""The load processes of ``router bench fleet``, seen from the parent.

:func:`worker_pool` forks ``clients`` worker processes for the fleet's members (member
``i`` lives in worker ``i % clients``) and one more for the publisher; each runs
:func:`router.bench.fleet_clients.worker_main` and answers commands in order. Every
question has a deadline: a worker that does not answer in time, or answers with an
error, raises :class:`BenchSetupError`. On exit every worker is told to close its
connections and exit, and killed if it has not within :data:`EXIT_TIMEOUT`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, Final

from router.errors import BenchSetupError

from .cpu_meter import cpu_seconds
from .fleet_clients import ConnectReport, ConnectSpec, FleetTally, worker_main

EXIT_TIMEOUT: Final = 20.0


class WorkerPool:
    """The load processes and their pipes (see the module docstring)."""

    def __init__(self, clients: int) -> None:
        # fork is quick; with other threads alive it is unsafe, so a fork server then.
        context = (
            multiprocessing.get_context("fork")
            if threading.active_count() == 1
            else multiprocessing.get_context("forkserver")
        )
        self.clients = clients
        self.pipes: list[Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        for _ in range(clients + 1):
            ours, theirs = context.Pipe()
            process = context.Process(target=worker_main, args=(theirs,), daemon=True)
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)

    @property
    def publisher(self) -> int:
        """The worker that holds the publisher."""
        return self.clients

    def split(self, indices: Iterable[int]) -> list[tuple[int, ...]]:
        """``indices`` by the worker that holds each member."""
        parts: list[list[int]] = [[] for _ in range(self.clients)]
        for index in indices:
            parts[index % self.clients].append(index)
        return [tuple(part) for part in parts]

    def send(self, worker: int, name: str, *args: Any) -> None:
        try:
            self.pipes[worker].send((name, args))
        except (BrokenPipeError, OSError):
            raise BenchSetupError(f"load process {worker} is gone (asked {name})") from None

    def receive(self, worker: int, name: str, timeout: float) -> Any:
        pipe = self.pipes[worker]
        try:
            if not pipe.poll(timeout):
                raise BenchSetupError(f"load process {worker} did not answer {name} in {timeout} s")
            status, result = pipe.recv()
        except (EOFError, OSError):
            raise BenchSetupError(f"load process {worker} exited (asked {name})") from None
        if status != "ok":
            raise BenchSetupError(f"load process {worker}: {result}")
        return result

    def ask(self, worker: int, name: str, *args: Any, timeout: float) -> Any:
        """The answer of ``worker`` to command ``name``."""
        self.send(worker, name, *args)
        return self.receive(worker, name, timeout)

    def ask_clients(
        self, name: str, args: Sequence[tuple[Any, ...]] | None = None, timeout: float = 30.0
    ) -> list[Any]:
        """Every member worker's answer to ``name`` (asked of all at once), with
        ``args[w]`` for worker ``w`` (none if ``args`` is None)."""
        for worker in range(self.clients):
            self.send(worker, name, *(args[worker] if args is not None else ()))
        return [self.receive(worker, name, timeout) for worker in range(self.clients)]

    def connect(
        self, spec: ConnectSpec, count: int = 0, background: bool = False, rejoin: bool = False
    ) -> ConnectReport | None:
        """Connect members ``spec.indices`` (or, when it is empty, ``0..count-1``), each
        by the process that holds it; the merged report (None with ``background``: the
        reports come from ``join``, one per background connect, in order). With
        ``rejoin``, clients the broker drops later connect again (see
        :meth:`router.bench.fleet_clients.FleetWorker.do_connect`)."""
        indices = spec.indices or tuple(range(count))
        parts = self.split(indices)
        specs = [(replace(spec, indices=part), background, rejoin) for part in parts]
        deadline = spec.timeout + 30 + len(indices) / 100
        reports: list[ConnectReport | None] = self.ask_clients("connect", specs, deadline)
        if background:
            return None
        return merge([r for r in reports if r is not None])

    def tally(self) -> FleetTally:
        """The members of every load process at one moment, added up."""
        total = FleetTally()
        for part in self.ask_clients("tally"):
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(part, name))
        return total

    def cpu_seconds(self) -> float:
        """CPU seconds the member processes spent so far (what the load cost)."""
        spent = (cpu_seconds(p.pid) for p in self.processes[: self.clients] if p.pid)
        return sum(seconds for seconds in spent if seconds is not None)

    def close(self) -> None:
        for worker in range(len(self.pipes)):
            with contextlib.suppress(BenchSetupError):
                self.send(worker, "exit")
        for process in self.processes:
            process.join(timeout=EXIT_TIMEOUT)
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self.pipes:
            pipe.close()


def merge(reports: Iterable[ConnectReport]) -> ConnectReport:
    """One report for several (load processes, or groups)."""
    merged = ConnectReport()
    reports = list(reports)
    started = [r.first_ns for r in reports if r.first_ns]
    merged.first_ns = min(started) if started else 0
    merged.last_ns = max((r.last_ns for r in reports), default=0)
    for report in reports:
        merged.ok += report.ok
        merged.present += report.present
        merged.gave_up += report.gave_up
        merged.connack_ns.extend(report.connack_ns)
        for reason, count in report.refused.items():
            merged.refused[reason] = merged.refused.get(reason, 0) + count
    return merged


@contextlib.contextmanager
def worker_pool(clients: int) -> Iterator[WorkerPool]:
    """``clients`` member workers and a publisher worker, all gone on exit."""
    pool = WorkerPool(clients)
    try:
        yield pool
    finally:
        pool.close()
