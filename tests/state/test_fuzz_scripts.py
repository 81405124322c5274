"""Every Lua script, called directly (EVALSHA) on a real Redis, standalone and cluster, with
hostile ARGV, hostile KEYS and corrupt state (hypothesis; the cases are in
tests/support/script_fuzz.py), then the defects that fuzzing found, each pinned.

The contract checked for every call: it succeeds, or it is refused with an error reply;
a refusal leaves every key of the namespace as it was (type, contents and TTL): Lua has
no rollback, so a script checks everything before its first write. When the keys are
the script's own and the state is one the router writes, a refusal is also one of the
scripts' coded errors (``ROUTER_...``, which the state layer turns into a typed
RouterError), never a Lua runtime error or a command's own error.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from router.errors import CorruptStateError, RouterError, ScriptError
from router.state.keys import Keys
from router.state.scripts import ERROR_CODES, RedisClient, Scripts, script_source
from tests.state.test_scripts import lua_files
from tests.support import script_fuzz
from tests.support.script_fuzz import (
    CLIENT_KEYS,
    SPECS,
    State,
    Value,
    argv_for,
    assert_unchanged,
    h,
    key,
    keys_for,
    s,
    state_for,
)

SERVERS = ["redis_standalone_url", "redis_cluster_url"]
EXAMPLES = 40  # per script and server: about 20 s for all of them on two cores


class Harness:
    """One client on one server, the scripts registered, a fresh namespace per call."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self.scripts: dict[str, AsyncScript] = {}
        self._run = uuid4().hex[:8]
        self._count = itertools.count()

    @classmethod
    async def open(cls, url: str, *, cluster: bool) -> Harness:
        if cluster:
            client = RedisCluster.from_url(url)
            await client.initialize()
            return cls(client)
        return cls(Redis.from_url(url))

    def namespace(self) -> str:
        return f"fz{self._run}-{next(self._count)}:"

    async def seed(self, ns: str, state: State) -> None:
        if state:
            pipe: Any = self.client.pipeline(transaction=False)
            script_fuzz.seed(pipe, ns, state)
            await pipe.execute()

    async def drop(self, names: list[bytes]) -> None:
        if names:
            pipe: Any = self.client.pipeline(transaction=False)
            for name in names:
                pipe.delete(name)
            await pipe.execute()

    async def call(self, name: str, data: st.DataObject) -> None:
        """Seed, call ``name`` with drawn KEYS and ARGV, and check the contract."""
        spec = SPECS[name]
        ns = self.namespace()
        state, plausible_state = data.draw(state_for(spec), "state")
        keys, own_keys = data.draw(keys_for(spec, ns), "keys")
        args = data.draw(argv_for(spec, ns), "argv")
        await self.seed(ns, state)
        before = await script_fuzz.snapshot_namespace(self.client, ns)
        if name not in self.scripts:
            self.scripts[name] = self.client.register_script(script_source(name))
        refusal = None
        try:
            await self.scripts[name](keys=keys, args=args)
        except ResponseError as error:
            refusal = error
        after = await script_fuzz.snapshot_namespace(self.client, ns)
        await self.drop(list(after))
        if refusal is not None:
            assert_unchanged(before, after, f"{name} refused with {refusal}")
            if own_keys and plausible_state:
                code = str(refusal).partition(" ")[0]
                assert code in ERROR_CODES, f"{name} {args!r:.300}: uncoded refusal {refusal}"


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("server", SERVERS)
def test_hostile_calls_succeed_or_change_nothing(
    server: str, name: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server)
    with asyncio.Runner() as runner:
        harness = runner.run(Harness.open(url, cluster=server == "redis_cluster_url"))

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            runner.run(harness.call(name, data))

        try:
            check()
        finally:
            runner.run(harness.client.aclose())


def test_every_script_is_fuzzed() -> None:
    assert sorted(SPECS) == lua_files()


# -- defects the fuzzing found, each pinned ------------------------------------------------

BACKENDS = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


