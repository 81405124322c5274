"""``router bench fleet --rolling``: a rolling upgrade of a 3-node cluster under QoS 1 load
with thousands of persistent sessions: every node drained and replaced, one at a time.

Three router nodes on one Redis, heartbeat TTL ``ttl`` (interval ``ttl / 4``), then:

1. ``sessions`` MQTT 3.1.1 clients (clean session 0, one QoS 1 subscription of
   ``fleet/<i>`` each) connect, client ``i`` to node ``i % 3``; one publisher on the
   last node probes every client (QoS 0) and starts the QoS 1 stream
   (:mod:`router.bench.fleet_publisher`: round ``r`` is seq ``r`` to every topic,
   ``rate`` msg/s), until a whole round is acknowledged;
2. each node in turn is replaced as an orchestrator would: SIGTERM (the node drains:
   :mod:`router.ops.draining`; its clients are closed, its sessions handed on), and once
   its process exited a new process of the same node id starts (the new version). A
   client the draining node closed connects again :data:`RETRY_DELAY` seconds later to
   the next node (as a load balancer sends it to a live one), clean session 0 and no
   SUBSCRIBE: its session must be there; the publisher, when its node is the one
   replaced, moves to the next node the same way (what it had in flight is given up, not
   counted as acknowledged). The step ends once every client is connected again and a
   whole round more is acknowledged;
3. the stream stops and the bench waits (bounded) until every client got every message
   acknowledged for its topic, or nothing new came for ``QUIET`` seconds.

Figures: ``acked``, ``lost`` (acknowledged, never received by its session's client),
``duplicates``, ``refused`` (reconnects refused: a CONNACK other than 0, the connection
closed, or no CONNACK within :data:`RECONNECT_TIMEOUT`), ``sessions_not_present``
(reconnects whose CONNACK said no session), ``reconnect_p50_ms``/``p99_ms``, and per step
(``steps``): how long the drain took (``drained_s``, from SIGTERM until the process
exited, and its exit status), when the new process was ready (``restarted_s``), when
every client was back (``all_back_s``) and the reconnects then. Every payload is checked
(:class:`BenchDisagreementError` for one that is not its client's).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from dataclasses import replace
from typing import Any, Final

from router.errors import BenchSetupError

from .broker_runs import percentile
from .brokers import delete_prefix
from .fleet_clients import ConnectReport, ConnectSpec
from .fleet_kill import outcome, probe, progress, wait_for
from .fleet_nodes import FleetConfig, RunningNode, fleet_node
from .fleet_pool import WorkerPool, merge

NODES: Final = 3
KEEPALIVE: Final = 300
CONNECT_TIMEOUT: Final = 30.0
RECONNECT_TIMEOUT: Final = 20.0
RETRIES: Final = 5
RETRY_DELAY: Final = 1.0
"""A client closed by a draining node connects again this many seconds later (and a
refused reconnect tries again, RETRIES times at most, from this delay doubling)."""
WINDOW: Final = 100
"""QoS 1 publishes in flight (below the router's --mqtt-receive-maximum of 128)."""
DRAIN_TIMEOUT: Final = 60.0
"""Seconds a node has to drain and exit (its --drain-grace is 30 s)."""


def run_rolling(url: str, config: FleetConfig, pool: WorkerPool) -> dict[str, Any]:
    """The rolling run (see the module docstring) on ``url``; the object ``--json`` prints."""
    nonce = uuid.uuid4().hex[:8]
    prefix, ids = f"fleet{nonce}", f"fr{nonce}"
    names = [f"fleet{nonce}-{k}" for k in range(NODES)]
    count = config.session_count
    options = config.node_options
    room = count + 16
    try:
        with contextlib.ExitStack() as stack:
            nodes = [
                stack.enter_context(fleet_node(url, prefix, name, room, options)) for name in names
            ]
            spec = ConnectSpec(
                nodes[0].address,
                (),
                ids,
                clean=False,
                keepalive=KEEPALIVE,
                in_flight=config.in_flight,
                timeout=CONNECT_TIMEOUT,
                retries=RETRIES,
                retry_delay=RETRY_DELAY,
            )
            connect_fleet(pool, nodes, spec, count)
            publisher_node = NODES - 1
            pool.ask(
                pool.publisher,
                "publisher_connect",
                nodes[publisher_node].address,
                f"{ids}-publisher",
                timeout=60,
            )
            probe(pool, count)
            pool.ask(pool.publisher, "stream", count, config.rate, WINDOW, timeout=30)
            await_round(pool, count, config.rate, "a round acknowledged")
            before = progress(pool)["acked"]
            steps = []
            for k in range(NODES):
                peer = nodes[(k + 1) % NODES]
                back = replace(
                    spec,
                    address=peer.address,
                    subscribe=False,
                    in_flight=0,
                    timeout=RECONNECT_TIMEOUT,
                )
                pool.ask_clients("redirect", [(nodes[k].address, back)] * pool.clients)
                if k == publisher_node:
                    pool.ask(pool.publisher, "publisher_move", peer.address, timeout=30)
                step, nodes[k] = replace_node(pool, stack, nodes[k], url, prefix, room, options)
                steps.append(step)
                await_round(pool, count, config.rate, f"a round acknowledged after step {k + 1}")
            stream = pool.ask(pool.publisher, "stream_stop", timeout=120)
            if stream["error"]:
                raise BenchSetupError(stream["error"])
            figures = outcome(pool, stream)
            rejoins: ConnectReport = merge(pool.ask_clients("rejoined"))
            pool.ask_clients("close", [(True,)] * pool.clients, timeout=60)
    finally:
        delete_prefix(url, prefix)
    figures.pop("lost_by_group", None)
    return {
        "mode": "rolling",
        "nodes": NODES,
        "sessions": count,
        "acked": stream["acked"],
        "acked_before_first_step": before,
        "sent": stream["sent"],
        "expired": stream["expired"],
        "publisher_reconnects": stream["publisher_reconnects"],
        **figures,
        "refused": sum(rejoins.refused.values()),
        "refused_by_reason": rejoins.refused,
        "reconnected": rejoins.ok,
        "never_back": rejoins.gave_up,
        "sessions_not_present": rejoins.ok - rejoins.present,
        "reconnect_p50_ms": _ms(rejoins.connack_ns, 0.5),
        "reconnect_p99_ms": _ms(rejoins.connack_ns, 0.99),
        "ttl_s": config.ttl,
        "rate": config.rate,
        "rounds": stream["round"],
        "steps": steps,
        "in_flight": config.in_flight,
        "processes": pool.clients,
    }


def connect_fleet(
    pool: WorkerPool, nodes: list[RunningNode], spec: ConnectSpec, count: int
) -> None:
    """Step 1's connects: client ``i`` to node ``i % 3`` (a refused one tries again)."""
    for k, node in enumerate(nodes):
        group = tuple(range(k, count, len(nodes)))
        done = pool.connect(replace(spec, address=node.address, indices=group))
        assert done is not None
        if done.ok != len(group):
            raise BenchSetupError(
                f"{len(group) - done.ok} of {len(group)} sessions did not connect to node "
                f"{node.node_id}: {done.refused}"
            )


def replace_node(
    pool: WorkerPool,
    stack: contextlib.ExitStack,
    node: RunningNode,
    url: str,
    prefix: str,
    room: int,
    options: tuple[str, ...],
) -> tuple[dict[str, Any], RunningNode]:
    """Step 2 for one node: SIGTERM, its exit, a new process of the same id, every client
    back. The step's figures and the new node."""
    count = pool.tally().members
    rejoined_before = pool.tally().rejoined
    began = time.monotonic()
    node.process.send_signal(signal.SIGTERM)
    try:
        status = node.process.wait(DRAIN_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise BenchSetupError(
            f"node {node.node_id} did not exit {DRAIN_TIMEOUT} s after SIGTERM"
        ) from None
    drained = time.monotonic() - began
    new = stack.enter_context(fleet_node(url, prefix, node.node_id, room, options))
    restarted = time.monotonic() - began
    wait_for(
        f"every client back after node {node.node_id} drained",
        lambda: pool.tally().accepted >= count,
        (RETRIES + 1) * RECONNECT_TIMEOUT + 60,
    )
    tally = pool.tally()
    step = {
        "node": node.node_id,
        "drain_exit_status": status,
        "drained_s": round(drained, 3),
        "restarted_s": round(restarted, 3),
        "all_back_s": round(time.monotonic() - began, 3),
        "reconnected": tally.rejoined - rejoined_before,
    }
    return step, new


def await_round(pool: WorkerPool, count: int, rate: float, what: str) -> None:
    """Until a whole round more (``count`` publishes) is acknowledged."""
    start = progress(pool)["acked"]
    wait_for(what, lambda: progress(pool)["acked"] >= start + count, 3 * count / rate + 60)


def _ms(nanos: list[int], fraction: float) -> float | None:
    return round(percentile(nanos, fraction), 3) if nanos else None
