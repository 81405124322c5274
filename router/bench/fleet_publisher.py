"""The one publisher of ``router bench fleet``: an MQTT 3.1.1 connection that writes QoS 0
bursts (probes, one message per member) and a paced QoS 1 stream over every member's topic.

The stream goes round after round: round ``r`` publishes seq ``r`` to each target in
order, ``rate`` messages per second in all, at most ``window`` unacknowledged (the
router's ``--mqtt-receive-maximum`` is 128 by default: keep it below). A message counts as
acknowledged when its PUBACK came; one that waits longer than :data:`ACK_TIMEOUT` is
given up (``expired``: never acknowledged, so never expected). Target ``index`` was sent
seqs ``1..sent_upto[index]`` (none where it is 0).

When the broker closes the stream's connection the publisher connects again (clean
session, :data:`RECONNECTS` attempts :data:`RECONNECT_DELAY` apart, counted in
``reconnects``) and goes on where it was; what was in flight then is given up (expired).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any, Final

from router.errors import BenchSetupError
from router.mqtt.codec import MQTT_3_1_1, PacketReader, encode
from router.mqtt.packets import ConnAck, Connect, PubAck, Publish

ACK_TIMEOUT: Final = 30.0
"""Seconds a QoS 1 publish waits for its PUBACK before it is given up."""
CONNECT_TIMEOUT: Final = 30.0
RECONNECTS: Final = 10
RECONNECT_DELAY: Final = 1.0
BATCH: Final = 64
"""PUBLISH packets written per write call, at most."""
PACE: Final = 0.002
"""Seconds between two looks at the schedule while nothing is due."""
BURST_CHUNK: Final = 2_000
"""QoS 0 packets of a burst written before waiting for the socket to drain."""


async def _wait(event: asyncio.Event, timeout: float) -> None:
    """Until ``event`` is set, or ``timeout`` seconds."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


