"""``router bench mqtt``: the router's MQTT front end beside mosquitto and amqtt, in one run.

The same load (:mod:`router.bench.mqtt_load`: MQTT 3.1.1 over TCP, 256-byte payloads,
fan-out 1) goes through four brokers, each started here on a free loopback port and
stopped before the next one starts:

1. ``router_two_nodes``: two ``router node run`` processes on one Redis; publishers
   connect to node 1, subscribers to node 2, so every message crosses between nodes;
2. ``router_one_node``: one node, publishers and subscribers on it;
3. ``mosquitto``: ``/usr/sbin/mosquitto`` with a generated config (no persistence, no
   queue or inflight limits, TCP_NODELAY);
4. ``amqtt``: the Python broker, from a virtualenv of its own that the bench creates on
   first use under ``~/.cache/router/`` (amqtt pins ``websockets==15.0.1``, which would
   downgrade the project's websockets, so it is not a dependency of the project).

At QoS 0 and QoS 1 in turn (:func:`run_load`, fresh load processes each time), each
broker gets the same messages and must deliver the same set of (publisher, seq); ``lost``
(never arrived within the drain wait) and ``duplicates`` are counted per broker.
Then, through the two router nodes at QoS 1, one publisher offers ``rate`` msg/s for
``seconds`` and the subscriber measures receive time - send time; then mosquitto gets the
same latency run (``mosquitto_p99_latency_ms``; ``p99_vs_mosquitto`` is ours over its), so
that on a machine whose absolute p99 swings from run to run the two still compare.

The router nodes run with ``ROUTER_OPTIONS`` (queues and inflight windows as unbounded
as mosquitto's here). With ``ROUTER_BENCH_PROFILE=DIR`` in the environment each node runs
under cProfile and writes ``DIR/<node id>.prof`` when it stops.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import math
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Final

import redis

from router.errors import BenchSetupError
from router.ops.embedded_redis import embedded_redis, free_port
from router.state.keys import Keys

from .checks import check_positive, check_redis
from .cpu_meter import cpu_seconds, cpu_us_per_message
from .mqtt_load import (
    DISCONNECT,
    IO_TIMEOUT,
    MAX_DRAIN,
    PAYLOAD_BYTES,
    PROBE_INTERVAL,
    PROBE_SEQ,
    SETUP_TIMEOUT,
    TOPICS_PER_PUBLISHER,
    LoadPlan,
    LoadResult,
    combine,
    open_session,
    payload_for,
    publish_packet,
    publisher_main,
    subscriber_main,
)

AMQTT_VERSION: Final = "0.12.1"
ROUTER_OPTIONS: Final = ("--queue-limit", "1000000", "--mqtt-max-inflight", "65535")
MOSQUITTO_CONFIG: Final = """\
listener {port} 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
persistence false
max_queued_messages 10000000
max_inflight_messages 0
log_dest stderr
"""
AMQTT_CONFIG: Final = """\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""
START_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0
BROKERS: Final = ("router_two_nodes", "router_one_node", "mosquitto", "amqtt")
# Targets of the product (reported, never enforced).
TARGET_QOS0_VS_AMQTT: Final = 3.0
TARGET_QOS0_VS_MOSQUITTO: Final = 0.5
TARGET_QOS1_VS_AMQTT: Final = 3.0
TARGET_P99_MS: Final = 10.0
MAX_LATENCY_MESSAGES: Final = 10_000_000
"""At most this many messages in the latency phase (``--rate`` x ``--seconds``)."""

Address = tuple[str, int]


@dataclass(frozen=True)
class MqttBenchConfig:
    """The sizes of one ``router bench mqtt`` run (``messages`` per QoS and broker)."""

    messages: int = 100_000
    publishers: int = 4
    subscribers: int = 4
    fanout: int = 1
    window: int = 100
    rate: float = 2_000.0
    seconds: float = 5.0
    drain_seconds: float = 3.0
    skip_mosquitto: bool = False
    skip_amqtt: bool = False

    def __post_init__(self) -> None:
        check_positive(rate=self.rate, seconds=self.seconds, drain_seconds=self.drain_seconds)
        if self.rate * self.seconds > MAX_LATENCY_MESSAGES:
            raise BenchSetupError(f"--rate x --seconds must be <= {MAX_LATENCY_MESSAGES:,}")
        self.plan(0, "check")  # LoadPlan checks the sizes
        self.latency_plan("check")

    def plan(self, qos: int, label: str) -> LoadPlan:
        return LoadPlan(
            self.messages, self.publishers, self.subscribers, qos, self.window,
            self.drain_seconds, label=label, fanout=self.fanout,
        )  # fmt: skip

    def latency_plan(self, label: str) -> LoadPlan:
        count = max(1, int(self.rate * self.seconds))
        return LoadPlan(count, 1, 1, 1, self.window, self.drain_seconds, self.rate, label)


