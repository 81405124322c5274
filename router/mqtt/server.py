"""The MQTT front end of one node: listeners that move bytes, and the connections on them.

:func:`serve` starts listeners around a running :class:`~router.cluster.node.RouterNode`
(embedded, or the one ``router node run`` starts)::

    async with router.connect(url, node_id="n1") as node:
        async with router.mqtt.serve(node, tcp=["127.0.0.1:1883"]) as server:
            await server.serve_forever()

Each accepted socket becomes an :class:`~router.mqtt.protocol.MqttConnection`; the
server knows which connection holds which client id on this node (a second CONNECT with
the same id closes the first, MQTT-3.1.4-3). Sockets above ``max_connections`` are
closed at accept, before a byte is read (counted: ``mqtt_refused``); the connections it
ends for what a client did are counted by reason (``mqtt_closed_<reason>``: the reason
code's name, or ``connect_timeout``, ``packet_timeout``, ``unfinished_bytes``: the
node's bound on packets begun and not yet whole, :mod:`router.mqtt.unfinished`, whose
bytes are ``mqtt_unfinished_bytes``). The node work of CONNECTs runs ``max_connecting``
at a time (:class:`~router.mqtt.settings.MqttSettings`): those that had to wait for a
turn are counted (``mqtt_connect_waited``), and one whose turn did not come within
``connect_timeout`` of its accept is refused with 0x89 (``mqtt_closed_server_busy``).
Closing the server ends every connection with DISCONNECT 0x8B.

Behind a load balancer (``MqttSettings.proxy_protocol``, ``proxy_trusted``) the client's
address is the one a PROXY header or a forwarded header named (:mod:`router.mqtt.proxy_gate`):
each listener finds it once and gives it to the connection's transport (``peer``), which
bans, the connect rate, logs, traces and the client listings read (counted:
``mqtt_proxy_*``, ``mqtt_forwarded_*``).

TCP and TLS sockets are asyncio protocols (:mod:`router.mqtt.tcp`), WebSocket
connections are pulled (:meth:`MqttServer.run_connection`); either way a connection
holds no task while it is idle (:mod:`router.mqtt.intake`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Final

from router.cluster.node import RouterNode
from router.errors import InvalidSettingError, ListenerError
from router.mqtt.alias_mirror import AliasMirror
from router.mqtt.ban_list import BanList, Flapping, peer_address
from router.mqtt.live_limits import changed
from router.mqtt.outgoing import TopicFields
from router.mqtt.pressure import PressureWatch
from router.mqtt.protocol import MqttConnection
from router.mqtt.proxy_gate import ProxyGate
from router.mqtt.rates import AddressRates
from router.mqtt.reason_codes import ReasonCode
from router.mqtt.settings import BACKLOG, DEFAULT_SETTINGS, MqttSettings
from router.mqtt.sys_topics import SysTopics
from router.mqtt.tcp import stream_factory
from router.mqtt.trace_tap import ClientTap
from router.mqtt.unfinished import Unfinished
from router.mqtt.websocket import DEFAULT_PATH, WebSocketServer, listen_websocket
from router.state.alias_store import RedisAliasTable
from router.state.ban_store import Ban, BanStore

log = logging.getLogger(__name__)

#: The reasons to end a connection (or refuse a CONNECT) that a client can cause, always
#: in the stats (any other appears once it happened): see :meth:`MqttServer.count_close`.
CLOSE_REASONS: Final = (
    "bad_user_name_or_password",
    "client_identifier_not_valid",
    "connect_timeout",
    "keep_alive_timeout",
    "malformed_packet",
    "maximum_connect_time",  # (the credentials expired: a JWT's exp)
    "not_authorized",
    "packet_timeout",  # (0x8D: a packet begun was not whole within packet_timeout)
    "packet_too_large",
    "protocol_error",
    "quota_exceeded",
    "receive_maximum_exceeded",
    "topic_alias_invalid",
    "topic_name_invalid",
    "unfinished_bytes",  # (0x97: past max_unfinished_bytes, the node's unfinished packets)
    "unsupported_protocol_version",
)


def tls_context(
    cert: str, key: str, ca: str | None = None, *, require_client_cert: bool = False
) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or later) for ``cert``/``key`` (PEM files); with
    ``ca``, client certificates are checked against it, and with ``require_client_cert``
    a client without one is refused. Raises :class:`InvalidSettingError` naming the
    file that cannot be used."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as error:
        raise InvalidSettingError(f"TLS certificate {cert} / key {key}: {error}") from None
    if ca is not None:
        try:
            context.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as error:
            raise InvalidSettingError(f"TLS CA file {ca}: {error}") from None
    if require_client_cert:
        if ca is None:
            raise InvalidSettingError("requiring client certificates needs a CA file")
        context.verify_mode = ssl.CERT_REQUIRED
    elif ca is not None:
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); :class:`InvalidSettingError`."""
    host, colon, port = address.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidSettingError(f"a listener address is HOST:PORT, not {address!r}")
    return host, int(port)


