"""JWT authentication end to end: paho-mqtt clients against ``router node run
--jwt-secret S`` (from ROUTER_JWT_SECRET) on a real Redis; the token is the password."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from click.testing import CliRunner

from router.cli import app
from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, mqtt_node

SECRET = "the secret the token issuer and the nodes share"


def token(key: str | None = SECRET, algorithm: str = "HS256", **claims: Any) -> str:
    claims.setdefault("exp", time.time() + 600)
    return jwt.encode(claims, key, algorithm)


@pytest.fixture
def port(redis_standalone_url: str, keys: Keys) -> Iterator[int]:
    env = {
        "ROUTER_REDIS_URL": redis_standalone_url,
        "ROUTER_PREFIX": keys.prefix,
        "ROUTER_JWT_SECRET": SECRET,
    }
    with mqtt_node("jwt", env, "--jwt-leeway", "0", "--no-allow-anonymous") as (_, node_port):
        yield node_port


def connect(
    port: int, clients: list[Paho], client_id: str, user: str, password: str, **options: Any
) -> tuple[Paho, int]:
    made = Paho(port, client_id, options.pop("protocol", V5), user=(user, password), **options)
    clients.append(made)
    return made, made.connected()[0]


@pytest.mark.parametrize("protocol", [V5, V311])
def test_a_valid_token_connects_and_bad_ones_get_0x86(
    port: int, clients: list[Paho], protocol: int
) -> None:
    _, code = connect(port, clients, "good", "alice", token(sub="alice"), protocol=protocol)
    assert code == 0
    bad = {
        "expired": token(sub="alice", exp=time.time() - 5),
        "forged": token("a secret that is not the nodes' one", sub="alice"),
        "unsigned": token(None, "none", sub="alice"),
        "another user": token(sub="bob"),
        "no exp": jwt.encode({"sub": "alice"}, SECRET, "HS256"),
        "not a token": "wonder land",
    }
    for case, password in bad.items():
        _, code = connect(
            port, clients, f"bad-{len(clients)}", "alice", password, protocol=protocol
        )
        assert code == 0x86, case  # (paho reports 3.1.1's return code 4 as 0x86)


def test_a_token_that_expires_while_connected_gets_0xa0_and_its_will_goes(
    port: int, clients: list[Paho]
) -> None:
    watcher, _ = connect(port, clients, "watcher", "bob", token(sub="bob"))
    assert watcher.subscribe("wills/#", 1) == [1]
    short = token(sub="alice", exp=time.time() + 2)
    alice, code = connect(
        port, clients, "alice-1", "alice", short, will=("wills/alice", b"gone", 1)
    )
    assert code == 0
    connected = time.monotonic()
    assert alice.expect_disconnect() == 0xA0  # (Maximum connect time)
    assert 1.0 < time.monotonic() - connected < TIMEOUT
    [will] = watcher.take(1)
    assert (will.topic, will.payload) == ("wills/alice", b"gone")
    assert watcher.disconnects.empty()


def test_the_acl_claim_limits_publish_subscribe_and_receive(port: int, clients: list[Paho]) -> None:
    claim = {"pub": ["a/#"], "sub": ["a/#", "%u/#"]}
    narrow, code = connect(port, clients, "narrow", "alice", token(sub="alice", acl=claim))
    assert code == 0
    acks: queue.Queue[int] = queue.Queue()
    narrow.client.on_publish = lambda client, data, mid, code, props: acks.put(code.value)
    narrow.publish("b/x", b"denied", 1)
    assert acks.get(timeout=TIMEOUT) == 0x87
    narrow.publish("a/x", b"allowed", 1)
    assert acks.get(timeout=TIMEOUT) == 0x10  # (published: no subscriber yet)
    assert narrow.subscribe("b/#", 1) == [0x87]
    assert narrow.subscribe("#", 1) == [1]  # (some topics of # may be received)
    sender, _ = connect(port, clients, "sender", "bob", token(sub="bob"))
    for topic in ("b/x", "alice/x", "a/x"):
        sender.publish(topic, topic.encode(), 1)
    assert [m.topic for m in narrow.take(2)] == ["alice/x", "a/x"]
    assert narrow.nothing_more()


def test_a_missing_public_key_file_is_one_error_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    result = CliRunner().invoke(app, ["node", "run", "--jwt-public-key", str(missing)])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert "cannot read the JWT public key" in lines[0] and str(missing) in lines[0]


def test_bad_jwt_options_are_one_error_line(tmp_path: Path) -> None:
    for args, expected in (
        (["--jwt-secret", "short"], "at least 32 bytes"),
        (["--jwt-secret", SECRET, "--jwt-algorithms", "none"], "never allowed"),
    ):
        result = CliRunner().invoke(app, ["node", "run", *args])
        assert result.exit_code != 0
        lines = result.output.splitlines()
        assert len(lines) == 1 and expected in lines[0], lines


def test_a_jwt_source_counts_as_an_authentication_source() -> None:
    """``--no-allow-anonymous`` needs a source: a JWT key is one (the node then tries to
    reach Redis, which is not there)."""
    args = ["node", "run", "--no-allow-anonymous", "--jwt-secret", SECRET]
    result = CliRunner().invoke(app, [*args, "--redis", "redis://127.0.0.1:1/0"])
    assert result.exit_code != 0
    assert "--no-allow-anonymous" not in result.output and "cannot reach Redis" in result.output
