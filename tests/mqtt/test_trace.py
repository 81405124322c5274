"""Traces (router.cluster.tracing, router.mqtt.trace_tap) across two `router node run`
processes on a real Redis, driven by `router trace` as an operator would: a client
traced by its id has its packets in and out recorded where it is connected, and a
topic filter traced has each matching publish's routing recorded on the node it entered
and its arrival on the node that delivers it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from click.testing import CliRunner

from router.cli import app
from router.state.keys import Keys
from tests.support.mqtt import TIMEOUT, V5, V311, Paho, mqtt_node
from tests.support.waiting import wait_until

Nodes = tuple[int, int]


@pytest.fixture
def nodes(redis_standalone_url: str, keys: Keys) -> Iterator[Nodes]:
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    with ExitStack() as stack:
        _, port_a = stack.enter_context(mqtt_node("a", env))
        _, port_b = stack.enter_context(mqtt_node("b", env))
        yield port_a, port_b


def trace(keys: Keys, url: str, *args: str) -> Any:
    result = CliRunner().invoke(
        app, ["trace", *args, "--json", "--redis", url, "--prefix", keys.prefix]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_traced_client_and_topic_are_followed_on_every_node(
    nodes: Nodes, keys: Keys, redis_standalone_url: str
) -> None:
    port_a, port_b = nodes
    url = redis_standalone_url
    sensor = Paho(port_a, "sensor-7", V5)  # (connected before the trace starts)
    listener = Paho(port_b, "listener", V311)
    quiet = Paho(port_a, "quiet", V5)
    try:
        assert sensor.connected()[0] == listener.connected()[0] == quiet.connected()[0] == 0
        assert listener.subscribe("plant/#", 1) == [1]
        by_client = trace(keys, url, "start", "client", "sensor-7", "--seconds", "60")
        by_topic = trace(keys, url, "start", "topic", "plant/#", "--seconds", "60")
        assert {s["id"] for s in trace(keys, url, "list")} == {by_client["id"], by_topic["id"]}

        def seen(trace_id: str, wanted: set[tuple[str, str]]) -> bool:
            sensor.publish("plant/7/temp", b"21.5", 1)
            quiet.publish("other/topic", b"x", 1)
            records = trace(keys, url, "show", trace_id)
            return wanted <= {(r["node"], r["what"]) for r in records}

        wait_until(
            lambda: seen(by_client["id"], {("a", "in"), ("a", "out"), ("a", "routed")}),
            TIMEOUT,
            "sensor-7's packets and routing on node a",
        )
        wait_until(
            lambda: seen(by_topic["id"], {("a", "routed"), ("b", "arrived")}),
            TIMEOUT,
            "plant/#'s routing on a and arrival on b",
        )
        records = trace(keys, url, "show", by_client["id"])
        texts = [r["text"] for r in records]
        assert any(t.startswith("PUBLISH qos 1") and t.endswith("4 B") for t in texts)
        assert any(t.startswith("PUBACK") for t in texts)  # (out: the node's answer)
        assert all(r["client"] in ("sensor-7", "") for r in records)
        assert "21.5" not in json.dumps(records)  # (no payload in a trace)
        routed = [r for r in records if r["what"] == "routed"]
        assert "forwarded to b" in routed[0]["text"]
        topic_records = trace(keys, url, "show", by_topic["id"])
        assert {r["topic"] for r in topic_records} == {"plant/7/temp"}  # (not other/topic)
        assert trace(keys, url, "stop", by_client["id"]) == {"stopped": True}
        assert [s["id"] for s in trace(keys, url, "list")] == [by_topic["id"]]
    finally:
        for client in (sensor, listener, quiet):
            client.close()


def test_bad_trace_commands_end_in_one_error_line(keys: Keys, redis_standalone_url: str) -> None:
    target = ["--redis", redis_standalone_url, "--prefix", keys.prefix]
    for args in (
        ["start", "topic", "a/#/b"],
        ["start", "client", "x", "--seconds", "7200"],
        ["show", "no-such-trace"],
        ["stop", "no-such-trace"],
    ):
        result = CliRunner().invoke(app, ["trace", *args, *target])
        assert result.exit_code != 0, args
        assert "Traceback" not in result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 or lines[-1].startswith("Error: "), args  # (click's usage)
