"""The operator CLI against real Redis (standalone and a 3-master cluster), nodes running.

Nodes run on a loop thread of their own (see tests/support/cli.py); every command runs
through CliRunner, or as a child process when it must run while the test acts
(``subscribe``, ``node run``).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from router.cluster.inbox import Forward, pack_batch
from router.core.messages import Message
from router.state.alias_store import RedisAliasTable
from router.state.channels import Channel
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.routes import RouteStore
from router.state.session_store import SessionStore
from router.state.subscriptions import SubscriptionStore
from tests.support.cli import Cluster, invoke, invoke_json, router_process
from tests.support.nodes import die
from tests.support.waiting import wait_until

SHARE = "$share/g/jobs/#"


@pytest.fixture
def cluster(redis_url: str, prefix: str) -> Iterator[Cluster]:
    """Router nodes on a loop thread; all stopped after the test."""
    nodes = Cluster(redis_url, Keys(prefix))
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def populated(cluster: Cluster) -> Cluster:
    """Nodes a and b with clients: c1 on a, c2 and c3 on b, one share group across both."""
    a, b = cluster.start("a"), cluster.start("b")
    cluster.call(a.subscribe("c1", "home/+/temp", qos=1))
    cluster.call(a.subscribe("c1", SHARE))
    cluster.call(b.subscribe("c2", "home/#"))
    cluster.call(b.subscribe("c2", SHARE, qos=2, retain_as_published=True))
    cluster.call(b.subscribe("c3", SHARE))
    aliases = RedisAliasTable(cluster.client(), cluster.keys)
    cluster.call(aliases.bind("c1", "client", 1, "home/kitchen/temp"))
    cluster.call(aliases.bind("c1", "server", 7, "home/garage/temp"))
    return cluster


def test_nodes_lists_registered_nodes_with_route_counts(populated: Cluster) -> None:
    url, prefix = populated.url, populated.keys.prefix
    found = invoke_json(url, prefix, "nodes")
    assert [n["node_id"] for n in found] == ["a", "b"]
    assert all(n["alive"] for n in found)
    assert {n["node_id"]: n["routes"] for n in found} == {"a": 2, "b": 2}
    assert all(n["expires_in_ms"] > 0 and n["incarnation"] for n in found)
    table = invoke(url, prefix, "nodes")
    assert table.exit_code == 0, table.output
    assert "alive" in table.output


def test_nodes_lists_a_dead_node_down_since_after_its_purge(cluster: Cluster) -> None:
    """Before, a killed node left `router nodes` with the purge that follows its
    heartbeat's expiry (about 2 s), never shown as not alive. Now it stays listed, down
    since the event that told it, for an hour (or until it starts again)."""
    url, prefix = cluster.url, cluster.keys.prefix
    a = cluster.start("a", heartbeat_ttl=1.0)
    cluster.start("b", heartbeat_ttl=1.0)
    cluster.call(die(a))

    def purged() -> bool:
        listed = invoke_json(url, prefix, "nodes")
        return [n["node_id"] for n in listed if n["registered"]] == ["b"]

    wait_until(purged, 15.0, "b to purge a")
    found = {n["node_id"]: n for n in invoke_json(url, prefix, "nodes")}
    assert list(found) == ["a", "b"]
    assert (found["a"]["alive"], found["a"]["registered"]) == (False, False)
    assert found["a"]["down_since_ms"] > 0 and found["b"]["down_since_ms"] is None
    table = invoke(url, prefix, "nodes")
    assert table.exit_code == 0 and "purged" in table.output and "UTC" in table.output
    events = invoke_json(url, prefix, "events", "--kind", "node_down")
    assert [(e["kind"], e["subject"], e["node"]) for e in events] == [("node_down", "a", "b")]


def test_nodes_says_a_node_that_left_with_persistent_sessions_left(cluster: Cluster) -> None:
    """A node stopped gracefully with a persistent session retires (a peer adopts the
    session): alone, it stays listed, not alive, and the table says it left, not NO."""
    url, prefix = cluster.url, cluster.keys.prefix
    a = cluster.start("a")

    async def leave_with_a_session() -> None:
        await a.connect("s", clean_start=False, expiry=600)
        await a.put_away("s")
        await a.stop()

    cluster.call(leave_with_a_session())
    [listed] = invoke_json(url, prefix, "nodes")
    assert (listed["node_id"], listed["alive"], listed["retired"]) == ("a", False, True)
    table = invoke(url, prefix, "nodes")
    assert table.exit_code == 0, table.output
    row = next(line for line in table.output.splitlines() if line.startswith("a "))
    assert "left" in row.split() and "NO" not in row.split(), table.output


def test_routes_table_and_its_filters(populated: Cluster) -> None:
    url, prefix = populated.url, populated.keys.prefix
    assert invoke_json(url, prefix, "routes") == [
        {"filter": SHARE, "nodes": ["a", "b"], "members": {"a": 1, "b": 2}},
        {"filter": "home/#", "nodes": ["b"]},
        {"filter": "home/+/temp", "nodes": ["a"]},
    ]
    assert invoke_json(url, prefix, "routes", "--node", "a") == [
        {"filter": SHARE, "nodes": ["a"], "members": {"a": 1}},
        {"filter": "home/+/temp", "nodes": ["a"]},
    ]
    # --filter keeps the routes that overlap it: for a topic, those matching it.
    by_topic = invoke_json(url, prefix, "routes", "--filter", "home/kitchen/temp")
    assert [r["filter"] for r in by_topic] == ["home/#", "home/+/temp"]
    by_filter = invoke_json(url, prefix, "routes", "--filter", "home/+/humidity")
    assert [r["filter"] for r in by_filter] == ["home/#"]
    assert [r["filter"] for r in invoke_json(url, prefix, "routes", "--filter", "jobs/+")] == [
        SHARE
    ]
    table = invoke(url, prefix, "routes")
    assert table.exit_code == 0, table.output
    assert "home/+/temp" in table.output


def test_match_explains_which_nodes_and_why(populated: Cluster) -> None:
    url, prefix = populated.url, populated.keys.prefix
    assert invoke_json(url, prefix, "match", "home/kitchen/temp") == {
        "topic": "home/kitchen/temp",
        "nodes": ["a", "b"],
        "filters": {"a": ["home/+/temp"], "b": ["home/#"]},
        "shared": {},
    }
    assert invoke_json(url, prefix, "match", "jobs/resize/1") == {
        "topic": "jobs/resize/1",
        "nodes": ["a", "b"],
        "filters": {"a": [SHARE], "b": [SHARE]},
        "shared": {SHARE: {"a": 1, "b": 2}},
    }
    assert invoke_json(url, prefix, "match", "home")["filters"] == {"b": ["home/#"]}
    assert invoke_json(url, prefix, "match", "office/x")["nodes"] == []
    table = invoke(url, prefix, "match", "jobs/1")
    assert table.exit_code == 0, table.output
    assert "one member of" in table.output


def test_subs_and_aliases_of_a_client(populated: Cluster) -> None:
    url, prefix = populated.url, populated.keys.prefix
    assert invoke_json(url, prefix, "subs", "c2") == [
        {
            "filter": SHARE,
            "qos": 2,
            "no_local": False,
            "retain_as_published": True,
            "retain_handling": 0,
            "subscription_identifier": None,
        },
        {
            "filter": "home/#",
            "qos": 0,
            "no_local": False,
            "retain_as_published": False,
            "retain_handling": 0,
            "subscription_identifier": None,
        },
    ]
    for command in ("subs", "aliases"):  # (not found: exit 1, one line)
        unknown = invoke(url, prefix, command, "nobody")
        assert unknown.exit_code == 1 and unknown.stdout == "", unknown.output
        [line] = unknown.stderr.splitlines()
        assert line.startswith("Error: client 'nobody' has no session under prefix"), line
    assert invoke_json(url, prefix, "aliases", "c1") == {
        "client": [{"alias": 1, "topic": "home/kitchen/temp"}],
        "server": [{"alias": 7, "topic": "home/garage/temp"}],
    }
    assert invoke_json(url, prefix, "aliases", "c2") == {"client": [], "server": []}
    for command in ("subs", "aliases"):
        table = invoke(url, prefix, command, "c1")
        assert table.exit_code == 0, table.output
        assert "owner a" in table.output or "home/kitchen/temp" in table.output


def test_trie_dump_of_the_cluster_and_of_one_node(populated: Cluster) -> None:
    url, prefix = populated.url, populated.keys.prefix
    result = invoke(url, prefix, "trie", "dump")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "(root)"
    assert any(line.endswith("temp  <- a") for line in lines), lines
    assert any(line.endswith("#  <- b") for line in lines), lines
    assert any("$share/g: [a, b]" in line for line in lines), lines
    assert f"  {SHARE}: a x1, b x2" in lines
    one = invoke(url, prefix, "trie", "dump", "--node", "b")
    assert one.exit_code == 0, one.output
    assert "temp  <- a" not in one.stdout
    assert "#  <- b" in one.stdout


def test_channels_list_and_show_the_inboxes(populated: Cluster) -> None:
    url, prefix = populated.url, populated.keys.prefix
    listed = invoke_json(url, prefix, "channels", "list")
    assert [c["name"] for c in listed] == ["inbox:a", "inbox:b"]
    assert all(c["clock"] == 0 and c["ttl_s"] > 0 for c in listed)
    shown = invoke_json(url, prefix, "channels", "show", "inbox:a")
    assert shown["name"] == "inbox:a" and shown["complete"] is True
    assert [(s["subscriber"], s["cursor"], s["pending"]) for s in shown["subscribers"]] == [
        ("a", 0, 0)
    ]
    # A publish from a to b's client goes through b's inbox: its clock moves.
    populated.call(populated.nodes["a"].publish("home/x", b"1"))
    assert invoke_json(url, prefix, "channels", "show", "inbox:b")["clock"] == 1
    for args in (("channels", "list"), ("channels", "show", "inbox:b")):
        table = invoke(url, prefix, *args)
        assert table.exit_code == 0, table.output
        assert "inbox:" in table.output


def test_reconcile_reports_and_repairs_stale_route_sets(cluster: Cluster) -> None:
    url, prefix = cluster.url, cluster.keys.prefix
    a = cluster.start("a")
    cluster.call(a.subscribe("c1", "home/#"))
    assert invoke_json(url, prefix, "reconcile") == {
        "ok": True,
        "problems": [],
        "checked": {"nodes": 1, "route_sets": 1, "clients": 1, "clients_complete": True},
        "repaired": False,
    }
    client = cluster.client()
    # A route set left behind by a node that is not registered...
    cluster.call(RouteStore(client, cluster.keys).claim("ghost", "inc-1", {"x/#": 1}))
    # ... and a client of a that subscribes to a filter missing from a's route set.
    store = SubscriptionStore(client, cluster.keys)
    cluster.call(store.claim("lost", "a"))
    cluster.call(store.subscribe("lost", "lost/#"))
    report = reconcile_json(url, prefix, exit_code=1)
    assert report["ok"] is False
    problems = {p["kind"]: p for p in report["problems"]}
    assert set(problems) == {"stale_route_set", "missing_route"}
    assert problems["stale_route_set"]["node_id"] == "ghost"
    assert problems["stale_route_set"]["routes"] == 1
    assert problems["stale_route_set"]["repair"] == "purge"
    assert problems["missing_route"]["node_id"] == "a"
    assert problems["missing_route"]["client_id"] == "lost"
    assert problems["missing_route"]["route"] == "lost/#"
    assert problems["missing_route"]["repair"] == "node"

    repaired = reconcile_json(url, prefix, "--repair", exit_code=1)
    assert repaired["repaired"] is True
    after = {p["kind"]: p for p in repaired["problems"]}
    assert after["stale_route_set"]["repaired"] == "purged"
    assert after["missing_route"]["repaired"] is None  # only node a may write its routes
    snapshot = cluster.call(RouteStore(client, cluster.keys).snapshot("ghost"))
    assert snapshot.generation is None and snapshot.routes == {}
    again = reconcile_json(url, prefix, exit_code=1)
    assert [p["kind"] for p in again["problems"]] == ["missing_route"]
    table = invoke(url, prefix, "reconcile")
    assert table.exit_code == 1, table.output  # (before, 0 whatever was found)
    assert "the node itself" in table.output


def test_reconcile_purges_dead_nodes_when_no_live_node_does(cluster: Cluster) -> None:
    url, prefix = cluster.url, cluster.keys.prefix
    client = cluster.client()
    routes = RouteStore(client, cluster.keys)
    # A node that died (a heartbeat TTL of 1 ms), and one registered without a route set.
    cluster.call(NodeRegistry(client, cluster.keys, ttl=0.001).register("zombie", "z-1"))
    cluster.call(routes.claim("zombie", "z-1", {"z/#": 1}))
    cluster.call(NodeRegistry(client, cluster.keys, ttl=60).register("empty", "e-1"))
    report = reconcile_json(url, prefix, exit_code=1)
    problems = {p["node_id"]: p for p in report["problems"]}
    assert problems["zombie"]["kind"] == "dead_node"
    assert problems["zombie"]["routes"] == 1
    assert problems["empty"]["kind"] == "missing_route_set"
    repaired = reconcile_json(url, prefix, "--repair", exit_code=1)
    assert {p["node_id"]: p["repaired"] for p in repaired["problems"]} == {
        "empty": None,
        "zombie": "purged",
    }
    assert [n["node_id"] for n in invoke_json(url, prefix, "nodes")] == ["empty"]
    assert cluster.call(routes.snapshot("zombie")).routes == {}


def test_reconcile_removes_the_clean_sessions_of_a_dead_node_and_keeps_its_persistent_ones(
    cluster: Cluster,
) -> None:
    """Before, a dead node's clean clients stayed listed for good, reconcile listed them
    and exited 0, and --repair left them. Now they are ghost clients: --repair removes
    them (fenced by the dead claim: one that came back elsewhere keeps its session), and
    the dead node, which still owns a persistent session, is left for a node to adopt."""
    url, prefix = cluster.url, cluster.keys.prefix
    client = cluster.client()
    store = SubscriptionStore(client, cluster.keys)
    sessions = SessionStore(client, cluster.keys, store)
    cluster.call(NodeRegistry(client, cluster.keys, ttl=0.001).register("zombie", "z-1"))
    for client_id, expiry in (("clean-1", 0), ("clean-2", 0), ("back", 0), ("kept", 600)):
        owner = cluster.call(store.claim(client_id, "zombie"))
        cluster.call(sessions.mark_open(client_id, owner, expiry=expiry, protocol=5))
        cluster.call(store.subscribe(client_id, f"t/{client_id}"))
    orphan = cluster.call(store.claim("orphan", "purged-long-ago"))
    cluster.call(sessions.mark_open("orphan", orphan, expiry=600, protocol=5))
    report = reconcile_json(url, prefix, exit_code=1)
    kinds = {(p["kind"], p["client_id"] or p["node_id"]) for p in report["problems"]}
    assert kinds == {
        ("dead_node", "zombie"),
        ("ghost_client", "clean-1"),
        ("ghost_client", "clean-2"),
        ("ghost_client", "back"),
        ("orphan_session", "orphan"),
    }
    [dead] = [p for p in report["problems"] if p["kind"] == "dead_node"]
    assert dead["repair"] == "node" and "1 persistent sessions" in dead["detail"]
    # (the client came back meanwhile, on a node still starting: no route set yet)
    cluster.call(NodeRegistry(client, cluster.keys, ttl=60).register("elsewhere", "e-1"))
    cluster.call(store.claim("back", "elsewhere"))
    repaired = reconcile_json(url, prefix, "--repair", exit_code=1)
    statuses = {p["client_id"] or p["node_id"]: p["repaired"] for p in repaired["problems"]}
    assert statuses == {
        "zombie": None,
        "clean-1": "removed",
        "clean-2": "removed",
        "elsewhere": None,
        "orphan": None,
    }
    for gone in ("clean-1", "clean-2"):
        assert cluster.call(client.exists(*cluster.keys.client_keys(gone))) == 0
    assert cluster.call(store.owner("back")).node_id == "elsewhere"
    assert cluster.call(store.owner("kept")).node_id == "zombie"
    assert [n["node_id"] for n in invoke_json(url, prefix, "nodes")] == ["elsewhere", "zombie"]
    again = reconcile_json(url, prefix, exit_code=1)
    assert {p["kind"] for p in again["problems"]} == {
        "dead_node",
        "orphan_session",
        "missing_route_set",
    }
    table = invoke(url, prefix, "reconcile")
    assert table.exit_code == 1 and "a live node" in table.output


def reconcile_json(url: str, prefix: str, *args: str, exit_code: int) -> Any:
    """``reconcile ARGS --json``'s report, asserting its exit status."""
    result = invoke(url, prefix, "reconcile", *args, "--json")
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def test_publish_and_subscribe_round_trip(cluster: Cluster) -> None:
    url, prefix = cluster.url, cluster.keys.prefix
    cluster.start("bystander")
    with router_process(
        "subscribe",
        "sensors/#",
        "--count",
        "2",
        "--json",
        "--qos",
        "1",
        "--node-id",
        "listener",
        "--timeout",
        "60",
        "--redis",
        url,
        "--prefix",
        prefix,
    ) as subscriber:
        subscriber.wait_for("subscribed listener to 'sensors/#'")
        assert invoke_json(url, prefix, "match", "sensors/t")["nodes"] == ["listener"]
        sent = invoke_json(url, prefix, "publish", "sensors/t", "21.5", "--qos", "1")
        assert sent["nodes"] == ["listener"]
        assert sent["topic"] == "sensors/t" and len(sent["message_id"]) == 32
        binary = invoke(url, prefix, "publish", "sensors/raw", "-", "--retain")
        assert binary.exit_code == 0, binary.output
        status, out, err = subscriber.finish()
    assert status == 0, err
    first, second = (json.loads(line) for line in out)
    assert first == {
        "topic": "sensors/t",
        "payload": "21.5",
        "encoding": "utf-8",
        "qos": 1,
        "retain": False,
        "message_id": sent["message_id"],
    }
    assert (second["topic"], second["payload"], second["encoding"]) == ("sensors/raw", "", "utf-8")
    # Both short-lived nodes left gracefully: deregistered, routes and client state gone.
    assert [n["node_id"] for n in invoke_json(url, prefix, "nodes")] == ["bystander"]
    assert invoke_json(url, prefix, "routes") == []
    assert invoke(url, prefix, "subs", "listener").exit_code == 1  # (not found: no state left)
    assert invoke_json(url, prefix, "reconcile")["ok"] is True


