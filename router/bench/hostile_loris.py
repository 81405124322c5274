"""The slow-loris phase of ``router bench hostile``: many connections that each send the
start of a large PUBLISH and stop, against a fresh broker, its memory measured.

Each loris (a process of its own, :func:`loris_main`, one event loop) connects from a
loopback source address of its group (:data:`PER_SOURCE` a group, so that no address
meets a connect rate), sends an MQTT 5.0 CONNECT (keepalive 0: only the broker's bounds on
unfinished packets can end it), and once accepted the first ``loris_bytes`` of a PUBLISH
announcing :data:`ANNOUNCED` bytes (the router's largest packet), then nothing. It notes
how its connection ended: a DISCONNECT and its reason code (0x97 Quota exceeded past the
router's ``--mqtt-max-unfinished-bytes``, 0x8D past its ``--mqtt-packet-timeout``), a close
without one, or refused before its CONNACK; and when, counted from the moment every loris
had sent.

:func:`measure_lorises` (the parent's side) reads the broker's RSS before, right after
every loris sent (``during``), its peak over ``loris_hold`` seconds, at the end of them
(``held``), and once the lorises closed and the broker's RSS settled (``after``); well-
behaved probes time their round trips beside the lorises meanwhile (``probes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final, cast

from router.errors import BenchSetupError
from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import MQTT_5, ConnAck, Connect, Disconnect, Publish

from .broker_runs import cut
from .fleet_clients import open_socket, raise_fd_limit
from .fleet_nodes import rss_kib, settled_rss_kib

ANNOUNCED: Final = 1 << 20
"""The size of the PUBLISH each loris begins (the router's default largest packet)."""
PER_SOURCE: Final = 100
"""Lorises per loopback source address (127.0.0.1 takes 0..99, 127.0.0.2 the next...)."""
IN_FLIGHT: Final = 500
"""Lorises connecting at once (between their connect and their CONNACK)."""
CONNECT_TIMEOUT: Final = 30.0
SAMPLE: Final = 0.5
"""Seconds between two readings of the broker's RSS while the lorises hold on."""
Address = tuple[str, int]
Probe = Callable[[], Coroutine[Any, Any, dict[str, Any]]]


def source_of(number: int) -> str:
    """The loopback address loris ``number`` connects from."""
    group = number // PER_SOURCE
    return f"127.0.{group // 254}.{group % 254 + 1}"


def the_start(loris_bytes: int) -> bytes:
    """The first ``loris_bytes`` of a PUBLISH of :data:`ANNOUNCED` bytes."""
    payload = b"x" * (ANNOUNCED - 64)
    packet = encode(Publish("loris/x", payload), MQTT_5)
    return packet[: min(loris_bytes, len(packet) - 1)]


class Loris(asyncio.Protocol):
    """One connection: CONNECT, then the start of a PUBLISH once accepted, then silence."""

    def __init__(self, number: int, start: bytes, accepted: asyncio.Future[bool]) -> None:
        self.connect = encode(Connect(f"loris-{number}", MQTT_5, keepalive=0))
        self.start = start
        self.accepted = accepted
        self.reader = PacketReader()
        self.reader.level = MQTT_5
        self.transport: asyncio.Transport | None = None
        self.code: int | None = None  # the DISCONNECT's reason code, if one came
        self.ended_at: float | None = None  # monotonic

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.connect)

    def data_received(self, data: bytes) -> None:
        with contextlib.suppress(Exception):  # (what else a broker sends is not measured)
            for packet in self.reader.feed(data):
                if isinstance(packet, ConnAck) and not self.accepted.done():
                    self.accepted.set_result(packet.reason_code == 0)
                    if packet.reason_code == 0 and self.transport is not None:
                        self.transport.write(self.start)
                elif isinstance(packet, Disconnect):
                    self.code = packet.reason_code

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended_at = time.monotonic()
        if not self.accepted.done():
            self.accepted.set_result(False)

    def outcome(self) -> str:
        """How the connection ended so far: ``open``, ``disconnect 0x..`` or ``closed``."""
        if self.ended_at is None:
            return "open"
        return "closed" if self.code is None else f"disconnect 0x{self.code:02x}"


