"""``router clients`` against real Redis (standalone and the 3-master cluster), with two
``router node run --mqtt`` processes and real paho-mqtt clients: the list, one client's
session, and the kick."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from router.cli import app
from router.mqtt.sys_topics import VERSION
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.session_store import open_fields
from router.state.subscriptions import SubscriptionStore
from tests.support.cli import invoke, invoke_json
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, connect_properties, mqtt_node, routed_to
from tests.support.waiting import wait_until

ADMINISTRATIVE_ACTION = 0x98


class Nodes:
    """Nodes a and b on the test's Redis and prefix, and the clients the test made."""

    def __init__(self, url: str, prefix: str, ports: dict[str, int]) -> None:
        self.url = url
        self.prefix = prefix
        self.ports = ports
        self.clients: list[Paho] = []

    def client(self, node: str, client_id: str, protocol: int = V5, **options: Any) -> Paho:
        """A connected client on ``node`` (CONNACK 0 checked)."""
        made = Paho(self.ports[node], client_id, protocol, **options)
        self.clients.append(made)
        code, _ = made.connected()
        assert code == 0
        return made

    def keeper(self, node: str, client_id: str, expiry: int = 300) -> Paho:
        """A 5.0 client with a persistent session (clean start 0, Session Expiry)."""
        properties = connect_properties(SessionExpiryInterval=expiry)
        return self.client(node, client_id, V5, clean=False, properties=properties)

    def rows(self, *args: str) -> dict[str, dict[str, Any]]:
        """``router clients ARGS --json`` by client id."""
        found = invoke_json(self.url, self.prefix, "clients", *args)
        return {row["client_id"]: row for row in found}

    def show(self, client_id: str) -> dict[str, Any]:
        found: dict[str, Any] = invoke_json(self.url, self.prefix, "clients", "show", client_id)
        return found


@pytest.fixture
def nodes(redis_url: str, prefix: str) -> Iterator[Nodes]:
    """Nodes a and b (child processes) and the clients of the test, all closed after it;
    the ``prefix`` fixture then deletes every key the test made."""
    env = {"ROUTER_REDIS_URL": redis_url, "ROUTER_PREFIX": prefix}
    with mqtt_node("a", env) as (_, port_a), mqtt_node("b", env) as (_, port_b):
        made = Nodes(redis_url, prefix, {"a": port_a, "b": port_b})
        try:
            yield made
        finally:
            for client in made.clients:
                client.close()


