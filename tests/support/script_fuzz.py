"""What tests/state/test_fuzz_scripts.py feeds every Lua script: the keys each one takes
(by role), a plausible state to seed them with, corrupt variants of that state, and
hypothesis strategies for ARGV that start plausible and turn hostile.

Every key of one example is ``NS{fz}:ROLE``: one hash tag, so one cluster slot, and one
namespace prefix ``NS`` of the example's own, so a snapshot reads exactly its keys.
A value is ``(type, content, ttl ms or 0)``; ``seed`` writes such a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from hypothesis import strategies as st
from redis.asyncio.cluster import RedisCluster

TAG: Final = "fz"

Value = tuple[str, Any, int]
State = dict[str, Value]


def key(ns: str, role: str) -> str:
    return f"{ns}{{{TAG}}}:{role}"


def s(text: str, ttl: int = 0) -> Value:
    return ("string", text.encode(), ttl)


def h(ttl: int = 0, **fields: str) -> Value:
    return ("hash", {k.replace("__", "/"): v for k, v in fields.items()}, ttl)


# -- the state each family of scripts works on --------------------------------------------

CLIENT: Final[State] = {
    "subs": ("hash", {"a/b": "o1", "x/+": "o2"}, 0),
    "owner": h(node="n1", epoch="5"),
    "alias:client": ("hash", {"1": "t/1", "3": "t/3"}, 0),
    "alias:client:topics": ("hash", {"t/1": "1", "t/3": "3"}, 0),
    "alias:server": ("hash", {"2": "s/2"}, 0),
    "alias:server:topics": ("hash", {"s/2": "2"}, 0),
    "alias:max": h(client="10", server="5"),
    "session": ("hash", {"node": "n1", "connected": "1"}, 100_000),
}
CLIENT_KEYS: Final = tuple(CLIENT)
ALIAS_KEYS: Final = ("alias:client", "alias:client:topics", "alias:max")

CHANNEL: Final[State] = {
    "clock": s("5", 100_000),
    "sub:s1": s("3", 100_000),
    "epoch": s("e1", 100_000),
    "m:4": s("1:aX", 100_000),
    "m:5": s("2:bbY", 100_000),
    "id:1": s("4", 100_000),
}
NODES: Final[State] = {
    "registry": h(n1="inc1", n2="inc2"),
    "heartbeats": ("zset", {"n1": 123.0, "n2": 456.0}, 0),
    "retired": h(n2="inc2"),
}
ROUTES: Final[State] = {
    "routes": ("hash", {"r/1": "1", "r/2": "2"}, 0),
    "stream": ("stream", [("1-0", {"r": "r/1", "n": "1"}), ("2-0", {"r": "r/2", "n": "2"})], 0),
    "meta": h(incarnation="inc1", generation="7", version="2"),
    "acks": h(n2="7 2"),
}
AUTH: Final[State] = {
    "users": h(alice="- $7$101$c2FsdA==$ZA==", bob="s $7$101$c2FsdA==$ZA=="),
    "acl": ("list", ["allow all publish a/#", "deny all all #", "allow all publish a/#"], 0),
    "count": s("3"),
}
CONSOLE: Final[State] = {
    "user": ("zset", {"a1": 1.0, "a2": 9e15}, 100_000),
    "address": ("zset", {"a1": 1.0}, 100_000),
}
RETAINED: Final[State] = {
    "topics": ("zset", {"a/b": 0.0, "a/c": 0.0, "a/d": 0.0, "b": 0.0}, 0),
    "messages": ("hash", {"a/b": "m1", "a/c": "m2", "a/d": "m3", "b": "m4"}, 0),
    "expiry": ("zset", {"a/c": 1.0, "a/d": 9e15}, 0),
    "shards": ("zset", {"a": 0.0, "b": 0.0}, 0),
    "counts": h(a="3", b="1"),
    "total": s("4"),
}

# Values a script reads and must check before it writes (field-level corruption).
CORRUPT: Final[dict[str, list[State]]] = {
    "client": [
        {"owner": h(node="n1", epoch="x")},
        {"owner": h(node="n1")},
        {"alias:max": h(client="x", server="99999")},
    ],
    "channel": [
        {"clock": s("1.5")},
        {"clock": s("9007199254740992")},
        {"sub:s1": s("x")},
        {"id:1": s("nope")},
        {"m:5": h(a="b")},
    ],
    "nodes": [{"registry": h(n1="")}],
    "routes": [
        {"meta": h(incarnation="inc1", generation="x", version="2")},
        {"meta": h(incarnation="inc1", generation="7", version="x")},
        {"meta": h(incarnation="inc1", generation="7", version="1")},
    ],
    "auth": [{"count": s("x")}, {"count": s("1.5")}, {"count": s("9223372036854775807")}],
    # (an attempt from the future: a server clock set back)
    "console": [{"address": ("zset", {"a0": 9e15, "a1": 9e15}, 0)}],
    "retained": [
        {"total": s("abc")},
        {"counts": h(a="x", b="1")},
        {"counts": h(a="9223372036854775807", b="1")},
    ],
}

# The wrong-type values a key may hold instead of its own.
WRONG_TYPES: Final[list[Value]] = [
    s("abc"),
    h(f="v"),
    ("list", ["x"], 0),
    ("set", ["x"], 0),
    ("zset", {"x": 1.0}, 0),
]


# -- ARGV ---------------------------------------------------------------------------------

NUMERIC_TRAPS: Final = [
    "",
    "0",
    "-0",
    "00",
    "01",
    "+1",
    " 1",
    "1 ",
    "1.5",
    "1e3",
    "1e+30",
    "0x10",
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "Infinity",
    "9007199254740991",
    "9007199254740992",
    "-9007199254740991",
    "-9007199254740992",
    "99999999999999",
    "123456789012345",
    "999999999999999",
    "9999999999999999",
    "99999999999999999999",
    "18446744073709551616",
    "-1",
    "-123456789012345",
    "2147483648",
    "65535",
    "65536",
    "4294967296",
]
WORD_TRAPS: Final = [
    "client",
    "server",
    "open",
    "away",
    "read",
    "delete",
    "PUBLISH",
    "SPUBLISH",
    "SET",
    "FLUSHALL",
    "\x00",
    "%",
    "{",
    "}",
    "{}",
    "/",
    "#",
    "+",
    "a/#",
    "$share/g/a",
    "*",
    "[",
    "(",
    "-",
    "+inf",
    "n1",
    "inc1",
    "e1",
    "5",
]


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


hostile: st.SearchStrategy[bytes] = st.one_of(
    st.sampled_from([_text(v) for v in NUMERIC_TRAPS + WORD_TRAPS]),
    st.integers(-(2**65), 2**65).map(lambda i: str(i).encode()),
    st.floats().map(lambda f: repr(f).encode()),
    st.binary(max_size=24),
    st.text(max_size=8).map(_text),
    st.sampled_from([b"x" * 65535, b"x" * 65536, b"9" * 1000, b"a/" * 3000]),
)


def one(*values: str) -> st.SearchStrategy[bytes]:
    return st.sampled_from([v.encode() for v in values])


def pairs(
    first: st.SearchStrategy[bytes], second: st.SearchStrategy[bytes], most: int = 3
) -> st.SearchStrategy[list[bytes]]:
    return st.lists(st.tuples(first, second), max_size=most).map(
        lambda items: [part for item in items for part in item]
    )


def fixed(*positions: st.SearchStrategy[bytes]) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(*positions).map(list)


def then(
    head: st.SearchStrategy[list[bytes]], tail: st.SearchStrategy[list[bytes]]
) -> st.SearchStrategy[list[bytes]]:
    return st.tuples(head, tail).map(lambda parts: parts[0] + parts[1])


owner = st.sampled_from([[b"n1", b"5"], [b"", b""], [b"n1", b"4"], [b"n2", b"5"]])
filters = one("a/b", "x/+", "#", "c")
options = one("o1", "o9")
ttl = one("100", "60")


@dataclass(frozen=True)
class Spec:
    """One script: the roles of its KEYS, the family state it runs on, plausible ARGV."""

    roles: tuple[str, ...]
    family: str
    argv: st.SearchStrategy[list[bytes]]
    extra_roles: tuple[str, ...] = field(default=())

    @property
    def state(self) -> State:
        return FAMILIES[self.family]


FAMILIES: Final[dict[str, State]] = {
    "client": CLIENT,
    "channel": CHANNEL,
    "nodes": NODES,
    "routes": ROUTES,
    "retained": RETAINED,
    "auth": AUTH,
    "console": CONSOLE,
}

REGISTRY = ("registry", "heartbeats", "retired")
NODE = ("routes", "stream", "meta")
SHARD = ("topics", "messages", "expiry")
SHARDS = ("shards", "counts", "total")
counts = one("0", "1", "2", "3")

SPECS: Final[dict[str, Spec]] = {
    "client_claim": Spec(
        CLIENT_KEYS,
        "client",
        then(
            fixed(
                one("n1", "n2", ""), one("keep", "fresh"), one("", "u1"), one("bound", "shared", "")
            ),
            st.one_of(
                st.just([]),
                then(
                    st.lists(one("open", "away"), max_size=1),
                    pairs(one("expiry", "qos2"), one("1", "")),
                ),
            ),
        ),
    ),
    "client_restore": Spec(("owner",), "client", fixed(one("n1", "n2"), one("5", "0", "x"))),
    "client_subscribe": Spec(("subs", "owner"), "client", then(owner, pairs(filters, options))),
    "client_unsubscribe": Spec(
        ("subs", "owner"), "client", then(owner, st.lists(filters, max_size=3))
    ),
    "client_remove": Spec(CLIENT_KEYS, "client", owner),
    "session_adopt": Spec(
        CLIENT_KEYS,
        "client",
        then(
            st.sampled_from([[b"n1", b"5"], [b"n1", b"4"], [b"n2", b"5"], [b"", b""]]),
            fixed(one("n3", ""), one("4294967295", "0", "1000", "x")),
        ),
    ),
    "session_mark": Spec(
        CLIENT_KEYS,
        "client",
        then(
            then(owner, fixed(one("open", "away"), one("-1", "0", "1000", "60000"))),
            pairs(one("expiry", "qos2", "node"), one("1", "", "x")),
        ),
    ),
    "import_subscriptions": Spec(("subs",), "client", pairs(filters, options)),
    "alias_bind": Spec(
        ALIAS_KEYS, "client", fixed(one("client", "server"), one("1", "2", "3", "11"), one("t/1"))
    ),
    "alias_maximum": Spec(ALIAS_KEYS, "client", fixed(one("client", "server"), one("0", "2"))),
    "alias_remove": Spec(
        ("alias:client", "alias:client:topics", "alias:server", "alias:server:topics", "alias:max"),
        "client",
        st.just([]),
    ),
    "alias_replace": Spec(
        ("owner", *CLIENT_KEYS[2:7]),
        "client",
        then(
            owner,
            st.one_of(
                st.just([b"forget"]),
                then(
                    fixed(one("set"), one("10", "2", "0"), one("5", "1"), one("0", "1", "2")),
                    pairs(one("1", "2", "11"), one("t/1", "s/2", "")),
                ),
            ),
        ),
    ),
    "channel_ack": Spec(("clock", "sub:s1"), "channel", fixed(one("3", "4", "5", "6"), ttl)),
    "channel_add_subscriber": Spec(
        ("clock", "sub:s2", "epoch"), "channel", fixed(ttl, one("", "e1", "e0")), ("sub:s1",)
    ),
    "channel_fetch": Spec(
        ("clock", "sub:s1", "m:", "epoch"),
        "channel",
        fixed(one("1", "2"), ttl, one("2", "5"), one("", "4", "9")),
    ),
    "channel_publish": Spec(
        ("clock", "m:", "id:0", "id:1", "id:2"),
        "channel",
        then(
            fixed(
                ttl,
                st.just(key("NS", "wake").encode()),
                one("0", "100"),
                one("PUBLISH", "SPUBLISH"),
            ),
            fixed(*[st.sampled_from([b"i0", b"i1", b"i2"]), one("c", "")] * 3),
        ),
    ),
    "node_register": Spec(REGISTRY, "nodes", fixed(one("n1", "n2"), one("inc1", "inc2"), ttl)),
    "node_heartbeat": Spec(REGISTRY[:2], "nodes", fixed(one("n1", "n2"), one("inc1", "inc2"), ttl)),
    "node_list": Spec(REGISTRY, "nodes", st.just([])),
    "node_unregister": Spec(REGISTRY, "nodes", fixed(one("n1", "n2"), one("inc1", "", "inc2"))),
    "node_retire": Spec(REGISTRY, "nodes", fixed(one("n1", "n2", "n3"), one("inc1", "inc2"))),
    "route_apply": Spec(NODE, "routes", then(fixed(one("inc1"), one("3")), pairs(filters, counts))),
    "route_changes": Spec(NODE[1:], "routes", fixed(one("7", ""), one("0", "1", "2"), one("5"))),
    "route_claim": Spec(NODE, "routes", then(fixed(one("inc1", "inc2")), pairs(filters, counts))),
    "route_purge": Spec(NODE, "routes", fixed(one("inc1", "", "inc2"))),
    "auth_change": Spec(
        ("users", "acl", "count"),
        "auth",
        st.one_of(
            fixed(one("user_add"), one("alice", "carol"), one("- $7$x", "s $7$y"), one("0", "1")),
            fixed(one("user_password"), one("alice", "zed"), one("$7$z")),
            fixed(one("user_remove"), one("bob", "zed")),
            fixed(one("acl_insert"), one("0", "1", "2", "9"), one("allow all all x")),
            fixed(one("acl_remove"), one("allow all publish a/#", "nope")),
        ),
    ),
    "login_attempt": Spec(
        ("user", "address"),
        "console",
        fixed(one("a3", "a1"), one("1", "2", "3", "10"), one("60000", "1")),
    ),
    "route_ack": Spec(
        ("acks",),
        "routes",
        fixed(one("n2", "n3"), one("7", "8"), one("0", "2", "9"), one("rt:acks"), ttl),
    ),
    "route_snapshot": Spec(NODE, "routes", fixed(one("1", "2", "1000"))),
    "retained_expire": Spec(SHARD, "retained", fixed(one("1", "10"))),
    "retained_locate": Spec(SHARDS[:2], "retained", fixed(one("0", "2", "3", "9"))),
    "retained_range": Spec(SHARD, "retained", fixed(one("0", "2"), one("1", "5"))),
    "retained_release": Spec(SHARDS, "retained", pairs(one("a", "b", "c"), counts)),
    "retained_reserve": Spec(SHARDS, "retained", fixed(one("a", "c", ""), one("0", "4", "9"))),
    "retained_scan": Spec(
        SHARD,
        "retained",
        st.one_of(
            st.just([b"delete", b"a/#", b"a", b"a/", b"", b"10", b"10"]),
            st.just([b"read", b"a/+", b"", b"a/", b"", b"2", b"1"]),
            st.just([b"delete", b"b", b"b", b"", b"", b"1", b"1"]),
        ),
    ),
    "retained_store": Spec(
        SHARD, "retained", fixed(one("a/b", "a/e"), one("m"), one("0", "5000"), one("0", "1"))
    ),
}


@st.composite
def argv_for(draw: st.DrawFn, spec: Spec, ns: str) -> list[bytes]:
    """ARGV for ``spec``: the plausible one, or one with hostile items or arity."""
    plausible = [item.replace(b"NS", ns.encode()) for item in draw(spec.argv)]
    mode = draw(st.sampled_from(["plausible", "mutate", "mutate", "mutate", "arity", "random"]))
    if mode == "plausible":
        return plausible
    args = list(plausible)
    if mode == "random":
        return draw(st.lists(hostile, max_size=9))
    if mode == "arity" or not args:
        for _ in range(draw(st.integers(1, 3))):
            if args and draw(st.booleans()):
                del args[draw(st.integers(0, len(args) - 1))]
            else:
                args.insert(draw(st.integers(0, len(args))), draw(hostile))
        return args
    for _ in range(draw(st.integers(1, min(3, len(args))))):
        args[draw(st.integers(0, len(args) - 1))] = draw(hostile)
    return args


@st.composite
def keys_for(draw: st.DrawFn, spec: Spec, ns: str) -> tuple[list[str], bool]:
    """KEYS for ``spec`` (all in one slot) and whether they are the script's own."""
    own = [key(ns, role) for role in spec.roles]
    if draw(st.integers(0, 3)):
        return own, True
    pool = [
        *own,
        *(key(ns, role) for role in spec.extra_roles),
        key(ns, "other"),
        f"{ns}x{{{TAG}}}:{spec.roles[0]}",
        f"{ns}{{{TAG}}}",
        f"{ns}{{{TAG}}}:m:5",
    ]
    return draw(st.lists(st.sampled_from(pool), max_size=len(own) + 2)), False