async def refused(
    redis: RedisClient,
    keys: Keys,
    name: str,
    state: dict[str, Value],
    roles: list[str],
    args: list[str],
) -> RouterError:
    """Seed ``state``, run ``name`` through the state layer's Scripts; return its typed
    refusal after checking that nothing changed."""
    ns = f"{keys.prefix}:"
    seed: Any = redis.pipeline(transaction=False)
    script_fuzz.seed(seed, ns, state)
    await seed.execute()
    before = await script_fuzz.snapshot_namespace(redis, ns)
    with pytest.raises(RouterError) as raised:
        await Scripts(redis).run(name, [key(ns, role) for role in roles], args)
    after = await script_fuzz.snapshot_namespace(redis, ns)
    assert_unchanged(before, after, f"{name} refused with {raised.value!r}")
    return raised.value


REGISTRY = {
    "registry": h(n1="inc1"),
    "heartbeats": ("zset", {"n1": 123.0}, 0),
    "retired": h(n2="inc2"),
}
ALIASES = {
    "aliases": ("hash", {"1": "t/1", "7": "t/7"}, 0),
    "topics": ("hash", {"t/1": "1", "t/7": "7"}, 0),
    "max": h(client="10"),
}
SHARD = {
    "topics": ("zset", {"a": 0.0, "a/b": 0.0}, 0),
    "messages": h(a="m", a__b="m"),
    "expiry": ("zset", {"a": 1.0}, 0),
}
SHARDS = {"shards": ("zset", {"a": 0.0}, 0), "counts": h(a="2"), "total": s("2")}


@BACKENDS
@pytest.mark.parametrize(
    ("name", "state", "roles", "args"),
    [
        ("node_unregister", REGISTRY, ["registry"], ["n1", ""]),
        ("node_register", REGISTRY, ["registry"], ["n2", "inc", "1000"]),
        ("alias_maximum", ALIASES, ["aliases", "topics"], ["client", "2"]),
        ("retained_store", SHARD, ["topics", "messages"], ["a/c", "m", "0", "1"]),
        ("node_register", REGISTRY, ["registry", "registry"], ["n2", "inc", "1000"]),
        ("node_retire", REGISTRY, ["registry", "heartbeats"], ["n1", "inc1"]),
    ],
)
async def test_missing_or_repeated_keys_are_refused_before_any_write(
    redis_client: RedisClient,
    keys: Keys,
    name: str,
    state: State,
    roles: list[str],
    args: list[str],
) -> None:
    """Before: the script wrote to KEYS[1], then a command on a missing KEYS[n] (nil) or on
    KEYS[1] again as another type failed: the first write stayed."""
    assert isinstance(await refused(redis_client, keys, name, state, roles, args), ScriptError)


@BACKENDS
@pytest.mark.parametrize(
    ("name", "wrong", "roles", "args"),
    [
        ("node_register", "heartbeats", list(REGISTRY), ["n2", "inc", "1000"]),
        ("node_unregister", "heartbeats", list(REGISTRY), ["n1", ""]),
        ("node_retire", "retired", list(REGISTRY), ["n1", "inc1"]),
        ("alias_maximum", "topics", list(ALIASES), ["client", "2"]),
        ("retained_store", "topics", list(SHARD), ["a/c", "m", "0", "1"]),
        ("retained_expire", "topics", list(SHARD), ["10"]),
        ("retained_scan", "topics", list(SHARD), ["delete", "a/#", "a", "a/", "", "9", "9"]),
        ("retained_reserve", "shards", list(SHARDS), ["b", "0"]),
        ("retained_release", "shards", list(SHARDS), ["a", "2"]),
    ],
)
async def test_keys_of_another_type_are_refused_before_any_write(
    redis_client: RedisClient, keys: Keys, name: str, wrong: str, roles: list[str], args: list[str]
) -> None:
    """Before: the script wrote to one key, then failed with WRONGTYPE on another."""
    state = {**REGISTRY, **ALIASES, **SHARD, **SHARDS, wrong: s("not a collection")}
    state = {role: state[role] for role in roles}
    error = await refused(redis_client, keys, name, state, roles, args)
    assert isinstance(error, CorruptStateError)


