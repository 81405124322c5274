"""Node telemetry and traffic history in Redis (written in one transaction, with expiries,
read back for many nodes, the live ones only when summing), and the merging of histories."""

from __future__ import annotations

import math

import pytest

from router.errors import CorruptStateError, InvalidIdError
from router.state.keys import Keys
from router.state.node_history import (
    MAX_GAP_INTERVALS,
    MergedHistory,
    NodeHistoryStore,
    NodeRecord,
    NodeTelemetry,
    Rates,
    TrafficSample,
    latest_rates,
    merge_histories,
    rates_between,
)
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient
from tests.support.waiting import eventually

DEADLINE = 5.0
ONE = NodeTelemetry(
    listeners=("mqtt://127.0.0.1:1883", "http://[::1]:8080"),
    started_at=1_700_000_000.25,
    version="router 1.0",
    interval_s=2.0,
    heartbeat_ttl_ms=3000,
    connections=3,
    sessions=4,
    subscriptions=5,
    routes=2,
    rss_kib=40_000,
    cpu_percent=12.5,
    loop_lag_ms=0.75,
    redis_latency_ms=0.3,
    messages_in=100,
    messages_out=200,
    dropped=1,
)
TWO = NodeTelemetry(version="router 1.1", connections=1)  # no listeners, no PING answered


def sample(
    t: float, messages_in: int = 0, messages_out: int = 0, dropped: int = 0
) -> TrafficSample:
    return TrafficSample(t, messages_in, messages_out, dropped)


@pytest.fixture
def store(redis_client: RedisClient, keys: Keys) -> NodeHistoryStore:
    return NodeHistoryStore(redis_client, keys)


# -- in Redis (fake, standalone and the 3-master cluster) --------------------------------


async def test_written_figures_and_samples_read_back(store: NodeHistoryStore) -> None:
    await store.write("n1", ONE, sample(10.0, 1, 2, 0), ttl_s=30.0, keep=10)
    await store.write("n1", ONE, sample(12.0, 5, 9, 1), ttl_s=30.0, keep=10)
    await store.write("n{2}", TWO, sample(11.5), ttl_s=30.0, keep=10)  # escaped in its tag
    found = await store.read(["n{2}", "gone", "n1"])
    assert list(found) == ["gone", "n1", "n{2}"]  # sorted by id
    assert found["n1"] == NodeRecord(ONE, [sample(10.0, 1, 2, 0), sample(12.0, 5, 9, 1)])
    assert found["n{2}"] == NodeRecord(TWO, [sample(11.5)])
    assert found["gone"] == NodeRecord(None, [])
    assert await store.read([]) == {}


async def test_both_keys_expire_the_history_later(
    store: NodeHistoryStore, redis_client: RedisClient, keys: Keys
) -> None:
    await store.write("n1", ONE, sample(1.0), ttl_s=6.0, keep=5, history_ttl_s=3600.0)
    assert 0 < await redis_client.pttl(keys.node_telemetry("n1")) <= 6_000
    assert 6_000 < await redis_client.pttl(keys.node_history("n1")) <= 3_600_000
    await store.write("n2", ONE, sample(1.0), ttl_s=0.2, keep=5)  # the history too

    async def gone() -> bool:
        return await store.read(["n2"]) == {"n2": NodeRecord(None, [])}

    await eventually(gone, DEADLINE, "n2's telemetry and history to expire", poll=0.02)


async def test_the_history_keeps_the_newest(
    store: NodeHistoryStore, redis_client: RedisClient, keys: Keys
) -> None:
    for t in range(6):
        await store.write("n1", ONE, sample(float(t), t), ttl_s=30.0, keep=3)
    assert await redis_client.llen(keys.node_history("n1")) == 3
    assert (await store.read(["n1"]))["n1"].history == [
        sample(3.0, 3),
        sample(4.0, 4),
        sample(5.0, 5),
    ]


async def test_delete(store: NodeHistoryStore, redis_client: RedisClient, keys: Keys) -> None:
    await store.write("n1", ONE, sample(1.0), ttl_s=30.0, keep=3)
    assert await store.delete("n1") is True
    assert await store.delete("n1") is False
    assert await redis_client.exists(keys.node_telemetry("n1"), keys.node_history("n1")) == 0


