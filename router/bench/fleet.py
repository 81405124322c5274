"""``router bench fleet``: many idle MQTT connections on one router node beside mosquitto,
(``kill``) a node's death under thousands of persistent sessions, and (``rolling``) every
node of three drained and replaced in turn under them.

Connections (the default): one ``router node run`` (on the given Redis, or a
``redis-server`` started for the run), then mosquitto, each measured the same way with
the load of :mod:`router.bench.fleet_clients` (worker processes of raw MQTT 3.1.1
clients, see :mod:`router.bench.fleet_pool`):

1. ``connections`` clients each CONNECT (clean session, keepalive :data:`KEEPALIVE`) and
   SUBSCRIBE ``fleet/<i>`` at QoS 1, ``in_flight`` connects outstanding per load
   process: ``connect_rate`` is clients subscribed per second, from the first CONNECT
   to the last SUBACK; ``refused`` counts a CONNACK or SUBACK refusal, a connection
   closed before its SUBACK, and :data:`CONNECT_TIMEOUT` passing;
2. the broker's RSS before the connects and after them, all idle (each read once it
   settled): ``rss_kib_per_connection`` is the growth over the clients connected;
3. one PINGREQ on every connection (``pings_answered`` within :data:`PING_TIMEOUT`), one
   QoS 0 message to every client's topic through one publisher (``delivered``: clients
   that got theirs, each payload checked), and the broker's CPU over
   :data:`IDLE_SECONDS` with every connection idle (``cpu_idle_percent``);
4. router only: ``sessions`` persistent sessions (clean session 0, one subscription each)
   connect and ``redis_bytes_per_session`` is Redis's ``used_memory`` growth over them.

A broker holds no more connections than its open-file limit allows (20,000 here, which
no process can raise): the run holds the fleet to what the router node can take
(``fd_limit``, ``capped`` and ``cap_reason`` in the result) and gives mosquitto the same
fleet. ``vs_mosquitto_connect_rate`` is the router's rate over mosquitto's, truncated
to two decimals. The kill scenario is :mod:`router.bench.fleet_kill`, the rolling upgrade
:mod:`router.bench.fleet_rolling`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Final

import redis

from router.errors import BenchDisagreementError
from router.ops.embedded_redis import embedded_redis

from .broker_runs import cut, percentile
from .brokers import delete_prefix, mosquitto, mosquitto_binary, mosquitto_version
from .checks import check_redis
from .cpu_meter import cpu_seconds
from .fleet_clients import ConnectSpec, FleetTally, raise_fd_limit
from .fleet_kill import run_kill
from .fleet_nodes import (
    FD_RESERVE,
    POLL,
    FleetConfig,
    cap_reason,
    capacity,
    fleet_node,
    scrape,
    settled_rss_kib,
    sigterm_interrupts,
)
from .fleet_pool import WorkerPool, worker_pool
from .fleet_rolling import run_rolling

KEEPALIVE: Final = 60
CONNECT_TIMEOUT: Final = 30.0
"""Seconds a client has from its CONNECT to its SUBACK."""
PING_TIMEOUT: Final = 15.0
IDLE_SECONDS: Final = 4.0
"""The window over which the idle broker's CPU is read (a measurement, not a wait)."""
DELIVERY_TIMEOUT: Final = 60.0
QUIET: Final = 5.0
"""Seconds without a new delivery after which the QoS 0 messages are counted."""


def run(url: str | None = None, config: FleetConfig | None = None) -> dict[str, Any]:
    """The connections run, or with ``config.kill`` the kill run (see
    :func:`router.bench.fleet_kill.run_kill`), on ``url`` (or a redis-server started for
    the run); the object ``--json`` prints. Every option is checked before any process
    starts."""
    config = config if config is not None else FleetConfig()
    if url is not None:
        check_redis(url)
    if not (config.kill or config.rolling or config.skip_mosquitto):
        mosquitto_binary()
    limit = raise_fd_limit()  # (the brokers inherit it)
    sessions = config.session_count + config.clean_session_count
    largest = min(max(config.connections, sessions), limit - FD_RESERVE)
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_interrupts())
        pool = stack.enter_context(worker_pool(config.load_processes(largest, limit)))
        if url is None:
            url = stack.enter_context(embedded_redis())
        if config.kill:
            return run_kill(url, config, pool)
        if config.rolling:
            return run_rolling(url, config, pool)
        return run_connections(url, config, pool)


def wait_delivered(pool: WorkerPool, expected: int) -> FleetTally:
    """Wait until ``expected`` members got a message, or none more came for
    :data:`QUIET` seconds (at most :data:`DELIVERY_TIMEOUT`); the tally then."""
    deadline = time.monotonic() + DELIVERY_TIMEOUT
    last, since = -1, time.monotonic()
    while True:
        now = pool.tally()
        if now.delivered >= expected or time.monotonic() > deadline:
            return now
        if now.delivered != last:
            last, since = now.delivered, time.monotonic()
        elif time.monotonic() - since > QUIET:
            return now
        time.sleep(POLL * 2)


