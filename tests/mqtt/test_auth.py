"""MQTT authentication with a password file written by the real ``mosquitto_passwd``:
``router node run --password-file FILE [--no-allow-anonymous]``."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner
from paho.mqtt.enums import CallbackAPIVersion

from router.cli import app
from router.state.keys import Keys
from tests.support.cli import Process
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, mqtt_node


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "passwords"
    for user, password in (("alice", "wonder land"), ("bob", "b0b")):
        create = ["-c"] if not path.exists() else []
        subprocess.run(
            ["mosquitto_passwd", *create, "-b", str(path), user, password],
            check=True,
            capture_output=True,
            timeout=TIMEOUT,
        )
    return path


@pytest.fixture
def guarded(
    redis_standalone_url: str, keys: Keys, password_file: Path
) -> Iterator[tuple[Process, int]]:
    """A node that takes only the users of the password file: (its process, its port)."""
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    args = ("--password-file", str(password_file), "--no-allow-anonymous")
    with mqtt_node("guarded", env, *args) as node:
        yield node


@pytest.fixture
def port(guarded: tuple[Process, int]) -> int:
    return guarded[1]


def connack(port: int, protocol: int, user: str | None, password: str | None) -> int:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"c-{user}", protocol=protocol)
    if user is not None:
        client.username_pw_set(user, password)
    codes: list[int] = []
    client.on_connect = lambda c, u, flags, code, props: codes.append(code.value)
    try:
        client.connect("127.0.0.1", port)
        for _ in range(int(TIMEOUT * 10)):
            client.loop(timeout=0.1)
            if codes:
                break
    finally:
        client.disconnect()
    [code] = codes
    return code


@pytest.mark.parametrize(
    ("protocol", "user", "password", "expected"),
    [
        (V5, "alice", "wonder land", 0),
        (V311, "bob", "b0b", 0),
        (V5, "alice", "wrong", 0x86),
        (V5, "mallory", "b0b", 0x86),
        (V5, None, None, 0x87),
        (V311, "alice", "wrong", 0x86),  # paho reports 3.1.1's return code 4 as 0x86
        (V311, None, None, 0x87),  # ... and return code 5 as 0x87
    ],
)
def test_users_of_the_password_file(
    port: int, protocol: int, user: str | None, password: str | None, expected: int
) -> None:
    assert connack(port, protocol, user, password) == expected


def test_a_refused_login_is_logged_once_with_its_client_id_and_reason_code(
    guarded: tuple[Process, int],
) -> None:
    """Before, a CONNACK refusal (a wrong password, a ban) was counted and not logged:
    the operator of a fleet with a bad credential saw nothing."""
    process, node_port = guarded
    assert connack(node_port, V5, "alice", "wrong") == 0x86

    process.wait_for("refusing MQTT client c-alice ")
    [line] = [line for line in process.logged() if "refusing MQTT client c-alice " in line]
    assert " INFO " in line and "CONNACK 0x86" in line and "Traceback" not in line


def test_an_accepted_user_publishes(port: int) -> None:
    client = Paho(port, "alice-app", V5, user=("alice", "wonder land"))
    try:
        assert client.connected()[0] == 0
        assert client.subscribe("a/#", 1) == [1]
    finally:
        client.close()


def test_a_bad_password_file_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("alice:$9$nonsense\n")
    result = CliRunner().invoke(app, ["node", "run", "--password-file", str(bad)])
    assert result.exit_code != 0
    assert f"{bad}:1:" in result.output
    assert "Traceback" not in result.output


def test_no_anonymous_without_an_authentication_source_is_one_error_line() -> None:
    """Before, ``--no-allow-anonymous`` without a password file accepted any user name
    with any password."""
    result = CliRunner().invoke(app, ["node", "run", "--no-allow-anonymous"])
    assert result.exit_code != 0
    assert "--no-allow-anonymous" in result.output and "--password-file" in result.output
    assert "Traceback" not in result.output
