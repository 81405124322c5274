"""``router bench fleet --rolling`` as a fault test: a rolling upgrade of three nodes under
2,000 persistent sessions (MQTT 3.1.1, clean session 0, one QoS 1 subscription each) and a
QoS 1 stream to every one: each node in turn gets SIGTERM (it drains), exits, and a new
process of the same id starts, while its clients come back to the next node.

Nothing acknowledged may be lost, no reconnect refused, every session must come back
present, and every drained node must exit 0. Bounded: each wait of the bench has a
deadline, and the test has 240 s. Run with ``-s`` to read the figures.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from router.bench import fleet
from router.bench.fleet_nodes import FleetConfig
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.fault, pytest.mark.redis]

SESSIONS = 2_000
RATE = 1_000.0  # QoS 1 msg/s: a round over every session every 2 s
IN_FLIGHT = 50  # CONNECTs per load process while the sessions first connect


@pytest.mark.timeout(240)
def test_a_rolling_upgrade_of_three_nodes_under_2000_sessions_loses_nothing(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    config = FleetConfig(rolling=True, sessions=SESSIONS, rate=RATE, in_flight=IN_FLIGHT)
    result = fleet.run(server.url, config)
    print(f"\nfleet --rolling: {json.dumps(result)}")
    assert result["sessions"] == SESSIONS
    steps = result["steps"]
    assert [step["drain_exit_status"] for step in steps] == [0, 0, 0], steps
    assert result["acked"] >= result["acked_before_first_step"] + 3 * SESSIONS
    assert result["lost"] == 0, result["lost_by_round"]
    assert result["refused"] == 0, result["refused_by_reason"]
    assert result["never_back"] == 0 and result["lost_absent"] == 0
    assert result["sessions_not_present"] == 0, "a session was lost: CONNACK said none"
    # Each drain moved every client its node held: the first node's third to the second
    # node, those two thirds to the third node, then all of them to the new first node.
    assert [step["reconnected"] for step in steps] == [667, 1334, 2000], steps
    assert result["connected_at_end"] == SESSIONS
    assert result["missing_at_end"] == 0