class Publisher(asyncio.Protocol):
    """One publisher (see the module docstring); :meth:`connect` makes one."""

    def __init__(self, address: tuple[str, int], client_id: str) -> None:
        self.address = address
        self.client_id = client_id
        self.reader = PacketReader()
        self.transport: asyncio.Transport | None = None
        self.connack: asyncio.Future[ConnAck] | None = None
        self.writable = asyncio.Event()
        self.acked_event = asyncio.Event()
        self.lost: str | None = None  # (why the connection ended, until it is back)
        self.error: str | None = None  # (the stream gave up)
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self.inflight: dict[int, tuple[int, int, float]] = {}  # id -> (index, seq, sent)
        self.acked: dict[int, list[int]] = {}
        self.sent_upto: dict[int, int] = {}
        self.sent = 0
        self.acked_count = 0
        self.expired = 0
        self.reconnects = 0
        self.round = 0
        self.next_id = 0

    @classmethod
    async def connect(cls, address: tuple[str, int], client_id: str) -> Publisher:
        """Connected (clean session), or :class:`BenchSetupError`."""
        publisher = cls(address, client_id)
        await publisher._open()
        return publisher

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        self.reader = PacketReader()
        self.reader.level = MQTT_3_1_1  # (a client reads a server's packets: no CONNECT)
        self.connack = loop.create_future()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await loop.sock_connect(sock, self.address)
                await loop.create_connection(lambda: self, sock=sock)
                assert self.transport is not None
                self.transport.write(encode(Connect(self.client_id, MQTT_3_1_1), MQTT_3_1_1))
                connack = await self.connack
        except (OSError, TimeoutError) as exc:
            sock.close()
            raise BenchSetupError(
                f"the publisher cannot connect to {self.address}: {exc!r}"
            ) from None
        if connack.reason_code:
            if self.transport is not None:
                self.transport.close()
            raise BenchSetupError(f"the publisher was refused: CONNACK {connack.reason_code:#x}")
        self.lost = None

    # -- protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        for packet in self.reader.feed(data):
            if type(packet) is PubAck:
                assert isinstance(packet, PubAck)
                sent = self.inflight.pop(packet.packet_id, None)
                if sent is not None:
                    self.acked.setdefault(sent[0], []).append(sent[1])
                    self.acked_count += 1
                    self.acked_event.set()
            elif type(packet) is ConnAck and self.connack and not self.connack.done():
                assert isinstance(packet, ConnAck)
                self.connack.set_result(packet)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = f"the publisher's connection was closed: {exc!r}"
        if self.connack is not None and not self.connack.done():
            self.connack.set_exception(exc or ConnectionResetError(self.lost))
        self.transport = None
        self.writable.set()
        self.acked_event.set()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise BenchSetupError(self.lost or "the publisher is not connected")
        self.transport.write(data)

    # -- QoS 0 -------------------------------------------------------------------------------

    async def burst(self, messages: list[tuple[str, bytes]]) -> None:
        """One QoS 0 PUBLISH per (topic, payload), written in chunks as the socket drains."""
        for first in range(0, len(messages), BURST_CHUNK):
            await self.writable.wait()
            self._write(
                b"".join(
                    encode(Publish(topic, data), MQTT_3_1_1)
                    for topic, data in messages[first : first + BURST_CHUNK]
                )
            )

    # -- the QoS 1 stream --------------------------------------------------------------------

    def start(
        self,
        targets: list[tuple[str, int]],
        payload: Callable[[int, int], bytes],
        rate: float,
        window: int,
    ) -> None:
        """Start the stream over ``targets`` (topic, index) at ``rate`` msg/s."""
        heads = []
        for topic, index in targets:
            sample = encode(Publish(topic, payload(index, 0), 1, packet_id=1), MQTT_3_1_1)
            heads.append(sample[: len(sample) - len(payload(index, 0)) - 2])
        self.task = asyncio.create_task(self._stream(targets, heads, payload, rate, window))

    async def _stream(
        self,
        targets: list[tuple[str, int]],
        heads: list[bytes],
        payload: Callable[[int, int], bytes],
        rate: float,
        window: int,
    ) -> None:
        began, position, inflight = time.monotonic(), len(targets), self.inflight
        while not self.stopping:
            if self.lost is not None and not await self._reconnect():
                return
            now = time.monotonic()
            self._expire(now)
            due = int((now - began) * rate) - self.sent
            count = min(due, window - len(inflight), BATCH)
            if count <= 0:
                self.acked_event.clear()
                if len(inflight) >= window:
                    await _wait(self.acked_event, 1.0)
                else:
                    await asyncio.sleep(PACE)
                continue
            packets = []
            for _ in range(count):
                if position == len(targets):
                    position, self.round = 0, self.round + 1
                index = targets[position][1]
                packet_id = self._take_id()
                inflight[packet_id] = (index, self.round, now)
                self.sent_upto[index] = self.round
                packets.append(
                    heads[position] + packet_id.to_bytes(2, "big") + payload(index, self.round)
                )
                position += 1
            self.sent += count
            await self.writable.wait()
            with contextlib.suppress(BenchSetupError):  # (lost: the next turn reconnects)
                self._write(b"".join(packets))

    async def _reconnect(self) -> bool:
        """Connect again after the broker closed the connection; what was in flight is
        given up. False (and ``error`` set) if no attempt got in."""
        self.expired += len(self.inflight)
        self.inflight.clear()
        for _ in range(RECONNECTS):
            await asyncio.sleep(RECONNECT_DELAY)
            if self.stopping:
                return False
            try:
                await self._open()
            except BenchSetupError as exc:
                self.lost = str(exc)
                continue
            self.reconnects += 1
            return True
        self.error = f"the publisher gave up after {RECONNECTS} attempts: {self.lost}"
        return False

    def _take_id(self) -> int:
        while True:
            self.next_id = self.next_id % 0xFFFF + 1
            if self.next_id not in self.inflight:
                return self.next_id

    def _expire(self, now: float) -> None:
        late = [i for i, (_, _, sent) in self.inflight.items() if now - sent > ACK_TIMEOUT]
        for packet_id in late:
            del self.inflight[packet_id]
            self.expired += 1

    def progress(self) -> dict[str, Any]:
        """Counts so far: sent, acked, expired, in flight, the round, reconnects, an error
        (the stream gave up)."""
        return {
            "sent": self.sent,
            "acked": self.acked_count,
            "expired": self.expired,
            "inflight": len(self.inflight),
            "round": self.round,
            "publisher_reconnects": self.reconnects,
            "error": self.error,
        }

    async def stop(self) -> dict[str, Any]:
        """Stop sending; wait (at most :data:`ACK_TIMEOUT`) for the acknowledgements of
        what is in flight; :meth:`progress` with ``acked_seqs`` (index -> seqs) and
        ``sent_upto`` (index -> last seq sent)."""
        self.stopping = True
        if self.task is not None:
            await self.task
        deadline = time.monotonic() + ACK_TIMEOUT
        while self.inflight and self.lost is None and time.monotonic() < deadline:
            self.acked_event.clear()
            await _wait(self.acked_event, 0.5)
        self.expired += len(self.inflight)
        self.inflight.clear()
        return {**self.progress(), "acked_seqs": self.acked, "sent_upto": self.sent_upto}

    async def close(self) -> None:
        self.stopping = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"\xe0\x00")
            self.transport.close()
