"""``router bench backends``: the framework backends of :mod:`router.integrations` beside
the frameworks' own Redis backends, on one Redis, in one run.

Layout of one run (all on loopback; :mod:`router.bench.backend_workers` has the processes,
:mod:`router.bench.backend_plan` the workload)::

    senders 0 .. S-1               workers 0 .. N-1 (one process each)
    group_send / emit  --Redis-->  one member for each group held (K workers a group);
    (each its share of messages)   each delivery recorded and checked against the plan

Four backends in turn, on the same processes and the same Redis:

* Django Channels: :class:`RouterChannelLayer` (``router_channels``), then
  ``channels_redis.pubsub.RedisPubSubChannelLayer`` (``channels_redis``);
* python-socketio: :class:`RouterManager` (``router_socketio``), then
  ``socketio.AsyncRedisManager`` (``socketio_redis``).

For each, three phases, then a fence:

1. *probes*: every sender sends one message to every group, again every
   :data:`PROBE_WAIT` s, until every member got one (its subscription is in effect);
2. *latency*: ``rate`` group sends a second for ``seconds`` (shared by the senders);
   ``p50_ms``/``p99_ms``/``max_ms`` from the send call to the member, over every delivery
   expected (one never made counts as infinitely late: a percentile that falls on one is
   None). Latency is taken at a fixed rate that every backend carries, and before the
   throughput phase: during it, it would measure how long the backlog grew, and just
   after it, what a backend still had to do for it;
3. *throughput*: M group sends as fast as the senders can, each with
   :data:`~router.bench.backend_workers.WINDOW` in flight; ``msgs_per_s`` is M over the
   time from the first send to the last delivery on any worker, ``send_s`` how long the
   senders took, ``senders_/workers_/redis_cpu_us_per_msg`` the CPU the senders, the
   workers and Redis spent per message meanwhile (what moves least on a shared machine);
4. *fence*: every sender sends a fence to every group; once every member has them all,
   each worker has taken in everything sent before (``fenced``); its figures are read
   once what it processed has settled (:func:`_fence`).

Every delivery is checked: ``lost`` (expected, not made after :data:`DRAIN_QUIET` s
without a new one), ``duplicates``, ``misdelivered`` (to a member of another group);
``answers_agree`` holds when every backend delivered exactly the expected messages to
exactly their groups' members. ``processed_per_worker`` is what each worker's backend
took in and handled (probes and fences included), ``needed_per_worker`` how many of
those were addressed to its members: a backend that routes by interest processes only
those.
``vs_channels_redis`` and ``vs_socketio_redis`` are the router backend's ``msgs_per_s``
over its peer's, cut to two decimals.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final

import redis

from router.bench.backend_plan import BACKENDS, BackendsConfig
from router.bench.backend_workers import WINDOW, BackendSpec, sender_main, worker_main
from router.bench.broker_runs import cut
from router.bench.checks import check_redis
from router.bench.cluster_node import latency_figures
from router.bench.cpu_meter import cpu_seconds, cpu_us_per_message
from router.ops.embedded_redis import embedded_redis, kind_of

SETUP_TIMEOUT: Final = 60.0
"""Seconds a process has to start, open a backend or get its probes (2 busy cores)."""
PROBE_WAIT: Final = 0.2
"""Seconds between two rounds of probes while a member has not got one."""
DRAIN_QUIET: Final = 5.0
"""Seconds without a new delivery after which the ones still missing count as lost."""
SETTLE_QUIET: Final = 1.0
"""Seconds without a change after which what the workers processed counts as settled."""
POLL: Final = 0.05
PEERS: Final = {"router_channels": "channels_redis", "router_socketio": "socketio_redis"}


class _Process:
    """A spawned bench process and the bench's end of its pipe."""

    def __init__(self, context: Any, name: str, target: Callable[..., None], *args: object) -> None:
        self.name = name
        self.pipe, theirs = context.Pipe()
        self.process = context.Process(target=target, args=(theirs, *args), name=name, daemon=True)
        self.process.start()
        theirs.close()

    def send(self, command: object) -> None:
        """Send ``command``; RuntimeError if the process is gone (a broken pipe must not
        reach click, which takes it for a closed standard output and exits silently)."""
        try:
            self.pipe.send(command)
        except OSError:
            raise RuntimeError(f"{self.name} exited ({self.process.exitcode})") from None

    def ask(self, command: object, timeout: float) -> Any:
        self.send(command)
        return self.answer(timeout)

    def answer(self, timeout: float) -> Any:
        """The next answer; raises RuntimeError after ``timeout`` s without one, when the
        process exited, or when its backend failed (with the process's traceback)."""
        if not self.pipe.poll(timeout):
            raise RuntimeError(f"{self.name} gave no answer in {timeout:.0f} s")
        try:
            answer = self.pipe.recv()
        except EOFError:
            raise RuntimeError(f"{self.name} exited ({self.process.exitcode})") from None
        if isinstance(answer, tuple) and answer[0] == "error":
            raise RuntimeError(f"{self.name} failed:\n{answer[1]}")
        return answer

    def stop(self, kill: bool = False) -> None:
        """Tell it to end, and kill it if it has not within a few seconds; with ``kill``
        (the run failed: it may be anywhere in a session), kill it at once."""
        if not kill:
            with contextlib.suppress(OSError):
                self.pipe.send(None)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.pipe.close()


