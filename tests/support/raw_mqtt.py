"""A raw MQTT 5.0 client for tests that need what client libraries hide: a connection that
leaves QoS 1/2 deliveries unacknowledged and then just closes its socket, or a takeover
while the first connection is still open.

It speaks through the router's own codec over an asyncio stream. Every wait has a
deadline; :meth:`RawClient.take` collects PUBLISH (and PUBREL) packets in arrival order.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from router.mqtt.codec import PacketReader, encode
from router.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Packet,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from router.mqtt.properties import Properties

WAIT = 10.0


@dataclass
class RawClient:
    """One connection of client ``client_id``; ``connack_seconds`` is how long its CONNACK
    took (None until :meth:`connect` returned)."""

    client_id: str
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    packets: PacketReader = field(default_factory=PacketReader)
    pending: list[Packet] = field(default_factory=list)
    connack: ConnAck | None = None
    connack_seconds: float | None = None

    @classmethod
    async def connect(
        cls,
        port: int,
        client_id: str,
        *,
        clean_start: bool,
        expiry: int,
        deadline: float = WAIT,
        receive_maximum: int | None = None,
    ) -> RawClient:
        """Open a connection and send CONNECT; returns once CONNACK came (TimeoutError after
        ``deadline`` seconds without it)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = cls(client_id, reader, writer)
        client.packets.level = MQTT_5
        started = time.monotonic()
        properties = Properties(session_expiry_interval=expiry, receive_maximum=receive_maximum)
        writer.write(
            encode(Connect(client_id, MQTT_5, clean_start, keepalive=60, properties=properties))
        )
        [connack] = await client.next(ConnAck, 1, deadline)
        assert isinstance(connack, ConnAck)
        client.connack = connack
        client.connack_seconds = time.monotonic() - started
        return client

    async def next(self, kind: type, count: int, deadline: float = WAIT) -> list[Packet]:
        """The next ``count`` packets of ``kind`` (others received meanwhile are kept)."""
        async with asyncio.timeout(deadline):
            while sum(type(p) is kind for p in self.pending) < count:
                chunk = await self.reader.read(65536)
                if not chunk:
                    raise ConnectionError(f"{self.client_id}: the server closed the connection")
                self.pending += self.packets.feed(chunk)
        taken: list[Packet] = []
        kept: list[Packet] = []
        for packet in self.pending:
            (taken if type(packet) is kind and len(taken) < count else kept).append(packet)
        self.pending = kept
        return taken

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        self.writer.write(encode(Subscribe(1, (Subscription(topic_filter, qos),)), MQTT_5))
        [suback] = await self.next(SubAck, 1)
        assert isinstance(suback, SubAck) and suback.reason_codes == (qos,)

    async def take(self, count: int, deadline: float = WAIT) -> list[Publish]:
        """The next ``count`` PUBLISH packets, not acknowledged."""
        got = await self.next(Publish, count, deadline)
        return [p for p in got if isinstance(p, Publish)]

    def acknowledge(self, publishes: list[Publish]) -> None:
        """PUBACK each QoS 1 publish; PUBREC each QoS 2 one (its PUBREL is answered by
        :meth:`complete`)."""
        for publish in publishes:
            assert publish.packet_id is not None
            ack = PubAck(publish.packet_id) if publish.qos == 1 else PubRec(publish.packet_id)
            self.writer.write(encode(ack, MQTT_5))

    async def complete(self, count: int) -> None:
        """Answer the next ``count`` PUBREL packets with PUBCOMP."""
        for rel in await self.next(PubRel, count):
            assert isinstance(rel, PubRel)
            self.writer.write(encode(PubComp(rel.packet_id), MQTT_5))

    async def publish_now(self, topic: str, payload: bytes) -> None:
        """Send a QoS 0 PUBLISH."""
        self.writer.write(encode(Publish(topic, payload), MQTT_5))
        await self.writer.drain()

    async def closed(self, deadline: float = WAIT) -> None:
        """Return once the server closed the connection (packets meanwhile are kept)."""
        async with asyncio.timeout(deadline):
            while chunk := await self.reader.read(65536):
                self.pending += self.packets.feed(chunk)

    def nothing_pending(self) -> bool:
        """True if no PUBLISH arrived that was not taken."""
        return not any(isinstance(p, Publish) for p in self.pending)

    def drop(self) -> None:
        """Close the socket without DISCONNECT (the session stays, the will would go)."""
        self.writer.close()