@BACKENDS
@pytest.mark.parametrize(
    ("name", "state", "roles", "args"),
    [
        # Lua's tonumber reads these; Redis commands then refuse the number it made, or
        # the script takes NaN for "no limit".
        ("retained_expire", SHARD, list(SHARD), ["1.5"]),
        ("retained_expire", SHARD, list(SHARD), ["nan"]),
        ("retained_range", SHARD, list(SHARD), ["0x0", "1"]),
        ("retained_range", SHARD, list(SHARD), ["1e20", "1"]),
        ("retained_locate", SHARDS, ["shards", "counts"], ["inf"]),
        ("retained_reserve", SHARDS, list(SHARDS), ["b", "nan"]),
        ("retained_reserve", SHARDS, list(SHARDS), ["b", " 1"]),
        ("retained_scan", SHARD, list(SHARD), ["delete", "a/#", "a", "a/", "", "1.5", "9"]),
        ("retained_scan", SHARD, list(SHARD), ["delete", "a/#", "a", "a/", "", "nan", "9"]),
        # An expiry past what Lua prints as an integer became PEXPIRE 1e+20 after HSET.
        ("session_mark", {"owner": h(node="n1", epoch="5")}, [], ["99999999999999999999"]),
        ("session_mark", {"owner": h(node="n1", epoch="5")}, [], ["-5"]),
    ],
)
async def test_numbers_lua_would_misread_are_refused_before_any_write(
    redis_client: RedisClient,
    keys: Keys,
    name: str,
    state: State,
    roles: list[str],
    args: list[str],
) -> None:
    if name == "session_mark":
        roles = ["subs", "owner", "a1", "a2", "a3", "a4", "a5", "session"]
        args = ["n1", "5", "away", *args, "f", "v"]
    assert isinstance(await refused(redis_client, keys, name, state, roles, args), ScriptError)


@BACKENDS
@pytest.mark.parametrize(
    ("name", "corrupt", "args"),
    [
        ("retained_release", {"total": s("abc")}, ["a", "1"]),
        ("retained_release", {"counts": h(a="1", b="x")}, ["a", "1", "b", "1"]),
        ("retained_reserve", {"total": s("abc")}, ["a", "0"]),
        ("retained_reserve", {"counts": h(a="x")}, ["a", "0"]),
    ],
)
async def test_corrupt_totals_are_refused_before_any_write(
    redis_client: RedisClient, keys: Keys, name: str, corrupt: State, args: list[str]
) -> None:
    """Before: HINCRBY (or INCR) wrote, then arithmetic on the corrupt value failed."""
    state = {**SHARDS, **corrupt}
    error = await refused(redis_client, keys, name, state, list(SHARDS), args)
    assert isinstance(error, CorruptStateError)


@BACKENDS
@pytest.mark.parametrize("announce", ["PUBLISH", "SPUBLISH"])
async def test_a_wake_up_channel_of_another_channel_is_refused_before_any_write(
    redis_client: RedisClient, keys: Keys, announce: str
) -> None:
    """Before: on a cluster, SPUBLISH to a channel of another slot failed after the messages
    were stored and the clock moved (the caller saw an error: a retry stored them twice)."""
    roles = ["clock", "m:", "id:a", "id:b"]
    args = ["60", "elsewhere", "0", announce, "a", "x", "b", "y"]
    state = {"clock": s("5", 60_000)}
    assert isinstance(
        await refused(redis_client, keys, "channel_publish", state, roles, args), ScriptError
    )


@BACKENDS
async def test_a_claim_that_opens_over_a_session_key_of_another_type_is_refused_before_any_write(
    redis_client: RedisClient, keys: Keys
) -> None:
    """Before: client_claim (keep, open) wrote the owner hash, then HSET on the session
    key, which held a string, failed: the session was claimed and not opened."""
    state = {**script_fuzz.CLIENT, "session": s("not a hash")}
    args = ["n2", "keep", "", "shared", "open", "expiry", "60"]
    error = await refused(redis_client, keys, "client_claim", state, list(CLIENT_KEYS), args)
    assert isinstance(error, CorruptStateError)