async def test_only_live_nodes_that_report_count(
    store: NodeHistoryStore, redis_client: RedisClient, keys: Keys
) -> None:
    registry = NodeRegistry(redis_client, keys, ttl=30.0)
    short = NodeRegistry(redis_client, keys, ttl=0.05)
    await registry.register("live", "inc-1")
    await registry.register("quiet", "inc-2")  # live, writes nothing
    await registry.register("left", "inc-3")
    await short.register("dead", "inc-4")  # its heartbeat expires
    await registry.register("silent", "inc-5")  # its telemetry expired, its history did not
    for node_id in ("live", "left", "dead", "unregistered"):
        await store.write(node_id, ONE, sample(1.0), ttl_s=30.0, keep=3)
    await store.write("silent", ONE, sample(1.0), ttl_s=0.05, keep=3, history_ttl_s=30.0)
    await registry.unregister("left")

    async def settled() -> bool:
        return not [n for n in await registry.live_nodes() if n.node_id == "dead"] and (
            (await store.read(["silent"]))["silent"].telemetry is None
        )

    await eventually(settled, DEADLINE, "dead's heartbeat and silent's telemetry to expire")
    assert await store.live(registry) == {"live": NodeRecord(ONE, [sample(1.0)])}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("connections", "many"),
        ("connections", "-1"),
        ("cpu_percent", "nan"),
        ("loop_lag_ms", "-0.5"),
        ("interval_s", "0"),
        ("redis_latency_ms", "fast"),
        ("started_at", "inf"),
        ("version", b"\xff"),
    ],
)
async def test_a_corrupt_hash_is_refused(
    store: NodeHistoryStore, redis_client: RedisClient, keys: Keys, field: str, value: object
) -> None:
    await store.write("n1", ONE, sample(1.0), ttl_s=30.0, keep=3)
    await redis_client.hset(keys.node_telemetry("n1"), field, value)  # type: ignore[arg-type]
    with pytest.raises(CorruptStateError, match="telemetry"):
        await store.read(["n1"])


@pytest.mark.parametrize(
    "entry",
    [b"\x93\x01\x02\x03", b"not msgpack \xc1", b"\x94\xa1t\x01\x02\x03", b"\x94\x01\xff\x02\x03"],
    ids=["three", "garbage", "text-t", "negative"],
)
async def test_a_corrupt_sample_is_refused(
    store: NodeHistoryStore, redis_client: RedisClient, keys: Keys, entry: bytes
) -> None:
    await store.write("n1", ONE, sample(1.0), ttl_s=30.0, keep=3)
    await redis_client.lpush(keys.node_history("n1"), entry)
    with pytest.raises(CorruptStateError, match="sample"):
        await store.read(["n1"])


async def test_missing_and_unknown_fields_and_bad_arguments(
    store: NodeHistoryStore, redis_client: RedisClient, keys: Keys
) -> None:
    await redis_client.hset(keys.node_telemetry("n1"), mapping={"connections": "2", "future": "x"})
    assert (await store.read(["n1"]))["n1"].telemetry == NodeTelemetry(connections=2)
    for bad in ({"ttl_s": 0}, {"history_ttl_s": -1.0}, {"keep": 0}, {"keep": 2.0}):
        arguments = {"ttl_s": 1.0, "keep": 3, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            await store.write("n1", ONE, sample(1.0), **arguments)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        await store.write("", ONE, sample(1.0), ttl_s=1.0, keep=3)
    with pytest.raises(InvalidIdError):
        await store.read([""])


# -- the value objects -------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"connections": -1},
        {"rss_kib": 1.5},
        {"routes": True},
        {"version": 3},
        {"listeners": ["mqtt://a:1"]},
        {"listeners": ("mqtt://a:1 http://b:2",)},
        {"listeners": ("",)},
        {"cpu_percent": math.nan},
        {"loop_lag_ms": -1.0},
        {"interval_s": 0},
        {"redis_latency_ms": math.inf},
        {"started_at": "now"},
    ],
    ids=repr,
)
def test_telemetry_checks_itself(fields: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        NodeTelemetry(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "values",
    [(-1.0, 0, 0, 0), (math.nan, 0, 0, 0), (1.0, -1, 0, 0), (1.0, 0, 0.5, 0), (1.0, 0, 0, True)],
    ids=repr,
)
def test_a_sample_checks_itself(values: tuple[object, ...]) -> None:
    with pytest.raises(ValueError):
        TrafficSample(*values)  # type: ignore[arg-type]


def test_the_stored_forms_round_trip() -> None:
    assert NodeTelemetry.from_hash(ONE.as_hash()) == ONE
    assert NodeTelemetry.from_hash(TWO.as_hash()) == TWO
    assert TWO.as_hash()["redis_latency_ms"] == ""
    assert TrafficSample.unpack(sample(1.5, 1, 2, 3).pack()) == sample(1.5, 1, 2, 3)


def test_the_auth_a_node_tells_is_read_by_neighbouring_versions() -> None:
    """A node of the version before writes no ``auth``: read as "" (not told); a field
    of a later version is ignored; a word with a space is refused."""
    stored = TWO.as_hash()
    told = NodeTelemetry.from_hash({**stored, "auth": "redis", "later_field": "x"})
    assert told.auth == "redis" and NodeTelemetry.from_hash(told.as_hash()) == told
    del stored["auth"]
    assert NodeTelemetry.from_hash(stored).auth == ""
    with pytest.raises(CorruptStateError):
        NodeTelemetry.from_hash({**stored, "auth": "two words"})


# -- rates and merging (pure) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("older", "newer", "expected"),
    [
        (sample(10, 0, 0, 0), sample(12, 10, 20, 2), Rates(5.0, 10.0, 1.0)),
        (sample(10, 5, 5, 5), sample(10.5, 5, 5, 5), Rates(0.0, 0.0, 0.0)),
        (sample(10, 50, 60, 0), sample(12, 3, 4, 0), None),  # restarted: counters went down
        (sample(10, 5, 5, 5), sample(12, 6, 6, 4), None),  # one counter went down
        (sample(12, 0, 0, 0), sample(12, 1, 1, 1), None),  # no time passed
        (sample(12, 0, 0, 0), sample(10, 1, 1, 1), None),  # the clock went back
    ],
)
def test_rates_between(older: TrafficSample, newer: TrafficSample, expected: Rates | None) -> None:
    assert rates_between(older, newer) == expected


