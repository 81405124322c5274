"""zMQTT's broker suite (:class:`BrokerTestBase`, upstream and unchanged) against router nodes.

``ROUTER_NODES`` names the nodes: ``HOST:PORT[,HOST:PORT...]``. The test classes aim at the
first node; with several, every :class:`MQTTClient` a test makes connects to the next node in
turn (from the first, afresh in each test), so a subscriber and the client that publishes to
it, or the two holders of one client id, usually sit on different nodes: the nodes must behave
as one broker.

Started by tests/system/test_conformance_zmqtt.py, which runs the nodes; kept out of the
project's own collection (tests/conformance/conftest.py).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

import pytest
from zmqtt import MQTTClient, Subscription

from tests.test_brokers._base import BrokerTestBase

#: How long a test waits for a duplicate copy before it concludes that none comes (s).
NO_DUPLICATE_WITHIN = 0.2


def parse_nodes(spec: str) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT...]`` as (host, port) pairs, in order.

    Raises ValueError for an empty list or an entry without a numeric port."""
    nodes = []
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"ROUTER_NODES: {entry!r} is not HOST:PORT")
        nodes.append((host, int(port)))
    if not nodes:
        raise ValueError("ROUTER_NODES names no node")
    return nodes


NODES = parse_nodes(os.environ.get("ROUTER_NODES", ""))


@pytest.fixture(autouse=True)
def round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    """With several nodes, each MQTTClient made in the test connects to the next node
    (whatever host and port the suite gave it): the first to ``NODES[0]``, and so on."""
    if len(NODES) == 1:
        return
    nodes = itertools.cycle(NODES)
    make = MQTTClient.__init__

    def to_next_node(self: MQTTClient, host: str, port: int, *args: Any, **kwargs: Any) -> None:
        make(self, *next(nodes), *args, **kwargs)

    monkeypatch.setattr(MQTTClient, "__init__", to_next_node)


class RouterBroker(BrokerTestBase):
    async def handle_sub_duplicates(self, *, sub: Subscription, n_duplicates: int) -> None:
        """A client gets one copy of a message however many of its subscriptions match it
        (MQTT 3.1.1 and 5.0 allow one copy, at the highest QoS of those subscriptions): none of
        the ``n_duplicates`` further copies arrives."""
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(sub.get_message(), timeout=NO_DUPLICATE_WITHIN)


class TestRouterV311(RouterBroker):
    host, port = NODES[0]
    version = "3.1.1"


class TestRouterV5(RouterBroker):
    host, port = NODES[0]
    version = "5.0"
