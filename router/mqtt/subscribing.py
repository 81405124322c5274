"""SUBSCRIBE and UNSUBSCRIBE of one MQTT connection: their limits, one reason code per
filter, and the moment from which they apply.

Reason codes, per filter: the granted QoS; 0x97 past ``max_subscriptions`` filters held;
0x8F for an invalid filter, one deeper than ``max_topic_levels`` levels or longer than
``max_topic_length`` characters; 0x87 when the
ACL or a ``client.subscribe`` hook refuses it; 0x80 when its route could not be written
yet (it is kept and written later). A 3.1.1 client gets 0x80 for any failure. A
shared subscription with No Local is a protocol error (MQTT-3.8.3-4). SUBACK goes once
every live node's route mirror holds what was granted (:mod:`router.cluster.visibility`);
UNSUBACK at once (0x11 for a filter that was not held).

**From when.** A subscription change applies to every PUBLISH the node *reads* after it,
from any connection, as on mosquitto, not merely to those handled after it: a
publisher's connection still busy with earlier packets may come to a PUBLISH read after
the SUBSCRIBE before the subscriber's connection starts on it. So when a connection
that was idle reads SUBSCRIBE or UNSUBSCRIBE packets, each opens a change in the node's
:class:`~router.cluster.visibility.ArrivalOrder` at once (:meth:`Subscribing.arrived`),
closed once it applied (or failed, or the connection ended); a publish handled
meanwhile waits for it. Two bounds keep that from ever waiting on itself:

* only the packets ahead of the first PUBLISH in what was read open one (a
  connection's PUBLISH must not wait for its own SUBSCRIBE that comes after it);
* only on an idle connection: a busy one's packets wait behind its earlier packets,
  which may be publishes waiting for changes, and a client throttled for its publish
  rate would hold every publisher of the node. A busy connection's SUBSCRIBE opens its
  change when it is handled (:meth:`RouterNode.subscribe
  <router.cluster.node.RouterNode.subscribe>`), as every embedding caller's does.
"""

from __future__ import annotations

import asyncio

from router.errors import (
    InvalidOptionsError,
    InvalidTopicError,
    MqttProtocolError,
    NotAuthorizedError,
    RouteWriteError,
)
from router.mqtt.connection_host import ConnectionHost
from router.mqtt.packets import Packet, Publish, SubAck, Subscribe, UnsubAck, Unsubscribe
from router.mqtt.reason_codes import ReasonCode as RC


class Subscribing:
    """The SUBSCRIBE and UNSUBSCRIBE packets of one attached client."""

    __slots__ = ("_arrived", "_client_id", "_node", "_server", "_v5")

    def __init__(self, server: ConnectionHost, client_id: str, v5: bool) -> None:
        self._server = server
        self._node = server.node
        self._client_id = client_id
        self._v5 = v5
        # The changes opened, in packet order; a list made when needed and dropped when
        # empty (an idle connection holds none).
        self._arrived: list[asyncio.Future[None]] | None = None

    def arrived(self, packets: list[Packet]) -> None:
        """``packets`` were read while the connection was idle: open a change for each
        SUBSCRIBE and UNSUBSCRIBE ahead of the first PUBLISH among them."""
        for packet in packets:
            kind = type(packet)
            if kind is Publish:
                return
            if kind is Subscribe or kind is Unsubscribe:
                if self._arrived is None:
                    self._arrived = []
                self._arrived.append(self._node.arrivals.open())

    def _applied(self) -> None:
        """The oldest packet that opened a change is handled: close its change."""
        arrived = self._arrived
        if arrived:
            self._node.arrivals.close(arrived.pop(0))
            if not arrived:
                self._arrived = None

    def close(self) -> None:
        """The connection ends: the changes of packets it will not handle close."""
        arrived, self._arrived = self._arrived or [], None
        for change in arrived:
            self._node.arrivals.close(change)

    async def subscribe(self, packet: Subscribe) -> SubAck:
        """Subscribe each filter; the SUBACK once what was granted is in effect everywhere."""
        try:
            codes = await self._subscribe_each(packet)
        finally:
            self._applied()
        if any(code < 0x80 for code in codes):
            await self._node.confirm_routes()
        return SubAck(packet.packet_id, tuple(codes))

    async def _subscribe_each(self, packet: Subscribe) -> list[int]:
        v5, server, node, client_id = self._v5, self._server, self._node, self._client_id
        identifiers = packet.properties.subscription_identifiers
        identifier = identifiers[0] if identifiers else None
        codes: list[int] = []
        held: set[str] = set(node.sessions.trie.subscriptions(client_id))
        settings = server.settings
        limit, levels, length = (
            settings.max_subscriptions,
            settings.max_topic_levels,
            settings.max_topic_length,
        )
        for sub in packet.subscriptions:
            new = sub.topic_filter not in held
            if new and limit and len(held) >= limit:
                server.subscriptions_refused += 1
                codes.append(RC.QUOTA_EXCEEDED if v5 else RC.UNSPECIFIED_ERROR)
                continue
            if sub.topic_filter.count("/") >= levels or len(sub.topic_filter) > length:
                server.subscriptions_refused += 1
                codes.append(RC.TOPIC_FILTER_INVALID if v5 else RC.UNSPECIFIED_ERROR)
                continue
            try:
                await node.subscribe(
                    client_id,
                    sub.topic_filter,
                    confirm=False,
                    qos=sub.qos,
                    no_local=sub.no_local,
                    retain_as_published=sub.retain_as_published,
                    retain_handling=sub.retain_handling,
                    subscription_identifier=identifier,
                )
                codes.append(sub.qos)
                held.add(sub.topic_filter)
            except InvalidTopicError:
                codes.append(RC.TOPIC_FILTER_INVALID if v5 else RC.UNSPECIFIED_ERROR)
            except InvalidOptionsError:
                raise MqttProtocolError("no local on a shared subscription") from None
            except NotAuthorizedError:
                codes.append(RC.NOT_AUTHORIZED if v5 else RC.UNSPECIFIED_ERROR)
            except RouteWriteError:  # (kept and written later: a repeat is harmless)
                codes.append(RC.UNSPECIFIED_ERROR)
        return codes

    async def unsubscribe(self, packet: Unsubscribe) -> UnsubAck:
        """Remove each filter; in effect on this node once the UNSUBACK goes."""
        codes = []
        try:
            for topic_filter in packet.topic_filters:
                try:
                    existed = await self._node.unsubscribe(self._client_id, topic_filter)
                    codes.append(RC.SUCCESS if existed else RC.NO_SUBSCRIPTION_EXISTED)
                except InvalidTopicError:
                    codes.append(RC.TOPIC_FILTER_INVALID)
        finally:
            self._applied()
        return UnsubAck(packet.packet_id, tuple(codes))