@dataclass
class Lorises:
    """The lorises of one process and what became of them."""

    accepted: list[Loris]
    refused: int
    sent_at: float  # monotonic: every accepted loris had sent its start

    def report(self) -> dict[str, Any]:
        outcomes = Counter(loris.outcome() for loris in self.accepted)
        ended: dict[str, list[float]] = {}
        for loris in self.accepted:
            if loris.ended_at is not None:
                ended.setdefault(loris.outcome(), []).append(loris.ended_at - self.sent_at)
        return {
            "accepted": len(self.accepted),
            "refused": self.refused,
            "open": outcomes.pop("open", 0),
            "ended": dict(sorted(outcomes.items())),
            "ended_after_s": {
                outcome: [cut(min(times), 1), cut(max(times), 1)]
                for outcome, times in sorted(ended.items())
            },
        }


async def _connect_all(address: Address, count: int, loris_bytes: int) -> Lorises:
    loop = asyncio.get_running_loop()
    start = the_start(loris_bytes)
    turns = asyncio.Semaphore(IN_FLIGHT)
    lorises: list[Loris] = []

    async def one(number: int) -> bool:
        async with turns:
            accepted: asyncio.Future[bool] = loop.create_future()
            try:
                sock = await open_socket(address, source_of(number))
                _, loris = await loop.create_connection(
                    lambda: Loris(number, start, accepted), sock=sock
                )
                if not await asyncio.wait_for(accepted, CONNECT_TIMEOUT):
                    return False
            except (OSError, TimeoutError):
                return False
            lorises.append(loris)
            return True

    results = await asyncio.gather(*(one(number) for number in range(count)))
    return Lorises(lorises, results.count(False), time.monotonic())


async def _serve(pipe: Connection, address: Address, count: int, loris_bytes: int) -> None:
    lorises = await _connect_all(address, count, loris_bytes)
    pipe.send(("sent", lorises.report()))
    while (command := await asyncio.to_thread(pipe.recv)) != "close":
        if command == "report":
            pipe.send(lorises.report())
    for loris in lorises.accepted:
        if loris.transport is not None:
            loris.transport.abort()
    pipe.send("closed")


def loris_main(pipe: Connection, address: Address, count: int, loris_bytes: int) -> None:
    """The loris process: ``count`` lorises on ``address``, then the parent's commands
    (``report``: what became of them so far; ``close``: close them all and answer)."""
    raise_fd_limit()
    asyncio.run(_serve(pipe, address, count, loris_bytes))


def measure_lorises(
    address: Address, pid: int, count: int, loris_bytes: int, hold: float, probe: Probe
) -> dict[str, Any]:
    """The slow-loris phase on the broker at ``address`` (process ``pid``), its figures
    (see the module docstring). Raises :class:`BenchSetupError` when the loris process
    does not answer."""
    before = rss_kib(pid)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=loris_main, args=(theirs, address, count, loris_bytes))
    process.start()
    try:
        if not ours.poll(CONNECT_TIMEOUT + count / 50):
            raise BenchSetupError("the loris process did not connect its lorises")
        _, sent = ours.recv()
        during = peak = rss_kib(pid)
        end = time.monotonic() + hold
        probed = asyncio.run(probe())
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, SAMPLE))
            peak = max(peak, rss_kib(pid))
        held = rss_kib(pid)
        ours.send("report")
        report = ours.recv() if ours.poll(60) else {}
        ours.send("close")
        if not ours.poll(60) or ours.recv() != "closed":
            raise BenchSetupError("the loris process did not close its lorises")
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    return {
        "lorises": count,
        "loris_bytes": len(the_start(loris_bytes)),
        "announced_bytes": ANNOUNCED,
        "hold_s": hold,
        "accepted": sent["accepted"],
        "refused": sent["refused"],
        "ended_while_sending": sent["ended"],
        "open_at_end": report.get("open"),
        "ended": report.get("ended"),
        "ended_after_s": report.get("ended_after_s"),
        "rss_mib_before": cut(before / 1024, 1),
        "rss_mib_during": cut(during / 1024, 1),
        "rss_mib_peak": cut(peak / 1024, 1),
        "rss_mib_held": cut(held / 1024, 1),
        "rss_mib_after": cut(settled_rss_kib(pid) / 1024, 1),
        "probes": probed,
    }
