"""A CONNECT changes nothing until its credentials are accepted, a session stays its
user's, and a will passes the gate every publish passes: paho-mqtt clients against
``router node run --password-file F --no-allow-anonymous --acl A`` (users alice, bob
and carol; each may use only its own topics, carol ``$SYS/#`` too) on a real Redis."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, connect_properties, mqtt_node

USERS = {"alice": "wonder land", "bob": "b0b", "carol": "c4rol"}
RULES = """\
allow user alice all     alice/#
allow user bob   all     bob/#
allow user carol all     carol/#
allow user carol publish $SYS/#
allow all        subscribe $SYS/#
"""
NOT_AUTHORIZED = 0x87  # (paho reports 3.1.1's return code 5 as 0x87, and 4 as 0x86)


@pytest.fixture
def port(tmp_path: Path, redis_standalone_url: str, keys: Keys) -> Iterator[int]:
    passwords = tmp_path / "passwords"
    for user, password in USERS.items():
        create = ["-c"] if not passwords.exists() else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", str(passwords), user, password],
            check=True,
            capture_output=True,
            timeout=TIMEOUT,
        )
    acl = tmp_path / "acl.conf"
    acl.write_text(RULES, encoding="utf-8")
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    args = ("--password-file", str(passwords), "--no-allow-anonymous", "--acl", str(acl))
    with mqtt_node("guarded", env, *args, "--mqtt-sys-interval", "0.5") as (_, node_port):
        yield node_port


def connect(
    port: int,
    clients: list[Paho],
    client_id: str,
    user: str,
    password: str | None = None,
    protocol: int = V5,
    *,
    keep: bool = True,
    **options: Any,
) -> tuple[Paho, int]:
    """``client_id`` connected as ``user`` (its password unless given); with ``keep``
    a persistent session (3.1.1: clean session 0; 5.0: expiry 300 s, clean start 0).
    Returns the client and its CONNACK code."""
    if keep and protocol == V5:
        options.setdefault("properties", connect_properties(SessionExpiryInterval=300))
    secret = USERS[user] if password is None else password
    made = Paho(port, client_id, protocol, clean=not keep, user=(user, secret), **options)
    clients.append(made)
    return made, made.connected()[0]


@pytest.mark.parametrize("protocol", [V5, V311])
def test_a_wrong_password_leaves_the_named_client_connected_and_its_will_unsent(
    port: int, clients: list[Paho], protocol: int
) -> None:
    """Before, the takeover ran before authentication: alice got DISCONNECT 0x8E, her
    will was published, and only then was the attacker refused."""
    watcher, _ = connect(port, clients, "alice-watch", "alice")
    assert watcher.subscribe("alice/status", 1) == [1]
    alice, code = connect(
        port, clients, "alice-phone", "alice", protocol=protocol, will=("alice/status", b"gone", 1)
    )
    assert code == 0
    for keep in (True, False):  # (clean start 1 would have cleared her session too)
        _, refused = connect(
            port, clients, "alice-phone", "alice", "wrong", protocol=protocol, keep=keep
        )
        assert refused == 0x86
    assert watcher.nothing_more(0.5)  # no will
    assert alice.disconnects.empty()
    alice.publish("alice/status", b"still here", 1)
    [got] = watcher.take(1)
    assert got.payload == b"still here"


@pytest.mark.parametrize("protocol", [V5, V311])
def test_another_user_cannot_resume_or_take_over_a_session(
    port: int, clients: list[Paho], protocol: int
) -> None:
    """Before, bob (his own valid password) resumed ``alice-phone`` and received what was
    queued for alice on alice/secret."""
    alice, _ = connect(port, clients, "alice-phone", "alice", protocol=protocol)
    assert alice.subscribe("alice/secret", 1) == [1]
    alice.close()  # (the session stays, away)
    sender, _ = connect(port, clients, "alice-sender", "alice", keep=False)
    sender.publish("alice/secret", b"for alice only", 1)
    for keep in (True, False):
        _, code = connect(port, clients, "alice-phone", "bob", protocol=protocol, keep=keep)
        assert code == NOT_AUTHORIZED
    back, code = connect(port, clients, "alice-phone", "alice", protocol=protocol)
    assert code == 0
    [got] = back.take(1)
    assert (got.topic, got.payload) == ("alice/secret", b"for alice only")
    _, code = connect(port, clients, "alice-phone", "carol", protocol=protocol, keep=False)
    assert code == NOT_AUTHORIZED  # (nor while she is connected)
    assert back.disconnects.empty()


def test_a_will_under_sys_is_refused_at_connect(port: int, clients: list[Paho]) -> None:
    """Before, carol (whose ACL allows publishing under $SYS) left a retained will on
    $SYS/broker/version and replaced the broker's value for every reader."""
    reader, _ = connect(port, clients, "reader", "alice", keep=False)
    assert reader.subscribe("$SYS/broker/version", 0) == [0]
    [version] = reader.take(1)
    forged = ("$SYS/broker/version", b"forged", 1, None)
    _, code = connect(port, clients, "carol-1", "carol", keep=False, will=forged)
    assert code == NOT_AUTHORIZED
    _, code = connect(port, clients, "carol-2", "carol", keep=False, will=("bob/x", b"no", 1))
    assert code == NOT_AUTHORIZED  # (her ACL does not allow bob's topics)
    carol, code = connect(port, clients, "carol-3", "carol", keep=False)
    assert code == 0
    carol.publish("$SYS/broker/version", b"forged", 1, retain=True)  # (refused, 0x87)
    again, _ = connect(port, clients, "reader-2", "alice", keep=False)
    assert again.subscribe("$SYS/broker/version", 0) == [0]
    [now] = again.take(1)
    assert now.payload == version.payload != b"forged"
