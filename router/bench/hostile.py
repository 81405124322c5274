"""``router bench hostile``: how well-behaved clients fare beside hostile ones, on one
router node (its default limits on) and on mosquitto (its defaults) in the same run.

For each broker: ``probes`` well-behaved MQTT 3.1.1 clients each publish QoS 1 to a
topic of their own, one message at a time, and time the round trip to their own
delivery, for ``seconds`` on a quiet broker, then for ``seconds`` while a flood process
(:mod:`router.bench.hostile_floods`) runs every flood at once. Reported per broker:
round-trip p50/p99 quiet and flooded and their ratio (the issue's target: flooded p99
within 2x of quiet), messages the probes missed or got wrong (the answer check: none,
on both brokers), the broker's RSS before and after, what the floods sent, and for the
router node its heartbeats in each phase (``heartbeat``: renewals seen, the longest gap
between two, whether it expired, ``on_time``; :mod:`router.bench.heartbeat_watch`).

The probes live in this process's event loop and the floods in another process; on a
2-core machine the floods, the broker and the probes share the cores, which is part of
what is measured: a broker that lets one client take its loop shows it in the probes'
p99. How much of the flooded p99 is that sharing alone, the control tells: with
mosquitto beside it (not ``--skip-mosquitto``), a third phase times the probes on the
broker while the same floods go to another mosquitto, a sink (``floods_elsewhere``,
``p99_floods_elsewhere_over_quiet``); ``p99_flooded_over_floods_elsewhere`` is then what
the floods cost the probes by reaching the broker itself.

Last, the slow-loris phase (``lorises``, unless ``--lorises 0``), on a fresh router node
and a fresh mosquitto: ``lorises`` connections (10,000, fewer if the open-file limit is
lower) each send the start of a 1 MiB PUBLISH and stop; the broker's RSS before, during,
at its peak and after, how many it ended and why, and the probes' round trips beside them
(:mod:`router.bench.hostile_loris`). The router node runs with its default limits, or
the ``--node-max-unfinished-bytes`` and ``--node-packet-timeout`` given.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from router.cluster.config import NodeConfig
from router.errors import BenchDisagreementError, BenchSetupError
from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import (
    MQTT_3_1_1,
    ConnAck,
    Connect,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from router.ops.embedded_redis import embedded_redis

from .broker_runs import cut, percentile
from .brokers import (
    fresh_prefix,
    mosquitto,
    mosquitto_binary,
    mosquitto_version,
    router_node_id,
    router_nodes,
)
from .checks import check_positive, check_redis
from .fleet_clients import raise_fd_limit
from .fleet_nodes import rss_kib, sigterm_interrupts
from .heartbeat_watch import HeartbeatWatch
from .hostile_floods import FLOODS, flood_main
from .hostile_loris import measure_lorises

STAMP: Final = struct.Struct("!Id")  # (probe seq, send time)
ROUND_TIMEOUT: Final = 10.0
FD_SPARE: Final = 500
"""Open files of the bench beside its lorises (probes, pipes, Redis)."""
Address = tuple[str, int]


@dataclass(frozen=True)
class HostileConfig:
    """The sizes of one run: probes, seconds per phase, the floods to run, the slow
    lorises (0: no such phase), the bytes each sends, the seconds they hold on, the waves
    of them one broker meets (each after the last ended: does it reuse the memory the
    first took?), and the router node's bounds on unfinished packets (None: defaults)."""

    probes: int = 20
    seconds: float = 10.0
    floods: tuple[str, ...] = FLOODS
    skip_mosquitto: bool = False
    lorises: int = 10_000
    loris_bytes: int = 64 << 10
    loris_hold: float = 70.0
    loris_waves: int = 1
    node_max_unfinished_bytes: int | None = None
    node_packet_timeout: float | None = None

    def __post_init__(self) -> None:
        check_positive(probes=self.probes, seconds=self.seconds)
        check_positive(loris_bytes=self.loris_bytes, loris_hold=self.loris_hold)
        if not 0 <= self.lorises <= 50_000:
            raise BenchSetupError("--lorises takes 0..50,000")
        if not 1 <= self.loris_waves <= 5:
            raise BenchSetupError("--loris-waves takes 1..5")
        if self.loris_hold > 3_600:
            raise BenchSetupError("at most 3,600 seconds of --loris-hold")
        if self.node_max_unfinished_bytes is not None and self.node_max_unfinished_bytes < 0:
            raise BenchSetupError("--node-max-unfinished-bytes takes 0 or more")
        timeout = self.node_packet_timeout
        if timeout is not None and not 0 <= timeout < float("inf"):
            raise BenchSetupError("--node-packet-timeout takes 0 or more seconds")
        unknown = [f for f in self.floods if f not in FLOODS]
        if unknown or not self.floods:
            raise BenchSetupError(f"--floods takes some of {', '.join(FLOODS)}, not {unknown}")
        if self.probes > 1_000 or self.seconds > 3_600:
            raise BenchSetupError("at most 1,000 probes and 3,600 seconds a phase")


