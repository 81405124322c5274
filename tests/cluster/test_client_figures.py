"""Per-client figures on a node (router/cluster/client_stats.py): a client that never
reads shows its real queue and drops; an away session's losses are its own; the stored
form round-trips; the slowest and the drop rates are what an operator reads first."""

from __future__ import annotations

import pytest

from router.cluster.client_stats import DropRates, FigureChanges, figures_of, slowest
from router.errors import CorruptStateError
from router.state.client_figures import (
    DROP_REASONS,
    NODE_DROP_REASONS,
    ClientFigures,
    ClientFigureStore,
    NodeDrops,
)
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.support import waiting
from tests.support.nodes import StartNode

WAIT = 10.0


def drops(**found: int) -> dict[str, int]:
    return {reason: found.get(reason, 0) for reason in DROP_REASONS}


async def test_a_client_that_never_reads_shows_its_queue_and_drops(start_node: StartNode) -> None:
    a = await start_node("a", queue_limit=10)
    await a.connect("stuck")
    await a.subscribe("stuck", "feed/#", qos=1)
    await a.connect("idle")
    for index in range(30):
        await a.publish(f"feed/{index}", b"12345", qos=1)
    stuck = figures_of(a.sessions.session("stuck"), "a", 1)
    assert (stuck.queued, stuck.queued_bytes, stuck.inflight) == (10, 50, 0)
    assert stuck.drops == drops(queue_full=20) and stuck.dropped == 20
    assert (stuck.received, stuck.sent, stuck.last_activity_ms) == (0, 0, None)
    idle = a.sessions.session("idle")
    assert idle.losses is None  # (nothing allocated for a session that never lost a copy)
    figures, gone, slow, full = FigureChanges().since(a.sessions.held(), "a", 1)
    assert [f.client_id for f in figures] == ["stuck", "idle"] and full and gone == []
    assert [f.client_id for f in slow] == ["stuck"]


async def test_a_node_writes_only_the_figures_that_changed(
    start_node: StartNode, redis_client: RedisClient, keys: Keys
) -> None:
    """Before, every node wrote every client's figures every interval: 10,000 idle
    clients cost it about a tenth of a core (router bench fleet: 9.8-14 % idle CPU
    against 1.5 %). Now an unchanged client costs no write; one gone is removed; every
    30th write, and the one after a failed write, replaces them all."""
    a = await start_node("a")
    for client in ("quiet", "busy", "leaving"):
        await a.connect(client)
    changes, store = FigureChanges(full_every=3), ClientFigureStore(redis_client, keys)

    async def write(at_ms: int) -> tuple[list[str], list[str], bool]:
        figures, gone, slow, full = changes.since(a.sessions.held(), "a", at_ms)
        drops = NodeDrops(at_ms, {}, {}, slow)
        await store.write("a", figures, drops, 10.0, gone=gone, replace=full)
        changes.written()
        return [f.client_id for f in figures], gone, full

    assert await write(1) == (["quiet", "busy", "leaving"], [], True)
    await a.publish("x", b"y")  # (nobody subscribes: no figure changes)
    assert await write(2) == ([], [], False)
    a.sessions.session("busy").received += 1
    await a.disconnect("leaving")
    assert await write(3) == (["busy"], ["leaving"], False)
    stored = await store.clients({"a": ["quiet", "busy", "leaving"]})
    assert sorted(stored) == ["busy", "quiet"]
    assert (stored["quiet"].at_ms, stored["busy"].at_ms, stored["busy"].received) == (1, 3, 1)
    assert await write(4) == (["quiet", "busy"], [], True)  # (the 3rd write after a full)
    changes.lost()
    figures, _gone, _slow, full = changes.since(a.sessions.held(), "a", 5)
    assert full and len(figures) == 2


