"""``$SYS/broker/...`` topics of two ``router node run`` processes, read by paho-mqtt and
mosquitto_sub: per-node figures, their cluster-wide sums, ``#`` never matching them, and a
node that stops (gracefully or killed) dropping out of the sums and out of ``$SYS``."""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import time
from collections.abc import Callable
from functools import partial

import pytest

import router
from router.errors import InvalidSettingError
from router.mqtt.settings import MqttSettings
from router.mqtt.sys_topics import NAMES, cluster_figures, node_level, payloads
from router.state.keys import Keys
from router.state.node_figures import NodeFigures
from tests.support.mqtt import TIMEOUT, Paho, mqtt_node
from tests.support.waiting import wait_until

INTERVAL = ("--mqtt-sys-interval", "0.2")
PER_PREFIX = len(NAMES)  # retained topics under each of nodes/a/, nodes/b/ and the cluster's


# -- the pure parts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_id", "level"), [("n1", "n1"), ("host-1234", "host-1234"), ("a/b", "a_b"), ("+#", "__")]
)
def test_node_level(node_id: str, level: str) -> None:
    assert node_level(node_id) == level


def test_payloads_are_mosquitto_style_text() -> None:
    figures = NodeFigures(3, 10, 20, 4, 60, "router 1.0")
    assert payloads(figures, retained=5) == {
        "clients/connected": b"3",
        "messages/received": b"10",
        "messages/sent": b"20",
        "subscriptions/count": b"4",
        "retained messages/count": b"5",
        "uptime": b"60 seconds",
        "version": b"router 1.0",
    }


def test_cluster_figures_sum_counts_and_take_the_oldest_uptime() -> None:
    one = NodeFigures(3, 10, 20, 4, 60, "router 1.0")
    two = NodeFigures(1, 1, 2, 0, 600, "router 1.1")
    three = NodeFigures(0, 0, 0, 1, 5, "router 1.0")
    assert cluster_figures([one, two, three]) == NodeFigures(
        4, 11, 22, 5, 600, "router 1.0, router 1.1"
    )
    assert cluster_figures([]) == NodeFigures()


def test_the_interval_setting() -> None:
    assert MqttSettings().sys_interval == 10.0
    assert MqttSettings(sys_interval=0).sys_interval == 0
    with pytest.raises(InvalidSettingError, match="sys_interval"):
        MqttSettings(sys_interval=-1)


# -- two nodes ----------------------------------------------------------------------------


class Latest:
    """The latest payload of each topic a subscriber got."""

    def __init__(self, client: Paho) -> None:
        self.client = client
        self.values: dict[str, str] = {}

    def __call__(self, name: str, node: str | None = None) -> str | None:
        """The latest value of ``$SYS/broker/[nodes/NODE/]NAME`` (None: none yet)."""
        while True:
            try:
                message = self.client.messages.get_nowait()
            except queue.Empty:
                break
            self.values[message.topic] = message.payload.decode()
        prefix = "$SYS/broker/" if node is None else f"$SYS/broker/nodes/{node}/"
        return self.values.get(prefix + name)

    def numbers(self, name: str) -> tuple[int | None, ...]:
        """``name`` of node a, of node b and of the cluster, as ints (None: none yet)."""
        found = (self(name, "a"), self(name, "b"), self(name))
        return tuple(None if value is None else int(value) for value in found)

    def has_all(self, prefix: str) -> bool:
        """Every one of :data:`NAMES` has a value under ``$SYS/broker/PREFIX``."""
        return all(self(prefix + name) for name in NAMES)

    def counted(self, name: str, node: str) -> bool:
        """The node's ``name`` is at least 1."""
        return int(self(name, node) or 0) >= 1

    def summed(self, name: str) -> bool:
        """The cluster's ``name`` is the sum of a's and b's, as last seen."""
        a, b, cluster = self.numbers(name)
        return a is not None and b is not None and cluster == a + b


@pytest.fixture(params=["redis_standalone_url", "redis_cluster_url"])
def env(request: pytest.FixtureRequest, keys: Keys) -> dict[str, str]:
    return {
        "ROUTER_REDIS_URL": request.getfixturevalue(request.param),
        "ROUTER_PREFIX": keys.prefix,
    }


def connected(clients: list[Paho], port: int, client_id: str) -> Paho:
    client = Paho(port, client_id)
    clients.append(client)
    assert client.connected()[0] == 0
    return client


def until(condition: Callable[[], bool], seen: Latest, what: str) -> None:
    wait_until(condition, TIMEOUT, lambda: f"{what}; seen {seen.values}")