# -- processes -------------------------------------------------------------------------------


@contextlib.contextmanager
def _process(
    name: str, args: list[str], ready: Callable[[Path], bool], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``args`` with its output in a log file, wait until ``ready(log)``; on exit
    SIGTERM, then SIGKILL after ``STOP_TIMEOUT``. Raises :class:`BenchSetupError` (with
    the end of the log) if it exits or is not ready within ``START_TIMEOUT``."""
    with tempfile.TemporaryDirectory(prefix="router-bench-mqtt-") as directory:
        log = Path(directory) / f"{name}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                env=env, cwd=directory,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not ready(log):
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text(errors="replace")[-2000:]
                    code = process.returncode
                    state = "was not ready in time" if code is None else f"exited with {code}"
                    raise BenchSetupError(f"{name} {state}:\n{tail}")
                time.sleep(0.05)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _listening(port: int) -> Callable[[Path], bool]:
    def ready(_: Path) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    return ready


def _logged(text: str) -> Callable[[Path], bool]:
    return lambda log: text in log.read_text(errors="replace")


def _node_command(node_id: str) -> tuple[list[str], dict[str, str]]:
    """How to start ``router node run`` in this interpreter (under cProfile when
    ``ROUTER_BENCH_PROFILE`` names a directory)."""
    env = dict(os.environ)
    profile = os.environ.get("ROUTER_BENCH_PROFILE")
    if not profile:
        return [sys.executable, "-c", "from router.cli import main; main()"], env
    env["ROUTER_BENCH_PROFILE_OUT"] = str(Path(profile).resolve() / f"{node_id}.prof")
    code = (
        "import cProfile, os; from router.cli import main; "
        "cProfile.run('main()', os.environ['ROUTER_BENCH_PROFILE_OUT'])"
    )
    return [sys.executable, "-c", code], env


@contextlib.contextmanager
def router_nodes(url: str, count: int, pids: list[int]) -> Iterator[list[Address]]:
    """``count`` router nodes on ``url`` under a fresh prefix; yields their MQTT addresses
    (their process ids appended to ``pids``) and deletes the prefix's keys after the nodes
    stopped."""
    prefix = f"mb{uuid.uuid4().hex[:8]}"
    addresses: list[Address] = []
    try:
        with contextlib.ExitStack() as stack:
            for number in range(1, count + 1):
                node_id, port = f"{prefix}-{number}", free_port()
                command, env = _node_command(node_id)
                args = [
                    *command, "node", "run", "--redis", url, "--prefix", prefix,
                    "--node-id", node_id, "--mqtt", f"127.0.0.1:{port}", *ROUTER_OPTIONS,
                ]  # fmt: skip
                ready = _logged(f"node {node_id} ready")
                pids.append(stack.enter_context(_process(node_id, args, ready, env)).pid)
                addresses.append(("127.0.0.1", port))
            yield addresses
    finally:
        delete_prefix(url, prefix)


def delete_prefix(url: str, prefix: str) -> None:
    """Best effort: the keys the nodes left (none if they left cleanly)."""
    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=Keys(prefix).pattern(), count=1000))
        for first in range(0, len(names), 1000):
            client.unlink(*names[first : first + 1000])
    except redis.RedisError:
        pass  # (Redis stopped with us on Ctrl-C: nothing to clean)
    finally:
        client.close()


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise BenchSetupError("no mosquitto: apt-get install mosquitto, or --skip-mosquitto")
    return found


def mosquitto_version() -> str:
    answer = subprocess.run(
        [mosquitto_binary(), "-h"], capture_output=True, text=True, timeout=10, check=False
    )
    return answer.stdout.split("\n", 1)[0].removeprefix("mosquitto version ").strip()


@contextlib.contextmanager
def mosquitto(pids: list[int]) -> Iterator[Address]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="router-bench-mosquitto-") as directory:
        config = Path(directory) / "mosquitto.conf"
        config.write_text(MOSQUITTO_CONFIG.format(port=port))
        config.chmod(0o644)
        args = [mosquitto_binary(), "-c", str(config)]
        with _process("mosquitto", args, _listening(port)) as process:
            pids.append(process.pid)
            yield ("127.0.0.1", port)


def amqtt_home() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "router" / f"bench-amqtt-{AMQTT_VERSION}"


def ensure_amqtt() -> Path:
    """The ``amqtt`` script of the bench's own virtualenv, created (under a file lock)
    on first use with pip; raises :class:`BenchSetupError` if pip cannot install it."""
    home = amqtt_home()
    script, complete = home / "bin" / "amqtt", home / ".complete"
    if complete.exists():
        return script
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / f"{home.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete.exists():
            return script
        shutil.rmtree(home, ignore_errors=True)
        own_pip = importlib.util.find_spec("pip") is not None
        steps = [[sys.executable, "-m", "venv", *(["--without-pip"] if own_pip else []), str(home)]]
        pip = [sys.executable, "-m", "pip", "--python", str(home / "bin" / "python")]
        if not own_pip:
            pip = [str(home / "bin" / "python"), "-m", "pip"]
        steps.append(
            [*pip, "install", "-q", "--disable-pip-version-check", f"amqtt=={AMQTT_VERSION}"]
        )
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise BenchSetupError(f"installing amqtt failed: {done.stderr[-2000:]}")
        complete.write_text(AMQTT_VERSION)
    return script


@contextlib.contextmanager
def amqtt(pids: list[int]) -> Iterator[Address]:
    script = ensure_amqtt()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="router-bench-amqtt-") as directory:
        config = Path(directory) / "amqtt.yaml"
        config.write_text(AMQTT_CONFIG.format(port=port))
        with _process("amqtt", [str(script), "-c", str(config)], _listening(port)) as process:
            pids.append(process.pid)
            yield ("127.0.0.1", port)


# -- one run of the load -----------------------------------------------------------------------


def _await_all(
    pipes: list[Connection], word: str, what: str, each_round: Callable[[set[int]], None] | None
) -> None:
    """Wait until every process said ``word`` (``each_round(waiting)`` first, every
    ``PROBE_INTERVAL``); :class:`BenchSetupError` on another answer or after SETUP_TIMEOUT."""
    waiting = set(range(len(pipes)))
    deadline = time.monotonic() + SETUP_TIMEOUT
    while waiting:
        if each_round is not None:
            each_round(waiting)
        for pipe in wait([pipes[i] for i in waiting], timeout=PROBE_INTERVAL):
            assert isinstance(pipe, Connection)
            index, answer = pipes.index(pipe), _answer(pipe)
            if answer != word:
                raise BenchSetupError(f"{what} {index}: {answer}")
            waiting.discard(index)
        if waiting and time.monotonic() > deadline:
            raise BenchSetupError(f"{what} {sorted(waiting)} not {word} in {SETUP_TIMEOUT} s")


def _probe(address: tuple[str, int], plan: LoadPlan, pipes: list[Connection]) -> None:
    """Publish probes on every publisher's topics until every subscriber saw its own."""
    sock = open_session(address, f"{plan.label}-probe")

    def send(waiting: set[int]) -> None:
        sock.sendall(
            b"".join(
                publish_packet(f"bench/p{p:03d}/probe", payload_for(p, PROBE_SEQ))
                for s in waiting
                for p in plan.publishers_of(s)
            )
        )

    try:
        _await_all(pipes, "ready", "subscriber", send)
        sock.sendall(DISCONNECT)
    finally:
        sock.close()


def _answer(pipe: Connection) -> Any:
    try:
        return pipe.recv()
    except EOFError:
        raise BenchSetupError("a load process exited without an answer") from None


def _result(pipe: Connection, timeout: float) -> dict[str, Any]:
    if not pipe.poll(timeout):
        raise BenchSetupError(f"a load process gave no result in {timeout} s")
    answer: dict[str, Any] = _answer(pipe)
    return answer


def run_load(
    publish_to: tuple[str, int], subscribe_to: tuple[str, int], plan: LoadPlan
) -> LoadResult:
    """One run (see :mod:`router.bench.mqtt_load`); every process it starts is gone when it
    returns.

    Raises :class:`BenchSetupError` when a connection, subscription or probe fails; what
    goes wrong once messages flow is counted (lost) and listed in ``errors``.
    """
    # fork is quick; with other threads alive it is unsafe (3.12 warns), so a fork server
    # (which stays until this process exits) makes the processes then.
    context = (
        multiprocessing.get_context("fork")
        if threading.active_count() == 1
        else multiprocessing.get_context("forkserver")
    )
    start, done, close = context.Event(), context.Event(), context.Event()
    processes: list[multiprocessing.process.BaseProcess] = []

    def spawn(target: Callable[..., None], *args: object) -> Connection:
        ours, theirs = context.Pipe()
        processes.append(context.Process(target=target, args=(*args, theirs), daemon=True))
        processes[-1].start()
        return ours

    try:
        subs = [
            spawn(subscriber_main, subscribe_to, plan, i, done) for i in range(plan.subscribers)
        ]
        _await_all(subs, "subscribed", "subscriber", None)
        _probe(publish_to, plan, subs)
        pubs = [
            spawn(publisher_main, publish_to, plan, i, start, close) for i in range(plan.publishers)
        ]
        _await_all(pubs, "connected", "publisher", None)
        start.set()
        longest = IO_TIMEOUT + plan.messages / (plan.rate or 100.0)
        published = [_result(pipe, longest) for pipe in pubs]
        done.set()
        received = [_result(pipe, MAX_DRAIN + 10) for pipe in subs]
        close.set()
        for process in processes:
            process.join(timeout=5)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return combine(plan, published, received)


# -- the run and its report ------------------------------------------------------------------


def cut(value: float, digits: int = 2) -> float:
    """``value`` truncated (never rounded up) to ``digits`` decimals, exactly (no float
    product that could round up first): how every ratio of the benches is printed."""
    scale: int = 10**digits
    return math.floor(Fraction(value) * scale) / scale


def percentile(values: list[int], fraction: float) -> float:
    """The ``fraction`` quantile of nanosecond ``values``, in milliseconds (0.0 if none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] / 1e6


@contextlib.contextmanager
def _interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt meanwhile, so every broker and process is stopped
    on the way out (in the main thread; elsewhere signals cannot be handled)."""
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


def run(url: str | None = None, config: MqttBenchConfig | None = None) -> dict[str, Any]:
    """Every broker at QoS 0 and 1, then latency through two router nodes, on ``url``
    (or a redis-server started for the run); the object ``--json`` prints."""
    config = config if config is not None else MqttBenchConfig()
    if url is not None:
        check_redis(url)
    if not config.skip_mosquitto:
        mosquitto_binary()  # before any process starts
    nonce = uuid.uuid4().hex[:6]
    results: dict[str, dict[int, LoadResult]] = {}
    cpu: dict[str, dict[int, list[float | None]]] = {}

    def each_qos(name: str, publish_to: Address, subscribe_to: Address, pids: list[int]) -> None:
        results[name], cpu[name] = {}, {}
        for qos in (0, 1):
            before = [cpu_seconds(pid) for pid in pids]
            done = run_load(publish_to, subscribe_to, config.plan(qos, f"{name}-{qos}-{nonce}"))
            after = [cpu_seconds(pid) for pid in pids]
            results[name][qos] = done
            spent = zip(before, after, strict=True)
            cpu[name][qos] = [cpu_us_per_message(b, a, done.received) for b, a in spent]

    with contextlib.ExitStack() as stack:
        stack.enter_context(_interrupted_by_sigterm())
        if url is None:
            url = stack.enter_context(embedded_redis())
        pids: dict[str, list[int]] = {name: [] for name in BROKERS}
        with router_nodes(url, 2, pids["router_two_nodes"]) as (first, second):
            each_qos("router_two_nodes", first, second, pids["router_two_nodes"])
            latency = run_load(first, second, config.latency_plan(f"latency-{nonce}"))
        with router_nodes(url, 1, pids["router_one_node"]) as (only,):
            each_qos("router_one_node", only, only, pids["router_one_node"])
        mosquitto_latency = None
        if not config.skip_mosquitto:
            with mosquitto(pids["mosquitto"]) as address:
                each_qos("mosquitto", address, address, pids["mosquitto"])
                plan = config.latency_plan(f"latency-mosquitto-{nonce}")
                mosquitto_latency = run_load(address, address, plan)
        if not config.skip_amqtt:
            with amqtt(pids["amqtt"]) as address:
                each_qos("amqtt", address, address, pids["amqtt"])
    return report(config, results, latency, cpu, mosquitto_latency)


def _qos_report(
    qos: int, results: dict[str, dict[int, LoadResult]], cpu: dict[str, dict[int, Any]]
) -> dict[str, Any]:
    rates = {name: results[name][qos].msgs_per_s for name in results}
    two = rates["router_two_nodes"]
    row: dict[str, Any] = {
        f"{name}_msgs_per_s": round(rates[name]) if name in rates else None for name in BROKERS
    }
    for peer in ("mosquitto", "amqtt"):
        row[f"vs_{peer}"] = cut(two / rates[peer]) if rates.get(peer) else None
    ours = results["router_two_nodes"][qos]
    row["lost"], row["duplicates"] = ours.lost, ours.duplicates
    row["lost_by_broker"] = {name: results[name][qos].lost for name in results}
    row["duplicates_by_broker"] = {name: results[name][qos].duplicates for name in results}
    row["loadgen_cores_by_broker"] = {  # CPU seconds of the load / elapsed seconds
        name: cut(results[name][qos].cpu_seconds / (results[name][qos].elapsed or 1))
        for name in results
    }
    # CPU of each broker process per message delivered (two nodes: publishers', subscribers').
    row["cpu_us_per_msg_by_broker"] = {name: cpu[name][qos] for name in results}
    row["answers_agree"] = len({results[name][qos].digest() for name in results}) == 1
    row["errors"] = [e for name in results for e in results[name][qos].errors]
    return row


LATENCY_FIGURES: Final = (
    "p50_latency_ms", "p99_latency_ms", "max_latency_ms", "p99_latency_from_schedule_ms",
    "latency_messages", "latency_lost", "latency_duplicates",
)  # fmt: skip


def latency_figures(latency: LoadResult | None, name: str = "") -> dict[str, Any]:
    """The :data:`LATENCY_FIGURES` of a latency run (ms to the microsecond, over the
    messages received), each named with the prefix ``name``; all None for a broker left
    out (``latency`` None)."""
    if latency is None:
        return {f"{name}{figure}": None for figure in LATENCY_FIGURES}
    values = (
        *(round(percentile(latency.latencies_ns, q), 3) for q in (0.5, 0.99, 1.0)),
        round(percentile(latency.scheduled_latencies_ns, 0.99), 3),
        latency.received, latency.lost, latency.duplicates,
    )  # fmt: skip
    return {f"{name}{figure}": v for figure, v in zip(LATENCY_FIGURES, values, strict=True)}


def report(
    config: MqttBenchConfig,
    results: dict[str, dict[int, LoadResult]],
    latency: LoadResult,
    cpu: dict[str, dict[int, Any]],
    mosquitto_latency: LoadResult | None = None,
) -> dict[str, Any]:
    """The JSON object of a run: a row per QoS, the latency figures (ours, then
    mosquitto's: ``p99_vs_mosquitto`` is ours over its, None without both), the workload."""
    qos0, qos1 = _qos_report(0, results, cpu), _qos_report(1, results, cpu)
    p99 = percentile(latency.latencies_ns, 0.99)
    ours, theirs = latency_figures(latency), latency_figures(mosquitto_latency, "mosquitto_")
    theirs_p99 = theirs["mosquitto_p99_latency_ms"]  # None: left out; 0.0: nothing arrived
    ratio = cut(ours["p99_latency_ms"] / theirs_p99) if latency.received and theirs_p99 else None
    met = {
        "qos0_vs_amqtt": qos0["vs_amqtt"] is not None and qos0["vs_amqtt"] >= TARGET_QOS0_VS_AMQTT,
        "qos0_vs_mosquitto": qos0["vs_mosquitto"] is not None
        and qos0["vs_mosquitto"] >= TARGET_QOS0_VS_MOSQUITTO,
        "qos1_vs_amqtt": qos1["vs_amqtt"] is not None and qos1["vs_amqtt"] >= TARGET_QOS1_VS_AMQTT,
        "p99_latency": latency.received > 0 and p99 <= TARGET_P99_MS,
        "qos1_lost_zero": qos1["lost"] == 0 and qos1["lost_by_broker"]["router_one_node"] == 0,
    }
    return {
        "qos0": qos0,
        "qos1": qos1,
        **ours,
        **theirs,
        "p99_vs_mosquitto": ratio,
        "messages": config.messages,
        "publishers": config.publishers,
        "subscribers": config.subscribers,
        "fan_out": config.fanout,
        "payload_bytes": PAYLOAD_BYTES,
        "topics_per_publisher": TOPICS_PER_PUBLISHER,
        "inflight_window": config.window,
        "rate": config.rate,
        "seconds": config.seconds,
        "drain_seconds": config.drain_seconds,
        "router_options": " ".join(ROUTER_OPTIONS),
        "mosquitto_version": None if config.skip_mosquitto else mosquitto_version(),
        "amqtt_version": None if config.skip_amqtt else AMQTT_VERSION,
        "cpus": os.cpu_count(),
        "targets_met": met,
    }