@st.composite
def state_for(draw: st.DrawFn, spec: Spec) -> tuple[State, bool]:
    """The state to seed and whether it is the plausible one (or empty)."""
    mode = draw(st.sampled_from(["plausible", "plausible", "empty", "corrupt", "wrong type"]))
    if mode == "empty":
        return {}, True
    state = dict(spec.state)
    if mode == "plausible":
        return state, True
    if mode == "corrupt":
        state.update(draw(st.sampled_from(CORRUPT[spec.family])))
    else:
        for role in draw(st.lists(st.sampled_from(sorted(state)), min_size=1, max_size=2)):
            state[role] = draw(st.sampled_from(WRONG_TYPES))
    return state, False


def seed(pipe: Any, ns: str, state: State) -> None:
    """Queue the commands that write ``state`` under ``ns`` on a pipeline."""
    for role, (kind, content, ttl_ms) in state.items():
        name = key(ns, role)
        if kind == "string":
            pipe.set(name, content)
        elif kind == "hash":
            pipe.hset(name, mapping=content)
        elif kind == "zset":
            pipe.zadd(name, content)
        elif kind == "list":
            pipe.rpush(name, *content)
        elif kind == "set":
            pipe.sadd(name, *content)
        else:
            for entry_id, fields in content:
                pipe.xadd(name, fields, id=entry_id)
        if ttl_ms:
            pipe.pexpire(name, ttl_ms)