def _expect(answer: object, word: str, name: str) -> None:
    if answer != word:
        raise RuntimeError(f"{name} answered {answer!r}, not {word!r}")


@contextlib.contextmanager
def _opened(spec: BackendSpec, senders: list[_Process], workers: list[_Process]) -> Iterator[None]:
    """The backend open in every process (the senders first: a router node that joined
    after the members subscribed would have to learn their routes), then closed in each
    (the router nodes leave the cluster). Should anything fail the bench kills every
    process, so nothing is closed then."""
    for process in (*senders, *workers):
        process.send(("open", spec))
        _expect(process.answer(SETUP_TIMEOUT), "ready", process.name)
    yield
    for process in (*senders, *workers):
        process.send("close")
    for process in (*senders, *workers):
        _expect(process.answer(SETUP_TIMEOUT), "closed", process.name)


def _all(processes: list[_Process], command: object, timeout: float) -> list[Any]:
    """``command`` to every process at once; their answers."""
    for process in processes:
        process.send(command)
    return [process.answer(timeout) for process in processes]


def _probe(senders: list[_Process], workers: list[_Process]) -> int:
    """Probe rounds (each sender: one message to each group) until every member got
    one; how many rounds."""
    deadline = time.monotonic() + SETUP_TIMEOUT
    rounds = 0
    while True:
        for answer in _all(senders, "probe", SETUP_TIMEOUT):
            _expect(answer, "probed", "a sender")
        rounds += 1
        next_round = time.monotonic() + PROBE_WAIT
        while time.monotonic() < next_round:
            if all(status["probed"] for status in _all(workers, "status", SETUP_TIMEOUT)):
                return rounds
            time.sleep(POLL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"members got no probe in {SETUP_TIMEOUT:.0f} s")


def _fence(senders: list[_Process], workers: list[_Process], total: int) -> bool:
    """Every sender's fence to every group; then wait until every member got them all
    (False if that took over :data:`DRAIN_QUIET` s: the backend lost some), and until
    what each worker processed is settled: every message sent (``total``), or no change
    for :data:`SETTLE_QUIET` s. Only fences can still be on their way then (the fence of
    a group a worker does not hold may follow its own)."""
    for lane, sender in enumerate(senders):
        sender.send(("fence", lane))
    for sender in senders:
        _expect(sender.answer(SETUP_TIMEOUT), "fenced", sender.name)
    fenced = False
    deadline = time.monotonic() + DRAIN_QUIET
    while not fenced and time.monotonic() < deadline:
        fenced = all(status["fenced"] for status in _all(workers, "status", SETUP_TIMEOUT))
        time.sleep(POLL)
    last: list[int] = []
    since = time.monotonic()
    while True:
        processed = [status["processed"] for status in _all(workers, "status", SETUP_TIMEOUT)]
        if all(count >= total for count in processed):
            return fenced
        if processed != last:
            last, since = processed, time.monotonic()
        elif time.monotonic() - since > SETTLE_QUIET:
            return fenced
        time.sleep(POLL)


def _drain(workers: list[_Process], phase: int, expected: int) -> None:
    """Until the workers' distinct deliveries of ``phase`` reach ``expected``, or none
    came for :data:`DRAIN_QUIET` seconds."""
    last_count, last_change = -1, time.monotonic()
    while True:
        count = sum(s["counts"][phase] for s in _all(workers, "status", SETUP_TIMEOUT))
        if count >= expected:
            return
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > DRAIN_QUIET:
            return
        time.sleep(POLL)


class _CpuMeter:
    """CPU seconds spent by the senders, the workers and Redis (its INFO: any server,
    started here or not) between :meth:`start` and :meth:`stop`, per message."""

    def __init__(self, url: str, senders: list[_Process], workers: list[_Process]) -> None:
        self.redis = redis.Redis.from_url(url)
        self.groups = {"senders": senders, "workers": workers}
        self.before: dict[str, float | None] = {}
        self.after: dict[str, float | None] = {}

    def read(self) -> dict[str, float | None]:
        figures = {name: _cpu_of(group) for name, group in self.groups.items()}
        try:
            info = self.redis.info("cpu")
            figures["redis"] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        except (redis.RedisError, KeyError):  # (fakeredis has no INFO cpu)
            figures["redis"] = None
        return figures

    def start(self) -> None:
        self.before = self.read()

    def stop(self) -> None:
        self.after = self.read()

    def us_per_message(self, messages: int) -> dict[str, float | None]:
        """``senders_cpu_us_per_msg``, ``workers_...`` and ``redis_...``: microseconds of
        CPU per message (None where one reading failed)."""
        return {
            f"{name}_cpu_us_per_msg": cpu_us_per_message(
                self.before[name], self.after[name], messages
            )
            for name in self.before
        }

    def close(self) -> None:
        self.redis.close()


