"""The limits on what one client sends (MQTT 5.0), without I/O: its topic aliases and
our Receive Maximum.

Topic aliases (3.3.2.3.4), per connection only (MQTT-3.3.2-7):

* alias 0, or above our Topic Alias Maximum: 0x94 Topic Alias invalid;
* a PUBLISH with a topic and an alias binds the alias to it (again: re-maps it), one
  with an empty topic uses the alias (never bound: 0x82 Protocol Error), one with an
  empty topic and no alias is 0x82 (MQTT-3.3.2-1);
* a topic name with a wildcard is 0x90 Topic Name invalid, also when it binds an alias.

A PUBLISH from a client carrying a Subscription Identifier is 0x82 (MQTT-3.3.4-6).

The table holds at most ``topic_alias_maximum`` topics of at most 65535 bytes each: a
client that keeps re-mapping aliases replaces entries, it never adds any.

Receive Maximum (MQTT-3.3.4-7/8): the QoS 1 and QoS 2 PUBLISHes a client sent that we
have not answered with PUBACK or PUBCOMP count against ours, and one more is 0x93
Receive Maximum exceeded. We answer a QoS 1 PUBLISH as we handle it, so between
packets only the QoS 2 flows awaiting PUBREL hold quota (the session's set, which
outlives the connection); a resend of one of them is no new flow. A QoS 1 PUBLISH
when they hold all of it is one too many.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from router.core.aliases import AliasTable
from router.core.messages import Outgoing
from router.errors import InvalidTopicError, MqttProtocolError
from router.mqtt.outgoing import carried_properties, message_expiry
from router.mqtt.packets import Publish
from router.mqtt.properties import NO_PROPERTIES
from router.mqtt.reason_codes import ReasonCode

_OWN = ""  # (the table serves one connection: one client, whatever its id)


class InboundLimits:
    """Topic aliases and the Receive Maximum quota of one connection (see the module
    docstring); every refusal raises :class:`MqttProtocolError` with its reason code."""

    __slots__ = (
        "_aliases",
        "max_length",
        "max_levels",
        "on_change",
        "receive_maximum",
        "topic_alias_maximum",
    )

    def __init__(
        self,
        topic_alias_maximum: int,
        receive_maximum: int,
        max_levels: int = 0xFFFF,
        max_length: int = 0xFFFF,
    ) -> None:
        self.topic_alias_maximum = topic_alias_maximum
        self.receive_maximum = receive_maximum
        self.max_levels = max_levels
        self.max_length = max_length
        self._aliases: AliasTable | None = None  # (made when the client binds an alias)
        #: Called when the client bound an alias anew (:mod:`router.mqtt.alias_mirror`).
        self.on_change: Callable[[], None] | None = None

    def outgoing(
        self, packet: Publish, publisher: str | None, awaiting: Collection[int]
    ) -> Outgoing:
        """The message a QoS 0/1 ``packet`` of ``publisher`` asks for, its alias resolved
        and its quota checked (``awaiting``: as :meth:`check_quota` takes it); raises as
        :meth:`check_quota` and :meth:`topic` do."""
        properties = packet.properties
        if properties is NO_PROPERTIES and packet.topic and not packet.qos:
            # (the common case in line: no alias, no quota, nothing carried)
            self.check_topic(packet.topic)
            return Outgoing(packet.topic, packet.payload, 0, packet.retain, publisher)
        self.check_quota(packet, awaiting)
        return Outgoing(
            self.topic(packet),
            packet.payload,
            packet.qos,
            packet.retain,
            publisher,
            message_expiry(properties),
            carried_properties(properties),
        )

    def check_topic(self, topic: str) -> None:
        """0x90 for a topic of more than ``max_levels`` levels or ``max_length`` characters."""
        if len(topic) > self.max_length or topic.count("/") >= self.max_levels:
            raise MqttProtocolError(
                f"a topic of more than {self.max_levels} levels or {self.max_length} characters",
                ReasonCode.TOPIC_NAME_INVALID,
            )

    def topic(self, packet: Publish) -> str:
        """The topic of ``packet``, its alias resolved (or bound, when it has both), at
        most ``max_levels`` levels deep and ``max_length`` characters long."""
        if packet.properties.subscription_identifiers:  # MQTT-3.3.4-6: the server's to send
            raise MqttProtocolError("a client's PUBLISH carries a Subscription Identifier")
        alias = packet.properties.topic_alias
        if packet.topic:
            self.check_topic(packet.topic)
        if alias is None:
            if not packet.topic:
                raise MqttProtocolError("a PUBLISH with neither a topic name nor a topic alias")
            return packet.topic
        if not 1 <= alias <= self.topic_alias_maximum:
            raise MqttProtocolError(
                f"topic alias {alias} is invalid", ReasonCode.TOPIC_ALIAS_INVALID
            )
        if packet.topic:
            if self._aliases is None:
                self._aliases = AliasTable()
                self._aliases.set_maximum(_OWN, "client", self.topic_alias_maximum)
            if self._aliases.topic(_OWN, "client", alias) == packet.topic:
                return packet.topic  # (bound to it already: nothing changes)
            try:
                self._aliases.bind(_OWN, "client", alias, packet.topic)
            except InvalidTopicError as error:
                raise MqttProtocolError(str(error), ReasonCode.TOPIC_NAME_INVALID) from None
            if self.on_change is not None:
                self.on_change()
            return packet.topic
        topic = None if self._aliases is None else self._aliases.topic(_OWN, "client", alias)
        if topic is None:
            raise MqttProtocolError(f"topic alias {alias} is not bound")
        return topic

    def alias_table(self) -> tuple[int, dict[int, str]]:
        """Our Topic Alias Maximum and a copy of the client's alias -> topic map."""
        bound = {} if self._aliases is None else self._aliases.aliases(_OWN, "client")
        return self.topic_alias_maximum, bound

    def check_quota(self, packet: Publish, awaiting: Collection[int]) -> None:
        """Raise 0x93 if ``packet`` is a QoS 1/2 PUBLISH beyond our Receive Maximum, the
        QoS 2 flows ``awaiting`` PUBREL (their packet ids) holding it."""
        if not packet.qos or (packet.qos == 2 and packet.packet_id in awaiting):
            return
        if len(awaiting) >= self.receive_maximum:
            raise MqttProtocolError("receive maximum exceeded", ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)
