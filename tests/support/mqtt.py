"""MQTT peers for the listener tests: paho-mqtt clients, and `router node run --mqtt` nodes.

:class:`Paho` wraps a real paho-mqtt client with its network thread; every wait has a
deadline. :func:`mqtt_node` starts a ``router node run`` process with a TCP listener on a
free loopback port and reads the port from its log.
"""

from __future__ import annotations

import contextlib
import queue
import re
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.cli import Process, router_process
from tests.support.waiting import wait_until

TIMEOUT = 10.0
V311 = mqtt.MQTTv311
V5 = mqtt.MQTTv5


class Paho:
    """A connected paho-mqtt client: ``messages`` collects what it receives."""

    def __init__(
        self, port: int, client_id: str, protocol: int = V5, *, clean: bool = True, **options: Any
    ) -> None:
        path = options.pop("websocket", None)
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=clean if protocol != V5 else None,
            transport="tcp" if path is None else "websockets",
        )
        if path is not None:
            self.client.ws_set_options(path=path, headers=options.pop("ws_headers", None))
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: queue.Queue[tuple[int, Any]] = queue.Queue()
        self.sessions_present: queue.Queue[bool] = queue.Queue()  # (each CONNACK's flag)
        self.disconnects: queue.Queue[int] = queue.Queue()
        self.references: queue.Queue[str | None] = queue.Queue()  # (each DISCONNECT's)
        self.subacks: queue.Queue[list[int]] = queue.Queue()
        self.client.on_connect = self._on_connect
        self.client.on_message = lambda client, userdata, message: self.messages.put(message)
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        if "will" in options:
            topic, payload, qos, *will_properties = options.pop("will")
            self.client.will_set(topic, payload, qos, properties=(will_properties or [None])[0])
        if options.pop("manual_ack", False):
            self.client.manual_ack_set(True)
        if "user" in options:
            self.client.username_pw_set(*options.pop("user"))
        if "tls" in options:
            pki, with_cert = options.pop("tls")
            cert = (str(pki.client_cert), str(pki.client_key)) if with_cert else (None, None)
            self.client.tls_set(ca_certs=str(pki.ca), certfile=cert[0], keyfile=cert[1])
        properties = options.pop("properties", None)
        clean_start = clean if protocol == V5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY
        keepalive = options.pop("keepalive", 60)
        self.client.connect(
            "127.0.0.1",
            port,
            keepalive,
            bind_address=options.pop("bind", ""),  # (a source address of its own: 127.0.0.2)
            clean_start=clean_start,
            properties=properties,
        )
        self.client.loop_start()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, code: Any, props: Any) -> None:
        self.sessions_present.put(flags.session_present)
        self.connack.put((code.value, props))

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, code: Any, props: Any) -> None:
        self.references.put(getattr(props, "ServerReference", None))
        self.disconnects.put(code.value)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        self.subacks.put([code.value for code in codes])

    def connected(self) -> tuple[int, Any]:
        """The CONNACK reason code (0: accepted) and properties."""
        return self.connack.get(timeout=TIMEOUT)

    def subscribe(self, topic: str, qos: int = 0, **options: Any) -> list[int]:
        if options or self.client.protocol == V5:
            sub_options = mqtt.SubscribeOptions(qos=qos, **options)
            self.client.subscribe(topic, options=sub_options)
        else:
            self.client.subscribe(topic, qos)
        return self.subacks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int = 0, **kwargs: Any) -> None:
        info = self.client.publish(topic, payload, qos, **kwargs)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def expect_disconnect(self) -> int:
        """The reason code of the DISCONNECT the server sent (or 0 for a plain close)."""
        return self.disconnects.get(timeout=TIMEOUT)

    def server_reference(self) -> str | None:
        """The Server Reference of the DISCONNECT :meth:`expect_disconnect` returned."""
        return self.references.get(timeout=TIMEOUT)

    def take(self, count: int) -> list[mqtt.MQTTMessage]:
        return [self.messages.get(timeout=TIMEOUT) for _ in range(count)]

    def nothing_more(self, wait: float = 0.3) -> bool:
        """True if no further message arrives within ``wait`` seconds."""
        with contextlib.suppress(queue.Empty):
            self.messages.get(timeout=wait)
            return False
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.client.loop_stop()
        self._release()

    def drop(self) -> None:
        """End the connection abnormally: the socket closes without DISCONNECT."""
        sock = self.client.socket()
        if sock is not None:
            sock.close()
        self.client.loop_stop()
        self._release()

    def _release(self) -> None:
        """Close what paho may leave open after its loop stopped: its wake-up socket pair
        (a loopback TCP pair), which a later garbage collection reports as unclosed
        (a ResourceWarning, an error under the suite's filterwarnings)."""
        self.client._reset_sockets()


def connected_publisher(port: int, deadline: float, client_id: str = "steady") -> Paho:
    """A 5.0 publisher connection to ``port``, retried while the node cannot take one
    (it is restarting, or cut off from Redis); fails after ``deadline`` seconds."""
    made: list[Paho] = []

    def attempt() -> bool:
        with contextlib.suppress(OSError):
            made.append(Paho(port, client_id, V5))
        return bool(made)

    wait_until(attempt, deadline, "a publisher connection")
    return made[0]


def routed_to(publisher: Paho, probe_topic: str, *watchers: Paho) -> None:
    """Publish QoS 0 probes until every watcher got one (the publisher's node knows the
    watchers' routes: a subscription reaches other nodes' route mirrors asynchronously),
    then forget the probes."""
    waiting = set(watchers)
    deadline = time.monotonic() + TIMEOUT
    while waiting and time.monotonic() < deadline:
        publisher.publish(probe_topic, b"probe", 0)
        waiting = {w for w in waiting if w.nothing_more(0.1)}
    assert not waiting, f"{probe_topic} never reached every watcher"
    for watcher in watchers:
        while not watcher.nothing_more(0.2):
            pass


def connect_properties(**values: Any) -> Properties:
    """CONNECT properties, e.g. ``SessionExpiryInterval=300``."""
    properties = Properties(PacketTypes.CONNECT)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def publish_properties(**values: Any) -> Properties:
    """PUBLISH properties, e.g. ``MessageExpiryInterval=60``."""
    properties = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(properties, name, value)
    return properties


def user_properties(pairs: list[tuple[str, str]]) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = pairs
    return properties


@contextlib.contextmanager
def mqtt_node(node_id: str, env: dict[str, str], *args: str) -> Iterator[tuple[Process, int]]:
    """``router node run --mqtt 127.0.0.1:0`` as a child process; yields it and its port
    (the ports of further listeners in ``args``: :func:`listener_ports`)."""
    with router_process(
        "node",
        "run",
        "--node-id",
        node_id,
        "--heartbeat-interval",
        "0.2",
        "--heartbeat-ttl",
        "2",
        "--mqtt",
        "127.0.0.1:0",
        *args,
        env=env,
    ) as process:
        process.wait_for("ready")
        yield process, listener_ports(process)["MQTT"][0]


def listener_ports(process: Process) -> dict[str, list[int]]:
    """The ports a started node logged, by kind ("MQTT", "MQTT TLS", "MQTT WS", "MQTT WSS")."""
    ports: dict[str, list[int]] = {}
    for line in process.stderr_lines:
        match = re.search(r"(MQTT(?: TLS| WSS| WS)?) on 127\.0\.0\.1:(\d+)", line)
        if match is not None:
            ports.setdefault(match.group(1), []).append(int(match.group(2)))
    return ports
