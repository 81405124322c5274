"""The decisions of one MQTT connection, without I/O: packets and events in, actions out.

:class:`~router.mqtt.protocol.MqttConnection` reads bytes, calls the node and writes
packets; what it answers is decided here, by plain functions of the packet, the settings
and the session's acknowledgement state, so that every order of packets can be tested
without a socket or a node (tests/mqtt/test_exchange.py drives random ones against a
model of what the client must see).

* **CONNECT** (:func:`admit`): an Authentication Method (0x8C: the server supports no
  enhanced authentication), a will topic past ``max_topic_levels`` or
  ``max_topic_length`` (0x90; 3.1.1: 5, Not authorized), the client id (assigned for an
  empty 5.0 id; 3.1.1 with clean session 0 and no id is refused, 0x02), anonymous
  clients when they are not allowed (0x87), the Session Expiry Interval granted;
  :func:`refusal` maps what the node answered instead (a bad id, a refused login, Redis
  failing) to the CONNACK code; :func:`connect_refused` answers a CONNECT the decoder
  refused (a CONNACK in 5.0); :func:`connack_properties` says what a 5.0 CONNACK
  announces.
* **Acknowledgements** (:class:`Acknowledgements`): the QoS 1/2 exchange both ways over a
  session's ``inflight`` (sent, not yet acknowledged) and ``awaiting_release`` (received
  QoS 2 ids before their PUBREL): a resent QoS 2 PUBLISH is acknowledged again and not
  published twice; PUBREC, PUBREL and PUBCOMP for an id it does not know get 0x92.
* **DISCONNECT** (:func:`disconnect`): the interval a client may change (not from 0: 0x82)
  and whether its will goes.

Actions are packets to send and :class:`Release` (a packet id whose QoS 1/2 exchange
ended: the delivery window has room again).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, MutableSet
from dataclasses import dataclass, field, replace
from typing import Final

from router.core.messages import Delivery
from router.errors import (
    ConnectionEndedError,
    InvalidIdError,
    MqttError,
    MqttProtocolError,
    NotAuthorizedError,
    SessionUserError,
    UnsupportedProtocolVersionError,
)
from router.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from router.mqtt.properties import Properties
from router.mqtt.reason_codes import ALLOWED, ReasonCode
from router.mqtt.settings import MqttSettings

RC = ReasonCode


@dataclass(frozen=True, slots=True)
class Admit:
    """A CONNECT the connection goes on with: the ``client_id`` (``assigned`` when the
    server chose it) and the Session Expiry Interval granted."""

    client_id: str
    assigned: str | None
    expiry: int


@dataclass(frozen=True, slots=True)
class Refuse:
    """A CONNECT answered with CONNACK ``code`` (the encoder maps it for 3.1.1), for
    the reason ``why`` (what the log says)."""

    code: int
    why: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Release:
    """The QoS 1/2 exchange of ``packet_id`` ended: it leaves the delivery window."""

    packet_id: int


Action = Packet | Release


def admit(connect: Connect, settings: MqttSettings, new_id: Callable[[], str]) -> Admit | Refuse:
    """Whether the connection may go on with ``connect`` (before the node is asked)."""
    v5 = connect.protocol_level >= MQTT_5
    if connect.properties.authentication_method is not None:  # (no enhanced authentication)
        return Refuse(RC.BAD_AUTHENTICATION_METHOD, "enhanced authentication asked")  # 4.12.0-1
    client_id, assigned = connect.client_id, None
    if not client_id:
        if not v5 and not connect.clean_start:
            return Refuse(RC.CLIENT_IDENTIFIER_NOT_VALID, "no client id for a kept session")
        client_id = assigned = new_id()
    will = connect.will
    if will is not None and (
        will.topic.count("/") >= settings.max_topic_levels
        or len(will.topic) > settings.max_topic_length
    ):  # (our limits on a topic, as for a PUBLISH's)
        return Refuse(RC.TOPIC_NAME_INVALID, "its will topic exceeds the topic limits")
    if connect.username is None and not settings.allow_anonymous:
        return Refuse(RC.NOT_AUTHORIZED, "no user name, and anonymous clients are refused")
    requested = connect.properties.session_expiry_interval
    if not v5:
        requested = 0 if connect.clean_start else settings.session_expiry_max
    return Admit(client_id, assigned, min(requested or 0, settings.session_expiry_max))


def connect_refused(error: MqttError) -> tuple[ConnAck, int] | None:
    """The CONNACK, and the protocol level to write it at, for a connection that ends
    with ``error`` before its CONNECT was accepted; None to close without one. A CONNECT
    refused as it was decoded (``error.level`` set): 5.0 gets a CONNACK of the error's
    reason code (0x80 for one a CONNACK may not carry), 3.1.1 and 3.1 none
    (MQTT-3.1.4-1) except for an unsupported protocol version (return code 0x01; a
    level it does not know is answered as 5.0: CONNACK 0x84)."""
    level = error.level
    if level is None:
        return None
    if isinstance(error, UnsupportedProtocolVersionError):
        return ConnAck(False, RC.UNSUPPORTED_PROTOCOL_VERSION), (
            MQTT_3_1_1 if level in (MQTT_3_1, MQTT_3_1_1) else MQTT_5
        )
    if level < MQTT_5:
        return None
    code = error.reason_code
    return ConnAck(False, code if code in ALLOWED[ConnAck.type] else RC.UNSPECIFIED_ERROR), MQTT_5


def refusal(connect: Connect, error: Exception) -> int:
    """The CONNACK code for a connect the node refused with ``error``: an invalid id
    0x85, another user's session or a will the publish gate refuses 0x87, a refused
    login 0x86 with a password (else 0x87), anything else (Redis refused or is gone)
    0x88, Server unavailable: the client may retry."""
    if isinstance(error, InvalidIdError):
        return RC.CLIENT_IDENTIFIER_NOT_VALID
    if isinstance(error, SessionUserError) or (
        isinstance(error, NotAuthorizedError) and error.action != "connect"
    ):
        return RC.NOT_AUTHORIZED  # (another user's session, a will the gate refuses)
    if isinstance(error, NotAuthorizedError):
        return RC.BAD_USER_NAME_OR_PASSWORD if connect.password is not None else RC.NOT_AUTHORIZED
    return RC.SERVER_UNAVAILABLE


def connack_properties(
    connect: Connect, settings: MqttSettings, admitted: Admit
) -> tuple[Properties, int]:
    """What a 5.0 CONNACK announces, and the keepalive the connection then keeps: a
    keepalive above ``max_keepalive`` or 0 is cut to it (Server Keep Alive); a Session
    Expiry Interval is announced only when it was cut down."""
    keepalive, announced = connect.keepalive, None
    if settings.max_keepalive and (keepalive > settings.max_keepalive or keepalive == 0):
        keepalive = announced = settings.max_keepalive
    asked = connect.properties.session_expiry_interval
    granted = admitted.expiry if asked is not None and asked != admitted.expiry else None
    properties = Properties(
        assigned_client_identifier=admitted.assigned,
        server_keep_alive=announced,
        session_expiry_interval=granted,
        receive_maximum=settings.receive_maximum,
        maximum_packet_size=settings.max_packet_size,
        topic_alias_maximum=settings.topic_alias_maximum,
    )
    return properties, keepalive


def disconnect(packet: Disconnect, connect: Connect | None, settings: MqttSettings) -> int | None:
    """The Session Expiry Interval after the client's DISCONNECT (None: unchanged);
    :class:`MqttProtocolError` (0x82) for a change from 0 at CONNECT."""
    expiry = packet.properties.session_expiry_interval
    if expiry is None:
        return None
    asked = 0 if connect is None else connect.properties.session_expiry_interval or 0
    if expiry and asked == 0:
        raise MqttProtocolError("a Session Expiry Interval of 0 at CONNECT is final")
    return min(expiry, settings.session_expiry_max)


def disconnect_ends(packet: Disconnect) -> ConnectionEndedError:
    """How a DISCONNECT ends the connection: no DISCONNECT back; the will is dropped only
    for reason 0x00 (0x04 and the others keep it)."""
    return ConnectionEndedError(None, keep_will=packet.reason_code != RC.NORMAL_DISCONNECTION)


#: Reason code of an acknowledgement for a packet id the server does not know.
NOT_FOUND: Final = RC.PACKET_IDENTIFIER_NOT_FOUND


class Acknowledgements:
    """The QoS 1/2 exchange of one session both ways (see the module docstring), over its
    ``inflight`` deliveries and ``awaiting_release`` ids (the session's own collections:
    they move with it). ``v5``: reason codes go out (3.1.1 acknowledgements carry none).
    """

    __slots__ = ("awaiting_release", "inflight", "v5")

    def __init__(
        self,
        inflight: MutableMapping[int, Delivery],
        awaiting_release: MutableSet[int],
        v5: bool,
    ) -> None:
        self.inflight = inflight
        self.awaiting_release = awaiting_release
        self.v5 = v5

    # -- the client's publishes ------------------------------------------------------

    def resent(self, packet: Publish) -> Packet | None:
        """The PUBREC again for a QoS 2 PUBLISH whose id awaits its PUBREL (published
        already: it must not be again); None for a publish to go through."""
        packet_id = packet.packet_id
        if packet.qos == 2 and packet_id is not None and packet_id in self.awaiting_release:
            return PubRec(packet_id)
        return None

    def published(self, packet: Publish, code: int) -> Packet | None:
        """The acknowledgement of a publish the node answered with ``code`` (0x00,
        0x10 no matching subscribers, 0x87 not authorized); a QoS 2 id accepted now
        awaits its PUBREL. None for QoS 0."""
        packet_id = packet.packet_id
        if packet_id is None or packet.qos == 0:
            return None
        sent = code if self.v5 else 0
        if packet.qos == 1:
            return PubAck(packet_id, sent)
        if code < 0x80:
            self.awaiting_release.add(packet_id)
        return PubRec(packet_id, sent)

    def on_pubrel(self, packet: PubRel) -> Packet:
        """PUBCOMP: the QoS 2 exchange of the client's publish ends (0x92 for an id that
        awaited nothing, 3.1.1 included: the encoder drops it)."""
        known = packet.packet_id in self.awaiting_release
        self.awaiting_release.discard(packet.packet_id)
        return PubComp(packet.packet_id, RC.SUCCESS if known else NOT_FOUND)

    # -- deliveries to the client ----------------------------------------------------

    def on_pubrec(self, packet: PubRec) -> list[Action]:
        """The client received a QoS 2 delivery: PUBREL, the delivery kept as released
        (a reconnect resends PUBREL, not the PUBLISH); a PUBREC with an error code ends
        the exchange; 0x92 for an id not in flight."""
        packet_id = packet.packet_id
        sent = self.inflight.get(packet_id)
        if packet.reason_code >= 0x80:
            return [Release(packet_id)]
        if sent is None:
            return [PubRel(packet_id, NOT_FOUND)]
        self.inflight[packet_id] = replace(sent, released=True)
        return [PubRel(packet_id)]

    def on_done(self, packet: PubAck | PubComp) -> list[Action]:
        """PUBACK (QoS 1) or PUBCOMP (QoS 2): the delivery's exchange ends."""
        return [Release(packet.packet_id)]
