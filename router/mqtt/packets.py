"""The MQTT control packets: one model for protocol levels 3 (3.1), 4 (3.1.1) and 5 (5.0).

Each packet is a value. PUBLISH and the acknowledgements are decoded once per message,
so they are plain slotted dataclasses (a frozen dataclass's ``__init__`` costs several
times as much); treat them as immutable too (:func:`dataclasses.replace` makes a changed
one). The others are frozen. Fields that only 5.0 has (properties, reason codes on
acknowledgements and DISCONNECT) keep their defaults for the older levels: the encoder
leaves them out there, and the decoder fills the defaults in. :mod:`router.mqtt.codec`
turns packets into bytes and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from router.mqtt.properties import NO_PROPERTIES, Properties
from router.mqtt.wire import PacketType

MQTT_3_1: Final = 3
MQTT_3_1_1: Final = 4
MQTT_5: Final = 5
PROTOCOL_NAMES: Final = {MQTT_3_1: "MQIsdp", MQTT_3_1_1: "MQTT", MQTT_5: "MQTT"}


@dataclass(frozen=True, slots=True)
class Will:
    """The will message of a CONNECT: published if the connection ends abnormally."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT. ``protocol_level`` is 3, 4 or 5; ``clean_start`` is 3.1.1's clean session."""

    client_id: str
    protocol_level: int = MQTT_5
    clean_start: bool = True
    keepalive: int = 60
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None
    properties: Properties = NO_PROPERTIES

    type = PacketType.CONNECT


@dataclass(frozen=True, slots=True)
class ConnAck:
    """CONNACK; ``reason_code`` is a 5.0 reason code (the encoder maps it for 3.1.1)."""

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES

    type = PacketType.CONNACK


@dataclass(slots=True)
class Publish:
    """PUBLISH. ``packet_id`` is None at QoS 0; ``topic`` may be "" with a topic alias."""

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES

    type = PacketType.PUBLISH


@dataclass(slots=True)
class Acknowledgement:
    """The shape of PUBACK, PUBREC, PUBREL and PUBCOMP: a packet identifier, a reason
    code (5.0) and properties (5.0). Packets of two kinds never compare equal."""

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


class PubAck(Acknowledgement):
    """PUBACK (QoS 1 acknowledgement)."""

    __slots__ = ()
    type = PacketType.PUBACK


class PubRec(Acknowledgement):
    """PUBREC (QoS 2, step 1)."""

    __slots__ = ()
    type = PacketType.PUBREC


class PubRel(Acknowledgement):
    """PUBREL (QoS 2, step 2)."""

    __slots__ = ()
    type = PacketType.PUBREL


class PubComp(Acknowledgement):
    """PUBCOMP (QoS 2, step 3)."""

    __slots__ = ()
    type = PacketType.PUBCOMP


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic filter of a SUBSCRIBE with its subscription options."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE: at least one subscription."""

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES

    type = PacketType.SUBSCRIBE


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK: one reason code (granted QoS, or a failure >= 0x80) per subscription."""

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES

    type = PacketType.SUBACK


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE: at least one topic filter."""

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES

    type = PacketType.UNSUBSCRIBE


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK: one reason code per filter in 5.0; none in 3.1.1."""

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES

    type = PacketType.UNSUBACK


@dataclass(frozen=True, slots=True)
class PingReq:
    """PINGREQ."""

    type = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class PingResp:
    """PINGRESP."""

    type = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class ReasonedPacket:
    """The shape of DISCONNECT and AUTH: a reason code and properties (both 5.0)."""

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


class Disconnect(ReasonedPacket):
    """DISCONNECT, from either side (a reason code only in 5.0)."""

    __slots__ = ()
    type = PacketType.DISCONNECT


class Auth(ReasonedPacket):
    """AUTH (5.0 only): enhanced authentication."""

    __slots__ = ()
    type = PacketType.AUTH


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
