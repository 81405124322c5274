"""``router bench fleet --kill`` as a fault test: 2,000 persistent sessions (MQTT 3.1.1,
clean session 0, one QoS 1 subscription each) and 1,000 clean ones (clean session 1:
Session Expiry 0, one subscription each) on node A, a QoS 1 stream to every persistent
one published on node B, ``kill -9`` of A, and the 2,000 clients back on B in three
storms (right after the kill, once A is purged, once the adoption finished).

Nothing acknowledged may be lost, no reconnect refused, and every session must come back
present (adopted by B or resumed by its client), none left with the dead node; B must
stay up meanwhile (drop no client, acknowledge every publish in time). Nothing of the
clean sessions may be left in Redis 2 s after A's heartbeat TTL ran out. Bounded:
each wait of the bench has a deadline, and the test has 240 s. Run with ``-s`` to read
the figures.
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
CLEAN = 1_000
RATE = 2_000.0  # QoS 1 msg/s: a round over every session each second
IN_FLIGHT = 50  # CONNECTs per load process while the sessions first connect to A


@pytest.mark.timeout(240)
def test_a_killed_node_under_2000_sessions_loses_nothing_and_refuses_no_reconnect(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    config = FleetConfig(
        kill=True, sessions=SESSIONS, clean_sessions=CLEAN, rate=RATE, in_flight=IN_FLIGHT
    )
    result = fleet.run(server.url, config)
    print(f"\nfleet --kill: {json.dumps(result)}")
    assert result["sessions"] == SESSIONS
    assert result["acked_before_kill"] >= SESSIONS  # a whole round before the kill
    assert result["acked"] >= result["acked_before_kill"] + SESSIONS  # and after it
    assert result["lost"] == 0, result["lost_by_round"]
    storms = [(group["group"], group["refused"], group["gave_up"]) for group in result["groups"]]
    assert result["refused"] == 0, storms
    assert result["never_back"] == 0 and result["lost_absent"] == 0, storms
    assert result["sessions_not_present"] == 0, "a session was lost: CONNACK said none"
    assert result["left_with_dead_node"] == 0, "sessions neither adopted nor resumed"
    assert result["adopted_within_s"] is not None, "the adoption did not finish in time"
    # (B stamps the adoption's end; the bench's polls see it at that moment or later)
    assert 0 < result["adopted_within_s"] <= result["adopted_seen_within_s"]
    assert [group["clients"] for group in result["groups"]] == [667, 667, 666]
    assert sum(group["ok"] for group in result["groups"]) == SESSIONS
    assert result["connected_at_end"] == SESSIONS
    # B itself stayed up: it dropped no client, nor the publisher, and acknowledged
    # every publish in time.
    assert result["rejoined"] == 0 and result["rejoin_refused"] == 0
    assert result["publisher_reconnects"] == 0
    assert result["expired"] == 0
    # The clean sessions had keys (subscriptions, claim, description) before the kill,
    # and none is left TTL + 2 s after it: B removed them with A's adoption.
    assert result["clean_sessions"] == CLEAN
    assert result["clean_keys_before_kill"] >= 3 * CLEAN
    assert result["clean_keys_counted_at_s"] >= result["ttl_s"] + 2
    assert result["clean_keys_left"] == 0, f"{result['clean_sessions_left']} clean sessions left"
    assert result["b_dead_clean_sessions_removed"] == CLEAN
