"""Fixtures of the MQTT listener tests: two ``router node run --mqtt`` processes, and
real clients that are closed after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from router.state.keys import Keys
from tests.support.mqtt import Paho, mqtt_node

Nodes = tuple[int, int]


@pytest.fixture(params=["redis_standalone_url", "redis_cluster_url"])
def nodes(request: pytest.FixtureRequest, keys: Keys) -> Iterator[Nodes]:
    """Two nodes with MQTT listeners, on a real Redis and on the 3-master Redis Cluster:
    (port of node A, port of node B)."""
    env = {"ROUTER_REDIS_URL": request.getfixturevalue(request.param), "ROUTER_PREFIX": keys.prefix}
    with mqtt_node("a", env) as (_, port_a), mqtt_node("b", env) as (_, port_b):
        yield port_a, port_b


@pytest.fixture
def clients() -> Iterator[list[Paho]]:
    """Clients a test made (append them): closed when the test ends."""
    made: list[Paho] = []
    try:
        yield made
    finally:
        for client in made:
            client.close()