class MqttServer:
    """The listeners and connections of one node (see the module docstring)."""

    def __init__(self, node: RouterNode, settings: MqttSettings = DEFAULT_SETTINGS) -> None:
        self.node = node
        self.settings = settings
        self.addresses: list[tuple[str, int]] = []
        self.listeners: list[tuple[str, str, int]] = []  # (scheme: mqtt, mqtts, ws, wss)
        self._servers: list[asyncio.Server] = []
        self._websockets: list[WebSocketServer] = []
        self._connections: set[MqttConnection] = set()
        self._clients: dict[str, MqttConnection] = {}
        #: Turns of the node's CONNECT work (see :class:`MqttSettings` ``max_connecting``).
        self.connecting = asyncio.Semaphore(settings.max_connecting)
        self.connect_waited = 0  # CONNECTs that waited for a turn
        self.draining = False  # (see stop_listening)
        node.add_kicker(self.kick)
        node.tracer.changed.append(self.retap)
        node.liveness.on_cut_off(self.end_all)
        self.accepted = 0
        self.refused = 0
        self.messages_received = 0  # PUBLISH packets from clients
        self.messages_sent = 0  # PUBLISH packets to clients
        self.oversized_dropped = 0  # deliveries above a client's Maximum Packet Size
        self.expired_dropped = 0  # deliveries whose Message Expiry Interval passed
        self.inflight_bytes_waited = 0  # times a client's deliveries waited on its bytes
        self.subscriptions_refused = 0  # past max_subscriptions or max_topic_levels
        self.publish_throttled = 0  # reading paused: a client past its publish rate
        self.connect_rates = AddressRates(settings.max_connect_rate)
        self.connect_rate_refused = 0  # connections closed at accept: their address's rate
        self.pressure = PressureWatch(self, settings.overload_limits())  # (serve() starts it)
        self.topic_fields = TopicFields()  # (the PUBLISH fields of topics, for every client)
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)  # connections ended, by reason
        #: The bytes of packets begun and not yet whole, of every connection (slow loris).
        self.unfinished = Unfinished(settings.max_unfinished_bytes, settings.packet_timeout)
        self.sys_topics = SysTopics(self)  # $SYS/broker/...: started by serve()
        flapping = Flapping(
            settings.flapping_max_connects, settings.flapping_window, settings.flapping_ban
        )
        self.bans = BanList(
            BanStore(node.registry.redis, node.keys),
            node.internal_error,
            flapping,
            self.end_banned,
            node.events,
        )  # (serve() starts it)
        self.ban_disconnects = 0
        #: Behind load balancers: the PROXY headers and forwarded headers believed, counted.
        self.proxy = ProxyGate(settings.proxy_trusted)
        #: The connections' topic aliases, copied to Redis (serve() starts it).
        self.aliases = AliasMirror(
            RedisAliasTable(node.registry.redis, node.keys), node.claim_of, node.internal_error
        )

    # -- the registry of connections -------------------------------------------------------

    def connections(self) -> list[MqttConnection]:
        """Every open connection of the node (a copy)."""
        return list(self._connections)

    def owner(self, client_id: str) -> MqttConnection | None:
        """The connection that holds ``client_id`` on this node, if any."""
        return self._clients.get(client_id)

    def attach(self, connection: MqttConnection) -> None:
        assert connection.client_id is not None
        self._clients[connection.client_id] = connection
        if self.node.tracer.clients:
            self._tap(connection)

    def forget(self, connection: MqttConnection) -> None:
        self._connections.discard(connection)
        client_id = connection.client_id
        if client_id is not None and self._clients.get(client_id) is connection:
            del self._clients[client_id]
        tap = connection.transport.tap
        if tap is not None:
            tap.closed(f"connection ended ({connection.transport.peer})")
            connection.transport.tap = None

    def retap(self) -> None:
        """Tap the connections of the clients traced now, and only those
        (:mod:`router.mqtt.trace_tap`; the tracer calls it when they change)."""
        for connection in self._clients.values():
            self._tap(connection)

    def _tap(self, connection: MqttConnection) -> None:
        client_id = connection.client_id
        specs = None if client_id is None else self.node.tracer.clients.get(client_id)
        transport = connection.transport
        if not specs or client_id is None:
            transport.tap = None
            return
        tap = ClientTap(self.node.tracer, specs, client_id, connection.level)
        if transport.tap is None:
            for spec in specs:
                self.node.tracer.record(
                    spec, "connected", client_id, "", f"connected from {transport.peer}"
                )
        transport.tap = tap

    def count_close(self, reason: int | str) -> None:
        """Count a connection ended (or a CONNECT refused) for ``reason``: a reason code
        (its name, lower case, names the count) or a name such as ``connect_timeout``."""
        name = reason if isinstance(reason, str) else ReasonCode(reason).name.lower()
        self.closed[name] = self.closed.get(name, 0) + 1

    def clients(self) -> list[str]:
        """Client ids connected to this node through MQTT, sorted."""
        return sorted(self._clients)

    def describe_client(self, client_id: str) -> dict[str, object] | None:
        """The client's connection here, for an operator: its peer, protocol level,
        keep alive, deliveries in flight and queued; None when it is not connected here."""
        connection = self._clients.get(client_id)
        if connection is None:
            return None
        session = self.node.sessions.find(client_id)
        return {
            "node": self.node.node_id,
            "peer": connection.transport.peer,
            "protocol_level": connection.level,
            "keepalive": connection.keepalive,
            "inflight": 0 if session is None else len(session.inflight),
            "queued": 0 if session is None else session.pending(),
            "queued_bytes": 0 if session is None else session.queued_bytes,
        }

    def kick(self, client_id: str) -> bool:
        """End the client's connection here with DISCONNECT 0x98 (administrative action);
        its session goes on as after any disconnect. False when it is not connected here."""
        connection = self._clients.get(client_id)
        if connection is None:
            return False
        connection.end(ReasonCode.ADMINISTRATIVE_ACTION)
        return True

    def end_banned(self, bans: list[Ban]) -> None:
        """End the connections that ``bans`` name, by client id, user name or source
        address, with DISCONNECT 0x98 (administrative action; counted as
        ``mqtt_ban_disconnects``). Their sessions go on as after any disconnect."""
        named = {(ban.kind, ban.value) for ban in bans}
        for connection in list(self._connections):
            client_id = connection.client_id
            if client_id is None:
                continue
            session = self.node.sessions.find(client_id)
            user = None if session is None else session.profile[2]
            if (
                ("client", client_id) in named
                or (user is not None and ("user", user) in named)
                or ("address", peer_address(connection.transport.peer)) in named
            ):
                self.ban_disconnects += 1
                log.info("client %s ended: banned", client_id)
                connection.end(ReasonCode.ADMINISTRATIVE_ACTION)

    def end_all(self, code: int = ReasonCode.SERVER_BUSY) -> None:
        """End every connection with DISCONNECT ``code`` (the node lost Redis: its peers
        purge it; a client reconnects, here once it is back or to another node)."""
        for connection in list(self._connections):
            connection.end(code)

    def reconfigure(self, settings: MqttSettings) -> None:
        """Serve with ``settings`` from now on, which differ from the current ones only in
        :data:`~router.mqtt.live_limits.LIVE` limits (that module says when each applies:
        a connection keeps what its CONNACK announced). Raises :class:`InvalidSettingError`,
        changing nothing, for another."""
        changed(self.settings, settings)
        if settings.max_connect_rate != self.settings.max_connect_rate:
            self.connect_rates = AddressRates(settings.max_connect_rate)
        self.pressure.retune(settings.overload_limits())
        self.settings = settings

    # -- listeners -------------------------------------------------------------------------

    async def listen_tcp(self, address: str, tls: ssl.SSLContext | None = None) -> tuple[str, int]:
        """Listen on ``HOST:PORT`` (port 0: any free one), over TLS with a ``tls``
        context (:func:`tls_context`); returns the bound address."""
        host, port = parse_address(address)
        proxied = ("mqtts" if tls else "mqtt") in self.settings.proxy_protocol
        listener_tls = None if proxied else tls  # (behind PROXY: TLS starts after the header)
        handshake = None if listener_tls is None else self.settings.connect_timeout
        try:
            server = await asyncio.get_running_loop().create_server(
                stream_factory(self, proxied=proxied, tls=tls),
                host,
                port,
                ssl=listener_tls,
                ssl_handshake_timeout=handshake,
                backlog=BACKLOG,
            )
        except OSError as error:
            raise ListenerError(f"cannot listen on {address}: {error.strerror or error}") from None
        self._servers.append(server)
        bound = server.sockets[0].getsockname()
        self.addresses.append((bound[0], bound[1]))
        self.listeners.append(("mqtts" if tls else "mqtt", bound[0], bound[1]))
        return bound[0], bound[1]

    def refuses(self) -> bool:
        """True when one more connection would be beyond ``max_connections`` (those
        waiting for their PROXY header count; it is counted as refused: the caller
        closes it); always while the server is draining."""
        pending = len(self._connections) + self.proxy.pending
        if not self.draining and pending < self.settings.max_connections:
            return False
        self.refused += 1
        return True

    def banned_peer(self, peer: object) -> bool:
        """True when ``peer`` (a socket's peer name) is a banned address (counted)."""
        host = peer[0] if isinstance(peer, tuple) and peer else None
        return self.bans.address(host if isinstance(host, str) else None) is not None

    def too_fast(self, peer: object) -> bool:
        """True when ``peer``'s address opens connections beyond ``max_connect_rate`` (it
        is counted as refused: the caller closes it)."""
        host = peer[0] if isinstance(peer, tuple) and peer else None
        if not isinstance(host, str) or self.connect_rates.allows(host):
            return False
        self.refused += 1
        self.connect_rate_refused += 1
        return True

    def admit(self, connection: MqttConnection) -> None:
        """A connection accepted (:meth:`refuses` said no) is served until it ends."""
        self.accepted += 1
        self._connections.add(connection)

    async def run_connection(
        self, connection: MqttConnection, chunks: AsyncIterator[bytes]
    ) -> None:
        """Serve one accepted connection whose bytes are pulled from ``chunks`` (the
        WebSocket listener) until it ends."""
        if self.refuses():
            connection.transport.close()
            return
        self.admit(connection)
        await connection.run(chunks)

    async def listen_websocket(
        self, address: str, path: str = DEFAULT_PATH, tls: ssl.SSLContext | None = None
    ) -> tuple[str, int]:
        """Serve MQTT over WebSocket on ``HOST:PORT`` at ``path`` (wss with ``tls``)."""
        proxied = ("wss" if tls else "ws") in self.settings.proxy_protocol
        host, port, listener = await listen_websocket(
            self, parse_address(address), path, tls, proxied=proxied
        )
        self._websockets.append(listener)
        self.addresses.append((host, port))
        self.listeners.append(("wss" if tls else "ws", host, port))
        return host, port

    async def serve_forever(self) -> None:
        """Wait until the server is closed (or the awaiting task is cancelled)."""
        await asyncio.gather(*(server.serve_forever() for server in self._servers))

    def stop_listening(self) -> None:
        """Accept no connection from now on (the listeners close; open connections go on).
        The server is then ``draining``: its ``/healthz`` says so, so that a load balancer
        sends new clients elsewhere."""
        self.draining = True
        for server in self._servers:
            server.close()
        for listener in self._websockets:
            listener.close()

    def open_connections(self) -> list[MqttConnection]:
        """The connections open now (accepted, whether or not their CONNECT came)."""
        return list(self._connections)

    def holds(self, connection: MqttConnection) -> bool:
        """Whether ``connection`` is still open here."""
        return connection in self._connections

    async def close(self) -> None:
        """Stop listening and end every connection with DISCONNECT 0x8B."""
        log.info("node %s: closing its MQTT listeners", self.node.node_id)
        with contextlib.suppress(ValueError):
            self.node.remove_kicker(self.kick)
        with contextlib.suppress(ValueError):
            self.node.tracer.changed.remove(self.retap)
        self.node.liveness.forget_cut_off(self.end_all)
        await self.sys_topics.stop()
        await self.bans.stop()
        await self.pressure.stop()
        self.stop_listening()
        connections = list(self._connections)
        for connection in connections:
            connection.end(ReasonCode.SERVER_SHUTTING_DOWN)
        if connections:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.connect_timeout):
                    await asyncio.gather(*(c.finished() for c in connections))
        self.unfinished.stop()
        await self.aliases.stop()  # (after the connections: their copies are forgotten)
        for server in self._servers:
            await server.wait_closed()
        for listener in self._websockets:
            await listener.wait_closed()
        self._servers.clear()
        self._websockets.clear()

    def stats(self) -> dict[str, int]:
        """Counters of the MQTT front end."""
        return {
            "mqtt_draining": int(self.draining),
            "mqtt_connections": len(self._connections),
            "mqtt_clients": len(self._clients),
            "mqtt_accepted": self.accepted,
            "mqtt_refused": self.refused,
            "mqtt_connect_waited": self.connect_waited,
            "mqtt_messages_received": self.messages_received,
            "mqtt_messages_sent": self.messages_sent,
            "mqtt_oversized_dropped": self.oversized_dropped,
            "mqtt_expired_dropped": self.expired_dropped,
            "mqtt_inflight_bytes_waited": self.inflight_bytes_waited,
            "mqtt_subscriptions_refused": self.subscriptions_refused,
            "mqtt_publish_throttled": self.publish_throttled,
            "mqtt_banned": self.bans.banned,
            "mqtt_connect_rate_refused": self.connect_rate_refused,
            "mqtt_flapping_banned": self.bans.flapping_banned,
            "mqtt_ban_disconnects": self.ban_disconnects,
            "mqtt_unfinished_packets": len(self.unfinished),
            "mqtt_unfinished_bytes": self.unfinished.held,
            "mqtt_unfinished_bytes_peak": self.unfinished.peak,
            **self.pressure.stats(),
            **{f"mqtt_closed_{name}": count for name, count in self.closed.items()},
            **self.proxy.stats(),
            **self.aliases.stats(),
        }


