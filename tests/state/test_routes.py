"""Node route sets: claims, batched and coalesced changes, versions, the change stream,
trimming and gap detection, snapshots, incarnations, purge; on every backend."""

from __future__ import annotations

import pytest

from router.errors import (
    CorruptStateError,
    InvalidIdError,
    InvalidTopicError,
    ResyncRequiredError,
    RouterError,
    RouteSetMissingError,
    ScriptError,
    StaleIncarnationError,
)
from router.state.keys import Keys
from router.state.routes import RouteChange, RouteStore
from router.state.scripts import RedisClient, Scripts

NODE = "node-a"
INC = "inc-1"


@pytest.fixture
def store(redis_client: RedisClient, keys: Keys) -> RouteStore:
    return RouteStore(redis_client, keys, stream_length=5)


async def test_claim_starts_an_empty_route_set_at_version_0(store: RouteStore) -> None:
    empty = await store.snapshot(NODE)
    assert (empty.incarnation, empty.generation, empty.version, empty.routes) == (
        None,
        None,
        0,
        {},
    )
    claim = await store.claim(NODE, INC, {"a/#": 1, "$share/g/b": 3})
    assert claim.dropped == 0
    snap = await store.snapshot(NODE)
    assert snap.incarnation == INC
    assert snap.generation == claim.generation
    assert (snap.version, snap.first_version) == (0, 0)
    assert snap.routes == {"a/#": 1, "$share/g/b": 3}


async def test_each_effective_change_bumps_the_version_by_one(store: RouteStore) -> None:
    claim = await store.claim(NODE, INC)
    changes = await store.apply(NODE, INC, [("a", 1), ("$share/g/x", 2), ("b/+", 1)])
    assert changes == [
        RouteChange(1, "a", 1),
        RouteChange(2, "$share/g/x", 2),
        RouteChange(3, "b/+", 1),
    ]
    # Unchanged routes are not logged; removing a missing route is a no-op.
    assert await store.apply(NODE, INC, [("a", 1), ("missing", 0), ("$share/g/x", 2)]) == []
    assert await store.add(NODE, INC, "$share/g/x", 5) is True
    assert await store.remove(NODE, INC, "a") is True
    assert await store.remove(NODE, INC, "a") is False
    snap = await store.snapshot(NODE)
    assert snap.version == 5
    assert snap.generation == claim.generation
    assert snap.routes == {"$share/g/x": 5, "b/+": 1}
    read = await store.changes(NODE, claim.generation, 0)
    assert read.version == 5
    assert [tuple(c) for c in read.changes] == [
        (1, "a", 1),
        (2, "$share/g/x", 2),
        (3, "b/+", 1),
        (4, "$share/g/x", 5),
        (5, "a", 0),
    ]


async def test_a_batch_is_coalesced_last_change_wins(store: RouteStore) -> None:
    await store.claim(NODE, INC, {"kept": 1})
    changes = await store.apply(
        NODE,
        INC,
        [("a", 1), ("kept", 0), ("a", 0), ("$share/g/t", 1), ("kept", 1), ("$share/g/t", 4)],
    )
    assert changes == [RouteChange(1, "$share/g/t", 4)]
    assert (await store.snapshot(NODE)).routes == {"kept": 1, "$share/g/t": 4}


async def test_a_reader_follows_changes_in_pages(store: RouteStore) -> None:
    claim = await store.claim(NODE, INC)
    snap = await store.snapshot(NODE)
    await store.apply(NODE, INC, [("a", 1), ("b", 1), ("c", 1)])
    mirror = dict(snap.routes)
    version = snap.version
    while True:
        page = await store.changes(NODE, claim.generation, version, limit=2)
        if not page.changes:
            break
        assert len(page.changes) <= 2
        for change in page.changes:
            assert change.version == version + 1
            version = change.version
            if change.members:
                mirror[change.route] = change.members
            else:
                mirror.pop(change.route, None)
    assert version == 3
    assert mirror == (await store.snapshot(NODE)).routes


