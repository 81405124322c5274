"""The public state API with hostile values (hypothesis), on a real Redis, standalone and
cluster, then the defects that fuzzing found, each pinned.

Every call succeeds or raises a RouterError, and an error leaves every key of the
namespace as it was. A value of the wrong Python type (None for a str, a float for an
int) may raise TypeError instead, as the API documents; a value of the documented type
never raises anything but a RouterError.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from router.core.options import SubscriptionOptions
from router.errors import InvalidIdError, RetainedArgumentError, RouterError
from router.state.alias_store import RedisAliasTable
from router.state.channels import Channel
from router.state.keys import Keys
from router.state.node_registry import NodeRegistry
from router.state.retained_store import RetainedStore
from router.state.routes import RouteStore
from router.state.scripts import RedisClient
from router.state.session_store import SessionStore
from router.state.subscriptions import Owner, SubscriptionStore
from tests.support.script_fuzz import Snapshot, assert_unchanged, snapshot

SERVERS = ["redis_standalone_url", "redis_cluster_url"]
EXAMPLES = 400  # calls per server, spread over every operation: about 10 s each

# A drawn argument: (value, True when its Python type is the documented one).
Arg = tuple[Any, bool]

TEXT_TRAPS = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "a/\udfff",
    "x" * 65536,
    "é" * 30000,
    "+",
    "#",
    "a/#",
    "a/+/b",
    "#/a",
    "a+",
    "$share/g/a",
    "$share//a",
    "$share/g",
    "$share/g/",
    "$SYS/x",
    "{",
    "}",
    "{c:c1}",
    "%7B",
    "%",
    "/",
    "//",
    "c1",
    "n1",
    "inc1",
    "a/b",
    "t/1",
    "s1",
]
INT_TRAPS = [
    -(2**63),
    -(2**53) - 1,
    -1,
    0,
    1,
    2,
    3,
    65535,
    65536,
    2**31,
    2**32 - 1,
    2**32,
    2**53,
    2**64,
    10**30,
]
WRONG = [None, 1.5, math.nan, math.inf, b"bytes", ["a"], True]


def typed(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Arg]:
    return strategy.map(lambda value: (value, True))


wrong: st.SearchStrategy[Arg] = st.sampled_from(WRONG).map(lambda value: (value, False))
text: st.SearchStrategy[Arg] = st.one_of(
    typed(st.sampled_from(TEXT_TRAPS)), typed(st.text(max_size=12)), wrong
)
integer: st.SearchStrategy[Arg] = st.one_of(
    typed(st.sampled_from(INT_TRAPS)),
    typed(st.integers()),
    wrong,
    text.map(lambda arg: (arg[0], False)),
)


class World:
    """The stores under one namespace, seeded with a client, a node, retained messages and
    a channel with a subscriber."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self.subs = SubscriptionStore(client, keys)
        self.aliases = RedisAliasTable(client, keys)
        self.sessions = SessionStore(client, keys, self.subs)
        self.routes = RouteStore(client, keys, stream_length=5)
        self.registry = NodeRegistry(client, keys, ttl=60.0, routes=self.routes)
        self.retained = RetainedStore(client, keys)
        self.channel = Channel(client, "ch1", 60.0, keys)
        self.owner = Owner("n1", 1)
        self.generation = ""

    async def seed(self) -> None:
        self.owner = await self.subs.claim("c1", "n1")
        await self.subs.subscribe("c1", "a/b", owner=self.owner)
        await self.aliases.set_maximum("c1", "client", 10)
        await self.aliases.bind("c1", "client", 1, "t/1")
        await self.sessions.mark_open("c1", self.owner, expiry=60)
        await self.registry.register("n1", "inc1")
        self.generation = (await self.routes.claim("n1", "inc1", {"r/1": 1})).generation
        await self.retained.store("a/b", b"m1")
        await self.retained.store("a/c", b"m2", expiry_interval=60)
        await self.channel.add_subscriber("s1")
        await self.channel.publish([("i1", b"x")])

    async def snapshot(self) -> Snapshot:
        client: Any = self.client
        pattern = self.keys.pattern()
        if isinstance(client, RedisCluster):
            names: list[bytes] = []
            for node in client.get_primaries():
                names += await client.keys(pattern, target_nodes=node)
        else:
            names = await client.keys(pattern)
        return await snapshot(client, names)

    async def drop(self) -> None:
        for name in await self.snapshot():
            await self.client.delete(name)
        await self.channel.aclose()


# -- the operations and what each draws -------------------------------------------------

