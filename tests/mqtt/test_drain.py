"""Draining a node (SIGTERM to ``router node run``, ``router node drain``) with real
clients (paho-mqtt) on ``router node run`` processes sharing one Redis: the node stops
accepting, tells MQTT 5.0 clients where to go (0x9C with the address a live peer
advertises, else 0x8B), its ``/healthz`` answers 503 meanwhile, and the persistent
sessions it held lose nothing, whether their clients come back at once (the draining node
hands each on) or only after it left (a peer adopted them)."""

from __future__ import annotations

import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from router.state.keys import Keys
from tests.support.cli import Process, router_process
from tests.support.mqtt import (
    TIMEOUT,
    V5,
    V311,
    Paho,
    connect_properties,
    mqtt_node,
    routed_to,
)
from tests.support.servers import free_port
from tests.support.waiting import wait_until

EXPIRY = connect_properties(SessionExpiryInterval=300)


def healthz(address: str) -> int:
    """The status ``/healthz`` answers (0: nothing listens)."""
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


@contextmanager
def two_nodes(
    redis_url: str, keys: Keys, *a_options: str
) -> Iterator[tuple[Process, int, str, int, str]]:
    """Nodes a and b; b advertises its MQTT address. Yields (a, a's port, a's metrics
    address, b's advertised port, b's advertised address)."""
    env = {"ROUTER_REDIS_URL": redis_url, "ROUTER_PREFIX": keys.prefix}
    b_port = free_port()
    advertised = f"127.0.0.1:{b_port}"
    metrics = f"127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        b_options = ("--mqtt", advertised, "--mqtt-advertise", advertised)
        stack.enter_context(mqtt_node("b", env, *b_options))
        a, a_port = stack.enter_context(mqtt_node("a", env, "--metrics", metrics, *a_options))
        yield a, a_port, metrics, b_port, advertised


def persistent(port: int, client_id: str) -> Paho:
    client = Paho(port, client_id, V5, clean=False, properties=EXPIRY)
    assert client.connected()[0] == 0
    return client


def test_sigterm_sends_mqtt5_clients_to_the_peer_and_their_sessions_lose_nothing(
    redis_standalone_url: str, keys: Keys
) -> None:
    with ExitStack() as stack, two_nodes(redis_standalone_url, keys) as nodes:
        a, a_port, _, b_port, advertised = nodes
        early = persistent(a_port, "early")  # (comes back while a still drains)
        late = persistent(a_port, "late")  # (comes back once a left)
        for client in (early, late):
            stack.callback(client.close)
            client.subscribe("plant/#", 1)
        publisher = Paho(b_port, "publisher", V5)
        stack.callback(publisher.close)
        routed_to(publisher, "plant/probe", early, late)

        a.signal(signal.SIGTERM)
        for client in (early, late):
            assert client.expect_disconnect() == 0x9C  # (Use another server)
            assert client.server_reference() == advertised
            client.close()
        for seq in range(10):  # (routed to a, whose sessions are away now)
            publisher.publish(f"plant/{seq}", f"m{seq}".encode(), 1)
        back = persistent(b_port, "early")
        stack.callback(back.close)
        assert back.sessions_present.get(timeout=TIMEOUT) is True
        assert sorted(m.payload for m in back.take(10)) == sorted(
            f"m{seq}".encode() for seq in range(10)
        )

        status, _, stderr = a.finish()
        assert status == 0
        assert any("drained in" in line for line in stderr), stderr[-10:]
        for seq in range(10, 20):  # (a left: for a peer to adopt "late")
            publisher.publish(f"plant/{seq}", f"m{seq}".encode(), 1)
        came = persistent(b_port, "late")
        stack.callback(came.close)
        assert came.sessions_present.get(timeout=TIMEOUT) is True
        got = sorted(m.payload for m in came.take(20))
        assert got == sorted(f"m{seq}".encode() for seq in range(20))
        assert came.nothing_more()


def test_router_node_drain_closes_the_listener_tells_healthz_and_waits_until_it_left(
    redis_standalone_url: str, keys: Keys
) -> None:
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    with ExitStack() as stack, two_nodes(redis_standalone_url, keys, "--drain-rate", "1") as nodes:
        a, a_port, metrics, _, _ = nodes
        old = Paho(a_port, "old", V311)  # (3.1.1: closed without DISCONNECT)
        stack.callback(old.close)
        assert old.connected()[0] == 0
        fives = [Paho(a_port, f"five-{i}", V5) for i in range(3)]
        for client in fives:
            stack.callback(client.close)
            assert client.connected()[0] == 0
        assert healthz(metrics) == 200

        drain = stack.enter_context(router_process("node", "drain", "a", env=env))
        wait_until(lambda: healthz(metrics) == 503, TIMEOUT, "a's /healthz says it drains")
        with pytest.raises(ConnectionRefusedError):  # (the listener is closed)
            socket.create_connection(("127.0.0.1", a_port), timeout=5).close()
        status, stdout, stderr = drain.finish()
        assert status == 0, stderr
        assert len(stdout) == 1 and stdout[0].startswith("node a drained in"), stdout
        assert "4 connections ended (3 sent to a peer)" in stdout[0]
        assert sorted(c.expect_disconnect() for c in fives) == [0x9C] * 3
        assert a.finish()[0] == 0


def test_router_node_drain_names_a_node_that_is_not_alive_and_exits_1(
    redis_standalone_url: str, keys: Keys
) -> None:
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    with router_process("node", "drain", "nobody", "--timeout", "5", env=env) as drain:
        status, stdout, stderr = drain.finish()
    assert status == 1
    assert stdout == ["node nobody is not alive"], (stdout, stderr)
