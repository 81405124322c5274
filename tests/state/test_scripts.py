"""The state layer's scripts as a whole: contract headers, SCRIPT FLUSH, a Redis restart,
every script on every master of the cluster, hostile ids, and missing ARGV."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot

from router.core.options import SubscriptionOptions
from router.errors import (
    InvalidIdError,
    ResyncRequiredError,
    RouteSetMissingError,
    ScriptError,
)
from router.state.alias_store import AliasCopy, RedisAliasTable
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.route_acks import RouteAcks
from router.state.routes import RouteStore
from router.state.scripts import RedisClient, Scripts, script_source
from router.state.session_store import SessionStore
from router.state.subscriptions import SubscriptionStore
from tests.support.servers import RedisServer

# Every script of the client / route / node state layer (channel_* scripts live elsewhere).
STATE_SCRIPTS = frozenset(
    {
        "client_claim",
        "client_restore",
        "client_subscribe",
        "client_unsubscribe",
        "client_remove",
        "session_mark",
        "session_adopt",
        "alias_bind",
        "alias_maximum",
        "alias_remove",
        "alias_replace",
        "route_claim",
        "route_apply",
        "route_snapshot",
        "route_changes",
        "route_purge",
        "route_ack",
        "node_register",
        "node_heartbeat",
        "node_list",
        "node_unregister",
        "node_retire",
    }
)
STATE_PREFIXES = ("client_", "alias_", "route_", "node_", "session_")

HOSTILE_IDS = [
    "plain",
    "{",
    "}",
    "{}",
    "}{",
    "{c:plain}",
    "a}:subs",
    "%7B",
    "%",
    "c:plain",
    "with spaces  and\ttabs",
    "ünïcödé ☃ 𝄞",
    "x" * 1024,
    "{" * 512 + "}" * 512,
]


def lua_files() -> list[str]:
    names = [p.name for p in resources.files("router.lua").iterdir() if p.name.endswith(".lua")]
    return sorted(name.removesuffix(".lua") for name in names)


# -- the scripts as files ----------------------------------------------------------------


def test_the_state_scripts_are_exactly_the_state_files() -> None:
    assert {n for n in lua_files() if n.startswith(STATE_PREFIXES)} == STATE_SCRIPTS


def test_includes_expand_to_the_shared_library() -> None:
    lua = resources.files("router.lua")
    libraries = sorted(p.name for p in lua.joinpath("lib").iterdir() if p.name.endswith(".lua"))
    assert libraries == ["clocks.lua", "keys.lua", "owner.lua", "pairs.lua"]
    raw = lua.joinpath("client_remove.lua").read_text(encoding="utf-8")
    assert "--! include owner" in raw and "local function check_owner" not in raw
    expanded = script_source("client_remove")
    assert expanded.count("local function check_owner") == 1
    for name in lua_files():
        lines = script_source(name).splitlines()
        assert not any(line.startswith("--! include") for line in lines), name


@pytest.mark.parametrize("name", sorted(STATE_SCRIPTS))
def test_each_script_opens_with_its_contract_and_uses_locals_only(name: str) -> None:
    lines = script_source(name).splitlines()
    header = []
    for line in lines:
        if not line.startswith("--"):
            break
        header.append(line)
    text = "\n".join(header)
    assert re.search(r"^-- KEYS\[1\] = ", text, re.M), name
    assert re.search(r"^-- ARGV(\[1\] = |: none)", text, re.M), name
    assert re.search(r"^-- returns ", text, re.M), name
    # A global assignment breaks every later script on fakeredis (its Lua runtime is shared).
    declared = set(re.findall(r"\blocal\s+(?:function\s+)?([A-Za-z_]\w*)", script_source(name)))
    for names in re.findall(r"\blocal\s+([A-Za-z_][\w\s,]*?)\s*=", script_source(name)):
        declared.update(part.strip() for part in names.split(","))
    for line in lines:
        code = line.split("--", 1)[0]
        for target in re.findall(r"^\s*([A-Za-z_]\w*)\s*=[^=]", code):
            assert target in declared, f"{name}: global assignment to {target!r}"
        assert not re.match(r"^\s*function\b", code), f"{name}: global function"


# -- one client of each kind, exercising every script ------------------------------------


class Recorder(Scripts):
    """Scripts that remember which script ran against which cluster node."""

    ran: dict[str, set[str]]

    def __init__(self, redis: RedisClient) -> None:
        super().__init__(redis)
        self.ran = {}

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        where = "-"
        if isinstance(self._redis, RedisCluster):
            node = self._redis.get_node_from_key(keys[0])
            assert node is not None
            assert len({key_slot(k.encode()) for k in keys}) == 1, (name, keys)
            where = node.name
        self.ran.setdefault(name, set()).add(where)
        return await super().run(name, keys, args)


async def exercise_everything(
    redis: RedisClient, keys: Keys, client_id: str, node_id: str, scripts: Scripts | None = None
) -> None:
    """Run every state script once for this client and node, checking the results."""
    subs = SubscriptionStore(redis, keys)
    aliases = RedisAliasTable(redis, keys)
    routes = RouteStore(redis, keys, stream_length=3)
    registry = NodeRegistry(redis, keys, ttl=30.0, routes=routes)
    acks = RouteAcks(redis, keys)
    if scripts is not None:
        for store in (subs, aliases, routes, registry, acks):
            store._scripts = scripts
    owner = await subs.claim(client_id, node_id)
    assert await subs.subscribe_many(client_id, [("a/+", SubscriptionOptions(qos=1))], owner=owner)
    assert await subs.unsubscribe_many(client_id, ["a/+", "b"], owner=owner) == [True, False]
    await subs.subscribe(client_id, "kept", owner=owner)
    assert await aliases.set_maximum(client_id, "client", 10) == 0
    assert await aliases.bind(client_id, "client", 3, "x/y")
    assert await aliases.alias(client_id, "client", "x/y") == 3
    assert await aliases.remove_client(client_id) == 1
    copy = AliasCopy(client_id, owner, ((10, {1: "x/y"}), (0, {})))
    assert await aliases.mirror([copy, AliasCopy(client_id, owner, None)]) == [1, 0]
    await aliases.bind(client_id, "server", 1, "z")
    sessions = SessionStore(redis, keys, subs)
    if scripts is not None:
        sessions._scripts = scripts
    await sessions.mark_away(client_id, owner, expiry=60, awaiting_release=[3, 1])
    info = await sessions.describe(client_id)
    assert info is not None and (info.connected, info.awaiting_release) == (False, (1, 3))
    assert not await subs.restore_owner(client_id, owner)  # (owned: unchanged)
    adopted = await sessions.adopt(client_id, owner, "adopter")
    assert adopted is not None
    owner = adopted.owner
    removed = await subs.remove_client(client_id, owner=owner)
    assert tuple(removed) == (1, 1, True)
    assert await subs.restore_owner(client_id, owner)
    assert await subs.owner(client_id) == owner
    await subs.remove_client(client_id, owner=owner)

    registration = await registry.register(node_id, "inc-1")
    assert registration.previous_incarnation is None
    await registry.heartbeat(node_id, "inc-1")
    claim = await routes.claim(node_id, "inc-1", {"r/#": 1})
    await routes.apply(node_id, "inc-1", [("s", 1), ("$share/g/t", 2)])
    snap = await routes.snapshot(node_id)
    assert (snap.generation, snap.version, snap.routes) == (
        claim.generation,
        2,
        {"r/#": 1, "s": 1, "$share/g/t": 2},
    )
    assert len((await routes.changes(node_id, claim.generation, 0)).changes) == 2
    await acks.ack(node_id, "reader 1", claim.generation, 2)
    assert await acks.read(node_id) == {"reader 1": (claim.generation, 2)}
    assert node_id in {n.node_id for n in await registry.live_nodes()}
    await registry.retire(node_id, "inc-1")
    assert node_id in {n.node_id for n in await registry.dead_nodes() if n.retired}
    assert (await registry.purge(node_id, "inc-1")).status == "purged"
    assert node_id not in {n.node_id for n in await registry.nodes()}


# -- script cache: SCRIPT FLUSH and a restarted server -----------------------------------


async def test_everything_survives_script_flush_between_calls(
    redis_client: RedisClient, keys: Keys
) -> None:
    subs = SubscriptionStore(redis_client, keys)
    routes = RouteStore(redis_client, keys)
    await subs.subscribe("c", "before")
    await routes.claim("n", "inc")
    sha = (await subs._scripts._script("client_subscribe")).sha
    assert await redis_client.script_exists(sha) == [True]
    assert await redis_client.script_flush() is True
    assert await redis_client.script_exists(sha) == [False]
    assert await subs.subscribe("c", "after") is True
    assert await routes.add("n", "inc", "route") is True
    assert set(await subs.subscriptions("c")) == {"before", "after"}
    await redis_client.script_flush()
    await exercise_everything(redis_client, keys, "client-after-flush", "node-after-flush")


async def test_everything_survives_a_redis_restart(
    redis_server_factory: Callable[[], RedisServer], keys: Keys
) -> None:
    server = redis_server_factory()
    # Redis.from_url() gives connections no retries: the first command on a connection the
    # restart closed would fail. A node configures retries like this; the test does too.
    redis = Redis.from_url(server.url, retry=Retry(NoBackoff(), 3))
    try:
        subs = SubscriptionStore(redis, keys)
        routes = RouteStore(redis, keys)
        await subs.subscribe("c", "before")
        claim = await routes.claim("n", "inc", {"r": 1})
        server.restart()
        # The data and the script cache are gone; the clients reconnect and reload.
        assert await subs.subscriptions("c") == {}
        assert await subs.subscribe("c", "after") is True
        with pytest.raises(RouteSetMissingError):
            await routes.add("n", "inc", "s")
        with pytest.raises(ResyncRequiredError) as info:
            await routes.changes("n", claim.generation, 0)
        assert info.value.reason == "gone"
        again = await routes.claim("n", "inc", {"r": 1})
        assert again.generation != claim.generation
        assert await routes.add("n", "inc", "s") is True
        await exercise_everything(redis, keys, "client-after-restart", "node-after-restart")
    finally:
        await redis.aclose()


# -- the cluster: every script on every master -------------------------------------------


def ids_on_every_master(
    cluster: RedisCluster, key_of: Callable[[str], str], stem: str
) -> dict[str, str]:
    """One id per master (node name -> id) whose keys live on that master."""
    masters = {node.name for node in cluster.get_primaries()}
    found: dict[str, str] = {}
    for i in range(10_000):
        candidate = f"{stem}-{i}"
        node = cluster.get_node_from_key(key_of(candidate))
        assert node is not None
        found.setdefault(node.name, candidate)
        if set(found) == masters:
            return found
    raise AssertionError("no ids found for every master")


@pytest.mark.parametrize("redis_backend", ["cluster"], indirect=True)
async def test_every_script_runs_on_every_master_of_the_cluster(
    redis_client: RedisClient, keys: Keys
) -> None:
    assert isinstance(redis_client, RedisCluster)
    masters = {node.name for node in redis_client.get_primaries()}
    assert len(masters) == 3
    clients = ids_on_every_master(redis_client, keys.client_owner, "client")
    nodes = ids_on_every_master(redis_client, keys.node_meta, "node")
    recorder = Recorder(redis_client)
    for master in sorted(masters):
        await exercise_everything(redis_client, keys, clients[master], nodes[master], recorder)
    assert set(recorder.ran) == STATE_SCRIPTS
    registry_master = redis_client.get_node_from_key(keys.registry())
    assert registry_master is not None
    for name, where in recorder.ran.items():
        if name.startswith("node_") and name != "node_purge":
            assert where == {registry_master.name}, name
        else:
            assert where == masters, name


# -- hostile ids -------------------------------------------------------------------------


def test_hostile_ids_keep_their_keys_in_one_slot_and_never_collide() -> None:
    keys = Keys("rt")
    seen: dict[str, str] = {}
    for value in HOSTILE_IDS:
        client_keys = SubscriptionStore(None, keys).client_keys(value)  # type: ignore[arg-type]
        node_keys = RouteStore(None, keys).node_keys(value)  # type: ignore[arg-type]
        for group in (client_keys, node_keys):
            assert len({key_slot(k.encode()) for k in group}) == 1, (value, group)
        for key in (*client_keys, *node_keys):
            assert seen.setdefault(key, value) == value, f"{value!r} and {seen[key]!r} share {key}"
    assert len(seen) == len(HOSTILE_IDS) * (8 + 3)


async def test_hostile_ids_stay_apart_in_redis(redis_client: RedisClient, keys: Keys) -> None:
    subs = SubscriptionStore(redis_client, keys)
    routes = RouteStore(redis_client, keys)
    aliases = RedisAliasTable(redis_client, keys)
    for index, value in enumerate(HOSTILE_IDS):
        await subs.subscribe(value, f"filter/{index}")
        await aliases.bind(value, "client", index + 1, f"topic/{index}")
        await routes.claim(value, "inc", {f"route/{index}": 1})
    for index, value in enumerate(HOSTILE_IDS):
        assert set(await subs.subscriptions(value)) == {f"filter/{index}"}
        assert await aliases.aliases(value, "client") == {index + 1: f"topic/{index}"}
        assert (await routes.snapshot(value)).routes == {f"route/{index}": 1}


def empty_id_calls(redis: RedisClient, keys: Keys) -> list[Callable[[], Awaitable[Any]]]:
    subs = SubscriptionStore(redis, keys)
    aliases = RedisAliasTable(redis, keys)
    routes = RouteStore(redis, keys)
    registry = NodeRegistry(redis, keys, routes=routes)
    return [
        lambda: subs.claim("", "n"),
        lambda: subs.owner(""),
        lambda: subs.subscribe("", "a"),
        lambda: subs.subscribe_many("", []),
        lambda: subs.unsubscribe("", "a"),
        lambda: subs.unsubscribe_many("", []),
        lambda: subs.subscriptions(""),
        lambda: subs.remove_client(""),
        lambda: aliases.set_maximum("", "client", 1),
        lambda: aliases.bind("", "client", 1, "t"),
        lambda: aliases.topic("", "client", 1),
        lambda: aliases.alias("", "client", "t"),
        lambda: aliases.aliases("", "client"),
        lambda: aliases.remove_client(""),
        lambda: routes.claim("", "inc"),
        lambda: routes.apply("", "inc", []),
        lambda: routes.apply("", "inc", [("a", 1)]),
        lambda: routes.snapshot(""),
        lambda: routes.changes("", None, 0),
        lambda: routes.purge(""),
        lambda: registry.register("", "inc"),
        lambda: registry.heartbeat("", "inc"),
        lambda: registry.unregister(""),
        lambda: registry.purge(""),
    ]


async def test_an_empty_id_is_refused_everywhere(redis_client: RedisClient, keys: Keys) -> None:
    calls = empty_id_calls(redis_client, keys)
    assert len(calls) == 24
    for call in calls:
        with pytest.raises(InvalidIdError):
            await call()
    assert await namespace_state(redis_client, keys) == {}


# -- missing ARGV: a typed error and nothing changed --------------------------------------


async def namespace_state(redis: RedisClient, keys: Keys) -> dict[bytes, Any]:
    """Every key of the namespace with its type and contents."""
    if isinstance(redis, RedisCluster):
        scan: AsyncIterator[bytes] = redis.scan_iter(
            match=keys.pattern(), target_nodes=RedisCluster.PRIMARIES
        )
    else:
        scan = redis.scan_iter(match=keys.pattern())
    state: dict[bytes, Any] = {}
    for key in sorted([key async for key in scan]):
        kind = await redis.type(key)
        if kind == b"hash":
            state[key] = await redis.hgetall(key)
        elif kind == b"zset":
            state[key] = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":
            state[key] = await redis.xrange(key)
        else:
            state[key] = (kind, await redis.dump(key))
    return state


async def test_every_script_called_without_argv_refuses_and_changes_nothing(
    redis_client: RedisClient, keys: Keys
) -> None:
    await exercise_everything(redis_client, keys, "c", "n")
    subs = SubscriptionStore(redis_client, keys)
    owner = await subs.claim("c", "n")
    await subs.subscribe("c", "kept", owner=owner)
    await RedisAliasTable(redis_client, keys).bind("c", "client", 1, "t")
    routes = RouteStore(redis_client, keys)
    await routes.claim("n", "inc", {"r": 1})
    await routes.add("n", "inc", "s")
    await NodeRegistry(redis_client, keys).register("n", "inc")
    before = await namespace_state(redis_client, keys)
    assert len(before) >= 8

    alias_keys = [
        keys.client_aliases("c", "client"),
        keys.client_alias_topics("c", "client"),
        keys.client_alias_maximum("c"),
    ]
    registry_keys = [keys.registry(), keys.registry_heartbeats(), keys.registry_retired()]
    keys_of = {
        "client_claim": subs.client_keys("c"),
        "client_restore": [keys.client_owner("c")],
        "client_subscribe": subs.client_keys("c")[:2],
        "client_unsubscribe": subs.client_keys("c")[:2],
        "client_remove": subs.client_keys("c"),
        "session_mark": subs.client_keys("c"),
        "session_adopt": subs.client_keys("c"),
        "alias_bind": alias_keys,
        "alias_maximum": alias_keys,
        "alias_remove": subs.client_keys("c")[2:],
        "alias_replace": [keys.client_owner("c"), *subs.client_keys("c")[2:7]],
        "route_claim": routes.node_keys("n"),
        "route_apply": routes.node_keys("n"),
        "route_snapshot": routes.node_keys("n"),
        "route_changes": routes.node_keys("n")[1:],
        "route_purge": routes.node_keys("n"),
        "route_ack": [keys.node_route_acks("n")],
        "node_register": registry_keys,
        "node_heartbeat": registry_keys[:2],
        "node_list": registry_keys,
        "node_unregister": registry_keys,
        "node_retire": registry_keys,
    }
    assert set(keys_of) == STATE_SCRIPTS
    takes_none = {"alias_remove", "node_list"}
    scripts = Scripts(redis_client)
    for name, script_keys in sorted(keys_of.items()):
        args = ["unexpected"] if name in takes_none else []
        with pytest.raises(ScriptError):
            await scripts.run(name, script_keys, args)
    assert await namespace_state(redis_client, keys) == before
