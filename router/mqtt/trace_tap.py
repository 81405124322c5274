"""The packets of a traced client (:mod:`router.cluster.tracing`), in and out.

The listener gives the transport of a traced client's connection a :class:`ClientTap`
(:meth:`MqttServer.retap <router.mqtt.server.MqttServer.retap>`, when the client
attaches and when the traces change). In: the packets as the connection read them.
Out: the bytes as written, read back into packets (a write is whole packets, so a tap
may start at any write). A connection without a tap pays one attribute read per write.
A packet is told in words, never with its payload or password: its kind, packet id,
QoS, topic or filters, reason codes and payload size.
"""

from __future__ import annotations

from router.cluster.tracing import Tracer
from router.errors import MqttError
from router.mqtt.codec import PacketReader
from router.mqtt.packets import (
    Acknowledgement,
    ConnAck,
    Connect,
    Packet,
    Publish,
    ReasonedPacket,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
)
from router.state.trace_store import TraceSpec


def describe(packet: Packet) -> tuple[str, str]:
    """(topic, words) of ``packet``: no payload, no credentials."""
    kind = type(packet).__name__.upper()
    if isinstance(packet, Publish):
        flags = f"{' retain' if packet.retain else ''}{' dup' if packet.dup else ''}"
        ident = "" if packet.packet_id is None else f" id {packet.packet_id}"
        return packet.topic, f"PUBLISH qos {packet.qos}{ident}{flags}, {len(packet.payload)} B"
    if isinstance(packet, Connect):
        return "", (
            f"CONNECT level {packet.protocol_level}, clean start {packet.clean_start}, "
            f"keepalive {packet.keepalive}, user {packet.username!r}, "
            f"will {'yes' if packet.will else 'no'}"
        )
    if isinstance(packet, ConnAck):
        return "", f"CONNACK 0x{packet.reason_code:02x}, session present {packet.session_present}"
    if isinstance(packet, Subscribe):
        wanted = ", ".join(f"{s.topic_filter} qos {s.qos}" for s in packet.subscriptions)
        return "", f"SUBSCRIBE id {packet.packet_id}: {wanted}"
    if isinstance(packet, Unsubscribe):
        return "", f"UNSUBSCRIBE id {packet.packet_id}: {', '.join(packet.topic_filters)}"
    if isinstance(packet, SubAck | UnsubAck):
        codes = " ".join(f"0x{code:02x}" for code in packet.reason_codes)
        return "", f"{kind} id {packet.packet_id}: {codes or 'success'}"
    if isinstance(packet, Acknowledgement):
        return "", f"{kind} id {packet.packet_id} 0x{packet.reason_code:02x}"
    if isinstance(packet, ReasonedPacket):
        return "", f"{kind} 0x{packet.reason_code:02x}"
    return "", kind


class ClientTap:
    """Records the packets of one traced client's connection for ``specs``."""

    __slots__ = ("_client_id", "_reader", "_specs", "_tracer")

    def __init__(self, tracer: Tracer, specs: list[TraceSpec], client_id: str, level: int) -> None:
        self._tracer = tracer
        self._specs = specs
        self._client_id = client_id
        self._reader = PacketReader()
        self._reader.level = level

    def inbound(self, packets: list[Packet]) -> None:
        for packet in packets:
            self._tell("in", packet)

    def outbound(self, data: bytes) -> None:
        try:
            packets = self._reader.feed(data)
        except MqttError as error:  # (a tap never breaks the connection)
            self._reader = PacketReader()
            for spec in self._specs:
                self._tracer.record(spec, "out", self._client_id, "", f"not read back: {error}")
            return
        for packet in packets:
            self._tell("out", packet)

    def closed(self, why: str) -> None:
        for spec in self._specs:
            self._tracer.record(spec, "closed", self._client_id, "", why)

    def _tell(self, what: str, packet: Packet) -> None:
        topic, text = describe(packet)
        for spec in self._specs:
            self._tracer.record(spec, what, self._client_id, topic, text)