def test_publish_reports_no_interested_node(cluster: Cluster) -> None:
    url, prefix = cluster.url, cluster.keys.prefix
    cluster.start("a")
    sent = invoke_json(url, prefix, "publish", "nobody/listens", "x")
    assert sent["nodes"] == []
    text = invoke(url, prefix, "publish", "nobody/listens", "x")
    assert text.exit_code == 0 and "no node is interested" in text.output


def test_subscribe_gives_up_after_its_timeout(cluster: Cluster) -> None:
    url, prefix = cluster.url, cluster.keys.prefix
    result = invoke(url, prefix, "subscribe", "quiet/#", "--count", "1", "--timeout", "0.3")
    assert result.exit_code == 1
    assert "received 0 of 1 messages" in result.output
    assert "Traceback" not in result.output
    assert invoke_json(url, prefix, "nodes") == []
    assert invoke_json(url, prefix, "routes") == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_node_run_serves_until_a_signal_then_leaves(
    cluster: Cluster, signum: signal.Signals
) -> None:
    url, prefix = cluster.url, cluster.keys.prefix
    cluster.start("bystander")
    env = {
        "ROUTER_REDIS_URL": url,
        "ROUTER_PREFIX": prefix,
        "ROUTER_NODE_ID": "served",
        "ROUTER_HEARTBEAT_INTERVAL": "0.2",
        "ROUTER_HEARTBEAT_TTL": "2",
    }
    with router_process("node", "run", env=env) as served:
        served.wait_for("node served ready")
        [status] = [n for n in invoke_json(url, prefix, "nodes") if n["node_id"] == "served"]
        assert status["alive"] is True and status["routes"] == 0
        # It serves its inbox: a batch stored there (as another node forwards one) is
        # fetched and acknowledged.
        inbox = Channel(cluster.client(), cluster.keys.inbox("served"), 300, cluster.keys)
        batch = pack_batch([Forward(Message(b"\x01" * 16, "x", b"payload"))])
        cluster.call(inbox.publish([("batch-1", batch)]))
        wait_until_acked(url, prefix, "served")
        served.signal(signum)
        code, _, err = served.finish()
    assert code == 0, err
    assert any("node served stopped" in line for line in err), err
    assert [n["node_id"] for n in invoke_json(url, prefix, "nodes")] == ["bystander"]
    assert invoke_json(url, prefix, "reconcile")["problems"] == []


def wait_until_acked(url: str, prefix: str, node_id: str, timeout: float = 30.0) -> None:
    """Poll ``router channels show`` until the node acknowledged its inbox's one message."""

    def acked() -> bool:
        shown = invoke_json(url, prefix, "channels", "show", f"inbox:{node_id}")
        [cursor] = shown["subscribers"]
        return bool(shown["clock"] == 1 and cursor["cursor"] == 1 and cursor["pending"] == 0)

    wait_until(acked, timeout, f"node {node_id} to acknowledge its inbox", poll=0.05)


def test_node_run_refuses_a_ttl_shorter_than_the_interval(redis_url: str, prefix: str) -> None:
    result = invoke(
        redis_url, prefix, "node", "run", "--heartbeat-ttl", "1", "--heartbeat-interval", "2"
    )
    assert result.exit_code == 2
    assert "--heartbeat-ttl" in result.output