async def test_the_stream_is_trimmed_exactly_and_a_late_reader_must_resync(
    store: RouteStore, redis_client: RedisClient
) -> None:
    claim = await store.claim(NODE, INC)
    await store.apply(NODE, INC, [(f"t/{i}", 1) for i in range(12)])
    assert await redis_client.xlen(store.keys.node_stream(NODE)) == 5
    snap = await store.snapshot(NODE)
    assert (snap.version, snap.first_version) == (12, 8)
    # Versions 8..12 are still there: a reader at 7 continues, a reader at 6 cannot.
    assert [c.version for c in (await store.changes(NODE, claim.generation, 7)).changes] == [
        8,
        9,
        10,
        11,
        12,
    ]
    for behind in (0, 6):
        with pytest.raises(ResyncRequiredError) as info:
            await store.changes(NODE, claim.generation, behind)
        assert info.value.reason == "trimmed"
    assert (await store.changes(NODE, claim.generation, 12)).changes == []


async def test_readers_resync_when_the_stream_or_route_set_vanishes(
    store: RouteStore, redis_client: RedisClient
) -> None:
    claim = await store.claim(NODE, INC)
    await store.apply(NODE, INC, [("a", 1), ("b", 1)])
    await redis_client.delete(store.keys.node_stream(NODE))
    with pytest.raises(ResyncRequiredError) as info:
        await store.changes(NODE, claim.generation, 1)
    assert info.value.reason == "trimmed"
    with pytest.raises(ResyncRequiredError) as info:
        await store.changes(NODE, claim.generation, 3)
    assert info.value.reason == "ahead"
    await store.purge(NODE)
    with pytest.raises(ResyncRequiredError) as info:
        await store.changes(NODE, claim.generation, 2)
    assert info.value.reason == "gone"
    # A reader of a node that never had a route set is up to date until one appears.
    assert (await store.changes(NODE, None, 0)).changes == []
    await store.claim(NODE, INC)
    with pytest.raises(ResyncRequiredError) as info:
        await store.changes(NODE, None, 0)
    assert info.value.reason == "generation"


async def test_a_new_incarnation_drops_the_old_routes_and_fences_the_old_writer(
    store: RouteStore,
) -> None:
    first = await store.claim(NODE, INC, {"old/a": 1, "old/b": 1})
    await store.apply(NODE, INC, [("old/c", 1)])
    second = await store.claim(NODE, "inc-2", {"new": 1})
    assert second.dropped == 3
    assert int(second.generation) > int(first.generation)
    with pytest.raises(StaleIncarnationError):
        await store.apply(NODE, INC, [("late", 1)])
    with pytest.raises(ResyncRequiredError) as info:
        await store.changes(NODE, first.generation, 1)
    assert info.value.reason == "generation"
    snap = await store.snapshot(NODE)
    assert (snap.incarnation, snap.version, snap.routes) == ("inc-2", 0, {"new": 1})
    # Claiming again (a republish) also starts a new generation.
    third = await store.claim(NODE, "inc-2", {"new": 1})
    assert int(third.generation) > int(second.generation)


async def test_writing_without_a_route_set_asks_for_a_claim(store: RouteStore) -> None:
    with pytest.raises(RouteSetMissingError):
        await store.apply(NODE, INC, [("a", 1)])
    await store.claim(NODE, INC)
    await store.purge(NODE)
    with pytest.raises(RouteSetMissingError):
        await store.add(NODE, INC, "a")
    assert (await store.snapshot(NODE)).routes == {}


async def test_purge_is_atomic_idempotent_and_respects_newer_incarnations(
    store: RouteStore, redis_client: RedisClient
) -> None:
    await store.claim(NODE, INC, {"a": 1, "b": 1})
    await store.apply(NODE, INC, [("c", 1)])
    assert tuple(await store.purge(NODE, "inc-0")) == (NODE, "skipped", 0)
    assert tuple(await store.purge(NODE, INC)) == (NODE, "purged", 3)
    for key in store.node_keys(NODE):
        assert await redis_client.exists(key) == 0
    assert tuple(await store.purge(NODE, INC)) == (NODE, "absent", 0)
    assert tuple(await store.purge(NODE)) == (NODE, "absent", 0)


async def test_nodes_are_separate(store: RouteStore) -> None:
    await store.claim("n1", INC, {"a": 1})
    await store.claim("n2", INC, {"b": 1})
    await store.apply("n1", INC, [("c", 1)])
    assert (await store.snapshot("n1")).routes == {"a": 1, "c": 1}
    assert (await store.snapshot("n2")).routes == {"b": 1}
    assert (await store.snapshot("n2")).version == 0


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ([("a/#/b", 1)], InvalidTopicError),
        ([("x" * 65536, 1)], InvalidTopicError),
        ([("ok", 1), ("", 1)], InvalidTopicError),
        ([("ok", 2)], InvalidIdError),
        ([("$share/g/ok", -1)], InvalidIdError),
        ([("$share/g/ok", "3")], InvalidIdError),
        ([("$share/g/ok", True)], InvalidIdError),
    ],
)
async def test_bad_changes_raise_and_change_nothing(
    store: RouteStore, changes: list[tuple[str, int]], error: type[RouterError]
) -> None:
    await store.claim(NODE, INC, {"keep": 1})
    before = await store.snapshot(NODE)
    with pytest.raises(error):
        await store.apply(NODE, INC, changes)
    with pytest.raises(error):
        await store.claim(NODE, INC, dict(changes))
    assert await store.snapshot(NODE) == before