def _cpu_of(processes: list[_Process]) -> float | None:
    readings = [cpu_seconds(p.process.pid) for p in processes if p.process.pid is not None]
    return None if None in readings or not readings else sum(r for r in readings if r)


def _measure(
    spec: BackendSpec, senders: list[_Process], workers: list[_Process], config: BackendsConfig
) -> dict[str, Any]:
    """One backend: probes, the latency phase, the throughput phase, the fence; its
    figures."""
    messages, latency_messages = config.messages, config.latency_messages
    longest = SETUP_TIMEOUT + (messages + latency_messages) / 50  # (a send rate nobody has)
    lanes = len(senders)
    indexes = range(len(workers))
    expected = [
        sum(config.expected(i, *span) for i in indexes)
        for span in ((0, messages), (messages, latency_messages))
    ]
    meter = _CpuMeter(spec.url, senders, workers)
    try:
        with _opened(spec, senders, workers):
            rounds = _probe(senders, workers)
            for lane, sender in enumerate(senders):
                sender.send(("paced", messages, latency_messages, lane, lanes))
            for sender in senders:
                sender.answer(longest)
            _drain(workers, 1, expected[1])
            meter.start()
            for lane, sender in enumerate(senders):
                sender.send(("burst", 0, messages, lane, lanes))
            bursts = [sender.answer(longest) for sender in senders]
            _drain(workers, 0, expected[0])
            meter.stop()
            total = messages + latency_messages + (rounds + 1) * lanes * config.groups
            fenced = _fence(senders, workers, total)
            reports = _all(workers, "report", SETUP_TIMEOUT)
    finally:
        meter.close()
    start = min(b["start"] for b in bursts)
    counts = [sum(r["counts"][phase] for r in reports) for phase in (0, 1)]
    elapsed = max(r["last"][0] for r in reports) - start if counts[0] else None
    latency = latency_figures([v for r in reports for v in r["latencies"]], expected[1])
    processed = [r["processed"] for r in reports]
    needed = [config.needed(i, rounds * lanes) for i in indexes]
    return {
        "msgs_per_s": round(messages * counts[0] / expected[0] / elapsed) if elapsed else 0,
        "deliveries_per_s": round(counts[0] / elapsed) if elapsed else 0,
        "p50_ms": _ms(latency["p50_ms"]),
        "p99_ms": _ms(latency["p99_ms"]),
        "max_ms": _ms(latency["max_ms"]),
        "elapsed_s": None if elapsed is None else round(elapsed, 3),
        "send_s": round(max(b["end"] for b in bursts) - start, 3),
        **meter.us_per_message(counts[0] and messages),
        "delivered": sum(counts),
        "expected": sum(expected),
        "lost": sum(expected) - sum(counts),
        "duplicates": sum(r["duplicates"] for r in reports),
        "misdelivered": sum(r["misdelivered"] for r in reports),
        "probe_rounds": rounds,
        "fenced": fenced,
        "processed_per_worker": processed,
        "needed_per_worker": needed,
        "processed_over_needed": cut(sum(processed) / sum(needed)),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    return cut(ours["msgs_per_s"] / theirs["msgs_per_s"]) if theirs["msgs_per_s"] else None


def measure(url: str, config: BackendsConfig) -> dict[str, Any]:
    """Every backend on the Redis at ``url``; the object ``--json`` prints."""
    nonce = uuid.uuid4().hex[:8]
    context = multiprocessing.get_context("spawn")
    processes: list[_Process] = []
    results: dict[str, dict[str, Any]] = {}
    failed = True
    try:
        for index in range(config.senders):
            processes.append(_Process(context, f"sender {index}", sender_main, config))
        for index in range(config.workers):
            processes.append(_Process(context, f"worker {index}", worker_main, index, config))
        senders, workers = processes[: config.senders], processes[config.senders :]
        for backend in BACKENDS:
            spec = BackendSpec(backend, url, f"bench{nonce}{backend.replace('_', '')}")
            results[backend] = _measure(spec, senders, workers, config)
        failed = False
    finally:
        for process in processes:
            process.stop(kill=failed)
    agree = all(
        r["lost"] == 0 and r["duplicates"] == 0 and r["misdelivered"] == 0 for r in results.values()
    )
    return {
        "backends": results,
        **{f"vs_{peer}": _ratio(results[ours], results[peer]) for ours, peer in PEERS.items()},
        "answers_agree": agree,
        "workers": config.workers,
        "senders": config.senders,
        "groups": config.groups,
        "members_per_group": config.members_per_group,
        "messages": config.messages,
        "payload_bytes": config.payload_bytes,
        "rate": config.rate,
        "seconds": config.seconds,
        "latency_messages": config.latency_messages,
        "window": WINDOW,
        "redis": kind_of(url),
        "cpus": os.cpu_count(),
    }


def run(url: str | None = None, config: BackendsConfig | None = None) -> dict[str, Any]:
    """Every backend on ``url`` (checked first: :class:`BenchSetupError` before any
    process starts), or on a redis-server started for the run."""
    config = config if config is not None else BackendsConfig()
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(embedded_redis())
        else:
            check_redis(url)
        return measure(url, config)