def probe(sender: Paho, receiver: Paho) -> None:
    """Publish to ``s/probe`` until ``receiver`` gets one (its route reached the sender's
    node), then forget the probes."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert time.monotonic() < deadline, "no probe arrived"
        sender.publish("s/probe", b"probe")
        try:
            receiver.messages.get(timeout=0.1)
            break
        except queue.Empty:
            continue
    while not receiver.nothing_more(0.2):
        pass


def test_figures_per_node_and_their_sums(env: dict[str, str], clients: list[Paho]) -> None:
    sys_env = {**env, "ROUTER_MQTT_SYS_INTERVAL": "0.2"}  # b: the option's variable
    with contextlib.ExitStack() as nodes:
        _, port_a = nodes.enter_context(mqtt_node("a", env, *INTERVAL))
        watcher = connected(clients, port_a, "watcher")
        assert watcher.subscribe("$SYS/#") == [0]
        seen = Latest(watcher)
        # b starts after the watcher subscribed, so b's route mirror holds the watcher's
        # route before b publishes anything (a subscriber that comes while another node
        # publishes may miss a change whose retained copy lands just after its subscribe)
        b, port_b = nodes.enter_context(mqtt_node("b", sys_env))
        sender = connected(clients, port_a, "sender")
        receiver = connected(clients, port_b, "receiver")
        assert receiver.subscribe("s/#") == [0]
        connected(clients, port_b, "idle")
        until(lambda: seen.numbers("clients/connected") == (2, 2, 4), seen, "2 + 2 clients")
        until(lambda: seen.numbers("subscriptions/count") == (1, 1, 2), seen, "1 + 1 subs")
        for prefix in ("nodes/a/", "nodes/b/", ""):
            until(partial(seen.has_all, prefix), seen, f"every {prefix}*")
            assert re.fullmatch(r"\d+ seconds", seen(prefix + "uptime") or "")
            assert seen(prefix + "version") == f"router {router.__version__}"
        every = 3 * PER_PREFIX  # a's, b's and the cluster's: the one shared store
        until(lambda: seen.numbers("retained messages/count") == (every,) * 3, seen, "retained")

        probe(sender, receiver)
        until(lambda: seen.counted("messages/received", "a"), seen, "sender's, on a")
        until(lambda: seen.counted("messages/sent", "b"), seen, "receiver's, on b")
        for name in ("messages/received", "messages/sent"):
            until(partial(seen.summed, name), seen, f"{name} summed")

        # `#` never matches `$SYS/...`: once its route is live, the $SYS updates that
        # "late" causes pass it by, and the marker published after them comes alone
        everything = connected(clients, port_a, "everything")
        assert everything.subscribe("#") == [0]
        probe(sender, everything)
        connected(clients, port_b, "late")
        until(lambda: seen.numbers("clients/connected") == (3, 3, 6), seen, "3 + 3 clients")
        sender.publish("s/end", b"marker")
        topics = [everything.messages.get(timeout=TIMEOUT).topic]
        while topics[-1] != "s/end":
            topics.append(everything.messages.get(timeout=TIMEOUT).topic)
        assert topics == ["s/end"]

        # mosquitto_sub, on the other node, gets a cluster-wide topic (retained)
        out = subprocess.run(
            [
                "mosquitto_sub",
                "-p",
                str(port_b),
                "-t",
                "$SYS/broker/version",
                "-C",
                "1",
                "-W",
                str(int(TIMEOUT)),
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=True,
        ).stdout
        assert out == f"router {router.__version__}\n"

        # b stops gracefully: its figures and its topics go at once
        b.signal(signal.SIGTERM)
        assert b.finish()[0] == 0
        until(lambda: seen("clients/connected") == "3", seen, "a's clients only")
        until(lambda: seen("subscriptions/count") == "2", seen, "a's subscriptions only")
        left = 2 * PER_PREFIX
        until(lambda: seen("retained messages/count") == str(left), seen, "b's topics deleted")


def test_a_killed_node_drops_out(
    redis_standalone_url: str, keys: Keys, clients: list[Paho]
) -> None:
    """A node that dies cannot clean up: the sums leave it out once its heartbeat expired
    (2 s), and node a deletes its topics."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    with contextlib.ExitStack() as nodes:
        _, port_a = nodes.enter_context(mqtt_node("a", env, *INTERVAL))
        watcher = connected(clients, port_a, "watcher")
        assert watcher.subscribe("$SYS/#") == [0]
        seen = Latest(watcher)
        b, port_b = nodes.enter_context(mqtt_node("b", env, *INTERVAL))
        connected(clients, port_b, "stays")
        until(lambda: seen.numbers("clients/connected") == (1, 1, 2), seen, "1 + 1 clients")
        every = 3 * PER_PREFIX
        until(lambda: seen("retained messages/count") == str(every), seen, "every topic")
        b.kill()
        until(lambda: seen("clients/connected") == "1", seen, "a's clients only")
        left = 2 * PER_PREFIX
        until(lambda: seen("retained messages/count") == str(left), seen, "b's topics deleted")
