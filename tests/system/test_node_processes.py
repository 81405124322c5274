"""Several router processes on a real Redis and on the 3-master Redis Cluster.

Three ``router node run`` processes form the cluster; ``router subscribe`` and
``router publish`` join it as nodes of their own (short-lived), as a client would.
"""

from __future__ import annotations

import ast
import asyncio
import json
import signal
from collections.abc import Iterator

import pytest

from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from tests.support.cli import Cluster, invoke_json, router_process
from tests.support.waiting import wait_until

HEARTBEAT_TTL = 3.0  # the default of `router subscribe` nodes
HEARTBEAT_INTERVAL = 1.0


@pytest.fixture(params=["redis_standalone_url", "redis_cluster_url"])
def url(request: pytest.FixtureRequest) -> str:
    value: str = request.getfixturevalue(request.param)
    return value


@pytest.fixture
def env(url: str, keys: Keys) -> dict[str, str]:
    return {"ROUTER_REDIS_URL": url, "ROUTER_PREFIX": keys.prefix}


@pytest.fixture
def observer(url: str, keys: Keys) -> Iterator[Cluster]:
    cluster = Cluster(url, keys)
    try:
        yield cluster
    finally:
        cluster.close()


def stopped_stats(lines: list[str]) -> dict[str, int]:
    [line] = [line for line in lines if "stopped: {" in line]  # (not the node_stopped event)
    stats: dict[str, int] = ast.literal_eval(line.split("stopped: ", 1)[1])
    return stats


def test_publish_crosses_once_and_bystanders_get_nothing(
    url: str, keys: Keys, env: dict[str, str]
) -> None:
    node_args = ("node", "run", "--heartbeat-interval", "0.2", "--heartbeat-ttl", "2")
    with (
        router_process(*node_args, "--node-id", "n1", env=env) as n1,
        router_process(*node_args, "--node-id", "n2", env=env) as n2,
        router_process(*node_args, "--node-id", "n3", env=env) as n3,
    ):
        for node in (n1, n2, n3):
            node.wait_for("ready")
        with router_process(
            "subscribe",
            "sensors/#",
            "--node-id",
            "sub",
            "--count",
            "3",
            "--json",
            "--timeout",
            "30",
            env=env,
        ) as subscriber:
            wait_until(
                lambda: (
                    {"filter": "sensors/#", "nodes": ["sub"]}
                    in invoke_json(url, keys.prefix, "routes")
                ),
                15,
                "the subscriber's route",
            )
            for index in range(3):
                sent = invoke_json(
                    url,
                    keys.prefix,
                    "publish",
                    f"sensors/{index}",
                    str(index),
                    "--node-id",
                    "pub",
                )
                assert sent["nodes"] == ["sub"]
            status, out, _ = subscriber.finish()
        assert status == 0
        assert sorted(json.loads(line)["payload"] for line in out) == ["0", "1", "2"]
        for node in (n1, n2, n3):
            node.signal(signal.SIGTERM)
        for node in (n1, n2, n3):
            status, _, err = node.finish()
            assert status == 0
            stats = stopped_stats(err)
            assert stats["received"] == 0  # no copy ever reached an uninterested node
            assert stats["forwarded"] == 0


def test_shared_group_across_processes_gets_each_message_once(
    url: str, keys: Keys, env: dict[str, str]
) -> None:
    messages = 20
    members = [
        router_process(
            "subscribe",
            "$share/workers/jobs/#",
            "--node-id",
            f"worker-{i}",
            "--json",
            "--timeout",
            "8",
            env=env,
        )
        for i in range(2)
    ]
    with members[0] as first, members[1] as second:
        wait_until(
            lambda: any(
                r["filter"] == "$share/workers/jobs/#"
                and sorted(r["nodes"]) == ["worker-0", "worker-1"]
                for r in invoke_json(url, keys.prefix, "routes")
            ),
            15,
            "both members routed",
        )
        for index in range(messages):
            invoke_json(
                url, keys.prefix, "publish", f"jobs/{index}", str(index), "--node-id", "pub"
            )
        got = []
        for worker in (first, second):
            worker.signal(signal.SIGINT)
            _, out, _ = worker.finish()
            got.append([json.loads(line)["payload"] for line in out])
    assert sorted(got[0] + got[1], key=int) == [str(i) for i in range(messages)]


def test_kill_9_routes_vanish_and_a_restart_drops_the_old_incarnation(
    url: str, keys: Keys, env: dict[str, str], observer: Cluster
) -> None:
    watcher = observer.start("observer", heartbeat_interval=0.2, heartbeat_ttl=2.0)
    with router_process("subscribe", "victim/#", "--node-id", "victim", env=env) as victim:
        wait_until(lambda: watcher.mirror.routes("victim") == {"victim/#": 1}, 15, "route seen")
        victim.process.kill()  # SIGKILL: no goodbye
        victim.process.wait()
        took = wait_until(lambda: "victim" not in watcher.mirror.nodes(), 15, "routes dropped")
    assert took <= HEARTBEAT_TTL + HEARTBEAT_INTERVAL + 1.0

    with router_process("subscribe", "old/#", "--node-id", "phoenix", env=env) as old:
        wait_until(lambda: watcher.mirror.routes("phoenix") == {"old/#": 1}, 15, "old route seen")
        old.process.kill()
        old.process.wait()
        # Restarted at once, long before the old incarnation's heartbeat expires.
        with router_process("subscribe", "new/#", "--node-id", "phoenix", env=env) as new:
            took = wait_until(
                lambda: watcher.mirror.routes("phoenix") == {"new/#": 1}, 15, "new routes only"
            )
            assert took < HEARTBEAT_TTL
            new.signal(signal.SIGINT)
            new.finish()


async def _register_mute_node(url: str, keys: Keys, node_id: str) -> None:
    """A registered node with a long heartbeat that never acks a route change (as a
    node under kill -9 before its heartbeat expired)."""
    redis = await open_redis(url)
    try:
        registry = NodeRegistry(redis, keys, ttl=60.0)
        await registry.register(node_id, "mute-incarnation")
        await registry.routes.claim(node_id, "mute-incarnation", {"mute/#": 1})
    finally:
        await redis.aclose()


def test_a_signal_while_the_subscription_is_confirmed_ends_the_command_cleanly(
    url: str, keys: Keys, env: dict[str, str]
) -> None:
    """SIGINT that comes while `router subscribe` waits for the other nodes to hold its
    route: it finishes subscribing, leaves cleanly and exits 0 (it used to be cancelled
    half-way, and a signal in the gap before the wait for messages went unheard)."""
    asyncio.run(_register_mute_node(url, keys, "mute"))
    with router_process("subscribe", "window/#", "--node-id", "sigint", env=env) as process:
        wait_until(
            lambda: any(r["filter"] == "window/#" for r in invoke_json(url, keys.prefix, "routes")),
            15,
            "route written",
        )
        process.signal(signal.SIGINT)  # (the subscribe waits for "mute" to ack, in vain)
        status, _, stderr = process.finish()
    assert status == 0, stderr
    assert any("subscribed sigint to 'window/#'" in line for line in stderr)
    assert not any(r["filter"] == "window/#" for r in invoke_json(url, keys.prefix, "routes"))