Draw = Callable[[World], st.SearchStrategy[Arg]]
Op = Callable[[World, st.DataObject], tuple[Callable[[], Awaitable[Any]], bool]]


def texts(world: World) -> st.SearchStrategy[Arg]:
    return text


def ints(world: World) -> st.SearchStrategy[Arg]:
    return integer


def owners(world: World) -> st.SearchStrategy[Arg]:
    """The seeded owner, None, or an Owner with hostile fields."""
    hostile = st.builds(lambda n, e: (Owner(n[0], e[0]), n[1] and e[1]), text, integer)
    return st.one_of(st.just((world.owner, True)), st.just((None, True)), hostile, wrong)


def session_owners(world: World) -> st.SearchStrategy[Arg]:
    """As :func:`owners`, but a session always names its owner: None is the wrong type."""
    return owners(world).map(lambda arg: (arg[0], arg[1] and arg[0] is not None))


def namespaces(world: World) -> st.SearchStrategy[Arg]:
    return st.one_of(typed(st.sampled_from(["client", "server"])), text)


def payloads(world: World) -> st.SearchStrategy[Arg]:
    return st.one_of(typed(st.binary(max_size=8)), wrong)


def generations(world: World) -> st.SearchStrategy[Arg]:
    return st.one_of(st.just((world.generation, True)), st.just((None, True)), text)


def op(*draws: Draw) -> Callable[[Callable[..., Awaitable[Any]]], Op]:
    """An operation: draws its arguments, calls ``call(world, *values)``; typed when all are."""

    def wrap(call: Callable[..., Awaitable[Any]]) -> Op:
        def run(world: World, data: st.DataObject) -> tuple[Callable[[], Awaitable[Any]], bool]:
            args = [data.draw(draw(world)) for draw in draws]
            values = [value for value, _ in args]
            return lambda: call(world, *values), all(ok for _, ok in args)

        return run

    return wrap


S, N = texts, ints
OPS: dict[str, Op] = {
    "claim": op(S, S)(lambda w, c, n: w.subs.claim(c, n)),
    "subscribe": op(S, S, owners)(
        lambda w, c, f, o: w.subs.subscribe(c, f, SubscriptionOptions(), owner=o)
    ),
    "unsubscribe": op(S, S, owners)(lambda w, c, f, o: w.subs.unsubscribe(c, f, owner=o)),
    "remove_client": op(S, owners)(lambda w, c, o: w.subs.remove_client(c, owner=o)),
    "set_maximum": op(S, namespaces, N)(lambda w, c, n, m: w.aliases.set_maximum(c, n, m)),
    "bind": op(S, namespaces, N, S)(lambda w, c, n, a, t: w.aliases.bind(c, n, a, t)),
    "alias_topic": op(S, namespaces, N)(lambda w, c, n, a: w.aliases.topic(c, n, a)),
    "mark_open": op(S, session_owners, N, N, N)(
        lambda w, c, o, e, p, k: w.sessions.mark_open(c, o, expiry=e, protocol=p, keepalive=k)
    ),
    "mark_open_user": op(S, session_owners, S)(
        lambda w, c, o, u: w.sessions.mark_open(c, o, expiry=5, username=u)
    ),
    "mark_away": op(S, session_owners, N, N)(
        lambda w, c, o, e, r: w.sessions.mark_away(c, o, expiry=e, awaiting_release=[r])
    ),
    "route_claim": op(S, S, S, N)(lambda w, n, i, r, k: w.routes.claim(n, i, {r: k})),
    "route_apply": op(S, S, S, N)(lambda w, n, i, r, k: w.routes.apply(n, i, [(r, k)])),
    "route_changes": op(S, generations, N, N)(
        lambda w, n, g, v, limit: w.routes.changes(n, g, v, limit=limit)
    ),
    "route_purge": op(S, S)(lambda w, n, i: w.routes.purge(n, i)),
    "register": op(S, S)(lambda w, n, i: w.registry.register(n, i)),
    "heartbeat": op(S, S)(lambda w, n, i: w.registry.heartbeat(n, i)),
    "unregister": op(S, S)(lambda w, n, i: w.registry.unregister(n, i)),
    "retain": op(S, payloads, N, N)(
        lambda w, t, p, q, e: w.retained.store(t, p, qos=q, expiry_interval=e)
    ),
    "retained_delete": op(S)(lambda w, f: w.retained.delete(f)),
    "retained_get": op(S)(lambda w, t: w.retained.get(t)),
    "retained_match": op(S, N)(lambda w, f, limit: w.retained.match(f, limit=limit)),
    "retained_page": op(N, N)(lambda w, p, limit: w.retained.page(p, limit=limit)),
    "clear_expired": op(S, N)(lambda w, c, limit: w.retained.clear_expired(c, limit=limit)),
    "publish": op(S, payloads)(lambda w, i, p: w.channel.publish([(i, p)])),
    "add_subscriber": op(S)(lambda w, s: w.channel.add_subscriber(s)),
    "fetch": op(S, N)(lambda w, s, m: w.channel.fetch(s, max=m)),
    "ack": op(S, S)(lambda w, s, h: w.channel.ack(s, h)),
    "ack_clock": op(S, N)(lambda w, s, c: w.channel.ack(s, w.channel.handle("s1", c))),
}


