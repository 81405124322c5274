"""Mirror convergence under churn: after random subscribe/unsubscribe on several nodes,
every node's mirror equals the union of the nodes' route sets in Redis."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.state.connection import open_redis
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.conftest import delete_namespace
from tests.support.waiting import eventually

NODES = ("n1", "n2", "n3")
FILTERS = ("a/#", "a/+", "a/b", "#", "$share/g/a/#", "$share/h/+", "x")
CLIENTS = ("c1", "c2", "c3")

operation = st.tuples(
    st.sampled_from(NODES),
    st.sampled_from(["sub", "unsub", "disconnect"]),
    st.sampled_from(CLIENTS),
    st.sampled_from(FILTERS),
)


async def converge(url: str, keys: Keys, ops: list[tuple[str, str, str, str]]) -> None:
    nodes: dict[str, RouterNode] = {}
    clients: list[RedisClient] = []
    try:
        for node_id in NODES:
            clients.append(await open_redis(url))
            nodes[node_id] = await RouterNode(
                clients[-1], NodeConfig(node_id, prefix=keys.prefix)
            ).start()

        # The operations of each node run concurrently with the other nodes'.
        async def churn(node_id: str) -> None:
            node = nodes[node_id]
            for target, action, client, topic_filter in ops:
                if target != node_id:
                    continue
                client_id = f"{node_id}-{client}"  # a client id lives on one node at a time
                if action == "sub":
                    await node.subscribe(client_id, topic_filter)
                elif action == "unsub":
                    await node.unsubscribe(client_id, topic_filter)
                else:
                    await node.disconnect(client_id)

        await asyncio.gather(*(churn(n) for n in NODES))
        truth = {n: (await nodes[n].routes.snapshot(n)).routes for n in NODES}
        for node_id, node in nodes.items():
            assert truth[node_id] == node.sessions.routes()  # Redis holds what clients need
        expected: dict[str, dict[str, int]] = {}
        for node_id in NODES:
            for route, count in truth[node_id].items():
                expected.setdefault(route, {})[node_id] = count
        expected = dict(sorted(expected.items()))
        await eventually(
            lambda: all(node.mirror.table() == expected for node in nodes.values()),
            5,
            lambda: {n: m.mirror.table() for n, m in nodes.items()},
        )
    finally:
        for node in nodes.values():
            await node.stop()
        for client in clients:
            await delete_namespace(client, keys)
            await client.aclose()


@pytest.mark.parametrize("server", ["redis_standalone_url", "redis_cluster_url"])
def test_mirrors_converge_to_the_union_of_route_sets(
    server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server)
    runner = asyncio.Runner()

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(operation, min_size=10, max_size=60), st.randoms(use_true_random=False))
    def check(ops: list[tuple[str, str, str, str]], rng: random.Random) -> None:
        rng.shuffle(ops)
        runner.run(converge(url, Keys(f"conv{rng.randrange(10**9)}"), ops))

    try:
        check()
    finally:
        runner.close()
