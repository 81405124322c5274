"""What the parts of a connection need of the server that holds it and of the listener
that carries its bytes, as small Protocols: the server (:mod:`router.mqtt.server`) makes
connections (:mod:`router.mqtt.protocol`) and its listeners (:mod:`router.mqtt.tcp`,
:mod:`router.mqtt.websocket`), and those call back into it through
:class:`ConnectionHost`, so neither imports the other.

The server's registry takes and gives back connections as :class:`Held` (what another
connection of the same client needs to end it) or as any object (what it keeps is the
connection the listener made); :class:`~router.mqtt.server.MqttServer` is the one
:class:`ConnectionHost`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from router.cluster.node import RouterNode
from router.mqtt.alias_mirror import AliasMirror
from router.mqtt.ban_list import BanList
from router.mqtt.pressure import PressureWatch
from router.mqtt.proxy_gate import ProxyGate
from router.mqtt.settings import MqttSettings
from router.mqtt.trace_tap import ClientTap
from router.mqtt.unfinished import Unfinished


class Transport(Protocol):
    """What a listener gives a connection: write whole packets, wait, close. ``tap``
    sees what is written, while the client is traced (:mod:`router.mqtt.trace_tap`)."""

    tap: ClientTap | None

    @property
    def peer(self) -> str: ...

    def write(self, data: bytes) -> None: ...

    def backlog(self) -> int:
        """Bytes written and not yet sent (the client is not reading them yet)."""
        ...

    def acknowledge(self) -> None:
        """What the client sent is answered later: let its TCP send its next packet now
        (:func:`router.mqtt.tcp.acknowledge_now`)."""
        ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class DeliveryCounters(Protocol):
    """Where a connection's outbox counts (the node's MQTT server)."""

    messages_sent: int
    expired_dropped: int
    oversized_dropped: int
    inflight_bytes_waited: int


class Held(Protocol):
    """A connection as the server holds it for its client: another connection of the
    same client ends it (a takeover) and waits until it has let go."""

    def end(self, code: int) -> None: ...

    async def finished(self) -> None: ...


class ConnectionHost(DeliveryCounters, Protocol):
    """What a connection, its subscriptions and its listener need of their server."""

    node: RouterNode
    settings: MqttSettings
    bans: BanList
    connecting: asyncio.Semaphore
    connect_waited: int
    pressure: PressureWatch
    messages_received: int
    subscriptions_refused: int
    publish_throttled: int
    unfinished: Unfinished
    proxy: ProxyGate
    aliases: AliasMirror

    @property
    def topic_fields(self) -> Mapping[str, bytes]:
        """Topic name -> its PUBLISH field, shared by the server's connections (made on
        first use)."""
        ...

    def count_close(self, reason: int | str) -> None: ...

    def owner(self, client_id: str) -> Held | None: ...

    def attach(self, connection: Any) -> None: ...

    def forget(self, connection: Any) -> None: ...

    def refuses(self) -> bool: ...

    def banned_peer(self, peer: object) -> bool: ...

    def too_fast(self, peer: object) -> bool: ...

    def admit(self, connection: Any) -> None: ...

    async def run_connection(self, connection: Any, chunks: AsyncIterator[bytes]) -> None: ...

    def stats(self) -> dict[str, int]: ...
