"""Suites written by others against router nodes: ``make conformance``.

Every folder of ``../shared/conformance/`` (beside the repository; :data:`SUITES`
overrides it) that holds a ``run.sh`` is a suite: ``run.sh HOST:PORT[,HOST:PORT...]``
runs it against those MQTT listeners, each new client on the next one, and prints its
result. The suites' code stays outside this repository; what is ours is how they are
judged, here:

* Each suite runs against every :data:`LAYOUTS` entry: one node, two nodes on one
  standalone Redis, and two nodes on a 3-master Redis Cluster, all real processes
  (``redis-server``, ``router node run``) on free loopback ports, started for the run
  and stopped after it.
* A :class:`Reader` per suite reads its output (:data:`READERS`): the tests that passed
  and the names of those that failed. A suite without a reader fails the run, so a new
  suite in ``shared/`` is noticed, not ignored.
* A run passes when every failed test is one the suite's upstream says cannot pass
  against a local broker (:attr:`Reader.cannot_pass`, with the reason), at least
  :attr:`Reader.least_passed` passed (a suite that stopped collecting is not a pass),
  and no node logged a traceback or an ERROR line (a client's input is never one).
* The first run of each suite goes alone (it makes the suite's virtualenv, kept under
  ``.venv/conformance/``), the other runs then go :data:`AT_ONCE` at a time: the suites
  wait on the network far more than they compute.

Prints one line per run, the failures upstream says must fail here, and last
``conformance: P passed, F failed`` counting the tests of every run (F: the other
failures); exits 1 when a run failed (its output and the nodes' logs are printed first),
0 otherwise.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tests.support.cli import Process
from tests.support.mqtt import mqtt_node
from tests.support.servers import RedisClusterServers, RedisServer

ROOT: Final = Path(__file__).resolve().parents[2]
SUITES: Final = Path(os.environ.get("ROUTER_CONFORMANCE", ROOT.parent / "shared" / "conformance"))
VENVS: Final = ROOT / ".venv" / "conformance"
#: Seconds one run of a suite may take before it is stopped (and fails).
RUN_TIMEOUT: Final = 1200.0
#: Runs at a time after each suite's first.
AT_ONCE: Final = 4
#: Lines of a node's log that no client may cause.
FORBIDDEN: Final = re.compile(r"Traceback \(most recent call last\)| ERROR ")


@dataclass(frozen=True)
class Layout:
    """Where a run's nodes keep their state: ``nodes`` router nodes on a standalone Redis
    or on a Redis Cluster."""

    name: str
    nodes: int
    cluster: bool = False


LAYOUTS: Final = (
    Layout("one node", 1),
    Layout("two nodes", 2),
    Layout("two nodes, Redis Cluster", 2, cluster=True),
)


@dataclass(frozen=True)
class Outcome:
    """What a suite's output says: how many tests passed, which failed (their names),
    and whether a result was found at all."""

    passed: int
    failed: tuple[str, ...]
    found: bool = True


@dataclass(frozen=True)
class Reader:
    """How to read one suite's output and what it cannot pass here."""

    read: Callable[[str], Outcome]
    least_passed: int
    cannot_pass: dict[str, str] = field(default_factory=dict)
    #: The suite's run.sh environment variable that names its virtualenv.
    venv_variable: str = ""


PYTEST_SUMMARY: Final = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+(?:, )?)+) in [\d.]+s")
PYTEST_FAILED: Final = re.compile(r"^(?:FAILED|ERROR) \S+::(?P<name>[\w\[\]\-.]+)")
GMQTT_RESULT: Final = re.compile(r"^gmqtt: (?P<passed>\d+)/(?P<ran>\d+) passed; failed: (?P<f>.*)$")


def pytest_counts(output: str) -> dict[str, int] | None:
    """The counts of pytest's last summary line (``"1 failed, 73 passed, 2 skipped in
    12.1s"``) by outcome, plural forms made singular (``errors`` counts as ``error``);
    None when the output has none (the run broke before the end)."""
    for line in reversed(output.splitlines()):
        match = PYTEST_SUMMARY.match(line.strip())
        if match is not None:
            counts = {}
            for count in match.group("counts").split(", "):
                number, outcome = count.split(" ")
                counts[outcome.removesuffix("s")] = int(number)
            return counts
    return None


def read_pytest(output: str) -> Outcome:
    """A suite whose run.sh prints pytest's own output (with ``-rfE``): the failed and
    errored tests by name from the short summary."""
    counts = pytest_counts(output)
    if counts is None:
        return Outcome(0, (), found=False)
    failed = tuple(
        match.group("name")
        for line in output.splitlines()
        if (match := PYTEST_FAILED.match(line.strip())) is not None
    )
    if len(failed) < counts.get("failed", 0) + counts.get("error", 0):
        failed += ("(unnamed failures)",)
    return Outcome(counts.get("passed", 0), failed)


def read_gmqtt(output: str) -> Outcome:
    """gmqtt's run.sh: its last line ``gmqtt: P/T passed; failed: A, B`` (or ``none``)."""
    for line in reversed(output.splitlines()):
        match = GMQTT_RESULT.match(line.strip())
        if match is not None:
            names = match.group("f").strip()
            failed = () if names == "none" else tuple(n.strip() for n in names.split(","))
            return Outcome(int(match.group("passed")), failed)
    return Outcome(0, (), found=False)


READERS: Final = {
    # zMQTT 0.2.5's broker tests: 76, of which 2 are MQTT 5.0 only and skipped on 3.1.1.
    "zmqtt": Reader(read_pytest, least_passed=74, venv_variable="ZMQTT_VENV"),
    # gmqtt 0.7.0's own suite: 16 tests (UPSTREAM names the two a local broker fails).
    "gmqtt": Reader(
        read_gmqtt,
        least_passed=14,
        cannot_pass={
            "test_assigned_clientid": "gmqtt replaces an empty client id with one of its own",
            "test_basic_ssl": "needs a certificate the system trusts on port 8883",
        },
        venv_variable="GMQTT_VENV",
    ),
}