def test_connected_clients_are_listed_with_node_protocol_and_subscriptions(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # the table's width (rich)
    five = nodes.client("a", "five", V5, keepalive=30)
    assert five.subscribe("home/+/temp", 1) == [1]
    assert five.subscribe("alerts/#", 0) == [0]
    old = nodes.client("b", "old", V311, keepalive=45)
    assert old.subscribe("home/#", 1) == [1]
    rows = nodes.rows()
    assert list(rows) == ["five", "old"]
    assert {
        k: rows["five"][k]
        for k in ("node", "protocol", "state", "keepalive", "subscriptions", "queued")
    } == {
        "node": "a",
        "protocol": "5.0",
        "state": "connected",
        "keepalive": 30,
        "subscriptions": 2,
        "queued": 0,
    }
    assert {k: rows["old"][k] for k in ("node", "protocol", "keepalive", "subscriptions")} == {
        "node": "b",
        "protocol": "3.1.1",
        "keepalive": 45,
        "subscriptions": 1,
    }
    assert rows["five"]["expires_in"] is None and rows["five"]["node_alive"]
    assert rows["five"]["since"].endswith("Z")
    assert list(nodes.rows("--node", "a")) == ["five"]
    assert list(nodes.rows("--node", "nowhere")) == []
    table = invoke(nodes.url, nodes.prefix, "clients")
    assert table.exit_code == 0, table.output
    assert "five" in table.output and "3.1.1" in table.output and "connected" in table.output


def test_a_persistent_session_that_left_is_away_with_what_waits_for_it(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    keeper = nodes.keeper("a", "keeper", 300)
    assert keeper.subscribe("news/#", 1) == [1]
    publisher = nodes.client("b", "publisher")
    routed_to(publisher, "news/probe", keeper)
    keeper.close()  # DISCONNECT 0x00: the session stays for 300 s
    wait_until(lambda: nodes.rows()["keeper"]["state"] == "away", TIMEOUT, nodes.rows)
    for n in range(3):
        publisher.publish("news/x", f"missed {n}".encode(), 1)
    wait_until(lambda: nodes.rows()["keeper"]["queued"] == 3, TIMEOUT, nodes.rows)
    row = nodes.rows()["keeper"]
    assert (row["node"], row["protocol"], row["subscriptions"]) == ("a", "5.0", 1)
    assert row["expiry"] == 300
    assert 0 < row["expires_in"] <= 300
    assert nodes.rows()["publisher"]["queued"] == 0
    table = invoke(nodes.url, nodes.prefix, "clients", "--node", "a")
    assert table.exit_code == 0, table.output
    assert "away" in table.output and "publisher" not in table.output


def test_show_lists_the_filters_with_their_options(nodes: Nodes) -> None:
    client = nodes.client("a", "shown", V5, user=("alice", "secret"))
    assert client.subscribe("home/+/temp", 1) == [1]
    assert client.subscribe("alerts/#", 2, noLocal=True) == [2]
    found = nodes.show("shown")
    assert (found["node"], found["state"], found["username"]) == ("a", "connected", "alice")
    assert found["subscriptions"] == 2
    assert [(f["filter"], f["qos"], f["no_local"]) for f in found["filters"]] == [
        ("alerts/#", 2, True),
        ("home/+/temp", 1, False),
    ]
    table = invoke(nodes.url, nodes.prefix, "clients", "show", "shown")
    assert table.exit_code == 0, table.output
    assert "home/+/temp" in table.output and "alice" in table.output


def test_kick_ends_the_connection_and_a_persistent_session_stays_away(nodes: Nodes) -> None:
    kicked = nodes.keeper("b", "kicked", 300)
    kicked.client.reconnect_delay_set(min_delay=60, max_delay=60)  # no reconnect meanwhile
    assert kicked.subscribe("jobs/#", 1) == [1]
    sent = invoke_json(nodes.url, nodes.prefix, "clients", "kick", "kicked")
    assert sent == {"client_id": "kicked", "node": "b", "protocol": "5.0"}
    assert kicked.expect_disconnect() == ADMINISTRATIVE_ACTION
    wait_until(lambda: nodes.show("kicked")["state"] == "away", TIMEOUT, "the session is away")
    assert nodes.show("kicked")["filters"][0]["filter"] == "jobs/#"
    again = invoke(nodes.url, nodes.prefix, "clients", "kick", "kicked")
    assert again.exit_code == 1
    [line] = again.output.strip().splitlines()
    assert line.startswith("Error: client 'kicked' is not connected"), line


def test_kick_of_a_3_1_1_client_closes_its_connection(nodes: Nodes) -> None:
    old = nodes.client("a", "old-kicked", V311)
    old.client.reconnect_delay_set(min_delay=60, max_delay=60)
    result = invoke(nodes.url, nodes.prefix, "clients", "kick", "old-kicked")
    assert result.exit_code == 0, result.output
    assert "node 'a'" in result.output
    old.expect_disconnect()  # 3.1.1 has no server DISCONNECT: the connection just closes
    # A clean session ends with its connection.
    wait_until(
        lambda: invoke(nodes.url, nodes.prefix, "clients", "show", "old-kicked").exit_code != 0,
        TIMEOUT,
        "the clean session ended",
    )


@pytest.mark.parametrize("command", [["show"], ["kick"]])
def test_an_unknown_client_is_one_line_and_a_failure(
    redis_url: str, prefix: str, command: list[str]
) -> None:
    result = invoke(redis_url, prefix, "clients", *command, "ghost")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith(f"Error: client 'ghost' has no session under prefix '{prefix}'")


def test_a_subcommand_takes_the_redis_options_given_to_the_group(
    redis_url: str, prefix: str
) -> None:
    args = ["clients", "--redis", redis_url, "--prefix", prefix, "--json", "show", "ghost"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert f"has no session under prefix '{prefix}'" in result.output


def seed_sessions(url: str, prefix: str, count: int) -> None:
    """``count`` connected sessions (``s-0000``...), half on node a and half on node b,
    written as a node's claim writes them."""

    async def seed() -> None:
        redis = await open_redis(url)
        try:
            store = SubscriptionStore(redis, Keys(prefix))
            fields = open_fields(0, 4, 30, None)
            for start in range(0, count, 500):
                await asyncio.gather(
                    *(
                        store.claim_over(f"s-{i:04d}", "ab"[i % 2], open_session=fields)
                        for i in range(start, min(start + 500, count))
                    )
                )
        finally:
            await redis.aclose()

    asyncio.run(seed())


def test_sessions_are_listed_in_pages_in_client_id_order_without_a_cap(
    redis_url: str, prefix: str
) -> None:
    seed_sessions(redis_url, prefix, 2_500)
    pages = [
        invoke(redis_url, prefix, "clients", "--limit", "1000", "--page", str(page), "--json")
        for page in (1, 2, 3)
    ]
    assert all(result.exit_code == 0 for result in pages)
    ids = [[row["client_id"] for row in json.loads(result.stdout)] for result in pages]
    assert ids == [[f"s-{i:04d}" for i in range(s, min(s + 1000, 2_500))] for s in (0, 1000, 2000)]
    assert "--page 2" in pages[0].stderr and "--page 4" not in pages[2].stderr
    on_b = invoke_json(redis_url, prefix, "clients", "--node", "b", "--limit", "500", "--page", "3")
    assert [row["client_id"] for row in on_b] == [f"s-{i:04d}" for i in range(2001, 2_500, 2)]
    assert all(row["node"] == "b" for row in on_b)


LONG_ID = "sensor-kitchen-temperature-and-humidity-probe-0001-" + "x" * 30
LONG_FILTER = "building/north-wing/floor-7/room-712/sensors/+/temperature/readings/#"


def lines_of(nodes: Nodes, *args: str) -> list[str]:
    """The stdout lines of ``router ARGS`` (it succeeded, and said nothing on stderr)."""
    result = invoke(nodes.url, nodes.prefix, *args)
    assert result.exit_code == 0 and result.stderr == "", result.output
    return result.stdout.splitlines()


def test_tables_fit_80_columns_one_line_a_row_and_wide_prints_values_whole(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    long = nodes.client("a", LONG_ID, V5)
    assert long.subscribe(LONG_FILTER, 1) == [1]
    nodes.client("b", "short", V311)
    listed = lines_of(nodes, "clients")
    assert all(len(line) <= 80 for line in listed), listed
    [row] = [line for line in listed if line.startswith("sensor-kitchen")]
    assert "…" in row and row.split()[-5:] == ["5.0", "connected", "1", "0", "-"]
    assert [line.split()[0] for line in listed[2:]] == [row.split()[0], "short"]
    for args in (["clients", "show", LONG_ID], ["subs", LONG_ID]):
        shown = lines_of(nodes, *args)
        assert all(len(line) <= 80 for line in shown), shown
        [sub] = [line for line in shown if line.startswith("building/")]
        assert "…" in sub and sub.split()[1:] == ["1", "False", "False", "0"]
    wide = lines_of(nodes, "clients", "--wide")
    [row] = [line for line in wide if line.startswith(LONG_ID)]
    assert row.split()[1:4] == ["a", "5.0", "connected"] and row.split()[4].endswith("Z")
    for args in (["clients", "show", LONG_ID, "--wide"], ["subs", LONG_ID, "--wide"]):
        shown = lines_of(nodes, *args)
        assert LONG_ID in shown[0]
        [sub] = [line for line in shown if line.startswith("building/")]
        assert sub.split() == [LONG_FILTER, "1", "False", "False", "0"]


def test_the_list_takes_the_filters_of_the_api(nodes: Nodes) -> None:
    nodes.client("a", "desk-1", V5, user=("alice", "secret"))
    nodes.client("b", "desk-2", V311)
    nodes.keeper("a", "phone-1", 300).close()  # (away: the session stays)
    wait_until(lambda: nodes.rows()["phone-1"]["state"] == "away", TIMEOUT, nodes.rows)
    assert list(nodes.rows()) == ["desk-1", "desk-2", "phone-1"]
    assert list(nodes.rows("--id-prefix", "desk-")) == ["desk-1", "desk-2"]
    assert list(nodes.rows("--user", "alice")) == ["desk-1"]
    assert list(nodes.rows("--state", "away")) == ["phone-1"]
    assert list(nodes.rows("--protocol", "3.1.1")) == ["desk-2"]
    assert list(nodes.rows("--node", "a", "--state", "connected")) == ["desk-1"]
    assert list(nodes.rows("--id-prefix", "desk-", "--node", "a", "--user", "bob")) == []
    wrong = invoke(nodes.url, nodes.prefix, "clients", "--state", "gone")
    assert wrong.exit_code == 2 and "Traceback" not in wrong.output


def test_clear_ends_an_away_session_and_refuses_a_connected_client(nodes: Nodes) -> None:
    kept = nodes.keeper("a", "kept", 300)
    kept.client.reconnect_delay_set(min_delay=60, max_delay=60)
    assert kept.subscribe("jobs/#", 1) == [1]
    refused = invoke(nodes.url, nodes.prefix, "clients", "clear", "kept")
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "Error: client 'kept' is connected to node 'a': kick it first"
    ]
    kept.close()
    wait_until(lambda: nodes.show("kept")["state"] == "away", TIMEOUT, "the session is away")
    cleared = invoke_json(nodes.url, nodes.prefix, "clients", "clear", "kept")
    assert cleared == {"client_id": "kept", "cleared": True}
    for args in (["clients", "show", "kept"], ["subs", "kept"], ["clients", "clear", "kept"]):
        gone = invoke(nodes.url, nodes.prefix, *args)
        assert gone.exit_code == 1 and "Traceback" not in gone.output, args
        [line] = gone.stderr.splitlines()
        assert line.startswith("Error: client 'kept' has no session under prefix"), line


def test_nodes_version_is_the_software_and_routes_version_counts_route_changes(
    nodes: Nodes,
) -> None:
    client = nodes.client("a", "versioned")
    assert client.subscribe("v/#", 0) == [0]

    def found() -> dict[str, dict[str, Any]]:
        return {row["node_id"]: row for row in invoke_json(nodes.url, nodes.prefix, "nodes")}

    wait_until(lambda: all(row["version"] for row in found().values()), TIMEOUT, found)
    rows = found()
    assert {row["version"] for row in rows.values()} == {VERSION}  # (as /api/v1/nodes says)
    assert VERSION.startswith("router ")
    assert rows["a"]["routes_version"] >= 1 and rows["b"]["routes_version"] >= 0
    with_json_first = CliRunner().invoke(
        app, ["--json", "nodes", "--redis", nodes.url, "--prefix", nodes.prefix]
    )
    assert with_json_first.exit_code == 0, with_json_first.output
    assert [row["node_id"] for row in json.loads(with_json_first.stdout)] == ["a", "b"]
