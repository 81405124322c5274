"""The ACL as mosquitto's operators know it, with real clients (paho-mqtt, mosquitto_sub)
against ``router node run --mqtt --acl FILE --acl-default allow`` on a real Redis: a
SUBSCRIBE is refused only where every topic it can match is denied, and every copy is
checked on its topic for the receiving session's user, whatever brought the session
there (a resume by another user, a move from a node without the ACL)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from router.state.keys import Keys
from tests.support.metrics import scrape
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, connect_properties, mqtt_node
from tests.support.servers import free_port
from tests.support.waiting import wait_until

RULES = """\
# the issue's case, and a user's own denial
deny all subscribe test/nosubscribe
deny user bob subscribe bob-secret/#
"""

Started = tuple[int, int, str]  # (port of node a, port of node b, node b's metrics address)


@pytest.fixture
def acl_nodes(tmp_path: Path, redis_standalone_url: str, keys: Keys) -> Iterator[Started]:
    """Node a without an ACL and node b with ``RULES`` and the default allow (and
    ``/metrics``; sessions shared between users), on one Redis namespace."""
    path = tmp_path / "acl.conf"
    path.write_text(RULES, encoding="utf-8")
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    with ExitStack() as stack:
        _, port_a = stack.enter_context(mqtt_node("a", env))
        _, port_b = stack.enter_context(
            mqtt_node(
                "b",
                env,
                *("--acl", str(path), "--acl-default", "allow", "--metrics", metrics),
                "--share-sessions-between-users",  # (bob may resume alice's session here)
            )
        )
        yield port_a, port_b, metrics


def client(
    port: int, clients: list[Paho], client_id: str, protocol: int = V5, **options: object
) -> Paho:
    made = Paho(port, client_id, protocol, **options)
    clients.append(made)
    assert made.connected()[0] == 0
    return made


def keeper(port: int, clients: list[Paho], client_id: str, user: str) -> Paho:
    """A 5.0 client of ``user`` resuming its session (clean start 0, expiry 300 s)."""
    properties = connect_properties(SessionExpiryInterval=300)
    return client(port, clients, client_id, clean=False, user=(user, ""), properties=properties)


def denied(metrics: str) -> float:
    return scrape(metrics)["router_acl_denied_deliveries_total"]


def test_a_wildcard_is_granted_and_the_denied_topic_never_arrives(
    acl_nodes: Started, clients: list[Paho]
) -> None:
    _, port_b, metrics = acl_nodes
    subscriber = client(port_b, clients, "watcher", user=("alice", ""))
    assert subscriber.subscribe("#", 1) == [1]  # (refused with 0x87 before)
    assert subscriber.subscribe("test/nosubscribe", 1) == [0x87]
    assert subscriber.subscribe("+/+", 1) == [1]
    older = client(port_b, clients, "older", V311)
    assert older.subscribe("test/#", 1) == [1]
    publisher = client(port_b, clients, "publisher")
    before = denied(metrics)
    publisher.publish("test/nosubscribe", b"kept out", 1)
    publisher.publish("test/other", b"let through", 1)
    for watcher in (subscriber, older):
        [got] = watcher.take(1)
        assert (got.topic, got.payload) == ("test/other", b"let through")
        assert watcher.nothing_more(0.3)
    wait_until(lambda: denied(metrics) == before + 2, TIMEOUT, lambda: denied(metrics))


def test_mosquitto_sub_on_hash_gets_no_denied_retained_message(
    acl_nodes: Started, clients: list[Paho]
) -> None:
    _, port_b, _ = acl_nodes
    publisher = client(port_b, clients, "retainer")
    publisher.publish("test/nosubscribe", b"retained, denied", 1, retain=True)
    publisher.publish("test/other", b"retained, allowed", 1, retain=True)
    got = subprocess.run(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port_b), "-t", "#", "-v", "-W", "2"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert got.stdout.splitlines() == ["test/other retained, allowed"], got.stderr


def test_a_session_resumed_by_another_user_gets_nothing_that_user_may_not_receive(
    acl_nodes: Started, clients: list[Paho]
) -> None:
    """alice's session (``#``) goes away on node b; bob resumes it there: neither what was
    queued for alice meanwhile nor what comes later on ``bob-secret/#`` reaches bob."""
    _, port_b, _ = acl_nodes
    alice = keeper(port_b, clients, "shared-id", "alice")
    assert alice.subscribe("#", 1) == [1]
    publisher = client(port_b, clients, "publisher")
    publisher.publish("bob-secret/1", b"for alice", 1)
    [seen] = alice.take(1)
    assert seen.topic == "bob-secret/1"
    alice.close()  # the session stays
    publisher.publish("bob-secret/2", b"queued for alice", 1)
    bob = keeper(port_b, clients, "shared-id", "bob")
    publisher.publish("bob-secret/3", b"live", 1)
    publisher.publish("news", b"for anyone", 1)
    [got] = bob.take(1)
    assert (got.topic, got.payload) == ("news", b"for anyone")
    assert bob.nothing_more(0.5)


def test_a_session_moved_to_a_node_with_the_acl_is_judged_there(
    acl_nodes: Started, clients: list[Paho]
) -> None:
    """A session subscribed to ``#`` on node a (no ACL) and away, resumed on node b (the
    ACL): what was queued for it on a and what is published on a later, which node b
    receives in its inbox, never brings it test/nosubscribe."""
    port_a, port_b, metrics = acl_nodes
    first = keeper(port_a, clients, "mover", "carol")
    assert first.subscribe("#", 1) == [1]
    publisher = client(port_a, clients, "publisher")
    publisher.publish("test/nosubscribe", b"before", 1)
    [seen] = first.take(1)  # node a has no ACL
    assert seen.payload == b"before"
    first.close()
    publisher.publish("test/nosubscribe", b"queued on a", 1)
    before = denied(metrics)
    second = keeper(port_b, clients, "mover", "carol")
    wait_until(lambda: denied(metrics) > before, TIMEOUT, "the queued copy judged on b")
    for n in range(3):
        publisher.publish("test/nosubscribe", f"live {n}".encode(), 1)
    publisher.publish("test/other", b"fence", 1)
    got = second.take(1)
    assert [m.payload for m in got] == [b"fence"]
    assert second.nothing_more(0.5)
