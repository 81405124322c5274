"""The hostile clients of ``router bench hostile``: one process, one thread per flood,
each a loop of blocking sockets until its deadline, connecting again whenever the broker
closes it (a refusal is what a defended broker does; the flood goes on).

The floods (:data:`FLOODS`), each from one client id at a time:

* ``subscriptions``: SUBSCRIBE packets of 500 new filters each, without end;
* ``properties``: an MQTT 5.0 PUBLISH carrying 100,000 user properties (700 kB);
* ``retained``: QoS 0 retained publishes of 1 kB on new topics, as fast as sent;
* ``aliases``: MQTT 5.0 PUBLISH packets with topic aliases past any maximum;
* ``publishes``: QoS 0 publishes of 64 bytes to a topic nobody reads, as fast as sent.

:func:`flood_main` (the process's target) reports through a pipe what each flood sent:
packets and connections.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Final

from router.mqtt.codec import encode
from router.mqtt.packets import (
    MQTT_3_1_1,
    MQTT_5,
    Connect,
    Packet,
    Publish,
    Subscribe,
    Subscription,
)
from router.mqtt.properties import Properties

FLOODS: Final = ("subscriptions", "properties", "retained", "aliases", "publishes")
SOCKET_TIMEOUT: Final = 2.0
Address = tuple[str, int]


def _connect(address: Address, client_id: str, level: int) -> socket.socket:
    sock = socket.create_connection(address, timeout=SOCKET_TIMEOUT)
    sock.sendall(encode(Connect(client_id, level, clean_start=True, keepalive=60), level))
    sock.recv(64)  # (the CONNACK, or the close of a refusal)
    return sock


def _subscriptions(number: int) -> Iterator[tuple[Packet, int]]:
    start = 0
    while True:
        filters = tuple(Subscription(f"hoard/{number}/{n}", 0) for n in range(start, start + 500))
        yield Subscribe(start // 500 % 65_535 + 1, filters), MQTT_3_1_1
        start += 500


def _properties(number: int) -> Iterator[tuple[Packet, int]]:
    pairs = (("k", "v"),) * 100_000
    heavy = Publish("heavy/x", b"", 0, properties=Properties(user_properties=pairs))
    while True:
        yield heavy, MQTT_5


def _retained(number: int) -> Iterator[tuple[Packet, int]]:
    payload = bytes(1024)
    n = 0
    while True:
        yield Publish(f"kept/{number}/{n}", payload, 0, retain=True), MQTT_3_1_1
        n += 1


def _aliases(number: int) -> Iterator[tuple[Packet, int]]:
    alias = 60_000
    while True:
        yield Publish("alias/x", b"x", 0, properties=Properties(topic_alias=alias)), MQTT_5
        alias = alias % 65_535 + 1 if alias < 65_535 else 60_000


def _publishes(number: int) -> Iterator[tuple[Packet, int]]:
    payload = bytes(64)
    while True:
        yield Publish("nobody/listens", payload, 0), MQTT_3_1_1


MAKERS: Final[dict[str, Callable[[int], Iterator[tuple[Packet, int]]]]] = {
    "subscriptions": _subscriptions,
    "properties": _properties,
    "retained": _retained,
    "aliases": _aliases,
    "publishes": _publishes,
}


class Flood(threading.Thread):
    """One flood against ``address`` until ``deadline`` (monotonic seconds)."""

    def __init__(self, kind: str, address: Address, deadline: float) -> None:
        super().__init__(name=f"flood-{kind}", daemon=True)
        self.kind, self.address, self.deadline = kind, address, deadline
        self.packets = 0
        self.connections = 0

    def run(self) -> None:
        packets = MAKERS[self.kind](0)
        sock: socket.socket | None = None
        encoded: dict[int, bytes] = {}
        while time.monotonic() < self.deadline:
            packet, level = next(packets)
            try:
                if sock is None:
                    self.connections += 1
                    sock = _connect(self.address, f"flood-{self.kind}-{self.connections}", level)
                    sock.setblocking(False)
                data = encoded.get(id(packet)) if self.kind == "properties" else None
                if data is None:
                    data = encode(packet, level)
                    if self.kind == "properties":
                        encoded[id(packet)] = data
                sock.setblocking(True)
                sock.settimeout(SOCKET_TIMEOUT)
                sock.sendall(data)
                self.packets += 1
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    if sock.recv(65536) == b"":  # (answers are read and dropped)
                        raise ConnectionResetError
            except OSError:
                if sock is not None:
                    sock.close()
                sock = None
                time.sleep(0.01)  # (refused: the next connection soon, not in a spin)
        if sock is not None:
            sock.close()


def flood_main(pipe: Connection, address: Address, kinds: list[str], seconds: float) -> None:
    """Run ``kinds`` against ``address`` for ``seconds``; send back what each sent."""
    deadline = time.monotonic() + seconds
    floods = [Flood(kind, address, deadline) for kind in kinds]
    pipe.send("started")
    for flood in floods:
        flood.start()
    for flood in floods:
        flood.join(seconds + 30)
    pipe.send({f.kind: {"packets": f.packets, "connections": f.connections} for f in floods})
