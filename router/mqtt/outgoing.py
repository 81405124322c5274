"""PUBLISH packets to a client: the MQTT 5 properties a delivery carries, and outbound
topic aliases.

The properties a publisher attaches travel with the message unaltered
(:func:`carried_properties`, :class:`~router.core.messages.MessageProperties`); a
delivery's PUBLISH gets them back with the subscription identifiers and the Message
Expiry Interval that is left (:func:`publish_properties`). A client that allows topic
aliases (Topic Alias Maximum in its CONNECT) gets one for each of the first topics sent
to it, up to its maximum: the topic goes with its alias once, then the alias alone; an
alias lives as long as the connection.

:class:`Outbox` sends a session's deliveries over one connection: at most ``window`` QoS
1/2 deliveries unacknowledged (the smaller of the node's ``max_inflight`` and the
client's Receive Maximum), the rest wait in the session; and, with ``max_bytes``, at
most that many payload bytes of QoS 1/2 deliveries unacknowledged: the next delivery
waits in the session (and all behind it, in order) while it would take them above it,
unless nothing is unacknowledged (so a single large message is never stuck; each such
wait is counted). A slot of the window, and its bytes, are taken *before* a delivery
leaves the session, so a delivery is always queued there or in flight, never in between
(a session handed on takes both). Packets gathered while more
deliveries wait go out in one write. A packet above the client's Maximum Packet Size is
not sent, as if it had been (MQTT-3.1.2-25: its packet id and slot are free again, and
so is the topic alias it would have bound), and a message whose expiry passed neither;
both are counted. It
sends from a task only while there is something to send: an idle client's outbox waits
for the next delivery without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, Final

from router.cluster.sessions.local_sessions import EXPIRED, OVERSIZED, ClientSession
from router.core.messages import Delivery, MessageProperties
from router.errors import MqttProtocolError
from router.mqtt.codec import encode, encode_publish, topic_field
from router.mqtt.connection_host import DeliveryCounters, Transport
from router.mqtt.packets import MQTT_5, PubRel
from router.mqtt.properties import NO_PROPERTIES, Properties

#: Packets to a client gathered into one write, at most.
OUT_BATCH: Final = 256
#: Topics whose PUBLISH field a server keeps, at most (then it starts again).
TOPIC_FIELDS: Final = 4096


_NOTHING_CARRIED: Final = MessageProperties()


class TopicFields(dict[str, bytes]):
    """Topic name -> its field in a PUBLISH (:func:`~router.mqtt.encoder.topic_field`),
    made on first use: the fields of the last topics sent, shared by the connections of
    a server (the same topics go to many clients, again and again); at most ``size``,
    then it starts again."""

    def __init__(self, size: int = TOPIC_FIELDS) -> None:
        super().__init__()
        self.size = size

    def __missing__(self, topic: str) -> bytes:
        field = topic_field(topic)
        if len(self) >= self.size:
            self.clear()
        self[topic] = field
        return field


class PublishEncoder:
    """Encodes the PUBLISH packets of one connection (protocol ``level``), with outbound
    topic aliases up to the client's ``alias_maximum`` (0: none); topic fields come from
    ``fields`` (a server's, shared)."""

    __slots__ = ("_aliases", "_fields", "alias_maximum", "level", "on_change")

    def __init__(
        self, level: int, alias_maximum: int, fields: Mapping[str, bytes] | None = None
    ) -> None:
        self.level = level
        self.alias_maximum = alias_maximum if level >= MQTT_5 else 0
        self._aliases: dict[str, int] | None = None  # (made with the first alias)
        self._fields: Mapping[str, bytes] = TopicFields() if fields is None else fields
        #: Called when a topic got an alias (:mod:`router.mqtt.alias_mirror`).
        self.on_change: Callable[[], None] | None = None

    def encode(self, delivery: Delivery, packet_id: int | None, dup: bool) -> bytes:
        """The PUBLISH of ``delivery`` for this connection. A QoS 0 one that carries
        nothing of this connection's (no properties, no alias) is the same for every
        client of its protocol family: it is encoded once and kept on the delivery,
        which the clients it was copied for share (:attr:`Delivery.encoded`)."""
        topic = delivery.topic
        v5 = self.level >= MQTT_5
        properties = NO_PROPERTIES
        if v5:
            properties = publish_properties(delivery, time.time())
            alias = self._alias(topic)
            if alias is not None:
                properties = replace(properties, topic_alias=alias[0])
                if alias[1]:
                    topic = ""
        if packet_id is not None or properties is not NO_PROPERTIES:  # this connection's own
            return encode_publish(
                self._fields[topic],
                delivery.payload,
                delivery.qos,
                delivery.retain,
                dup,
                packet_id,
                properties,
                v5,
            )
        encoded = delivery.encoded
        if encoded is not None and encoded[0] == v5:
            return encoded[1]
        data = encode_publish(
            self._fields[topic],
            delivery.payload,
            delivery.qos,
            delivery.retain,
            dup,
            None,
            NO_PROPERTIES,
            v5,
        )
        delivery.encoded = (v5, data)
        return data

    def encode_within(self, delivery: Delivery, packet_id: int | None, most: int) -> bytes | None:
        """As :meth:`encode` (no DUP), or None for a PUBLISH above ``most`` bytes (0: no
        limit), which is not sent: nothing of it stays, so an alias it bound is free
        again (the client never saw it) and the next PUBLISH of its topic carries the
        topic (MQTT-3.1.2-25: as if it had been sent)."""
        bound = 0 if self._aliases is None else len(self._aliases)
        data = self.encode(delivery, packet_id, dup=False)
        if not most or len(data) <= most:
            return data
        if self._aliases is not None and len(self._aliases) > bound:
            del self._aliases[delivery.topic]  # (the newest alias: the numbering holds)
        return None

    def _alias(self, topic: str) -> tuple[int, bool] | None:
        """(alias, already known to the client) for ``topic``, None to send it plainly."""
        aliases = self._aliases
        if aliases is None:
            if not self.alias_maximum:
                return None
            aliases = self._aliases = {}
        alias = aliases.get(topic)
        if alias is not None:
            return alias, True
        if len(aliases) >= self.alias_maximum:
            return None
        alias = aliases[topic] = len(aliases) + 1
        if self.on_change is not None:
            self.on_change()
        return alias, False

    def alias_table(self) -> tuple[int, dict[int, str]]:
        """The client's Topic Alias Maximum and a copy of our alias -> topic map."""
        bound = {} if self._aliases is None else {a: t for t, a in self._aliases.items()}
        return self.alias_maximum, bound


def carried_properties(properties: Properties) -> MessageProperties | None:
    """The properties of a PUBLISH that travel with the message (None: none of them)."""
    if properties is NO_PROPERTIES:
        return None
    carried = MessageProperties(
        properties.payload_format_indicator,
        properties.content_type,
        properties.response_topic,
        properties.correlation_data,
        properties.user_properties,
    )
    return None if carried == _NOTHING_CARRIED else carried


def message_expiry(properties: Properties) -> int | None:
    """The lifetime in seconds a PUBLISH or a will asks for with its Message Expiry
    Interval; None (it never expires) when it has none, or 0: as on mosquitto, an
    interval of 0 is no expiry (the specification gives 0 no meaning of its own, and a
    message that expired as it arrived could not even be retained)."""
    return properties.message_expiry_interval or None


def publish_properties(delivery: Delivery, now: float) -> Properties:
    """The properties of the PUBLISH that delivers ``delivery`` to a 5.0 client at ``now``
    (wall-clock seconds): a live message's expiry interval is what is left of it."""
    carried = delivery.properties
    expiry = delivery.expiry_interval
    if delivery.expires_at is not None:
        expiry = max(math.ceil(delivery.expires_at - now), 1)
    if carried is None and not delivery.subscription_ids and expiry is None:
        return NO_PROPERTIES
    if carried is None:
        carried = _NOTHING_CARRIED
    return Properties(
        payload_format_indicator=carried.payload_format_indicator,
        message_expiry_interval=expiry,
        content_type=carried.content_type,
        response_topic=carried.response_topic,
        correlation_data=carried.correlation_data,
        subscription_identifiers=delivery.subscription_ids,
        user_properties=carried.user_properties,
    )


class Outbox:
    """The deliveries of one session over one connection (see the module docstring).

    It sends from a task only while there is something to send. With a free slot and an
    empty queue it waits for the session's next delivery without one: the session's
    :meth:`~router.cluster.sessions.local_sessions.ClientSession.wait` is stepped from the done
    callback of the future it waits on (an idle connection holds no task). ``on_end`` is
    called once the session is closed (None) or sending failed (the error).
    """

    __slots__ = (
        "_bytes",
        "_counters",
        "_encoder",
        "_free",
        "_max_bytes",
        "_max_packet",
        "_next_id",
        "_on_end",
        "_out",
        "_session",
        "_slot_freed",
        "_task",
        "_transport",
        "_waiting",
    )

    def __init__(
        self,
        session: ClientSession,
        transport: Transport,
        counters: DeliveryCounters,
        encoder: PublishEncoder,
        window: int,
        max_bytes: int,
        max_packet: int,
        on_end: Callable[[Exception | None], None],
    ) -> None:
        self._session = session
        self._transport = transport
        self._counters = counters
        self._encoder = encoder
        self._free = window  # slots of the window not held by a delivery
        self._max_bytes = max_bytes  # 0: no limit
        self._bytes = 0  # payload bytes of the QoS 1/2 deliveries holding a slot
        self._slot_freed: asyncio.Future[None] | None = None  # (waited on with no room)
        self._max_packet = max_packet  # 0: no limit
        self._next_id = 0
        self._out: list[bytes] = []
        self._on_end = on_end
        self._task: asyncio.Task[None] | None = None  # sending
        self._waiting: Coroutine[Any, Any, bool] | None = None  # session.wait()

    def start(self) -> None:
        """Send deliveries until the session closes: first what was in flight when its
        last connection ended (by packet id), then the queue. Whatever is queued when a
        turn starts goes in that turn, up to the free slots, without a wait per delivery.
        What was in flight goes again whatever its bytes (they count from then on)."""
        if self._session.inflight:
            self._task = asyncio.get_running_loop().create_task(self._run(resend=True))
        else:
            self._sleep()

    async def stop(self) -> None:
        """Stop sending (what is in flight stays the session's, and the queue)."""
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.close()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, resend: bool) -> None:
        session = self._session
        try:
            for packet_id in sorted(session.inflight) if resend else ():
                await self._slot(queued=False)
                self._hold(session.inflight[packet_id])
                self._send_inflight(packet_id, session.inflight[packet_id])
            while True:
                if self._out:
                    await self._flush()
                await self._slot(queued=True)
                deliveries = self._take()
                if not deliveries:
                    break
                for delivery in deliveries:
                    self._send(delivery)
        except Exception as error:  # (RouterError, ConnectionError: the connection ends)
            self._task = None
            self._on_end(error)
            return
        self._task = None
        self._sleep()

    def _sleep(self) -> None:
        """Wait for the next delivery (nothing is gathered) without a task."""
        self._step(self._session.wait())

    def _step(self, waiting: Coroutine[Any, Any, bool]) -> None:
        try:
            future = waiting.send(None)
        except StopIteration as woken:
            self._waiting = None
            self._woken(woken.value)
            return
        except Exception as error:
            self._waiting = None
            self._on_end(error)
            return
        self._waiting = waiting
        if isinstance(future, asyncio.Future):
            future.add_done_callback(self._wake)
        else:  # (a bare yield: step again soon)
            asyncio.get_running_loop().call_soon(self._wake, None)

    def _wake(self, _: object) -> None:
        if self._waiting is not None:
            self._step(self._waiting)

    def _woken(self, queued: bool) -> None:
        if not queued:  # (the session is closed)
            self._on_end(None)
            return
        self._task = asyncio.get_running_loop().create_task(self._run(resend=False))

    def _fits(self, delivery: Delivery) -> bool:
        """``delivery`` may go out now as far as the bytes are concerned."""
        return (
            not self._max_bytes
            or not delivery.qos
            or not self._bytes
            or self._bytes + len(delivery.payload) <= self._max_bytes
        )

    async def _slot(self, queued: bool) -> None:
        """Return once a slot of the window is free and, with ``queued``, the next queued
        delivery (if any) fits the bytes left (what is gathered goes out first: the
        client cannot acknowledge packets it has not got)."""
        counted = False
        queue = self._session.queue_view()
        while not self._free or (queued and queue and not self._fits(queue[0])):
            if self._out:
                await self._flush()
                continue
            if self._free and not counted:  # (held by the bytes alone)
                self._counters.inflight_bytes_waited += 1
                counted = True
            self._slot_freed = asyncio.get_running_loop().create_future()
            try:
                await self._slot_freed
            finally:
                self._slot_freed = None

    def _take(self) -> list[Delivery]:
        """The queued deliveries the window has room for, oldest first, each holding its
        slot (and bytes) from now on."""
        session = self._session
        limit = min(self._free, OUT_BATCH)
        held = self._bytes
        if self._max_bytes:
            count = 0
            for delivery in session.queue_view():
                if count == limit:
                    break
                if delivery.qos:
                    size = len(delivery.payload)
                    if held and held + size > self._max_bytes:
                        break
                    held += size
                count += 1
            taken = session.take(count)
        else:
            taken = session.take(limit)
            held += sum(len(delivery.payload) for delivery in taken if delivery.qos)
        self._free -= len(taken)
        self._bytes = held
        return taken

    def _hold(self, delivery: Delivery) -> None:
        self._free -= 1
        if delivery.qos:
            self._bytes += len(delivery.payload)

    def _give_back(self, delivery: Delivery) -> None:
        self._free += 1
        if delivery.qos:
            self._bytes -= len(delivery.payload)
        freed = self._slot_freed  # (only a window without room is waited on)
        if freed is not None and not freed.done():
            freed.set_result(None)

    def release(self, packet_id: int) -> None:
        """The client acknowledged ``packet_id`` (PUBACK, PUBCOMP, a failed PUBREC)."""
        delivery = self._session.inflight.pop(packet_id, None)
        if delivery is not None:
            self._give_back(delivery)

    async def _flush(self) -> None:
        data, self._out = b"".join(self._out), []
        self._session.active_at = time.time()  # (a packet out: its last activity)
        self._transport.write(data)
        await self._transport.drain()

    def _send(self, delivery: Delivery) -> None:
        """Gather one delivery's packet (holding a slot, given back unless in flight)."""
        if delivery.expires_at is not None and delivery.expires_at <= time.time():
            self._counters.expired_dropped += 1
            self._session.lose(EXPIRED)
            self._give_back(delivery)
            return
        if delivery.packet_id is not None:  # resumed: went out before this connection
            self._session.inflight[delivery.packet_id] = delivery
            self._send_inflight(delivery.packet_id, delivery)
            return
        packet_id = None
        if delivery.qos:
            packet_id = self._allocate()
            self._session.inflight[packet_id] = delivery
        data = self._encoder.encode_within(delivery, packet_id, self._max_packet)
        if data is None:
            self._counters.oversized_dropped += 1  # discarded as if sent
            self._session.lose(OVERSIZED)
            if packet_id is not None:
                self.release(packet_id)
            else:
                self._give_back(delivery)
            return
        if packet_id is None:
            self._give_back(delivery)
        self._out.append(data)
        self._counters.messages_sent += 1
        session = self._session
        session.sent += 1
        session.sent_bytes += len(delivery.payload)

    def _send_inflight(self, packet_id: int, delivery: Delivery) -> None:
        """Send again, with DUP, what was in flight (a released one: its PUBREL)."""
        if delivery.released:
            self._out.append(encode(PubRel(packet_id), self._encoder.level))
        else:
            self._out.append(self._encoder.encode(delivery, packet_id, dup=True))
            self._counters.messages_sent += 1
            self._session.sent += 1
            self._session.sent_bytes += len(delivery.payload)

    def _allocate(self) -> int:
        inflight = self._session.inflight
        for _ in range(0xFFFF):
            self._next_id = self._next_id % 0xFFFF + 1
            if self._next_id not in inflight:
                return self._next_id
        raise MqttProtocolError("no free packet identifier")  # (the window makes it unreachable)