class Probe:
    """One well-behaved client: publish, wait for its own copy, again."""

    def __init__(self, number: int) -> None:
        self.topic = f"probe/{number}"
        self.client_id = f"probe-{number}"
        self.round_trips: list[float] = []
        self.wrong = 0
        self.missed = 0

    async def run(self, address: Address, until: float) -> None:
        reader, writer = await asyncio.open_connection(*address)
        packets = PacketReader()
        packets.level = MQTT_3_1_1

        async def next_of(kind: type) -> Any:
            while True:
                for packet in packets.feed(await reader.read(65536) or b"") or ():
                    if isinstance(packet, kind):
                        return packet
                    if isinstance(packet, Publish) and kind is not Publish:
                        self.wrong += 1
                if reader.at_eof():
                    raise ConnectionError(f"{self.client_id}: the broker closed the connection")

        try:
            writer.write(encode(Connect(self.client_id, MQTT_3_1_1), MQTT_3_1_1))
            await asyncio.wait_for(next_of(ConnAck), ROUND_TIMEOUT)
            writer.write(encode(Subscribe(1, (Subscription(self.topic, 0),)), MQTT_3_1_1))
            await asyncio.wait_for(next_of(SubAck), ROUND_TIMEOUT)
            seq = 0
            while time.monotonic() < until:
                seq += 1
                stamp = STAMP.pack(seq, time.monotonic())
                out = Publish(self.topic, stamp, 1, packet_id=seq % 65_535 + 1)
                writer.write(encode(out, MQTT_3_1_1))
                try:
                    got = await asyncio.wait_for(next_of(Publish), ROUND_TIMEOUT)
                except TimeoutError:
                    self.missed += 1
                    continue
                if got.topic != self.topic or STAMP.unpack(got.payload)[0] != seq:
                    self.wrong += 1
                    continue
                self.round_trips.append(time.monotonic() - STAMP.unpack(got.payload)[1])
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


async def _phase(address: Address, config: HostileConfig) -> dict[str, Any]:
    probes = [Probe(n) for n in range(config.probes)]
    until = time.monotonic() + config.seconds
    results = await asyncio.gather(*(p.run(address, until) for p in probes), return_exceptions=True)
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    trips = [int(t * 1e9) for p in probes for t in p.round_trips]  # (ns, as percentile takes)
    return {
        "round_trips": len(trips),
        "p50_ms": cut(percentile(trips, 0.50), 3),
        "p99_ms": cut(percentile(trips, 0.99), 3),
        "missed": sum(p.missed for p in probes),
        "wrong": sum(p.wrong for p in probes),
        "probe_failures": failed[:3],
    }


def _beside_floods(
    address: Address, target: Address, config: HostileConfig
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A phase of the probes on ``address`` while the flood process floods ``target``;
    and what the floods sent."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    floods = context.Process(
        target=flood_main, args=(theirs, target, list(config.floods), config.seconds + 1)
    )
    floods.start()
    try:
        if not ours.poll(60) or ours.recv() != "started":
            raise BenchSetupError("the flood process did not start")
        probed = asyncio.run(_phase(address, config))
        sent = ours.recv() if ours.poll(config.seconds + 60) else {}
    finally:
        floods.join(10)
        if floods.is_alive():
            floods.kill()
    return probed, sent


