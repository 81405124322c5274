"""``router retained list|get|delete|count`` against real Redis (standalone and a 3-master
cluster), in the style of tests/cli/test_cli_ops.py."""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterator

import pytest

from router.state.keys import Keys
from router.state.retained_store import RetainedStore
from tests.cli.test_cli_errors import UNREACHABLE, assert_clean_failure
from tests.support.cli import Cluster, invoke, invoke_json, router_process
from tests.support.waiting import wait_until


@pytest.fixture
def stored(redis_url: str, prefix: str) -> Iterator[Cluster]:
    """Retained messages written through the library: text, binary, expiring, '$SYS'."""
    cluster = Cluster(redis_url, Keys(prefix))
    try:
        store = RetainedStore(cluster.client(), cluster.keys)
        cluster.call(store.store("home/temp", b"21.5", qos=1, message_id=b"\x01" * 16))
        cluster.call(store.store("home/raw", b"\xff\x00", publisher="p"))
        cluster.call(store.store("office/temp", b"19", expiry_interval=600))
        cluster.call(store.store("$SYS/up", b"1"))
        yield cluster
    finally:
        cluster.close()


def test_count_list_and_get(stored: Cluster) -> None:
    url, prefix = stored.url, stored.keys.prefix
    assert invoke_json(url, prefix, "retained", "count") == {"count": 4}
    listed = invoke_json(url, prefix, "retained", "list")
    assert [m["topic"] for m in listed] == ["$SYS/up", "home/raw", "home/temp", "office/temp"]
    raw = listed[1]
    assert raw == {
        "topic": "home/raw",
        "payload": base64.b64encode(b"\xff\x00").decode(),
        "encoding": "base64",
        "bytes": 2,
        "qos": 0,
        "expiry_interval": None,
        "message_id": "",
        "publisher": "p",
    }
    assert listed[2]["payload"] == "21.5" and listed[2]["encoding"] == "utf-8"
    assert listed[2]["message_id"] == "01" * 16
    assert 599 <= listed[3]["expiry_interval"] <= 600
    filtered = invoke_json(url, prefix, "retained", "list", "--filter", "+/temp")
    assert [m["topic"] for m in filtered] == ["home/temp", "office/temp"]
    limited = invoke_json(url, prefix, "retained", "list", "--limit", "2")
    assert [m["topic"] for m in limited] == ["$SYS/up", "home/raw"]
    assert invoke_json(url, prefix, "retained", "get", "home/temp")["payload"] == "21.5"
    for args in (("list",), ("get", "home/raw"), ("count",)):
        table = invoke(url, prefix, "retained", *args)
        assert table.exit_code == 0, table.output
    assert "home/raw  base64:/wA=  (qos 0)" in invoke(url, prefix, "retained", "list").output


def test_list_pages_the_whole_store(stored: Cluster) -> None:
    url, prefix = stored.url, stored.keys.prefix
    first = invoke(url, prefix, "retained", "list", "--page", "1", "--limit", "3", "--json")
    assert first.exit_code == 0, first.output
    assert "more on page 2" in first.stderr
    second = invoke_json(url, prefix, "retained", "list", "--page", "2", "--limit", "3")
    assert [m["topic"] for m in second] == ["office/temp"]


def test_delete_a_topic_or_every_match(stored: Cluster) -> None:
    url, prefix = stored.url, stored.keys.prefix
    assert invoke_json(url, prefix, "retained", "delete", "home/raw") == {"deleted": 1}
    assert invoke_json(url, prefix, "retained", "delete", "home/raw") == {"deleted": 0}
    assert invoke_json(url, prefix, "retained", "delete", "#") == {"deleted": 2}
    assert invoke_json(url, prefix, "retained", "list") == [
        invoke_json(url, prefix, "retained", "get", "$SYS/up")
    ]
    text = invoke(url, prefix, "retained", "delete", "$SYS/#")
    assert text.exit_code == 0 and "deleted 1 retained message" in text.output
    assert invoke_json(url, prefix, "retained", "count") == {"count": 0}
    assert invoke(url, prefix, "retained", "list").output.strip() == "no retained messages"


def test_a_retain_publish_from_the_cli_is_listed(redis_url: str, prefix: str) -> None:
    published = invoke(redis_url, prefix, "publish", "cli/t", "hello", "--retain")
    assert published.exit_code == 0, published.output
    assert invoke_json(redis_url, prefix, "retained", "get", "cli/t")["payload"] == "hello"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("get", "no/such"), "no retained message on 'no/such'"),
        (("get", "a/+"), "invalid topic"),
        (("delete", "a/#/b"), "invalid topic"),
        (("delete", "$share/g/a"), "plain filters"),
        (("list", "--filter", "a+"), "invalid topic"),
        (("list", "--filter", "a", "--page", "1"), "does not take --filter"),
    ],
)
def test_bad_input_is_one_line(
    redis_url: str, prefix: str, args: tuple[str, ...], expected: str
) -> None:
    assert_clean_failure(invoke(redis_url, prefix, "retained", *args), expected)


@pytest.mark.parametrize("args", [("count",), ("list",), ("get", "a"), ("delete", "a/#")])
def test_unreachable_redis_is_one_line(args: tuple[str, ...]) -> None:
    result = invoke(UNREACHABLE, "rt", "retained", *args)
    assert_clean_failure(result, "cannot reach Redis")


def test_node_run_clears_expired_retained_messages(redis_url: str, prefix: str) -> None:
    cluster = Cluster(redis_url, Keys(prefix))
    try:
        store = RetainedStore(cluster.client(), cluster.keys)
        cluster.call(store.store("short/lived", b"x", expiry_interval=1))
        cluster.call(store.store("long/lived", b"y"))
        # Expired messages are invisible at once, but stay in Redis until a node clears them.
        wait_until(
            lambda: cluster.call(store.get("short/lived")) is None, 10, "short/lived to expire"
        )
        assert cluster.call(store.size()) == 2
        args = ["--retained-clear-interval", "0.2", "--retained-max-count", "10"]
        env = {"ROUTER_REDIS_URL": redis_url, "ROUTER_PREFIX": prefix, "ROUTER_NODE_ID": "n"}
        with router_process("node", "run", *args, env=env) as node:
            node.wait_for("node n ready")
            wait_until(lambda: cluster.call(store.size()) == 1, 10, "the expired message cleared")
            node.signal(signal.SIGTERM)
            code, _, err = node.finish()
        assert code == 0, err
        assert [m.topic for m in cluster.call(store.page(1, limit=10)).messages] == ["long/lived"]
    finally:
        cluster.close()


def test_node_run_refuses_bad_retained_limits(redis_url: str, prefix: str) -> None:
    negative = invoke(redis_url, prefix, "node", "run", "--retained-max-payload", "-1")
    assert negative.exit_code == 2
    assert "'--retained-max-payload': -1 is not in the range" in negative.output
    endless = invoke(redis_url, prefix, "node", "run", "--retained-clear-interval", "inf")
    assert endless.exit_code == 1
    assert endless.output.strip().splitlines() == [
        "Error: clear_interval must be seconds >= 0, not inf"
    ]
    assert invoke_json(redis_url, prefix, "nodes") == []
