"""The limits of a node's MQTT listeners: :class:`MqttSettings`, with a default for each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from router.core.trusted_proxies import TrustedProxies
from router.errors import InvalidSettingError
from router.mqtt.codec import MAX_PACKET_SIZE
from router.mqtt.overload import OverloadLimits
from router.mqtt.properties import PropertyLimits

PROXIED_LISTENERS: Final = frozenset({"mqtt", "mqtts", "ws", "wss"})
"""The listeners that can read a PROXY protocol header (by scheme): plain TCP, TLS (the
header comes before the TLS handshake), WebSocket (before the HTTP upgrade) and
WebSocket over TLS (before the TLS handshake)."""

NO_PROXIES: Final = TrustedProxies()

BACKLOG: Final = 4096
"""Connections the kernel completes on a listener before the node accepts them
(asyncio's default is 100): the SYNs of a burst beyond it are dropped, and every client
in it, well-behaved ones included, waits a second or more for the retransmission. The
clients of a dead node come back by the thousand at once (the kernel caps it at
``net.core.somaxconn``, 4096 here)."""


@dataclass(frozen=True)
class MqttSettings:
    """How the listeners of one node treat their clients (times in seconds).

    ``max_connections``: connections at once (those still waiting for their CONNECT
    included); more are closed right after accept, before a byte is read, so a flood
    costs the node no buffer. ``connect_timeout``: a CONNECT must arrive this soon
    after accept (else the connection closes). ``max_packet_size``: the largest packet
    a client may send (0x95 above it, judged from the fixed header: nothing of it is
    buffered), announced in CONNACK. ``receive_maximum``: QoS 1/2 publishes a client may
    have unanswered (0x93 above it; :mod:`router.mqtt.inbound`). ``max_keepalive``: a
    larger keepalive, or 0, is cut down and announced as Server Keep Alive (0: no cap);
    a 3.1.1 client, which cannot be told, is held to it all the same (closed after 1.5 x
    ``max_keepalive`` of silence). ``topic_alias_maximum``: topic aliases a client may
    use towards the node, and the most the node uses towards a client (whatever larger
    Topic Alias Maximum the client announced). ``max_inflight``:
    QoS 1/2 deliveries unacknowledged by a client, at most (and at most the client's
    Receive Maximum); further ones wait in the client's queue. ``max_inflight_bytes``: the
    payload bytes of those deliveries, at most (0: no limit); a delivery that would
    take them above it waits in the client's queue too, unless none is unacknowledged
    (a single larger message still goes). ``allow_anonymous``: a
    client without a user name may connect. ``sys_interval``: seconds between updates of
    the ``$SYS/broker/...`` topics (:mod:`router.mqtt.sys_topics`; 0: none published).
    ``session_expiry_max``: the longest Session Expiry Interval granted (a longer one is
    cut down and announced in CONNACK); also what a 3.1.1 client with clean session 0
    gets, whose session the specification never ends. ``max_connecting``: CONNECTs whose
    node work (session claim, Redis reads and writes) runs at once; the others wait
    their turn, at most until ``connect_timeout`` after their accept (then CONNACK 0x89
    Server busy, 3.1.1: 3 server unavailable), so that a burst of clients is served in
    turn instead of running the node's Redis connection pool out. ``max_subscriptions``:
    the filters one session may hold (a SUBSCRIBE past it: 0x97 Quota exceeded, 3.1.1:
    0x80; 0: no limit). ``max_topic_levels``: the levels of a topic a client publishes
    (more: DISCONNECT 0x90) or of a filter it subscribes (0x8F, 3.1.1: 0x80);
    ``max_topic_length`` the characters of either, the same way.
    ``max_user_properties`` and ``max_user_properties_bytes``: the User Properties one
    property block of a client's packet may carry, by count and by the UTF-8 bytes of
    their names and values (past either: DISCONNECT 0x97 Quota exceeded, judged while
    the packet is decoded; 0: no limit).
    ``max_publish_rate`` and ``max_publish_bytes_rate``: PUBLISH packets and payload
    bytes a client may send a second, ``max_subscribe_rate`` the filters of its SUBSCRIBE
    and UNSUBSCRIBE packets a second (each a burst of one second's worth; 0: no limit);
    past any the connection stops reading until it is back within them
    (:mod:`router.mqtt.rates`). ``max_connect_rate``: connections a source address may
    open a second (a second's burst; more are closed at accept; 0: no limit). The
    publish and connect rates are off by default: a fleet behind one NAT or load
    balancer, or one backend commanding thousands of devices, is honest traffic; the
    node pushes back when it is overloaded instead (below).
    ``overload_loop_lag`` (seconds), ``overload_queued_bytes``, ``overload_memory``
    (resident bytes) and ``overload_redis_latency`` (seconds): the levels of pressure at
    which the node is overloaded, and while it is, defers new CONNECTs and slows its
    heaviest clients; ``overload_busy_lag`` (seconds) the loop lag, and
    ``overload_busy_load`` the share of the time the loop works (0 to 1), at which it
    only slows them (:mod:`router.mqtt.overload`; 0: that signal is not watched).
    ``flapping_max_connects``: more CONNECTs of one client
    id within ``flapping_window`` seconds on one node ban it for ``flapping_ban`` seconds
    on every node (0: never, as EMQX ships it; :mod:`router.mqtt.ban_list`).
    ``max_unfinished_bytes``: the bytes of packets begun and not yet whole, every
    connection of the node together (a slow loris sends most of a large packet and
    stops); a connection whose unfinished packet would take them past it ends with
    DISCONNECT 0x97 Quota exceeded (0: no limit). The default is 256 MiB: 10,000 clients
    each halfway through a 10 KiB message at once hold under 100 MiB, while 10,000 slow
    lorises within ``max_packet_size`` would hold 10 GiB. ``packet_timeout``: a packet
    must be whole this many seconds after the read that began it (time the node was not
    reading from the client does not count), else DISCONNECT 0x8D (0: no limit); a 1 MiB
    packet at 18 KiB/s still makes it. Either way the bytes of an unfinished packet do
    not count as a sign of life against the keepalive (MQTT-3.1.2-24).
    (:mod:`router.mqtt.unfinished`.)
    ``proxy_protocol``: the listeners (``mqtt``, ``mqtts``, ``ws``, ``wss``) whose
    connections from ``proxy_trusted`` sources must open with a PROXY protocol header (v1
    or v2), whose client address is then the connection's (:mod:`router.mqtt.proxy_gate`);
    ``proxy_trusted``: the load balancers believed, in PROXY headers and in the
    ``X-Forwarded-For``/``Forwarded`` headers of WebSocket upgrades (none by default, and
    a listener in ``proxy_protocol`` needs some).
    """

    max_connections: int = 10_000
    connect_timeout: float = 10.0
    max_packet_size: int = 1 << 20
    receive_maximum: int = 128
    max_keepalive: int = 3600
    topic_alias_maximum: int = 64
    max_inflight: int = 64
    max_inflight_bytes: int = 1 << 20
    allow_anonymous: bool = True
    sys_interval: float = 10.0
    session_expiry_max: int = 7 * 24 * 3600
    max_connecting: int = 64
    max_subscriptions: int = 1_000
    max_topic_levels: int = 128
    max_topic_length: int = 4_096
    max_user_properties: int = 128
    max_user_properties_bytes: int = 16 << 10
    max_publish_rate: float = 0.0
    max_publish_bytes_rate: int = 0
    max_subscribe_rate: float = 1_000.0
    max_connect_rate: float = 0.0
    flapping_max_connects: int = 0
    flapping_window: float = 60.0
    flapping_ban: float = 300.0
    max_unfinished_bytes: int = 256 << 20
    packet_timeout: float = 60.0
    overload_loop_lag: float = 1.0
    overload_queued_bytes: int = 1 << 30
    overload_memory: int = 0
    overload_redis_latency: float = 1.0
    overload_busy_lag: float = 0.1
    overload_busy_load: float = 0.9
    proxy_protocol: frozenset[str] = frozenset()
    proxy_trusted: TrustedProxies = NO_PROXIES

    def __post_init__(self) -> None:
        checks = {
            "max_connections": self.max_connections >= 1,
            "connect_timeout": self.connect_timeout > 0,
            "max_packet_size": 64 <= self.max_packet_size <= MAX_PACKET_SIZE,
            "receive_maximum": 1 <= self.receive_maximum <= 0xFFFF,
            "max_keepalive": 0 <= self.max_keepalive <= 0xFFFF,
            "topic_alias_maximum": 0 <= self.topic_alias_maximum <= 0xFFFF,
            "max_inflight": 1 <= self.max_inflight <= 0xFFFF,
            "max_inflight_bytes": self.max_inflight_bytes >= 0,
            "sys_interval": self.sys_interval >= 0,
            "session_expiry_max": 0 <= self.session_expiry_max <= 0xFFFFFFFF,
            "max_connecting": self.max_connecting >= 1,
            "max_subscriptions": self.max_subscriptions >= 0,
            "max_topic_levels": 1 <= self.max_topic_levels <= 0xFFFF,
            "max_topic_length": 1 <= self.max_topic_length <= 0xFFFF,
            "max_user_properties": self.max_user_properties >= 0,
            "max_user_properties_bytes": self.max_user_properties_bytes >= 0,
            "max_publish_rate": 0 <= self.max_publish_rate < float("inf"),
            "max_publish_bytes_rate": self.max_publish_bytes_rate >= 0,
            "max_subscribe_rate": 0 <= self.max_subscribe_rate < float("inf"),
            "max_connect_rate": 0 <= self.max_connect_rate < float("inf"),
            "flapping_max_connects": self.flapping_max_connects >= 0,
            "flapping_window": 0 < self.flapping_window < float("inf"),
            "flapping_ban": 0 < self.flapping_ban < float("inf"),
            "max_unfinished_bytes": self.max_unfinished_bytes >= 0,
            "packet_timeout": 0 <= self.packet_timeout < float("inf"),
            "overload_loop_lag": 0 <= self.overload_loop_lag < float("inf"),
            "overload_queued_bytes": self.overload_queued_bytes >= 0,
            "overload_memory": self.overload_memory >= 0,
            "overload_redis_latency": 0 <= self.overload_redis_latency < float("inf"),
            "overload_busy_lag": 0 <= self.overload_busy_lag < float("inf"),
            "overload_busy_load": 0 <= self.overload_busy_load <= 1,
        }
        unknown = set(self.proxy_protocol) - PROXIED_LISTENERS
        if unknown:
            raise InvalidSettingError(
                f"MQTT setting proxy_protocol names {', '.join(sorted(unknown))}: "
                f"the listeners are {', '.join(sorted(PROXIED_LISTENERS))}"
            )
        if self.proxy_protocol and not self.proxy_trusted:
            raise InvalidSettingError(
                "MQTT setting proxy_protocol needs proxy_trusted: the load balancers "
                "whose PROXY headers are believed"
            )
        for name, good in checks.items():
            if not good:
                raise InvalidSettingError(
                    f"MQTT setting {name} is out of range: {getattr(self, name)!r}"
                )

    @property
    def property_limits(self) -> PropertyLimits:
        """The limits on what one property block of a client's packet may hold."""
        return PropertyLimits(self.max_user_properties, self.max_user_properties_bytes)

    def overload_limits(self) -> OverloadLimits:
        """The levels of pressure of overload protection (:mod:`router.mqtt.overload`)."""
        return OverloadLimits(
            self.overload_loop_lag,
            self.overload_queued_bytes,
            self.overload_memory,
            self.overload_redis_latency,
            self.overload_busy_lag,
            busy_load=self.overload_busy_load,
        )


DEFAULT_SETTINGS = MqttSettings()