def _measure(
    address: Address,
    pid: int,
    config: HostileConfig,
    sink: Address | None,
    watch: Callable[[], HeartbeatWatch] | None = None,
) -> dict[str, Any]:
    """The phases on the broker at ``address`` (process ``pid``): quiet, flooded and,
    with a ``sink``, floods elsewhere; with ``watch``, each phase's ``heartbeat``."""
    watching = watch if watch is not None else contextlib.nullcontext
    before = rss_kib(pid)
    with watching() as beats:
        quiet = asyncio.run(_phase(address, config))
    _heartbeats(quiet, beats)
    with watching() as beats:
        flooded, sent = _beside_floods(address, address, config)
    _heartbeats(flooded, beats)
    ratio = flooded["p99_ms"] / quiet["p99_ms"] if quiet["p99_ms"] else 0.0
    figures = {
        "quiet": quiet,
        "flooded": flooded,
        "p99_flooded_over_quiet": cut(ratio),
        "rss_mib_before": cut(before / 1024, 1),
        "rss_mib_after": cut(rss_kib(pid) / 1024, 1),
        "floods_sent": sent,
    }
    if sink is not None:
        with watching() as beats:
            elsewhere, _ = _beside_floods(address, sink, config)
        _heartbeats(elsewhere, beats)
        figures["floods_elsewhere"] = elsewhere
        figures["p99_floods_elsewhere_over_quiet"] = cut(
            elsewhere["p99_ms"] / quiet["p99_ms"] if quiet["p99_ms"] else 0.0
        )
        figures["p99_flooded_over_floods_elsewhere"] = cut(
            flooded["p99_ms"] / elsewhere["p99_ms"] if elsewhere["p99_ms"] else 0.0
        )
    return figures


def _node_options(config: HostileConfig) -> tuple[str, ...]:
    """The router node's options of the slow-loris phase (none: its defaults)."""
    options: list[str] = []
    if config.node_max_unfinished_bytes is not None:
        options += ["--mqtt-max-unfinished-bytes", str(config.node_max_unfinished_bytes)]
    if config.node_packet_timeout is not None:
        options += ["--mqtt-packet-timeout", str(config.node_packet_timeout)]
    return tuple(options)


def _lorises(url: str, config: HostileConfig, result: dict[str, Any]) -> None:
    """The slow-loris phase on a fresh router node, then on a fresh mosquitto."""
    count = min(config.lorises, raise_fd_limit() - FD_SPARE)
    if count <= 0:
        return

    def phase(address: Address, pid: int, figures: dict[str, Any]) -> None:
        """The waves on one broker: the first's figures in ``lorises``, the next ones'
        in ``loris_waves`` (its ``rss_mib_peak`` beside the first's tells reuse)."""
        probe = functools.partial(_phase, address, config)
        waves = [
            measure_lorises(address, pid, count, config.loris_bytes, config.loris_hold, probe)
            for _ in range(config.loris_waves)
        ]
        figures["lorises"] = waves[0]
        if len(waves) > 1:
            figures["loris_waves"] = waves[1:]

    pids: list[int] = []
    with router_nodes(url, 1, pids, options=_node_options(config)) as [address]:
        phase(address, pids[-1], result["router"])
    if not config.skip_mosquitto:
        with mosquitto(pids) as address:
            phase(address, pids[-1], result["mosquitto"])


def _heartbeats(phase: dict[str, Any], watch: HeartbeatWatch | None) -> None:
    if watch is not None:
        phase["heartbeat"] = watch.figures()


def run(url: str | None = None, config: HostileConfig | None = None) -> dict[str, Any]:
    """The run (see the module docstring) on ``url`` (or a redis-server started for it);
    the object ``--json`` prints. Raises :class:`BenchDisagreementError` when a probe
    missed or got a wrong message on a quiet broker (the brokers must give the same
    answers)."""
    config = config if config is not None else HostileConfig()
    if url is not None:
        check_redis(url)
    if not config.skip_mosquitto:
        mosquitto_binary()
    result: dict[str, Any] = {
        "mode": "hostile",
        "probes": config.probes,
        "seconds_per_phase": config.seconds,
        "floods": list(config.floods),
    }
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_interrupts())
        if url is None:
            url = stack.enter_context(embedded_redis())
        pids: list[int] = []
        sinks: list[int] = []
        with contextlib.ExitStack() as brokers:
            sink = None if config.skip_mosquitto else brokers.enter_context(mosquitto(sinks))
            prefix = fresh_prefix()
            with router_nodes(url, 1, pids, options=(), prefix=prefix) as [address]:
                node_id, interval = router_node_id(prefix, 1), NodeConfig.heartbeat_interval
                watch = functools.partial(HeartbeatWatch, url, prefix, node_id, interval)
                result["router"] = _measure(address, pids[-1], config, sink, watch)
            if not config.skip_mosquitto:
                result["mosquitto_version"] = mosquitto_version()
                with mosquitto(pids) as address:
                    result["mosquitto"] = _measure(address, pids[-1], config, sink)
        if config.lorises:
            _lorises(url, config, result)
    for broker in ("router", "mosquitto"):
        quiet = result.get(broker, {}).get("quiet")
        if quiet is not None and (quiet["missed"] or quiet["wrong"] or quiet["probe_failures"]):
            raise BenchDisagreementError(f"{broker}: probes went wrong on a quiet broker: {quiet}")
    return result
