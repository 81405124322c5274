"""One MQTT client connection on a node: the protocol between the packets and the node.

Bytes arrive from a listener (TCP, TLS, WebSocket: they only move bytes), packets come
out of a :class:`~router.mqtt.codec.PacketReader`, and each one becomes a call on the
:class:`~router.cluster.node.RouterNode`; deliveries of the node go back as PUBLISH.
What is answered without the node (CONNECT admission and refusals, CONNACK properties,
DISCONNECT, the QoS 1/2 acknowledgements both ways) is decided without I/O in
:mod:`router.mqtt.exchange`; this class does the reading, the node calls and the writing.

The life of a connection:

1. CONNECT must be the first packet and arrive within ``connect_timeout`` (else the
   connection closes). A client id that is empty gets one assigned (5.0, Assigned
   Client Identifier) or is refused (3.1.1 with clean session 0: return code 0x02).
   Credentials go through the node's
   ``client.authenticate`` hooks (refused: 0x86 with a password, else 0x87). A client id
   already connected to this node closes that connection first (0x8E, MQTT-3.1.4-3;
   should it not end within ``connect_timeout``, CONNACK 0x89 and the client retries);
   connected to another node, the node's takeover closes it there.
2. Sessions: a Session Expiry Interval (5.0; capped by ``session_expiry_max`` and then
   announced in CONNACK) or clean session 0 (3.1.1: ``session_expiry_max``) keeps the
   session after the connection, on any node of the cluster
   (:mod:`router.cluster.sessions.keeper`): CONNACK says Session Present, copies that were
   in flight go again with their packet ids and DUP (a released one as PUBREL), and
   inbound QoS 2 ids awaiting PUBREL are remembered. DISCONNECT may change the interval
   (not from 0: 0x82).
3. PUBLISH at QoS 0, 1 and 2: PUBACK / PUBREC go out only once the node has stored
   every remote copy; a QoS 2 message is published once however often it is resent
   before PUBREL (exactly once). Receive Maximum and topic aliases:
   :mod:`router.mqtt.inbound` (0x93, 0x94, 0x82); both alias tables are copied to Redis
   for operators (:mod:`router.mqtt.alias_mirror`). A topic with a wildcard is 0x90; the
   ACL refusing it: PUBACK/PUBREC 0x87 in 5.0, a silent drop in 3.1.1. The QoS 0/1
   packets read at once are published as one batch (``node.publish_each``), each
   judged by the ACL once and answered as it would have been alone.
4. SUBSCRIBE / UNSUBSCRIBE map to the node's, one reason code per filter (granted QoS,
   0x8F invalid filter, 0x87 not authorized, 0x80 in 3.1.1 for any failure). They apply
   to every PUBLISH the node receives after them, and SUBACK goes once every live node's
   route mirror holds the subscription (:mod:`router.cluster.visibility`).
5. Deliveries: at most ``min(max_inflight, client's Receive Maximum)`` QoS 1/2 publishes
   are unacknowledged at once, and at most ``max_inflight_bytes`` of their payloads
   (beyond one); the rest wait in the client's queue on the node. A
   packet above the client's Maximum Packet Size is not sent and is counted, as is a
   message whose Message Expiry Interval passed (the interval sent is what is left).
   Outbound topic aliases, when the client allows them: the first ``topic_alias_maximum``
   topics get one each, sent with the topic once, then alone.
6. The connection ends on DISCONNECT (0x04 keeps the will), on a protocol error (5.0:
   DISCONNECT with its reason code first), after 1.5 x keepalive of silence (0x8D), when
   another connection takes the session over (0x8E), an operator kicks it (0x98), the
   credentials it connected with expire (0xA0, Maximum connect time: the accepting
   decision's ``expires_at``, such as a JWT's ``exp``; counted) or the node stops
   (0x8B). The will is published unless the client sent DISCONNECT 0x00; with a Will
   Delay Interval, only if the client is not back by then (or its session ends first).
7. Every connection the server ends for what the client did (a refusal, a protocol
   error, silence) is counted by reason in the server's stats (``mqtt_closed_*``). A
   client that does not read what it is sent is not read from once ``READ_PAUSE`` bytes
   wait for it, and that is silence (0x8D after 1.5 x keepalive).

How the bytes come in (pushed by TCP and TLS, pulled from a WebSocket), with no task
while the connection is idle: :mod:`router.mqtt.intake`. The connection keeps of its
CONNECT only the will and the Session Expiry Interval asked for (should it have either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace

from router.cluster.node import RouterNode
from router.cluster.sessions.local_sessions import ClientSession
from router.cluster.sessions.resumes import LENT_WHILE_WAITING
from router.core.messages import Outgoing, PublishResult
from router.errors import (
    ConnectionEndedError,
    InvalidIdError,
    InvalidTopicError,
    MqttError,
    MqttProtocolError,
    NotAuthorizedError,
    RouterError,
    SessionOwnershipError,
    SessionStateError,
    StateError,
)
from router.mqtt.codec import encode, encode_puback
from router.mqtt.connect_turns import ConnectTurn
from router.mqtt.connection_host import ConnectionHost, Transport
from router.mqtt.exchange import (
    Acknowledgements,
    Action,
    Refuse,
    Release,
    admit,
    connack_properties,
    connect_refused,
    disconnect,
    disconnect_ends,
    refusal,
)
from router.mqtt.inbound import InboundLimits
from router.mqtt.intake import READ_PAUSE, Intake
from router.mqtt.outgoing import Outbox, PublishEncoder, carried_properties, message_expiry
from router.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
)
from router.mqtt.properties import NO_PROPERTIES, Properties
from router.mqtt.rates import ClientRates
from router.mqtt.reason_codes import ReasonCode
from router.mqtt.settings import MqttSettings
from router.mqtt.subscribing import Subscribing

__all__ = ["READ_PAUSE", "MqttConnection", "Transport"]

log = logging.getLogger(__name__)

RC = ReasonCode


class MqttConnection(Intake):
    """The protocol state of one client connection (see the module docstring); its
    bytes come in through :class:`~router.mqtt.intake.Intake`."""

    __slots__ = (
        "_acks",
        "_caught_up",
        "_disconnect_sent",
        "_expiry",
        "_kept",
        "_limits",
        "_outbox",
        "_rate",
        "_session",
        "_session_expiry",
        "_slowed_until",
        "_subscribing",
        "client_id",
        "keepalive",
        "level",
        "node",
        "settings",
    )

    _limits: InboundLimits  # (these five once the client is attached)
    _session: ClientSession
    _subscribing: Subscribing
    _acks: Acknowledgements
    _outbox: Outbox

    def __init__(self, server: ConnectionHost, transport: Transport) -> None:
        super().__init__(server, transport)
        self.node: RouterNode = server.node
        self.settings: MqttSettings = server.settings
        self.client_id: str | None = None
        self.level = MQTT_5
        self.keepalive = 0
        self._kept: Connect | None = None  # its will and expiry, should it have either
        self._session_expiry = 0
        self._disconnect_sent = False
        self._caught_up = False  # (the route mirror, before the first PUBLISH)
        self._rate: ClientRates | None = None  # (made at the first packet it counts)
        self._slowed_until = 0.0  # (loop time: overload protection, router.mqtt.pressure)
        self._expiry: asyncio.TimerHandle | None = None  # (credentials that expire)

    def slow(self, seconds: float) -> None:
        """Stop reading for ``seconds`` after the packets being handled (the node is
        overloaded and this client is among its heaviest); its SUBSCRIBEs not handled
        yet hold the node's other publishers no longer."""
        self._slowed_until = asyncio.get_running_loop().time() + seconds
        if self.client_id is not None:
            self._subscribing.let_go()

    # -- the connection's life -----------------------------------------------------------

    async def _handle_packets(self, packets: list[Packet]) -> None:
        if self.client_id is None:  # (the first packets: the CONNECT, and what came with it)
            connect = packets[0]
            if type(connect) is not Connect:
                raise MqttProtocolError("the first packet must be CONNECT")
            if not await self._accept(connect):
                raise ConnectionEndedError(None)
            packets = packets[1:]
        await self._handle_all(packets)

    def _arrived(self, packets: list[Packet]) -> None:
        tap = self.transport.tap
        if tap is not None:
            tap.inbound(packets)
        if self.client_id is not None and self._subscribing.arrived(packets):
            self.transport.acknowledge()  # (the answer waits: the client's next packet need not)

    async def _conclude(self, reason: BaseException) -> None:
        """Answer why the connection ends; never raises for anything the client did."""
        if self._expiry is not None:
            self._expiry.cancel()
        if self.client_id is not None:
            self._subscribing.close()
        keep_will = True
        if isinstance(reason, ConnectionEndedError):
            keep_will = reason.keep_will
            self._send_disconnect(reason.disconnect_code)
        elif isinstance(reason, MqttError):  # (what the client sent: counted, told, logged)
            self.server.count_close(reason.reason_code)
            log.info(
                "closing MQTT client %s (%s): 0x%02x %s",
                self.client_id,
                self.transport.peer,
                reason.reason_code,
                reason,
            )
            if self.client_id is None:
                refused = connect_refused(reason)
                if refused is not None:
                    self.transport.write(encode(*refused))
            else:
                self._send_disconnect(reason.reason_code)
        elif isinstance(reason, StateError):  # (Redis refused or is gone: no ack)
            log.warning("closing MQTT client %s: %s", self.client_id, reason)
            self._send_disconnect(RC.SERVER_BUSY)
        elif isinstance(reason, Exception) and not isinstance(reason, ConnectionError):
            log.error("MQTT client %s failed", self.client_id, exc_info=reason)
        await self._finish(keep_will)

    async def _finish(self, keep_will: bool) -> None:
        client_id = self.client_id
        try:
            if client_id is not None:
                self.server.aliases.closed(client_id, self._limits)
                await self._outbox.stop()
                will, delay = self._will() if keep_will else (None, 0)
                if self.node.serves(client_id):
                    await self.node.put_away(
                        client_id, expiry=self._session_expiry, will=will, will_delay=delay
                    )
                elif will is not None and (not delay or self._session_ended()):
                    await self.node.publish(
                        will.topic,
                        will.payload,
                        qos=will.qos,
                        retain=will.retain,
                        publisher=client_id,
                        expiry_interval=will.expiry_interval,
                        properties=will.properties,
                    )
        except SessionStateError as error:  # (a defect of the node, not of the client)
            self.node.internal_error("closing an MQTT connection", error)
        except (RouterError, ConnectionError) as error:  # (the session stays)
            log.warning("closing MQTT client %s: %s", client_id, error)
        finally:
            self.server.forget(self)
            self.transport.close()

    def _session_ended(self) -> bool:
        """Whether a takeover ended the connection's session (a clean start, or an
        interval of 0, took it over elsewhere): its will goes whatever its delay
        [MQTT-3.1.3-9]; a session that goes on elsewhere drops a delayed one."""
        return self._session.close_reason == "takenover_ended"

    def _will(self) -> tuple[Outgoing | None, int]:
        """The connection's will as a message, and its delay in seconds."""
        kept = self._kept
        if kept is None or kept.will is None:
            return None, 0
        will = kept.will
        outgoing = Outgoing(
            will.topic,
            will.payload,
            will.qos,
            will.retain,
            self.client_id,
            message_expiry(will.properties),
            carried_properties(will.properties),
        )
        return outgoing, will.properties.will_delay_interval or 0

    @property
    def persistent(self) -> bool:
        """Whether the client's session outlives this connection (Session Expiry > 0)."""
        return self.client_id is not None and self._session_expiry > 0

    def end(self, code: int, reference: str | None = None) -> None:
        """Close from outside (takeover on this node, node shutdown, a drain): DISCONNECT
        ``code``, with ``reference`` as its Server Reference (0x9C: the server to use)."""
        self._send_disconnect(code, reference)
        self.transport.close()
        self._end_with(ConnectionEndedError(code))

    # -- CONNECT -------------------------------------------------------------------------

    async def _accept(self, connect: Connect) -> bool:
        """Answer the CONNECT; True when the client is attached to the node."""
        self.level = connect.protocol_level
        self.reader.level = self.level
        if connect.will is not None or connect.properties.session_expiry_interval:
            self._kept = replace(connect, username=None, password=None)  # (no credentials)
        v5 = self.level >= MQTT_5
        admitted = admit(connect, self.settings, lambda: f"auto-{uuid.uuid4().hex}")
        if isinstance(admitted, Refuse):
            return self._refuse(admitted.code, connect.client_id, admitted.why)
        client_id = admitted.client_id
        if self.server.bans.connect(client_id, connect.username) is not None:
            return self._refuse(RC.BANNED, client_id, "banned")  # (before authentication)
        try:  # (before anything changes: no takeover, no session cleared, no will)
            accepted = await self.node.admit_connect(
                client_id,
                connect.username,
                connect.password,
                will_topic=None if connect.will is None else connect.will.topic,
            )
        except (InvalidIdError, NotAuthorizedError) as error:
            return self._refuse(refusal(connect, error), client_id, error)
        self._session_expiry = admitted.expiry
        present = await self._admitted(connect, client_id)
        if present is None:
            return False
        self.keepalive = connect.keepalive
        self._session = self.node.sessions.session(client_id)
        self._acks = Acknowledgements(self._session.inflight, self._session.awaiting_release, v5)
        self._subscribing = Subscribing(self.server, client_id, v5, self._write, self._end_with)
        settings = self.settings
        self._limits = InboundLimits(
            settings.topic_alias_maximum,
            settings.receive_maximum,
            settings.max_topic_levels,
            settings.max_topic_length,
        )
        asked = connect.properties
        window = min(self.settings.max_inflight, asked.receive_maximum or 0xFFFF)
        encoder = PublishEncoder(
            self.level,
            min(asked.topic_alias_maximum or 0, settings.topic_alias_maximum),
            self.server.topic_fields,
        )
        self.server.aliases.opened(client_id, self._limits, encoder, resumed=present)
        self._outbox = Outbox(
            self._session,
            self.transport,
            self.server,
            encoder,
            window,
            settings.max_inflight_bytes,
            asked.maximum_packet_size or 0,
            self._deliveries_ended,
        )
        properties = NO_PROPERTIES
        if v5:
            properties, self.keepalive = connack_properties(connect, self.settings, admitted)
        elif settings.max_keepalive and not 0 < self.keepalive <= settings.max_keepalive:
            self.keepalive = settings.max_keepalive  # (held to it: 3.1.1 cannot be told)
        self._write(ConnAck(present, RC.SUCCESS, properties))
        self._watch_silence(self.keepalive)
        self._outbox.start()
        if accepted.expires_at is not None:
            loop = asyncio.get_running_loop()
            left = max(0.0, accepted.expires_at - time.time())  # (wall clock to loop time)
            self._expiry = loop.call_at(loop.time() + left, self._credentials_expired)
        return True

    async def _admitted(self, connect: Connect, client_id: str) -> bool | None:
        """Take the client id over from its connection on this node, if any (DISCONNECT
        0x8E, MQTT-3.1.4-3), connect it to the node and attach this connection; returns
        Session Present, None when refused (the CONNACK written). CONNECTs of one client
        id are admitted one at a time (:meth:`RouterNode.admitting`): a second one waits
        until the first is attached, at most until ``connect_timeout`` after its accept
        (then 0x89, the client may retry), then takes it over. Nothing is awaited between
        the attach and the CONNACK, so that takeover's DISCONNECT comes after it."""
        admission = contextlib.AsyncExitStack()
        try:
            async with asyncio.timeout_at(self._opened_at + self.settings.connect_timeout):
                await admission.enter_async_context(self.node.admitting(client_id))
        except TimeoutError:
            self._refuse(RC.SERVER_BUSY, client_id, "another CONNECT of its id is under way")
            return None
        async with admission:
            previous = self.server.owner(client_id)
            if previous is not None:
                previous.end(RC.SESSION_TAKEN_OVER)
                try:
                    async with asyncio.timeout(self.settings.connect_timeout):
                        await previous.finished()
                except TimeoutError:  # (the old one is still letting go: the client may retry)
                    self._refuse(RC.SERVER_BUSY, client_id, "its old connection is letting go")
                    return None
            taken = self.node.sessions.find(client_id) if previous is not None else None
            takeovers = 0 if taken is None else taken.takeovers + 1  # (a clean start: anew)
            present = await self._connect_node(connect, client_id, previous is None)
            if present is not None:
                self.client_id = client_id
                self.server.attach(self)
                if previous is not None:
                    session = self.node.sessions.find(client_id)
                    if session is not None:
                        session.takeovers = max(takeovers, session.takeovers + 1)
            return present

    def _credentials_expired(self) -> None:
        """The credentials of the CONNECT expired: DISCONNECT 0xA0 (3.1.1: closed); the
        will goes, as for any end the client did not ask for."""
        self._expiry = None
        if self._reason is None:
            self.server.count_close(RC.MAXIMUM_CONNECT_TIME)
            self._end_with(ConnectionEndedError(RC.MAXIMUM_CONNECT_TIME))

    async def _connect_node(self, connect: Connect, client_id: str, alone: bool) -> bool | None:
        """The node's connect of ``client_id`` (Session Present), once a turn comes: the
        node's CONNECTs at once are bounded, a wait for one by ``connect_timeout`` from
        accept (then 0x89, as when the node refuses: None, the CONNACK written). A step
        of the client's session under way (its adoption, say) is waited for first,
        without a turn, and a resume lends its turn out while it waits for another
        node's handoff (:mod:`router.mqtt.connect_turns`): turns go to the CONNECTs that
        can use them."""
        if not await self.server.pressure.admit(self._opened_at + self.settings.connect_timeout):
            self._refuse(RC.SERVER_BUSY, client_id, "the node is overloaded")
            return None
        turn = ConnectTurn(self.server.connecting)
        if turn.turns.locked() or self.node.settling(client_id):
            self.server.connect_waited += 1
            try:
                async with asyncio.timeout_at(self._opened_at + self.settings.connect_timeout):
                    await self.node.settled(client_id)  # (an adoption, say: without a turn)
                    await turn.take()
            except TimeoutError:  # (the client may retry)
                turn.give_back()
                self._refuse(RC.SERVER_BUSY, client_id, "no turn to connect in time")
                return None
        else:
            await turn.take()  # (a turn is free: taken at once, no timer)
        lending = LENT_WHILE_WAITING.set(turn.lent)  # (a resume's wait for another node)
        try:
            if connect.clean_start and alone and self.node.serves(client_id):
                await self.node.disconnect(client_id)  # a clean start drops a local session
            return await self.node.connect(
                client_id,
                connect.username,
                connect.password,
                clean_start=connect.clean_start,
                expiry=self._session_expiry,
                protocol=self.level,
                keepalive=connect.keepalive,
                authenticate=False,  # (admitted already)
            )
        except (InvalidIdError, NotAuthorizedError) as error:
            self._refuse(refusal(connect, error), client_id, error)
            return None
        except SessionOwnershipError:  # (a CONNECT on another node claimed it meanwhile)
            await self._taken_over_at_once(client_id)
            return None
        except StateError as error:  # (Redis refused or is gone)
            self._refuse(refusal(connect, error), client_id, error, logging.WARNING)
            return None
        finally:
            LENT_WHILE_WAITING.reset(lending)
            turn.give_back()

    async def _taken_over_at_once(self, client_id: str) -> None:
        """The CONNECT was accepted and its session taken over by a newer CONNECT of the
        client on another node before the CONNACK went: CONNACK 0 and (5.0) DISCONNECT
        0x8E, and its will if it has no delay, as for a takeover that comes after it (the
        newer one's node goes on with the session, handed on by this node)."""
        log.info("MQTT client %s was taken over while it connected", client_id)
        self._write(ConnAck(False, RC.SUCCESS))
        if self.level >= MQTT_5:
            self._write(Disconnect(RC.SESSION_TAKEN_OVER))
        will, delay = self._will()
        if will is not None and not delay:
            will.publisher = client_id
            try:
                await self.node.publish_many([will])
            except RouterError as error:
                log.warning("the will of MQTT client %s was not published: %s", client_id, error)

    def _refuse(self, code: int, client_id: str, why: object, level: int = logging.INFO) -> bool:
        """CONNACK ``code``: counted, and logged once with the client id and ``why``."""
        log.log(
            level,
            "refusing MQTT client %s (%s): CONNACK 0x%02x %s",
            client_id or "(no id)",
            self.transport.peer,
            code,
            why,
        )
        self.server.count_close(code)
        self._write(ConnAck(False, code))
        return False

    # -- packets from the client -----------------------------------------------------------

    async def _handle_all(self, packets: list[Packet]) -> None:
        """Handle packets in order; a run of QoS 0/1 PUBLISH packets is published as one
        batch (one inbox write per node, one write of their acknowledgements)."""
        self._count_rates(packets)
        self._session.active_at = time.time()  # (a packet in: its last activity)
        if not self._caught_up and any(type(packet) is Publish for packet in packets):
            self._caught_up = True  # (a new publisher sees what was subscribed before it)
            await self.node.catch_up_routes()
        run: list[Publish] = []
        for packet in packets:
            if type(packet) is Publish and packet.qos < 2:
                run.append(packet)
                continue
            if run:
                await self._on_publishes(run)
                run = []
            await self._handle(packet)
        if run:
            await self._on_publishes(run)

    def _count_rates(self, packets: list[Packet]) -> None:
        """Take what ``packets`` publish and subscribe from the client's rates
        (:mod:`router.mqtt.rates`)."""
        settings = self.settings
        if not (
            settings.max_publish_rate
            or settings.max_publish_bytes_rate
            or settings.max_subscribe_rate
        ):
            return
        published = size = filters = 0
        for packet in packets:
            if isinstance(packet, Publish):
                published += 1
                size += len(packet.payload)
            elif isinstance(packet, Subscribe):
                filters += len(packet.subscriptions)
            elif isinstance(packet, Unsubscribe):
                filters += len(packet.topic_filters)
        if published or filters:
            if self._rate is None:
                self._rate = ClientRates(
                    settings.max_publish_rate,
                    settings.max_publish_bytes_rate,
                    settings.max_subscribe_rate,
                )
            self._rate.published(published, size)
            self._rate.subscribed(filters)

    def _throttle(self) -> float:
        wait = 0.0 if self._rate is None else self._rate.wait()
        if self._slowed_until:
            wait = max(wait, self._slowed_until - asyncio.get_running_loop().time())
            self._slowed_until = 0.0
        if wait > 0 and self.client_id is not None:
            self._subscribing.let_go()  # (a throttled client holds up no publisher)
        return wait

    async def _handle(self, packet: Packet) -> None:
        kind = type(packet)
        if kind is Publish:
            assert isinstance(packet, Publish)
            await self._on_publish(packet)
        elif kind is PubAck or kind is PubComp:
            assert isinstance(packet, PubAck | PubComp)
            self._act(self._acks.on_done(packet))
        elif kind is PubRec:
            assert isinstance(packet, PubRec)
            self._act(self._acks.on_pubrec(packet))
        elif kind is PubRel:
            assert isinstance(packet, PubRel)
            self._write(self._acks.on_pubrel(packet))
        elif kind is Subscribe:
            assert isinstance(packet, Subscribe)
            await self._subscribing.subscribe(packet)
        elif kind is Unsubscribe:
            assert isinstance(packet, Unsubscribe)
            await self._subscribing.unsubscribe(packet)
        elif kind is PingReq:
            self._write(PingResp())
        elif kind is Disconnect:
            assert isinstance(packet, Disconnect)
            self._on_disconnect(packet)
        elif kind is Connect:
            raise MqttProtocolError("a second CONNECT")
        else:
            raise MqttProtocolError(f"a client may not send {kind.__name__}")

    def _on_disconnect(self, packet: Disconnect) -> None:
        expiry = disconnect(packet, self._kept, self.settings)
        if expiry is not None:
            self._session_expiry = expiry
        raise disconnect_ends(packet)

    def _act(self, actions: list[Action]) -> None:
        for action in actions:
            if type(action) is Release:
                self._outbox.release(action.packet_id)
            else:
                assert not isinstance(action, Release)
                self._write(action)

    async def _on_publishes(self, packets: list[Publish]) -> None:
        """Publish QoS 0/1 packets as one batch, each judged by the ACL alone (denied:
        0x87 as :meth:`_on_publish` answers it); should the batch be refused as a whole
        (an invalid topic, found before any hook runs), one at a time instead, so that
        each packet gets exactly what it would have got alone."""
        if len(packets) == 1:
            await self._on_publish(packets[0])
            return
        items: list[Outgoing] = []
        error: MqttError | None = None
        awaiting = self._session.awaiting_release
        for packet in packets:
            try:
                items.append(self._limits.outgoing(packet, self.client_id, awaiting))
            except MqttError as refused:
                error = refused  # (the packets before it still go)
                break
        try:
            results = await self.node.publish_each(items, self._subscribing.arrived_before())
        except InvalidTopicError:
            for packet, item in zip(packets, items, strict=False):
                await self._on_publish(packet, item.topic)
        else:
            self.server.messages_received += len(items)
            session = self._session
            session.received += len(items)
            session.received_bytes += sum(len(item.payload) for item in items)
            v5 = self.level >= MQTT_5
            acks = [
                encode_puback(p.packet_id, _code(v5, r), v5)
                for p, r in zip(packets, results, strict=False)
                if p.qos == 1 and p.packet_id is not None
            ]
            if acks:
                self.transport.write(b"".join(acks))
        if error is not None:
            raise error

    async def _on_publish(self, packet: Publish, resolved: str | None = None) -> None:
        """Publish one packet; ``resolved``: its topic, its alias resolved already."""
        self.server.messages_received += 1
        self._session.received += 1
        self._session.received_bytes += len(packet.payload)
        v5 = self.level >= MQTT_5
        qos = packet.qos
        if resolved is None:
            self._limits.check_quota(packet, self._session.awaiting_release)
        topic = self._limits.topic(packet) if resolved is None else resolved
        again = self._acks.resent(packet)
        if again is not None:  # (published already)
            self._write(again)
            return
        expiry = message_expiry(packet.properties)
        code = RC.SUCCESS
        try:
            result = await self.node.publish(
                topic,
                packet.payload,
                qos=qos,
                retain=packet.retain,
                publisher=self.client_id,
                expiry_interval=expiry,
                properties=carried_properties(packet.properties),
                arrived_before=self._subscribing.arrived_before(),
            )
            if v5 and not result.nodes:
                code = RC.NO_MATCHING_SUBSCRIBERS
        except InvalidTopicError:
            raise MqttProtocolError(
                f"invalid topic name {topic!r}", RC.TOPIC_NAME_INVALID
            ) from None
        except NotAuthorizedError:
            code = RC.NOT_AUTHORIZED
        ack = self._acks.published(packet, code)
        if ack is not None:
            self._write(ack)

    # -- deliveries to the client ----------------------------------------------------------

    def _deliveries_ended(self, error: Exception | None) -> None:
        """The session was closed by the node (taken over elsewhere, node stopping), or
        sending failed: the connection ends (unless it is ending already). A socket reset
        before asyncio told the connection (its drain raised) ends it as lost: no
        DISCONNECT, the will goes, nothing logged."""
        expected = error is None or isinstance(error, RouterError | ConnectionError)
        if not expected:
            log.error("deliveries to MQTT client %s failed", self.client_id, exc_info=error)
        if self._reason is not None:
            return
        if isinstance(error, ConnectionError):  # (the client is gone: its socket was reset)
            self._end_with(ConnectionEndedError(None))
            return
        if error is not None and expected:
            log.warning("deliveries to MQTT client %s ended: %s", self.client_id, error)
        reason = self._session.close_reason
        running = self.node.running and reason != "node_stopped"
        self.end(RC.SESSION_TAKEN_OVER if running else RC.SERVER_SHUTTING_DOWN)

    # -- writing -----------------------------------------------------------------------------

    def _write(self, packet: Packet) -> None:
        self.transport.write(encode(packet, self.level))

    def _send_disconnect(self, code: int | None, reference: str | None = None) -> None:
        """DISCONNECT with ``code`` (and a Server Reference) to a 5.0 client that got its
        CONNACK (3.1.1: none)."""
        if code is None or self.level < MQTT_5 or self.client_id is None:
            return
        if self._disconnect_sent:
            return
        self._disconnect_sent = True
        told = NO_PROPERTIES if reference is None else Properties(server_reference=reference)
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._write(Disconnect(code, told))


def _code(v5: bool, result: PublishResult | NotAuthorizedError) -> int:
    """The PUBACK reason code of a publish: 0x87 in 5.0 when it was denied, 0x10 when
    nobody subscribed (3.1.1: 0x00 for both, as :meth:`Acknowledgements.published` answers)."""
    if not v5:
        return RC.SUCCESS
    if isinstance(result, NotAuthorizedError):
        return RC.NOT_AUTHORIZED
    return RC.SUCCESS if result.nodes else RC.NO_MATCHING_SUBSCRIBERS