def measure(
    pool: WorkerPool, address: tuple[str, int], pid: int, count: int, ids: str, config: FleetConfig
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring against the broker ``pid`` at ``address``;
    every client and the publisher are disconnected when it returns."""
    rss_before = settled_rss_kib(pid)
    spec = ConnectSpec(
        address, (), ids, keepalive=KEEPALIVE, in_flight=config.in_flight, timeout=CONNECT_TIMEOUT
    )
    load_before = pool.cpu_seconds()
    report = pool.connect(spec, count)
    assert report is not None
    elapsed = (report.last_ns - report.first_ns) / 1e9
    load_cores = cut((pool.cpu_seconds() - load_before) / elapsed) if elapsed > 0 else None
    rss_after = settled_rss_kib(pid)
    pings = sum(pool.ask_clients("ping", [(PING_TIMEOUT,)] * pool.clients, PING_TIMEOUT + 30))
    pool.ask(pool.publisher, "publisher_connect", address, f"{ids}-publisher", timeout=60)
    pool.ask(pool.publisher, "burst", list(range(count)), 0, timeout=120)
    delivered = wait_delivered(pool, report.ok)
    if delivered.mismatches:
        raise BenchDisagreementError(
            f"{delivered.mismatches} messages arrived that were not published to their client"
        )
    before = cpu_seconds(pid)
    time.sleep(IDLE_SECONDS)  # (the measurement window)
    after = cpu_seconds(pid)
    dropped = pool.tally().drops
    cpu = None
    if before is not None and after is not None:
        cpu = round(100 * (after - before) / IDLE_SECONDS, 2)
    pool.ask_clients("close", [(True,)] * pool.clients, timeout=60)
    pool.ask(pool.publisher, "close", True, timeout=60)
    rate = report.ok / elapsed if report.ok and elapsed > 0 else 0.0
    return {
        "connect_rate": round(rate, 1),
        "connect_rate_exact": rate,
        "connected": report.ok,
        "refused": sum(report.refused.values()),
        "refused_by_reason": report.refused,
        "loadgen_cores": load_cores,
        "connect_p50_ms": round(percentile(report.connack_ns, 0.5), 3),
        "connect_p99_ms": round(percentile(report.connack_ns, 0.99), 3),
        "rss_kib_per_connection": round((rss_after - rss_before) / report.ok, 2)
        if report.ok
        else None,
        "rss_mib_idle": round(rss_after / 1024, 1),
        "pings_answered": pings,
        "delivered": delivered.delivered,
        "duplicates": delivered.messages - delivered.delivered,
        "dropped": dropped,
        "cpu_idle_percent": cpu,
    }


def wait_until_closed(metrics: str | None, timeout: float = 60.0) -> None:
    """Wait (bounded) until the node's ``/metrics`` counts no MQTT connection."""
    deadline = time.monotonic() + timeout
    while metrics is not None and time.monotonic() < deadline:
        if scrape(metrics).get("router_mqtt_connections", 0.0) == 0:
            return
        time.sleep(POLL)


def redis_bytes_per_session(
    pool: WorkerPool, address: tuple[str, int], url: str, count: int, ids: str, in_flight: int
) -> tuple[float | None, int]:
    """(Redis ``used_memory`` growth per persistent session, sessions connected) for
    ``count`` sessions (clean session 0, one QoS 1 subscription each) made through the
    node at ``address``; they disconnect before it returns."""
    client = redis.Redis.from_url(url)
    try:
        before = int(client.info("memory")["used_memory"])
        spec = ConnectSpec(
            address,
            (),
            ids,
            clean=False,
            keepalive=KEEPALIVE,
            in_flight=in_flight,
            timeout=CONNECT_TIMEOUT,
        )
        report = pool.connect(spec, count)
        assert report is not None
        after = int(client.info("memory")["used_memory"])
    finally:
        client.close()
    pool.ask_clients("close", [(True,)] * pool.clients, timeout=60)
    return (round((after - before) / report.ok, 1) if report.ok else None), report.ok


def run_connections(url: str, config: FleetConfig, pool: WorkerPool) -> dict[str, Any]:
    """The connections run (see the module docstring) on ``url``."""
    nonce = uuid.uuid4().hex[:8]
    prefix, node_id = f"fleet{nonce}", f"fleet{nonce}-1"
    asked = config.connections
    try:
        with fleet_node(url, prefix, node_id, max(asked, config.session_count) + 16) as node:
            pid = node.process.pid
            count, fd_limit, idle_files = capacity(pid, asked)
            ours = measure(pool, node.address, pid, count, f"fc{nonce}", config)
            wait_until_closed(node.metrics)
            sessions = min(config.session_count, count)
            per_session, stored = redis_bytes_per_session(
                pool, node.address, url, sessions, f"fs{nonce}", config.in_flight
            )
    finally:
        delete_prefix(url, prefix)
    theirs: dict[str, Any] = {}
    if not config.skip_mosquitto:
        pids: list[int] = []
        with mosquitto(pids) as address:
            theirs = measure(pool, address, pids[0], count, f"fm{nonce}", config)
    figures = report(config, count, fd_limit, idle_files, ours, theirs, per_session, stored)
    return figures | {"processes": pool.clients}


def report(
    config: FleetConfig,
    count: int,
    fd_limit: int,
    idle_files: int,
    ours: dict[str, Any],
    theirs: dict[str, Any],
    per_session: float | None,
    sessions: int,
) -> dict[str, Any]:
    """The JSON object of a connections run: the router's figures, mosquitto's under
    ``mosquitto_`` (None when left out), the cap and the workload."""
    capped = count < config.connections
    rate, their_rate = ours.pop("connect_rate_exact"), theirs.pop("connect_rate_exact", None)
    return {
        "mode": "connections",
        "connections": count,
        "connections_asked": config.connections,
        "capped": capped,
        "cap_reason": cap_reason(count, config.connections, fd_limit, idle_files),
        "fd_limit": fd_limit,
        "files_open_idle": idle_files,
        **ours,
        "vs_mosquitto_connect_rate": cut(rate / their_rate) if rate and their_rate else None,
        **{f"mosquitto_{name}": theirs.get(name) for name in ours},
        "sessions": sessions,
        "redis_bytes_per_session": per_session,
        "keepalive_s": KEEPALIVE,
        "in_flight": config.in_flight,
        "mosquitto_version": None if config.skip_mosquitto else mosquitto_version(),
    }