async def call_once(world: World, name: str, data: st.DataObject) -> None:
    before = await world.snapshot()
    call, all_typed = OPS[name](world, data)
    try:
        await call()
    except RouterError as error:
        assert_unchanged(before, await world.snapshot(), f"{name} raised {error!r:.200}")
    except TypeError as error:
        assert not all_typed, f"{name}: TypeError for values of the documented types: {error}"
        assert_unchanged(before, await world.snapshot(), f"{name} raised {error!r:.200}")


async def open_client(server: str, url: str) -> RedisClient:
    if server == "redis_cluster_url":
        client = RedisCluster.from_url(url)
        await client.initialize()
        return client
    return Redis.from_url(url)


@pytest.mark.parametrize("server", SERVERS)
def test_hostile_values_raise_router_errors_and_change_nothing(
    server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server)
    with asyncio.Runner() as runner:
        world = World(runner.run(open_client(server, url)), Keys(f"fzapi{uuid4().hex[:10]}"))

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(name=st.sampled_from(sorted(OPS)), data=st.data())
        def check(name: str, data: st.DataObject) -> None:
            runner.run(call_once(world, name, data))

        try:
            runner.run(world.seed())
            check()
        finally:
            try:
                runner.run(world.drop())
            finally:
                runner.run(world.client.aclose())


# -- defects the fuzzing found, each pinned ------------------------------------------------

BACKENDS = pytest.mark.parametrize("redis_backend", ["standalone", "cluster"], indirect=True)


@BACKENDS
async def test_session_writes_refuse_values_they_could_not_read_back(
    redis_client: RedisClient, keys: Keys
) -> None:
    """Before: a None owner raised AttributeError, a lone surrogate UnicodeEncodeError, and a
    float keepalive or a packet id 0 were stored, to fail every later describe()."""
    world = World(redis_client, keys)
    await world.seed()
    before = await world.snapshot()
    sessions, owner = world.sessions, world.owner
    with pytest.raises(TypeError):
        await sessions.mark_open("c1", None, expiry=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await sessions.mark_open("c1", owner, expiry=5, keepalive=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdError):
        await sessions.mark_open("c1", owner, expiry=5, username="\ud800")
    with pytest.raises(InvalidIdError):
        await sessions.mark_open("c1", owner, expiry=5, username="\x00")  # None's marker
    with pytest.raises(InvalidIdError):
        await sessions.mark_away("c1", owner, expiry=5, awaiting_release=[0])
    with pytest.raises(InvalidIdError):
        await sessions.mark_away("c1", Owner("\ud800", owner.epoch), expiry=5)
    with pytest.raises(RouterError):
        await sessions.mark_away("c1", owner, expiry=-5)  # was taken for "never"
    assert_unchanged(before, await world.snapshot(), "refused session writes")
    info = await sessions.describe("c1")
    assert info is not None and info.connected


@BACKENDS
async def test_other_arguments_the_api_refuses_with_a_router_error(
    redis_client: RedisClient, keys: Keys
) -> None:
    """Before: ValueError (a change limit of 0), UnicodeEncodeError (a subscriber or an
    expiry cursor with a lone surrogate), AttributeError (a cursor that is not a str)."""
    world = World(redis_client, keys)
    await world.seed()
    before = await world.snapshot()
    with pytest.raises(InvalidIdError):
        await world.routes.changes("n1", world.generation, 0, limit=0)
    with pytest.raises(InvalidIdError):
        world.channel.handle("\ud800", 1)
    with pytest.raises(RetainedArgumentError):
        await world.retained.clear_expired("\ud800")
    with pytest.raises(RetainedArgumentError):
        await world.retained.clear_expired(1.5)  # type: ignore[arg-type]
    assert_unchanged(before, await world.snapshot(), "refused calls")
    # A page past anything a store can hold is empty (the script takes 15 digits at most).
    page = await world.retained.page(2**64, limit=10)
    assert (page.messages, page.has_next) == ([], False)
