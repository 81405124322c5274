"""How bytes drive one MQTT connection, with no task while it is idle.

A listener gives a connection its bytes in one of two ways. Pushed (:mod:`router.mqtt.tcp`,
TCP and TLS): asyncio calls back with each read, :meth:`Intake.feed` takes the bytes and
:meth:`Intake.lost` the end of the stream, and the connection pauses and resumes reading
through its :class:`Reading`. Pulled (:meth:`Intake.run`, the WebSocket listener): an
async iterator of chunks, each one taken only once the packets before it are handled.

Either way the bytes become packets at once (the connection's
:class:`~router.mqtt.codec.PacketReader`), and the packets wait, in order, for a worker
task that exists only while there is work: it hands them to :meth:`Intake._handle_packets`
(:class:`~router.mqtt.protocol.MqttConnection`) a batch at a time and ends when none
wait. An idle connection holds no task and no read buffer: its packet reader (empty),
its state and one timer (and, once attached, its outbox's wait for the next delivery,
without a task either: :class:`~router.mqtt.outgoing.Outbox`).

* The timer: until its first packet a connection has ``connect_timeout`` (else it
  closes, counted as ``connect_timeout``); once :meth:`Intake._watch_silence` is given a
  keepalive, 1.5 x keepalive without a whole control packet from the client (time spent
  handling its packets does not count; the bytes of an unfinished one do not either,
  MQTT-3.1.2-24) ends it with 0x8D, counted as ``keep_alive_timeout``.
* Unfinished packets (a slow loris): the bytes of a packet begun and not yet whole are
  counted for the whole node (:class:`~router.mqtt.unfinished.Unfinished`, the server's
  ``unfinished``). A read that would take them past ``max_unfinished_bytes`` ends the
  connection with 0x97 (counted as ``unfinished_bytes``); a packet not whole within
  ``packet_timeout`` of the read that began it ends it with 0x8D (``packet_timeout``),
  unless the node was not reading from it (its clock then starts again). A connection
  that ends gives its unfinished bytes back at once.
* The connection ends for one reason, set once (:meth:`Intake._end_with`): a bad packet
  (raised after the good ones before it are handled), the stream closing, silence,
  :meth:`~router.mqtt.protocol.MqttConnection.end` from outside, or what handling a
  packet raised. The worker then hands the reason to :meth:`Intake._conclude`, which
  answers it and lets go of the client; :meth:`Intake.finished` returns after that.
* Reading pauses (pushed) while more than ``READ_LIMIT`` bytes of packets wait for the
  worker, and from the end on; and for as long as :meth:`Intake._throttle` says after a
  batch (a client past its publish rate; the worker waits, so a pulled stream is not
  read either, and the wait is not silence). It also pauses while more than ``READ_PAUSE`` bytes
  written to the client wait for it to read them (a client that sends and never reads
  must not grow the node's write buffer without bound: TCP then pushes back on it);
  that wait is silence too (0x8D after 1.5 x keepalive).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Final, Protocol

from router.errors import ConnectionEndedError, MqttError
from router.mqtt.codec import PacketReader
from router.mqtt.connection_host import ConnectionHost, Transport
from router.mqtt.overload import PACKET_WORK
from router.mqtt.packets import Packet
from router.mqtt.reason_codes import ReasonCode

#: Answers (PINGRESP, PUBACK, deliveries...) a client has not read, in bytes, above which
#: the node stops reading from it until they are sent.
READ_PAUSE: Final = 1 << 20
#: Bytes of packets waiting for the worker above which reading pauses (pushed bytes).
READ_LIMIT: Final = 1 << 17

# Why reading is paused (bits of Intake._paused).
_WAITING: Final = 1  # packets wait for the worker
_UNREAD: Final = 2  # the client does not read what it is sent
_ENDING: Final = 4  # the connection ends
_THROTTLED: Final = 8  # the client publishes faster than its rate (router.mqtt.rates)
#: Packets handled at a time: a client that sent many at once does not hold the event
#: loop for all of them, and its publish rate is judged after each batch.
HANDLE_BATCH: Final = 512
#: Seconds a throttled worker sleeps at a time (it looks for the connection's end between).
THROTTLE_STEP: Final = 0.1


class Reading(Protocol):
    """How a connection whose bytes are pushed holds them back (TCP flow control)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Intake:
    """The reading side of one connection (see the module docstring)."""

    __slots__ = (
        "_done",
        "_finished",
        "_greeted",
        "_heard",
        "_held",
        "_opened_at",
        "_outside",
        "_paused",
        "_pending",
        "_reading",
        "_reason",
        "_silence",
        "_timer",
        "_unhandled",
        "_worker",
        "reader",
        "server",
        "transport",
        "work",
    )

    def __init__(self, server: ConnectionHost, transport: Transport) -> None:
        self.server = server
        self.transport = transport
        settings = server.settings
        self.reader = PacketReader(settings.max_packet_size, settings.property_limits)
        self._reading: Reading | None = None
        self._pending: list[Packet] | None = None  # packets for the worker, in order
        self._unhandled = 0  # bytes of them
        self._reason: BaseException | None = None  # why the connection ends, once known
        self._worker: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._heard = 0.0  # loop time of the last whole packet (or of the end of the last work)
        self._held = 0  # unfinished bytes of the reader counted in the server's unfinished
        self._outside = 0  # unfinished bytes the transport holds (a WebSocket frame)
        self._silence = 0.0  # seconds of silence that end the connection (0: none)
        self._paused = 0
        self._opened_at = 0.0
        self._greeted = False  # the first packet came
        self._finished: asyncio.Event | None = None  # made when someone waits
        self._done = False
        self.work = 0  # what the client brought (router.mqtt.overload.PACKET_WORK)

    # -- what the listener calls -----------------------------------------------------------

    def start(self, reading: Reading | None) -> None:
        """The connection is open (and admitted): its ``connect_timeout`` starts."""
        loop = asyncio.get_running_loop()
        self._reading = reading
        self._opened_at = loop.time()
        self._timer = loop.call_at(
            self._opened_at + self.server.settings.connect_timeout, self._connect_expired
        )

    def feed(self, data: bytes | memoryview) -> None:
        """Bytes from the client (the reader copies them: ``data`` may be reused)."""
        if self._reason is not None:
            return
        try:
            packets = self.reader.feed(data)
        except MqttError as error:
            self._end_with(error)
            return
        now = asyncio.get_running_loop().time()
        self.work += len(data) + PACKET_WORK * len(packets)
        if packets:
            self._heard = now
            if not self._greeted:
                self._greeted = True
                self._stop_timer()
            if self._pending is None:
                self._pending = packets
            else:
                self._pending += packets
            self._unhandled += len(data)
            self._arrived(packets)
            if self._worker is None:
                self._worker = asyncio.get_running_loop().create_task(self._work())
            elif self._unhandled > READ_LIMIT:
                self._pause(_WAITING)
        held = self.reader.buffered + self._outside
        if held != self._held or (held and packets):
            self._hold(held, now, bool(packets))
        if self.reader.error is not None:  # (raised once the packets before it are handled)
            self._end_with(self.reader.error)

    def held_outside(self, held: int) -> None:
        """The transport now holds ``held`` bytes of a message not whole yet (a WebSocket
        frame, the fragments of a message): they count in the node's unfinished bytes
        and a packet's deadline as the bytes of an unfinished packet do."""
        if self._reason is not None or held == self._outside:
            return
        self._outside = held
        total = self.reader.buffered + held
        if total != self._held:
            self._hold(total, asyncio.get_running_loop().time(), False)

    def lost(self) -> None:
        """The stream ended (EOF, reset, closed): the connection ends once the packets
        that came before are handled (without DISCONNECT: the will goes)."""
        self._end_with(ConnectionEndedError(None))

    async def run(self, chunks: AsyncIterator[bytes]) -> None:
        """Serve a connection whose bytes are pulled from ``chunks`` until it ends; each
        chunk is handled before the next is taken. Never raises for what the client did."""
        self.start(None)
        try:
            async for chunk in chunks:
                self.feed(chunk)
                while (worker := self._worker) is not None and not worker.done():
                    await asyncio.wait((worker,))
                if self._reason is not None:
                    break
        except ConnectionError:
            pass
        finally:
            self.lost()
        await self.finished()

    async def finished(self) -> None:
        """Return once the connection has ended and let go of its client on the node."""
        if self._done:
            return
        if self._finished is None:
            self._finished = asyncio.Event()
        await self._finished.wait()

    # -- what the connection implements ----------------------------------------------------

    async def _handle_packets(self, packets: list[Packet]) -> None:
        """Handle packets in order (the first ones start with the CONNECT)."""
        raise NotImplementedError

    def _arrived(self, packets: list[Packet]) -> None:
        """``packets`` were just read, before any packet read after them (they are
        handled after those read before them)."""

    async def _conclude(self, reason: BaseException) -> None:
        """Answer the reason the connection ends and let go of its client."""
        raise NotImplementedError

    def _throttle(self) -> float:
        """Seconds to stop reading after the packets just handled (0: none)."""
        return 0.0

    def packet_overdue(self, now: float) -> None:
        """The packet begun ``packet_timeout`` ago is not whole (from the server's
        :class:`~router.mqtt.unfinished.Unfinished`)."""
        if self._reason is not None:
            return
        if self._paused & (_WAITING | _THROTTLED):  # (the node held it back)
            self.server.unfinished.begin(self, now)
            return
        self.server.count_close("packet_timeout")
        self._end_with(ConnectionEndedError(ReasonCode.KEEP_ALIVE_TIMEOUT))

    # -- unfinished packets ----------------------------------------------------------------

    def _hold(self, held: int, now: float, finished: bool) -> None:
        """The reader now holds ``held`` unfinished bytes (``finished``: packets came
        out of this read): count them for the node, or end the connection with 0x97
        when they would take the node past ``max_unfinished_bytes``."""
        unfinished = self.server.unfinished
        if held > self._held and not unfinished.take(held - self._held):
            self.server.count_close("unfinished_bytes")
            self._end_with(ConnectionEndedError(ReasonCode.QUOTA_EXCEEDED))
            return
        if held < self._held:
            unfinished.give(self._held - held)
        if not held:
            unfinished.end(self)
        elif finished or not self._held:  # (a new packet began in this read)
            unfinished.begin(self, now)
        self._held = held

    def _let_go(self) -> None:
        """The connection ends: its unfinished bytes are given back (and dropped)."""
        if self._held:
            self.server.unfinished.give(self._held)
            self.server.unfinished.end(self)
            self._held = 0
        self.reader.discard()

    # -- the worker ------------------------------------------------------------------------

    def _end_with(self, reason: BaseException) -> None:
        """The connection ends for ``reason`` (the first one given is kept), once the
        packets that came before are handled."""
        if self._reason is not None:
            return
        self._reason = reason
        self._let_go()
        self._pause(_ENDING)
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        try:
            while True:
                packets = self._pending
                if packets is not None:
                    self._pending = None
                    self._unhandled = 0
                    self._resume(_WAITING)
                    for start in range(0, len(packets), HANDLE_BATCH):
                        if start:
                            await asyncio.sleep(0)  # (the loop's other work between)
                        await self._handle_packets(packets[start : start + HANDLE_BATCH])
                        if (wait := self._throttle()) > 0:
                            await self._throttled(wait)
                elif self._reason is not None:
                    raise self._reason
                elif self.transport.backlog() > READ_PAUSE:
                    await self._wait_for_client()
                else:
                    break
        except BaseException as reason:
            self._reason = self._reason or reason
            self._let_go()
            self._stop_timer()
            try:
                await self._conclude(reason)
            finally:
                self._done = True
                if self._finished is not None:
                    self._finished.set()
            if not isinstance(reason, Exception):
                raise  # (cancelled: the connection was ended first)
            return
        self._heard = asyncio.get_running_loop().time()
        self._worker = None

    async def _throttled(self, wait: float) -> None:
        """Stop reading for ``wait`` seconds (or until the connection ends)."""
        self.server.publish_throttled += 1
        self._pause(_THROTTLED)
        try:
            end = asyncio.get_running_loop().time() + wait
            while self._reason is None and (left := end - asyncio.get_running_loop().time()) > 0:
                await asyncio.sleep(min(left, THROTTLE_STEP))
        finally:
            self._resume(_THROTTLED)

    async def _wait_for_client(self) -> None:
        """Stop reading until the client reads what it was sent (silence if it does not)."""
        self._pause(_UNREAD)
        try:
            async with asyncio.timeout(self._silence or None):
                await self.transport.drain()
        except TimeoutError:
            raise self._silent() from None
        finally:
            self._resume(_UNREAD)

    # -- timers ----------------------------------------------------------------------------

    def _watch_silence(self, keepalive: int) -> None:
        """From now on, 1.5 x ``keepalive`` seconds of silence end the connection (0: never)."""
        self._stop_timer()
        if not keepalive or self._reason is not None:
            return
        loop = asyncio.get_running_loop()
        self._silence = keepalive * 1.5
        self._heard = loop.time()
        self._timer = loop.call_at(self._heard + self._silence, self._check_silence)

    def _check_silence(self) -> None:
        self._timer = None
        if self._reason is not None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = now + self._silence if self._worker is not None else self._heard + self._silence
        if due > now:  # (heard since, or busy with what it sent)
            self._timer = loop.call_at(due, self._check_silence)
            return
        self._end_with(self._silent())

    def _silent(self) -> ConnectionEndedError:
        self.server.count_close(ReasonCode.KEEP_ALIVE_TIMEOUT)
        return ConnectionEndedError(ReasonCode.KEEP_ALIVE_TIMEOUT)

    def _connect_expired(self) -> None:
        self._timer = None
        if self._reason is None and not self._greeted:
            self.server.count_close("connect_timeout")
            self._end_with(ConnectionEndedError(None))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- reading ---------------------------------------------------------------------------

    def _pause(self, why: int) -> None:
        if not self._paused and self._reading is not None:
            self._reading.pause_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        if self._paused & why:
            self._paused &= ~why
            if not self._paused and self._reading is not None:
                self._reading.resume_reading()