async def test_an_away_sessions_losses_are_counted_on_it(start_node: StartNode) -> None:
    a = await start_node("a", max_queued=3)
    await a.connect("away", clean_start=False, expiry=600)
    await a.subscribe("away", "feed/#", qos=1, confirm=False)
    await a.put_away("away")
    session = a.sessions.session("away")
    for index in range(5):
        await a.publish(f"feed/{index}", b"x", qos=1)
    await a.publish("feed/zero", b"x", qos=0)

    def counted() -> bool:
        found = figures_of(session, "a", 1).drops
        return found["session_queue_full"] == 2 and found["offline_qos0"] == 1

    await waiting.eventually(counted, WAIT, lambda: session.losses)
    stats = a.stats()
    assert (stats["session_queue_drops"], stats["offline_qos0_skipped"]) == (2, 1)


@pytest.mark.parametrize(
    ("queued", "dropped", "chosen"),
    [
        ({"a": 5, "b": 0, "c": 9}, {}, ["c", "a"]),  # most queued first; none queued: out
        ({"a": 0}, {"a": 3, "b": 1}, ["a", "b"]),  # droppers with nothing queued
        ({"a": 1}, {"a": 7}, ["a"]),  # each once
        ({}, {}, []),
    ],
)
def test_the_slowest_are_those_with_most_queued_then_most_dropped(
    queued: dict[str, int], dropped: dict[str, int], chosen: list[str]
) -> None:
    every = [
        ClientFigures(c, "a", 1, queued=queued.get(c, 0), drops=drops(expired=dropped.get(c, 0)))
        for c in sorted({*queued, *dropped})
    ]
    assert [f.client_id for f in slowest(every, 2)] == chosen


def test_drop_rates_are_per_second_between_samples_and_never_negative() -> None:
    rates = DropRates()
    totals, first = rates.sample(10.0, {"queue_drops": 4})
    assert totals["queue_drops"] == 4 and set(first.values()) == {0.0}
    _, second = rates.sample(12.0, {"queue_drops": 10, "unrouted": 2})
    assert (second["queue_drops"], second["unrouted"]) == (3.0, 1.0)
    _, restarted = rates.sample(14.0, {"queue_drops": 1})
    assert restarted["queue_drops"] == 0.0


def test_figures_round_trip_and_bad_ones_are_refused() -> None:
    figures = ClientFigures(
        "c", "n", 5, 1, 2, 3, 4, 5, 6, 7, 8, last_activity_ms=9, drops=drops(oversized=2)
    )
    assert ClientFigures.unpack("c", "n", figures.pack()) == figures
    assert figures.as_dict()["drops"]["oversized"] == 2
    with pytest.raises(CorruptStateError):
        ClientFigures.unpack("c", "n", b"\x93\x01\x02\x03")
    with pytest.raises(ValueError, match="queued"):
        ClientFigures("c", "n", 1, queued=-1)


async def test_a_nodes_figures_are_replaced_and_expire(
    redis_client: RedisClient, keys: Keys
) -> None:
    store = ClientFigureStore(redis_client, keys)
    first = ClientFigures("gone", "n1", 1, queued=3)
    totals = dict.fromkeys(NODE_DROP_REASONS, 0) | {"queue_drops": 7}
    await store.write("n1", [first], NodeDrops(1, totals, {"queue_drops": 1.5}, [first]), 5.0)
    assert await store.clients({"n1": ["gone"]}) == {"gone": first}
    kept = ClientFigures("kept", "n1", 2)
    await store.write("n1", [kept], NodeDrops(2, totals, {}, []), 5.0)
    assert await store.clients({"n1": ["gone", "kept"]}) == {"kept": kept}
    [read] = (await store.drops(["n1", "n2"])).values()
    assert (read.totals["queue_drops"], read.rates["queue_drops"], read.slowest) == (7, 0.0, [])
    assert 0 < await redis_client.pttl(keys.node_clients("n1")) <= 5000
    await store.delete("n1")
    assert await store.drops(["n1"]) == {}