@asynccontextmanager
async def serve(
    node: RouterNode,
    tcp: Iterable[str] = (),
    settings: MqttSettings = DEFAULT_SETTINGS,
    *,
    tls: Iterable[str] = (),
    tls_context: ssl.SSLContext | None = None,
    websocket: Iterable[str] = (),
    websocket_path: str = DEFAULT_PATH,
    wss: Iterable[str] = (),
) -> AsyncIterator[MqttServer]:
    """Start MQTT listeners around a running node: plain TCP on ``tcp`` addresses
    (``HOST:PORT``), TLS on ``tls`` addresses with ``tls_context``, WebSocket on
    ``websocket`` addresses at ``websocket_path``, WebSocket over TLS (the browsers'
    ``wss://``) on ``wss`` addresses with ``tls_context``; closed (every connection ended
    with 0x8B) on exit. ``server.listeners`` names each: (scheme, host, port)."""
    tls, wss = list(tls), list(wss)
    if (tls or wss) and tls_context is None:
        raise InvalidSettingError("TLS listeners need a certificate and key (tls_context)")
    server = MqttServer(node, settings)
    try:
        for address in tcp:
            await server.listen_tcp(address)
        for address in tls:
            await server.listen_tcp(address, tls_context)
        for address in websocket:
            await server.listen_websocket(address, websocket_path)
        for address in wss:
            await server.listen_websocket(address, websocket_path, tls_context)
        if settings.sys_interval > 0 and server.listeners:
            server.sys_topics.start()
        if server.listeners:
            server.bans.start()
            server.pressure.start()
            server.aliases.start()
        yield server
    finally:
        await server.close()
