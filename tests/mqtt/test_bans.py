"""Bans shared by the cluster, checked before authentication: ``router bans add|list|
remove`` against two ``router node run`` processes, paho-mqtt clients (CONNACK 0x8A,
3.1.1: 5), a banned address closed at accept, and flapping client ids banned on every
node; on a real Redis."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from click.testing import CliRunner

from router.cli import app
from router.state.keys import Keys
from tests.support.metrics import scrape
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, mqtt_node
from tests.support.servers import free_port
from tests.support.waiting import wait_until

BANNED = 0x8A  # (paho reports 3.1.1's return code 5 as 0x87)

Nodes = tuple[int, int, str]  # (port of node a, port of node b, node a's metrics)


@contextlib.contextmanager
def two_nodes(url: str, keys: Keys, *options: str) -> Iterator[Nodes]:
    env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        _, port_a = stack.enter_context(mqtt_node("a", env, *options, "--metrics", metrics))
        _, port_b = stack.enter_context(mqtt_node("b", env, *options))
        yield port_a, port_b, metrics


@pytest.fixture
def nodes(redis_standalone_url: str, keys: Keys) -> Iterator[Nodes]:
    with two_nodes(redis_standalone_url, keys) as started:
        yield started


@pytest.fixture
def flapping_nodes(redis_standalone_url: str, keys: Keys) -> Iterator[Nodes]:
    flapping = ("--mqtt-flapping-max-connects", "3", "--mqtt-flapping-ban", "60")
    with two_nodes(redis_standalone_url, keys, *flapping) as started:
        yield started


def bans(keys: Keys, url: str, *args: str) -> str:
    result = CliRunner().invoke(app, ["bans", *args, "--redis", url, "--prefix", keys.prefix])
    assert "Traceback" not in result.output
    return result.output


def code(port: int, client_id: str, protocol: int = V5, user: str | None = None) -> int:
    options = {} if user is None else {"user": (user, "")}
    client = Paho(port, client_id, protocol, **options)
    try:
        return client.connected()[0]
    finally:
        client.close()


def test_a_ban_reaches_every_node_and_its_lifting_too(
    nodes: Nodes, keys: Keys, redis_standalone_url: str
) -> None:
    port_a, port_b, metrics = nodes
    assert code(port_a, "spammer") == 0
    bans(keys, redis_standalone_url, "add", "client", "spammer", "--reason", "floods")
    bans(keys, redis_standalone_url, "add", "user", "mallory", "--for", "600")
    for port in (port_a, port_b):
        wait_until(lambda p=port: code(p, "spammer") == BANNED, TIMEOUT, "spammer refused")
        assert code(port, "spammer", V311) == 0x87  # (3.1.1: return code 5)
        assert code(port, "other-id", user="mallory") == BANNED
        assert code(port, "fine") == 0
    assert scrape(metrics)["router_mqtt_banned_total"] >= 3
    listed = json.loads(bans(keys, redis_standalone_url, "list", "--json"))
    assert [(b["kind"], b["value"], b["reason"]) for b in listed] == [
        ("client", "spammer", "floods"),
        ("user", "mallory", ""),
    ]
    assert listed[0]["until"] is None and listed[1]["until"] > 0
    assert "lifted" in bans(keys, redis_standalone_url, "remove", "client", "spammer")
    for port in (port_a, port_b):
        wait_until(lambda p=port: code(p, "spammer") == 0, TIMEOUT, "spammer back")


def test_a_ban_ends_the_connections_it_names_on_every_node(
    nodes: Nodes, keys: Keys, redis_standalone_url: str
) -> None:
    """Before, a ban refused the next CONNECT only: a client already connected stayed.
    Now each node ends the connections a new ban names, by client id or user name, with
    DISCONNECT 0x98 (3.1.1: closed), and leaves the others."""
    port_a, port_b, metrics = nodes
    spammer = Paho(port_a, "spammer")
    mallory = Paho(port_b, "mallory-device", V311, user=("mallory", ""))
    bystander = Paho(port_a, "bystander")
    try:
        for client in (spammer, mallory, bystander):
            assert client.connected()[0] == 0
        bans(keys, redis_standalone_url, "add", "client", "spammer", "--for", "60")
        bans(keys, redis_standalone_url, "add", "user", "mallory", "--for", "60")
        assert spammer.expect_disconnect() == 0x98  # (administrative action)
        assert mallory.expect_disconnect() != 0
        assert bystander.disconnects.empty()
        assert code(port_a, "bystander-2") == 0
        assert scrape(metrics)["router_mqtt_ban_disconnects_total"] == 1
    finally:
        for client in (spammer, mallory, bystander):
            client.close()


def test_a_banned_address_is_closed_at_accept(
    nodes: Nodes, keys: Keys, redis_standalone_url: str
) -> None:
    port_a, _, _ = nodes
    bans(keys, redis_standalone_url, "add", "address", "127.0.0.1", "--for", "30")

    def closed_at_once() -> bool:  # (before the ban is read, the node waits for a CONNECT)
        with socket.create_connection(("127.0.0.1", port_a), timeout=TIMEOUT) as sock:
            sock.settimeout(0.5)
            try:
                return sock.recv(16) == b""
            except TimeoutError:
                return False

    wait_until(closed_at_once, TIMEOUT, "127.0.0.1 closed at accept")


def test_a_flapping_client_id_is_banned_on_every_node(
    flapping_nodes: Nodes, keys: Keys, redis_standalone_url: str
) -> None:
    port_a, port_b, metrics = flapping_nodes
    for _ in range(4):  # (more than 3 connects within the window)
        assert code(port_a, "flapper") == 0
    assert code(port_a, "flapper") == BANNED
    wait_until(lambda: code(port_b, "flapper") == BANNED, TIMEOUT, "banned on b too")
    assert scrape(metrics)["router_mqtt_flapping_banned_total"] == 1
    assert code(port_a, "steady") == 0
    [ban] = json.loads(bans(keys, redis_standalone_url, "list", "--json"))
    assert (ban["value"], ban["reason"]) == ("flapper", "flapping: more than 3 connects")
    assert 0 < ban["until"] - time.time() <= 60


def test_bad_ban_commands_are_one_error_line(keys: Keys, redis_standalone_url: str) -> None:
    for args in (
        ("add", "address", "nowhere"),
        ("add", "client", "x", "--for", "0"),
        ("add", "planet", "mars"),
    ):
        result = CliRunner().invoke(
            app, ["bans", *args, "--redis", redis_standalone_url, "--prefix", keys.prefix]
        )
        assert result.exit_code != 0 and "Traceback" not in result.output, result.output
        assert result.output.strip().splitlines()[-1].startswith("Error:")  # (one error line)
    result = CliRunner().invoke(
        app,
        ["bans", "remove", "client", "x", "--redis", redis_standalone_url, "--prefix", keys.prefix],
    )
    assert result.exit_code == 1 and "no ban" in result.output
