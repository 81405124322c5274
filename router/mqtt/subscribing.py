"""SUBSCRIBE and UNSUBSCRIBE of one MQTT connection: their limits, one reason code per
filter, and the moment from which they apply.

Reason codes, per filter: the granted QoS; 0x97 past ``max_subscriptions`` filters held;
0x8F for an invalid filter, one deeper than ``max_topic_levels`` levels or longer than
``max_topic_length`` characters; 0x87 when the
ACL or a ``client.subscribe`` hook refuses it; 0x80 when its route could not be written
yet (it is kept and written later). A 3.1.1 client gets 0x80 for any failure. A
shared subscription with No Local is a protocol error (MQTT-3.8.3-4). SUBACK goes once
every live node's route mirror holds what was granted (:mod:`router.cluster.visibility`);
UNSUBACK at once (0x11 for a filter that was not held), but never before the SUBACKs of
the SUBSCRIBEs ahead of it.

**From when.** A subscription change applies to every PUBLISH the node *reads* after it,
from any connection, as on mosquitto, not merely to those handled after it: a
publisher's connection still busy with earlier packets may come to a PUBLISH read after
the SUBSCRIBE before the subscriber's connection starts on it. So each SUBSCRIBE and
UNSUBSCRIBE opens a change in the node's
:class:`~router.cluster.visibility.ArrivalOrder` the moment its bytes are read
(:meth:`Subscribing.arrived`), closed once it applied on this node (or failed, or the
connection ended); a publish handled meanwhile waits for the changes opened before it
that can concern its topic (by their filters' first levels: a flood of SUBSCRIBEs under
one prefix holds up no publish elsewhere).
Nothing may make that wait long or circular:

* a connection's own PUBLISH waits only for changes numbered below its own oldest one
  still open (:meth:`Subscribing.arrived_before`): never for its own SUBSCRIBE read
  after it, so every wait points at an earlier change;
* the SUBACK's wait for the other nodes' acks does not hold the connection: the
  subscription applies, its change closes, the connection goes on with its next
  packets, and the SUBACK is written once the acks came (after the answers before it);
* a client throttled for its publish rate lets go of its open changes
  (:meth:`Subscribing.let_go`): its subscriptions then apply when they are handled,
  rather than holding every publisher of the node for as long as it is throttled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from router.cluster.visibility import first_levels
from router.errors import (
    InvalidOptionsError,
    InvalidTopicError,
    MqttProtocolError,
    NotAuthorizedError,
    RouteWriteError,
)
from router.mqtt.connection_host import ConnectionHost
from router.mqtt.packets import Packet, SubAck, Subscribe, UnsubAck, Unsubscribe
from router.mqtt.reason_codes import ReasonCode as RC


class Subscribing:
    """The SUBSCRIBE and UNSUBSCRIBE packets of one attached client: ``write`` sends an
    answer, ``fail`` ends the connection for an error met while an answer waited."""

    __slots__ = (
        "_answering",
        "_arrived",
        "_client_id",
        "_fail",
        "_node",
        "_server",
        "_v5",
        "_write",
    )

    def __init__(
        self,
        server: ConnectionHost,
        client_id: str,
        v5: bool,
        write: Callable[[Packet], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        self._server = server
        self._node = server.node
        self._client_id = client_id
        self._v5 = v5
        self._write = write
        self._fail = fail
        # The changes opened, each with the packet that opened it, in packet order; a
        # list made when needed and dropped when empty (an idle connection holds none).
        self._arrived: list[tuple[Packet, asyncio.Future[None]]] | None = None
        # The last answer waiting to be written (the others before it wait in it).
        self._answering: asyncio.Task[None] | None = None

    def arrived(self, packets: list[Packet]) -> bool:
        """``packets`` were just read: open a change for each SUBSCRIBE and UNSUBSCRIBE;
        True if there was one (its answer waits for the peers)."""
        opened = False
        for packet in packets:
            if isinstance(packet, Subscribe):
                filters = [wanted.topic_filter for wanted in packet.subscriptions]
            elif isinstance(packet, Unsubscribe):
                filters = list(packet.topic_filters)
            else:
                continue
            if self._arrived is None:
                self._arrived = []
            self._arrived.append((packet, self._node.arrivals.open(first_levels(filters))))
            opened = True
        return opened

    def arrived_before(self) -> int | None:
        """What the connection's next PUBLISH waits for: the changes numbered below its
        own oldest one still open (None: every change open, it has none)."""
        arrived = self._arrived
        return self._node.arrivals.number(arrived[0][1]) if arrived else None

    def _applied(self, packet: Packet) -> None:
        """``packet`` is handled: close the change it opened (if it still holds one)."""
        arrived = self._arrived
        if arrived:
            for index, (opened_by, change) in enumerate(arrived):
                if opened_by is packet:
                    del arrived[index]
                    self._node.arrivals.close(change)
                    break
            if not arrived:
                self._arrived = None

    def let_go(self) -> None:
        """Close the changes of packets not handled yet (they apply when handled)."""
        arrived, self._arrived = self._arrived or [], None
        for _packet, change in arrived:
            self._node.arrivals.close(change)

    def close(self) -> None:
        """The connection ends: the changes of packets it will not handle close, and
        answers still waiting are not written."""
        self.let_go()
        if self._answering is not None:
            self._answering.cancel()
            self._answering = None

    async def subscribe(self, packet: Subscribe) -> None:
        """Subscribe each filter; the SUBACK goes once what was granted is in effect
        everywhere (without holding the connection meanwhile)."""
        try:
            codes = await self._subscribe_each(packet)
        finally:
            self._applied(packet)
        granted = any(code < 0x80 for code in codes)
        self._answer(
            SubAck(packet.packet_id, tuple(codes)), self._node.confirm_routes if granted else None
        )

    def _answer(self, packet: Packet, wait: Callable[[], Awaitable[object]] | None) -> None:
        """Write ``packet`` after the answers before it and once ``wait`` returned."""
        before = self._answering
        if before is None and wait is None:
            self._write(packet)
            return
        self._answering = asyncio.get_running_loop().create_task(
            self._answer_later(before, packet, wait)
        )

    async def _answer_later(
        self,
        before: asyncio.Task[None] | None,
        packet: Packet,
        wait: Callable[[], Awaitable[object]] | None,
    ) -> None:
        try:
            if before is not None:
                await before
            if wait is not None:
                await wait()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # (Redis failing meanwhile: the connection ends)
            self._fail(error)
            return
        finally:
            if self._answering is asyncio.current_task():
                self._answering = None
        self._write(packet)

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

    async def unsubscribe(self, packet: Unsubscribe) -> None:
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
            self._applied(packet)
        self._answer(UnsubAck(packet.packet_id, tuple(codes)), None)
