"""Messages as they travel: what a publisher sent, and what one client receives.

A :class:`Message` is one publish as the cluster routes it (it crosses between nodes
packed into an inbox record, see :mod:`router.cluster.inbox`); a :class:`Delivery` is one
client's copy, with the QoS and retain flag that MQTT gives that client's subscription.
:class:`Outgoing` is what a caller hands to ``publish_many`` and :class:`PublishResult`
what a publish did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router.core.topics import TopicName


@dataclass(frozen=True, slots=True)
class MessageProperties:
    """What MQTT 5 lets a publisher attach to a message, which every broker forwards to
    subscribers unaltered and in order [MQTT-3.3.2-17/18]: Payload Format Indicator,
    Content Type, Response Topic, Correlation Data and User Properties (repeatable)."""

    payload_format_indicator: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    user_properties: tuple[tuple[str, str], ...] = ()

    def as_row(self) -> list[Any]:
        """Plain values for a wire format (read back by :meth:`from_row`)."""
        return [
            self.payload_format_indicator,
            self.content_type,
            self.response_topic,
            self.correlation_data,
            [list(pair) for pair in self.user_properties],
        ]

    @classmethod
    def from_row(cls, row: Any) -> MessageProperties:
        """The properties of :meth:`as_row`'s values; ``TypeError``/``ValueError`` if
        they are not such values."""
        indicator, content_type, response_topic, correlation, pairs = row
        return cls(
            None if indicator is None else int(indicator),
            None if content_type is None else str(content_type),
            None if response_topic is None else str(response_topic),
            None if correlation is None else bytes(correlation),
            tuple((str(name), str(value)) for name, value in pairs),
        )


@dataclass(slots=True)
class Message:
    """One publish: ``id`` (16 bytes, unique cluster-wide), ``topic``, ``payload`` bytes,
    ``qos`` 0..2, ``retain``, the publishing client (if any), the monotonic clock
    reading when it was published (for latency measurements on one machine), and when
    it expires (MQTT 5 Message Expiry Interval): wall-clock seconds since the epoch, so
    every node of a cluster whose clocks agree drops it at the same time; None: never.

    Treat it as immutable (:func:`dataclasses.replace` makes a changed one); it is not
    frozen for the reason :class:`Delivery` is not: one is built per publish on the
    publishing node and again per copy on each receiving node."""

    id: bytes
    topic: TopicName  # validated where the publish entered (see router.core.topics)
    payload: bytes
    qos: int = 0
    retain: bool = False
    publisher: str | None = None
    sent_at: float = 0.0
    properties: MessageProperties | None = None
    expires_at: float | None = None


@dataclass(slots=True)
class Delivery:
    """One client's copy of a message; treat it as immutable (:func:`dataclasses.replace`
    makes a changed one). It is not frozen because one is built per copy on the delivery
    path, where a frozen dataclass's ``__init__`` costs four times as much.

    ``qos`` is min(message QoS, the best matching subscription's QoS); ``retain`` is the
    message's flag only where a matching subscription asked for retain-as-published (or
    the copy comes from the retained store); ``subscription_ids`` lists the MQTT 5
    subscription identifiers of the matching subscriptions; ``expiry_interval`` is the
    seconds the message has left (set on copies from the retained store), None for never;
    ``properties`` are the message's MQTT 5 properties, as the publisher sent them;
    ``expires_at`` when a live message expires (wall-clock seconds, see :class:`Message`).

    A persistent session's copy that was sent but not acknowledged when its connection
    ended carries the MQTT ``packet_id`` it was sent with: it goes again with that id and
    DUP set [MQTT-4.4.0-1]; ``released`` says its PUBREC came, so only PUBREL is due.

    Clients whose subscriptions ask for the same copy share one Delivery (see
    :meth:`~router.cluster.sessions.local_sessions.LocalSessions.deliver`), and ``encoded`` is where
    the MQTT layer keeps the QoS 0 PUBLISH it encoded for it, so that one encoding serves
    them all: ``(5.0 or not, bytes)``, never compared, never copied by ``replace``.
    """

    topic: str
    payload: bytes
    qos: int
    retain: bool
    message_id: bytes
    publisher: str | None = None
    subscription_ids: tuple[int, ...] = ()
    sent_at: float = 0.0
    expiry_interval: int | None = None
    properties: MessageProperties | None = None
    expires_at: float | None = None
    packet_id: int | None = None
    released: bool = False
    encoded: tuple[bool, bytes] | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(slots=True)
class Outgoing:
    """One message for :meth:`RouterNode.publish_many` (a request: read once, where it
    is published; not frozen, which would make building one per publish cost more)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    publisher: str | None = None
    expiry_interval: int | None = None  # seconds the message lives (MQTT 5 Message Expiry)
    properties: MessageProperties | None = None


@dataclass(slots=True)
class PublishResult:
    """What a publish did: its message id, the nodes that got a copy (this node included
    when it had an interested client), and the local copies queued and dropped."""

    message_id: bytes
    nodes: list[str]
    local_deliveries: int
    local_drops: int
