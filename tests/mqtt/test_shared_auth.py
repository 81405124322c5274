"""Users and ACL rules shared by the cluster in Redis: ``router users`` and ``router acl``
change what two running ``router node run --auth-redis`` processes accept, without a
restart; paho-mqtt clients observe it (CONNACK, SUBACK and PUBACK codes, deliveries).
On a standalone Redis and on the 3-master cluster."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from click.testing import CliRunner

from router.cli import app
from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, mqtt_node
from tests.support.waiting import wait_until

Nodes = tuple[int, int]
Cli = Callable[..., tuple[int, str]]


@pytest.fixture(params=["redis_standalone_url", "redis_cluster_url"])
def url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def cli(url: str, keys: Keys) -> Cli:
    def invoke(*args: str, stdin: str | None = None) -> tuple[int, str]:
        target = ["--redis", url, "--prefix", keys.prefix]
        result = CliRunner().invoke(app, [*args, *target], input=stdin)
        assert "Traceback" not in result.output
        return result.exit_code, result.output.strip()

    return invoke


@pytest.fixture
def nodes(url: str, keys: Keys) -> Iterator[Nodes]:
    env = {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}
    options = ("--auth-redis", "--no-allow-anonymous")
    with ExitStack() as stack:
        _, port_a = stack.enter_context(mqtt_node("a", env, *options))
        _, port_b = stack.enter_context(mqtt_node("b", env, *options))
        yield port_a, port_b


def connack(port: int, user: str | None, password: str = "", protocol: int = V5) -> int:
    client = Paho(port, f"probe-{user}", protocol, **({"user": (user, password)} if user else {}))
    try:
        return client.connected()[0]
    finally:
        client.close()


def test_users_and_rules_reach_every_node_without_a_restart(nodes: Nodes, cli: Cli) -> None:
    port_a, port_b = nodes
    assert connack(port_b, "alice", "wonder land") == 0x86  # (no users yet)
    assert cli("users", "add", "alice", stdin="wonder land\n") == (0, "added user alice")
    wait_until(lambda: connack(port_b, "alice", "wonder land") == 0, TIMEOUT, "alice on b")
    assert connack(port_a, "alice", "wonder land", V311) == 0
    assert connack(port_a, "alice", "wrong") == 0x86
    assert connack(port_a, None) == 0x87  # (--no-allow-anonymous)

    alice = Paho(port_a, "alice-app", V5, user=("alice", "wonder land"))
    try:
        assert alice.subscribe("a/#", 1) == [0x87]  # (no rule: the default denies)
        code, _ = cli("acl", "add", "allow", "user", "alice", "all", "a/#")
        assert code == 0
        wait_until(lambda: alice.subscribe("a/#", 1) == [1], TIMEOUT, "the rule on a")

        assert cli("users", "add", "root", "--superuser", stdin="s3cret\n")[0] == 0
        wait_until(lambda: connack(port_b, "root", "s3cret") == 0, TIMEOUT, "root on b")
        root = Paho(port_b, "root-app", V5, user=("root", "s3cret"))
        try:
            assert root.subscribe("#", 1) == [1]  # (a superuser: every topic)
            root.publish("a/x", b"from root", 1)
            [got] = alice.take(1)
            assert (got.topic, got.payload) == ("a/x", b"from root")

            assert cli("acl", "remove", "allow user alice all a/#")[0] == 0
            wait_until(lambda: connack(port_a, "alice", "wonder land") == 0, TIMEOUT, "alive")

            def denied_now() -> bool:  # (a held subscription: its copies are judged again)
                root.publish("a/y", b"after the rule went", 1)
                return alice.nothing_more(0.3)

            wait_until(denied_now, TIMEOUT, "alice's copies denied")
        finally:
            root.close()
    finally:
        alice.close()

    assert cli("users", "passwd", "alice", stdin="new one\n")[0] == 0
    wait_until(lambda: connack(port_b, "alice", "new one") == 0, TIMEOUT, "alice's new password")
    assert cli("users", "remove", "alice") == (0, "removed user alice")
    wait_until(lambda: connack(port_a, "alice", "new one") == 0x86, TIMEOUT, "alice gone from a")
    code, listed = cli("users", "list", "--json")
    assert code == 0 and json.loads(listed) == [{"name": "root", "superuser": True}]


def test_the_commands_refuse_bad_input_in_one_line(cli: Cli, tmp_path: Path) -> None:
    assert cli("users", "add", "bob", stdin="b0b\n")[0] == 0
    assert cli("users", "add", "bob", stdin="b0b\n") == (1, "user bob exists (see --replace)")
    assert cli("users", "passwd", "nobody", stdin="x\n") == (1, "no user nobody")
    code, said = cli("users", "add", "carol", stdin="\n")
    assert code != 0 and len(said.splitlines()) == 1 and "password" in said
    code, said = cli("acl", "add", "allow", "everyone", "publish", "x")
    assert code != 0 and len(said.splitlines()) == 1
    no_rule = (1, "no rule allow all publish x")
    assert cli("acl", "remove", "allow", "all", "publish", "x") == no_rule
    assert cli("acl", "add", "deny", "all", "all", "b/#") == (0, "rule 1: deny all all b/#")
    assert cli("acl", "add", "allow", "all", "publish", "b/ok", "--at", "1")[0] == 0
    code, listed = cli("acl", "list", "--json")
    assert json.loads(listed) == [
        {"position": 1, "rule": "allow all publish b/ok"},
        {"position": 2, "rule": "deny all all b/#"},
    ]
    acl_file = tmp_path / "acl"
    acl_file.write_text("allow all all #\n")
    result = CliRunner().invoke(app, ["node", "run", "--auth-redis", "--acl", str(acl_file)])
    assert result.exit_code != 0 and "--auth-redis" in result.output
    assert "Traceback" not in result.output