@dataclass
class Run:
    """One suite against one layout, once it ran."""

    suite: str
    layout: Layout
    outcome: Outcome = Outcome(0, (), found=False)
    output: str = ""
    node_logs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def line(self) -> str:
        verdict = "ok" if self.passed else "FAILED: " + "; ".join(self.problems)
        failed = ", ".join(self.outcome.failed) or "none"
        return (
            f"{self.suite} on {self.layout.name}: {self.outcome.passed} passed, "
            f"failed: {failed} -> {verdict}"
        )


def judge(run: Run, reader: Reader) -> None:
    """Fill ``run.problems`` from its outcome and its nodes' logs."""
    outcome = run.outcome
    if not outcome.found:
        run.problems.append("no result in the suite's output")
    unexpected = [name for name in outcome.failed if name not in reader.cannot_pass]
    if unexpected:
        run.problems.append("failed: " + ", ".join(unexpected))
    if outcome.found and outcome.passed < reader.least_passed:
        run.problems.append(f"only {outcome.passed} passed (at least {reader.least_passed})")
    bad = [line for line in run.node_logs if FORBIDDEN.search(line)]
    if bad:
        run.problems.append(f"{len(bad)} traceback or ERROR lines in the nodes' logs")


@contextlib.contextmanager
def redis_for(layout: Layout) -> Iterator[str]:
    """A Redis for one run (its URL), stopped after it."""
    server: RedisServer | RedisClusterServers = (
        RedisClusterServers() if layout.cluster else RedisServer()
    )
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def run_suite(suite: Path, layout: Layout, reader: Reader) -> Run:
    """Run ``suite`` against the nodes of ``layout``; the run, judged."""
    run = Run(suite.name, layout)
    with redis_for(layout) as url, contextlib.ExitStack() as stack:
        env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": f"cf-{uuid.uuid4().hex[:8]}"}
        nodes: list[Process] = []
        ports: list[int] = []
        for index in range(layout.nodes):
            process, port = stack.enter_context(mqtt_node(f"{suite.name}-{index + 1}", env))
            nodes.append(process)
            ports.append(port)
        suite_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        suite_env = {k: v for k, v in suite_env.items() if not k.startswith("PYTEST_")}
        if reader.venv_variable:
            suite_env[reader.venv_variable] = str(VENVS / suite.name)
        address = ",".join(f"127.0.0.1:{port}" for port in ports)
        try:
            done = subprocess.run(
                ["bash", str(suite / "run.sh"), address],
                env=suite_env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
                stdin=subprocess.DEVNULL,
            )
            run.output = done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            run.output = f"{expired.stdout or ''}{expired.stderr or ''}"
            run.problems.append(f"stopped after {RUN_TIMEOUT:.0f} s")
        for process in nodes:
            process.kill()
            run.node_logs += process.stderr_lines + drain(process)
    run.outcome = reader.read(run.output)
    judge(run, reader)
    return run


def drain(process: Process) -> list[str]:
    """The stderr lines of a stopped node not read yet."""
    lines = []
    with contextlib.suppress(Exception):
        while True:
            lines.append(process.stderr.get_nowait())
    return lines


def suites() -> list[Path]:
    """The suites beside the repository (folders with a run.sh), by name."""
    if not SUITES.is_dir():
        raise SystemExit(f"conformance: no suites at {SUITES} (set ROUTER_CONFORMANCE)")
    return sorted(path for path in SUITES.iterdir() if (path / "run.sh").is_file())


def run_all(known: list[Path]) -> list[Run]:
    """Every suite against every layout: each suite's first run alone (it makes the
    suite's virtualenv), then its other runs in the shared pool."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=AT_ONCE) as pool:

        def chain(suite: Path) -> list[Run]:
            reader = READERS[suite.name]
            first = run_suite(suite, LAYOUTS[0], reader)
            rest = [pool.submit(run_suite, suite, layout, reader) for layout in LAYOUTS[1:]]
            return [first, *(future.result() for future in rest)]

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(known) or 1) as chains:
            return [run for runs in chains.map(chain, known) for run in runs]


def main() -> int:
    found = suites()
    unread = [suite.name for suite in found if suite.name not in READERS]
    for name in unread:
        print(f"{name}: no reader for this suite in tests/conformance/suites.py -> FAILED")
    runs = run_all([suite for suite in found if suite.name in READERS])
    for run in runs:
        if not run.passed:
            print(f"==== {run.suite} on {run.layout.name}: the suite's output ====")
            print(run.output[-20000:])
            print(f"==== {run.suite} on {run.layout.name}: the nodes' logs (problems) ====")
            print("\n".join(line for line in run.node_logs if FORBIDDEN.search(line))[-20000:])
    for run in runs:
        print(run.line())
    expected = [
        f"{run.suite}.{name} ({READERS[run.suite].cannot_pass[name]})"
        for run in runs
        for name in run.outcome.failed
        if name in READERS[run.suite].cannot_pass
    ]
    if expected:
        print(f"failed as their upstream says they must here: {len(expected)}")
        for line in sorted(set(expected)):
            print(f"  {line}")
    passed = sum(run.outcome.passed for run in runs)
    unexpected = sum(len(run.outcome.failed) for run in runs) - len(expected)
    print(f"conformance: {passed} passed, {unexpected} failed")
    return 0 if all(run.passed for run in runs) and not unread else 1


if __name__ == "__main__":
    sys.exit(main())