# -- snapshots ----------------------------------------------------------------------------

# How each type is read back. Not DUMP: a hash or set big enough for a real hash table is
# dumped in its table order, which incremental rehashing changes on mere reads.
READERS: Final = {
    b"string": lambda pipe, name: pipe.get(name),
    b"hash": lambda pipe, name: pipe.hgetall(name),
    b"zset": lambda pipe, name: pipe.zrange(name, 0, -1, withscores=True),
    b"set": lambda pipe, name: pipe.smembers(name),
    b"list": lambda pipe, name: pipe.lrange(name, 0, -1),
    b"stream": lambda pipe, name: pipe.xrange(name),
}

Snapshot = dict[bytes, tuple[bytes, Any, int]]


async def snapshot_namespace(client: Any, ns: str) -> Snapshot:
    """Every key under ``ns``: all of them are in the slot of :data:`TAG`."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key(ns, "x"))
        return await snapshot(client, await client.keys(f"{ns}*", target_nodes=node))
    return await snapshot(client, await client.keys(f"{ns}*"))


async def snapshot(client: Any, names: list[bytes]) -> Snapshot:
    """Type, contents and PTTL of each key (two pipelined round trips; on a cluster, one per
    node that holds some of the keys)."""
    if not names:
        return {}
    names = sorted(names)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    kinds = await pipe.execute()
    present = [(name, kind) for name, kind in zip(names, kinds, strict=True) if kind != b"none"]
    if not present:
        return {}  # they expired meanwhile
    pipe = client.pipeline(transaction=False)
    for name, kind in present:
        READERS[kind](pipe, name)
        pipe.pttl(name)
    replies = await pipe.execute()
    return {
        name: (kind, replies[2 * i], replies[2 * i + 1])
        for i, (name, kind) in enumerate(present)
        if replies[2 * i + 1] != -2  # it expired meanwhile
    }


#: A key whose TTL was at most this (ms) may expire between two snapshots.
EXPIRING_MS: Final = 3000


def assert_unchanged(before: Snapshot, after: Snapshot, what: str) -> None:
    """Same keys, types and contents; no TTL appeared, vanished or grew. A key about to
    expire may be gone."""
    expired = {name for name in set(before) - set(after) if 0 <= before[name][2] <= EXPIRING_MS}
    changed = (set(before) ^ set(after)) - expired
    assert not changed, (
        f"{what}: keys changed {[(n, before.get(n), after.get(n)) for n in changed]}"
    )
    for name, (kind, contents, ttl) in before.items():
        if name in expired:
            continue
        kind_after, contents_after, ttl_after = after[name]
        assert (kind_after, contents_after) == (kind, contents), (
            f"{what}: {name!r} changed {before[name]} -> {after[name]}"
        )
        assert (ttl_after < 0) == (ttl < 0) and ttl_after <= ttl, f"{what}: TTL of {name!r}"