async def test_bad_ids_and_arguments(store: RouteStore) -> None:
    with pytest.raises(InvalidIdError):
        await store.claim("", INC)
    with pytest.raises(InvalidIdError):
        await store.claim(NODE, "")
    with pytest.raises(InvalidIdError):
        await store.claim(NODE, INC, {"$share/g/t": 0})
    with pytest.raises(InvalidIdError):
        await store.changes(NODE, None, -1)
    with pytest.raises(InvalidIdError):
        await store.changes(NODE, "", 0)
    with pytest.raises(InvalidIdError):
        await store.snapshot("")
    with pytest.raises(ValueError, match="stream_length"):
        RouteStore(store.redis, store.keys, stream_length=0)
    assert (await store.snapshot(NODE)).generation is None


async def test_garbage_planted_in_redis_raises_corrupt_state(
    store: RouteStore, redis_client: RedisClient
) -> None:
    claim = await store.claim(NODE, INC, {"keep": 1})
    meta = store.keys.node_meta(NODE)
    await redis_client.hset(meta, "version", "many")
    with pytest.raises(CorruptStateError):
        await store.apply(NODE, INC, [("new", 1)])
    with pytest.raises(CorruptStateError):
        await store.snapshot(NODE)
    with pytest.raises(CorruptStateError):
        await store.changes(NODE, claim.generation, 0)
    await redis_client.hset(meta, "version", "0")
    await redis_client.xadd(store.keys.node_stream(NODE), {"r": "x", "n": "1"}, id="9-0")
    with pytest.raises(CorruptStateError):
        await store.apply(NODE, INC, [("new", 1)])
    await redis_client.hset(meta, "generation", "soon")
    with pytest.raises(CorruptStateError):
        await store.claim(NODE, INC)
    await redis_client.hset(store.keys.node_routes(NODE), "keep", "lots")
    with pytest.raises(CorruptStateError):
        await store.snapshot(NODE)
    assert await redis_client.hgetall(store.keys.node_routes(NODE)) == {b"keep": b"lots"}


async def test_scripts_refuse_malformed_argv(store: RouteStore, redis_client: RedisClient) -> None:
    claim = await store.claim(NODE, INC, {"keep": 1})
    scripts = Scripts(redis_client)
    node_keys = store.node_keys(NODE)
    bad_apply = [
        [],
        [INC],
        ["", "5"],
        [INC, "0"],
        [INC, "x"],
        [INC, "5", "route"],
        [INC, "5", "", "1"],
        [INC, "5", "r", "-1"],
        [INC, "5", "r", "01"],
        [INC, "5", "r", "1.5"],
        [INC, "5", "r", "one"],
    ]
    for args in bad_apply:
        with pytest.raises(ScriptError):
            await scripts.run("route_apply", node_keys, args)
    for args in ([], [""], [INC, "r"], [INC, "r", "0"], [INC, "r", "x"]):
        with pytest.raises(ScriptError):
            await scripts.run("route_claim", node_keys, args)
    change_keys = [store.keys.node_stream(NODE), store.keys.node_meta(NODE)]
    for args in ([], [claim.generation, "0"], [claim.generation, "-1", "5"], ["", "0", "0"]):
        with pytest.raises(ScriptError):
            await scripts.run("route_changes", change_keys, args)
    for name, args in (
        ("route_snapshot", []),
        ("route_snapshot", ["x"]),
        ("route_snapshot", ["0"]),
        ("route_snapshot", ["1", "2"]),
        ("route_purge", []),
        ("route_purge", ["a", "b"]),
    ):
        with pytest.raises(ScriptError):
            await scripts.run(name, node_keys, args)
    snap = await store.snapshot(NODE)
    assert (snap.generation, snap.version, snap.routes) == (claim.generation, 0, {"keep": 1})
