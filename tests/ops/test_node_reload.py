"""Reload without restart: a real ``router node run`` process rereads its password file,
ACL file, limits file and TLS certificate on SIGHUP and on ``router node reload``; a
new client is judged by the new files while the clients already connected stay; a file
that does not parse keeps the old configuration (one line, counted); every reload is an
event, a metric and a part of the node's row in ``/api/v1/nodes``."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import socket
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.state.keys import Keys
from tests.support.cli import Process, invoke
from tests.support.mqtt import TIMEOUT, V5, Paho, listener_ports, mqtt_node, routed_to
from tests.support.pki import Pki, make_pki
from tests.support.waiting import wait_until


def add_user(path: Path, user: str, password: str) -> None:
    create = ["-c"] if not path.exists() else []
    subprocess.run(
        ["mosquitto_passwd", *create, "-b", str(path), user, password],
        check=True,
        capture_output=True,
        timeout=TIMEOUT,
    )


@pytest.fixture
def env(redis_standalone_url: str, keys: Keys) -> dict[str, str]:
    return {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}


class Files:
    """The files a node reads, in a folder of the test."""

    def __init__(self, folder: Path) -> None:
        self.passwords = folder / "passwords"
        self.acl = folder / "acl.conf"
        self.limits = folder / "limits.conf"
        add_user(self.passwords, "alice", "alice-pw")
        self.acl.write_text("allow user alice all a/#\n")
        self.limits.write_text("mqtt-receive-maximum = 10\n")

    def args(self) -> tuple[str, ...]:
        return (
            "--password-file",
            str(self.passwords),
            "--acl",
            str(self.acl),
            "--limits-file",
            str(self.limits),
            "--no-allow-anonymous",
        )


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


@pytest.fixture
def node(env: dict[str, str], files: Files) -> Iterator[tuple[Process, int, str]]:
    """(the process, its MQTT port, its HTTP base URL)."""
    with mqtt_node("reloader", env, *files.args(), "--http", "127.0.0.1:0") as (process, port):
        base = re.search(r"HTTP on (http://\S+)", "\n".join(process.stderr_lines))
        assert base is not None
        yield process, port, base.group(1)


def client(port: int, client_id: str, user: str, password: str) -> Paho:
    return Paho(port, client_id, V5, user=(user, password))


def connack(port: int, user: str, password: str) -> tuple[int, Any]:
    """The CONNACK code and properties of a new client of ``user``; it disconnects."""
    probe = client(port, f"probe-{user}", user, password)
    try:
        return probe.connected()
    finally:
        probe.close()


def hangup(process: Process, logged: str) -> str:
    """SIGHUP the node; the line it logged for the reload (containing ``logged``)."""
    process.signal(signal.SIGHUP)
    return process.wait_for(logged)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
        return str(answer.read().decode())


def test_sighup_rereads_the_users_rules_and_limits_and_a_broken_file_keeps_them(
    node: tuple[Process, int, str], files: Files, env: dict[str, str]
) -> None:
    process, port, base = node
    assert connack(port, "bob", "bob-pw")[0] == 0x86  # (not in the password file yet)
    code, properties = connack(port, "alice", "alice-pw")
    assert (code, properties.ReceiveMaximum) == (0, 10)  # (the limits file's)
    alice = client(port, "alice-1", "alice", "alice-pw")
    try:
        assert alice.connected()[0] == 0
        assert alice.subscribe("a/#", 1) == [1]

        add_user(files.passwords, "bob", "bob-pw")
        files.acl.write_text("allow user alice all a/#\nallow user bob all b/#\n")
        files.limits.write_text("mqtt-receive-maximum = 20\n")
        line = hangup(process, "config_reloaded")
        assert "2 users" in line and "2 rules" in line
        assert "mqtt-receive-maximum 10 -> 20" in line
        code, properties = connack(port, "bob", "bob-pw")
        assert (code, properties.ReceiveMaximum) == (0, 20)
        bob = client(port, "bob-1", "bob", "bob-pw")
        try:
            assert bob.subscribe("b/#", 1) == [1]  # (a rule of the new file)
            assert bob.subscribe("a/#", 1) == [0x87]
            routed_to(alice, "a/probe", alice)  # (alice's connection of before still serves)
            bob.publish("b/x", b"new rules", 1)
            assert bob.take(1)[0].payload == b"new rules"
        finally:
            bob.close()

        add_user(files.passwords, "carol", "carol-pw")
        files.acl.write_text("allow user carol all c/#\nallow bogus\n")
        line = hangup(process, "config_reload_failed")
        assert f"{files.acl}:2" in line and "kept its configuration" in line
        assert connack(port, "carol", "carol-pw")[0] == 0x86  # (all or nothing)
        assert connack(port, "bob", "bob-pw")[0] == 0

        files.acl.write_text("allow user alice all a/#\n")
        files.limits.write_text("mqtt-max-connecting = 5\n")  # (not a live limit)
        line = hangup(process, "config_reload_failed")
        assert "mqtt-max-connecting" in line
        assert not alice.disconnects.qsize()  # (alice stayed through every reload)
    finally:
        alice.close()

    metrics = get(base + "/metrics")
    assert re.search(r'^router_reloads_total\{node="reloader"\} 1\.0$', metrics, re.M)
    assert re.search(r'^router_reload_failures_total\{node="reloader"\} 2\.0$', metrics, re.M)
    assert "Traceback" not in "\n".join(process.logged())


def reload_command(env: dict[str, str], *args: str) -> Any:
    return invoke(env["ROUTER_REDIS_URL"], env["ROUTER_PREFIX"], "node", "reload", *args)


def test_router_node_reload_asks_the_node_and_its_row_tells_what_it_loaded(
    node: tuple[Process, int, str], files: Files, env: dict[str, str]
) -> None:
    process, port, base = node
    add_user(files.passwords, "bob", "bob-pw")
    files.limits.write_text("")
    answered = reload_command(env, "--json")
    assert answered.exit_code == 0, answered.output
    [answer] = json.loads(answered.stdout)
    assert (answer["node"], answer["ok"]) == ("reloader", True)
    assert "asked by router node reload" in answer["text"]
    assert "mqtt-receive-maximum 10 -> 128" in answer["text"]  # (back to the option's)
    assert connack(port, "bob", "bob-pw")[0] == 0

    files.passwords.write_text("not a password line\n")
    answered = reload_command(env)
    assert answered.exit_code == 1
    assert "node reloader kept its configuration (asked by router node reload): " in (
        answered.output
    )
    assert str(files.passwords) in answered.output
    assert "Traceback" not in answered.output + "\n".join(process.logged())
    assert connack(port, "bob", "bob-pw")[0] == 0

    row: dict[str, Any] = {}

    def reported() -> bool:
        rows = json.loads(get(base + "/api/v1/nodes"))["items"]
        row.update(next(r for r in rows if r["node_id"] == "reloader"))
        return bool(row["reload"] and row["reload"]["failures"] == 1)

    wait_until(reported, TIMEOUT, "the failed reload in the node's telemetry")
    assert row["reload"]["reloads"] == 1
    assert str(files.passwords) in row["reload"]["error"]
    assert f"password file {files.passwords} (2 users)" in row["reload"]["loaded"]
    assert row["reload"]["last_ms"] > 0

    named = reload_command(env, "reloader", "ghost")
    assert named.exit_code == 1
    assert "node ghost is not alive" in named.output
    assert "node reloader kept its configuration" in named.output


def test_with_jwts_the_passwords_that_are_not_tokens_follow_the_reloaded_file(
    env: dict[str, str], files: Files
) -> None:
    jwt = {**env, "ROUTER_JWT_SECRET": "the secret the token issuer and the nodes share"}
    args = ("--password-file", str(files.passwords), "--no-allow-anonymous")
    with mqtt_node("jwt", jwt, *args) as (process, port):
        assert connack(port, "bob", "bob-pw")[0] == 0x86
        add_user(files.passwords, "bob", "bob-pw")
        hangup(process, "config_reloaded")
        assert connack(port, "bob", "bob-pw")[0] == 0


def test_a_bad_limits_file_at_start_is_one_error_line(env: dict[str, str], files: Files) -> None:
    files.limits.write_text("mqtt-max-publish-rate = fast\n")
    url, prefix = env["ROUTER_REDIS_URL"], env["ROUTER_PREFIX"]
    result = invoke(url, prefix, "node", "run", "--limits-file", str(files.limits))
    assert result.exit_code != 0
    assert f"limits file {files.limits} line 1: mqtt-max-publish-rate is a number" in (
        result.output
    )
    assert "Traceback" not in result.output


# -- certificates ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    return make_pki(tmp_path_factory.mktemp("one")), make_pki(tmp_path_factory.mktemp("two"))


def served_fingerprint(port: int) -> str:
    """The SHA-256 of the certificate a new TLS connection to ``port`` is shown."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def fingerprint_of(cert: Path) -> str:
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).hexdigest()


