"""MQTT 5.0 reason codes (section 2.4) and the 3.1.1 CONNACK return codes.

One :class:`ReasonCode` enum serves every packet; the specification gives some values
several names (0x00 is Success, Normal disconnection and Granted QoS 0), which are
aliases here. A 3.1.1 client gets a CONNACK *return code* instead
(:func:`connack_return_code`) and, for anything else, the connection is just closed.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from router.mqtt.wire import PacketType


class ReasonCode(IntEnum):
    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


VALUES: Final = frozenset(int(code) for code in ReasonCode)
"""Every value the specification defines (a reason code outside it is a Malformed Packet)."""

# Which packets may carry each reason code (section 2.4, Table 2-6 of MQTT 5.0).
_ACKS: Final = ("PUBACK", "PUBREC")
_USED_IN: Final[dict[int, tuple[str, ...]]] = {
    0x00: ("CONNACK", *_ACKS, "PUBREL", "PUBCOMP", "SUBACK", "UNSUBACK", "DISCONNECT", "AUTH"),
    0x01: ("SUBACK",),
    0x02: ("SUBACK",),
    0x04: ("DISCONNECT",),
    0x10: _ACKS,
    0x11: ("UNSUBACK",),
    0x18: ("AUTH",),
    0x19: ("AUTH",),
    0x80: ("CONNACK", *_ACKS, "SUBACK", "UNSUBACK", "DISCONNECT"),
    0x81: ("CONNACK", "DISCONNECT"),
    0x82: ("CONNACK", "DISCONNECT"),
    0x83: ("CONNACK", *_ACKS, "SUBACK", "UNSUBACK", "DISCONNECT"),
    0x84: ("CONNACK",),
    0x85: ("CONNACK",),
    0x86: ("CONNACK",),
    0x87: ("CONNACK", *_ACKS, "SUBACK", "UNSUBACK", "DISCONNECT"),
    0x88: ("CONNACK",),
    0x89: ("CONNACK", "DISCONNECT"),
    0x8A: ("CONNACK",),
    0x8B: ("DISCONNECT",),
    0x8C: ("CONNACK", "DISCONNECT"),
    0x8D: ("DISCONNECT",),
    0x8E: ("DISCONNECT",),
    0x8F: ("SUBACK", "UNSUBACK", "DISCONNECT"),
    0x90: ("CONNACK", *_ACKS, "DISCONNECT"),
    0x91: (*_ACKS, "SUBACK", "UNSUBACK"),
    0x92: ("PUBREL", "PUBCOMP"),
    0x93: ("DISCONNECT",),
    0x94: ("DISCONNECT",),
    0x95: ("CONNACK", "DISCONNECT"),
    0x96: ("DISCONNECT",),
    0x97: ("CONNACK", *_ACKS, "SUBACK", "DISCONNECT"),
    0x98: ("DISCONNECT",),
    0x99: ("CONNACK", *_ACKS, "DISCONNECT"),
    0x9A: ("CONNACK", "DISCONNECT"),
    0x9B: ("CONNACK", "DISCONNECT"),
    0x9C: ("CONNACK", "DISCONNECT"),
    0x9D: ("CONNACK", "DISCONNECT"),
    0x9E: ("SUBACK", "DISCONNECT"),
    0x9F: ("CONNACK", "DISCONNECT"),
    0xA0: ("DISCONNECT",),
    0xA1: ("SUBACK", "DISCONNECT"),
    0xA2: ("SUBACK", "DISCONNECT"),
}
ALLOWED: Final[dict[int, frozenset[int]]] = {
    PacketType[packet]: frozenset(code for code, names in _USED_IN.items() if packet in names)
    for packet in {name for names in _USED_IN.values() for name in names}
}
"""The reason codes each packet type may carry; another one in that packet is a
Malformed Packet, even where the value is defined for another packet."""

# 3.1.1 CONNACK return codes (section 3.2.2.3 of 3.1.1), from the 5.0 reason code.
_V3_RETURN_CODES: Final = {
    0x00: 0x00,  # accepted
    0x84: 0x01,  # unacceptable protocol version
    0x85: 0x02,  # identifier rejected
    0x88: 0x03,  # server unavailable
    0x89: 0x03,
    0x8B: 0x03,
    0x86: 0x04,  # bad user name or password
    0x87: 0x05,  # not authorized
    0x8A: 0x05,
    0x90: 0x05,  # (a will topic past our limits: the nearest, as mosquitto's for a large will)
}


def connack_return_code(reason_code: int) -> int:
    """The 3.1.1 CONNACK return code for a 5.0 CONNACK reason code (3: unavailable when
    3.1.1 has no closer one)."""
    return _V3_RETURN_CODES.get(reason_code, 0x03)