def test_latest_rates_and_their_json() -> None:
    assert latest_rates([]) is None
    assert latest_rates([sample(1, 5)]) is None
    assert latest_rates([sample(0, 0), sample(1, 5), sample(4, 6)]) == Rates(1 / 3, 0.0, 0.0)
    assert Rates(1 / 3, 2.0, 0.0).as_dict() == {"in": 0.333, "out": 2.0, "dropped": 0.0}
    assert Rates(1.0, 2.0, 3.0).plus(Rates(0.5, 0.5, 0.5)) == Rates(1.5, 2.5, 3.5)


def test_one_node_on_the_grid() -> None:
    history = [sample(10.3, 0, 0, 0), sample(12.3, 10, 4, 0), sample(14.3, 30, 8, 2)]
    merged = merge_histories([history], 2.0)
    assert merged == MergedHistory(2.0, (12.0, 14.0), (5.0, 10.0), (2.0, 2.0), (0.0, 1.0))
    assert merged.as_dict() == {
        "interval_s": 2.0,
        "t": [12.0, 14.0],
        "in": [5.0, 10.0],
        "out": [2.0, 2.0],
        "dropped": [0.0, 1.0],
    }
    assert merge_histories([], 2.0) == MergedHistory(2.0)
    assert merge_histories([[sample(1.0, 5)]], 2.0) == MergedHistory(2.0)


def test_two_nodes_sum_per_bucket_and_the_filling_bucket_waits() -> None:
    a = [sample(10.3, 0), sample(12.3, 10), sample(14.3, 30)]  # 5/s in bucket 6, 10/s in 7
    b = [sample(11.9, 0), sample(13.9, 2)]  # 1/s in bucket 6; bucket 7 not reached yet
    merged = merge_histories([a, b], 2.0)
    assert (merged.t, merged.messages_in) == ((12.0,), (6.0,))
    b.append(sample(15.9, 6))  # 2/s in bucket 7
    merged = merge_histories([a, b], 2.0)
    assert (merged.t, merged.messages_in) == ((12.0, 14.0), (6.0, 12.0))


def test_a_faster_node_is_averaged_within_a_bucket() -> None:
    fast = [sample(10.0, 0), sample(10.5, 1), sample(11.0, 1), sample(11.5, 4), sample(12.0, 4)]
    merged = merge_histories([fast], 2.0)
    assert merged.t == (10.0, 12.0)
    assert merged.messages_in == (round(4 / 1.5, 3), 0.0)


def test_a_restart_gives_no_negative_rate_and_a_gap_no_rate() -> None:
    before = [sample(10.0, 100, 100, 9), sample(12.0, 120, 130, 9)]
    after = [sample(14.0, 0, 0, 0), sample(16.0, 4, 8, 0)]  # pushed onto the old history
    merged = merge_histories([before + after], 2.0)
    assert merged.t == (12.0, 16.0)
    assert merged.messages_in == (10.0, 2.0)
    assert min(merged.messages_in + merged.messages_out + merged.dropped) >= 0
    gap = 2.0 * (MAX_GAP_INTERVALS + 1)
    spanning = [sample(10.0, 0), sample(12.0, 2), sample(12.0 + gap, 400), sample(14.0 + gap, 402)]
    assert merge_histories([spanning], 2.0).messages_in == (1.0, 1.0)
    with pytest.raises(ValueError, match="interval_s"):
        merge_histories([before], 0.0)