def test_certificate_rotation_reaches_new_connections_only(
    env: dict[str, str], pkis: tuple[Pki, Pki], tmp_path: Path
) -> None:
    old, new = pkis
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    shutil.copy(old.server_cert, cert)
    shutil.copy(old.server_key, key)
    args = ("--mqtt-tls", "127.0.0.1:0", "--mqtt-wss", "127.0.0.1:0")
    with mqtt_node("tls", env, *args, "--tls-cert", str(cert), "--tls-key", str(key)) as (
        process,
        port,
    ):
        ports = listener_ports(process)
        tls_port, wss_port = ports["MQTT TLS"][0], ports["MQTT WSS"][0]
        assert served_fingerprint(tls_port) == fingerprint_of(old.server_cert)
        before = Paho(tls_port, "before", V5, tls=(old, False))  # (trusts the old CA only)
        plain = Paho(port, "plain", V5)
        try:
            assert before.connected()[0] == 0
            assert before.subscribe("t/#", 1) == [1]

            shutil.copy(new.server_cert, cert)
            shutil.copy(new.server_key, key)
            line = hangup(process, "config_reloaded")
            assert fingerprint_of(new.server_cert).upper()[:16] in line
            for listener in (tls_port, wss_port):
                assert served_fingerprint(listener) == fingerprint_of(new.server_cert)
            after = Paho(tls_port, "after", V5, tls=(new, False))
            try:
                assert after.connected()[0] == 0
            finally:
                after.close()
            routed_to(plain, "t/probe", before)  # (the connection of before is untouched)

            key.write_text("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
            line = hangup(process, "config_reload_failed")
            assert str(key) in line
            assert served_fingerprint(wss_port) == fingerprint_of(new.server_cert)
        finally:
            before.close()
            plain.close()
