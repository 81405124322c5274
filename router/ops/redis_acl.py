"""The Redis ACL user a router deployment needs, and nothing more.

:func:`acl_setuser` makes the ``ACL SETUSER`` line for a key prefix: the commands the
router sends (its own, redis-py's connection set-up, the cluster client's discovery, and
every command its Lua scripts call, which Redis checks against the caller's ACL too),
keys ``~PREFIX:*`` (every key, hash-tagged ones included, starts with the prefix) and
pub/sub channels ``&PREFIX:*`` (route hints and the inboxes' wake-ups). ``router acl``
prints it; the tests run nodes and the CLI as that user and check that ``ACL LOG``
stays empty, on a standalone server and a cluster.
"""

from __future__ import annotations

from typing import Final

from router.state.keys import Keys

ROUTER_COMMANDS: Final = (
    # connection set-up (redis-py) and health
    "hello",
    "ping",
    "info",
    "time",
    "client|setname",
    # the cluster client's view of the cluster
    "cluster|slots",
    "command",
    # scripts, and what the router sends itself
    "evalsha",
    "script|load",
    "multi",
    "exec",
    "discard",
    "get",
    "set",
    "mget",
    "copy",
    "del",
    "unlink",
    "exists",
    "expire",
    "pexpire",
    "persist",
    "pttl",
    "type",
    "incr",
    "incrby",
    "scan",
    "hget",
    "hset",
    "hsetnx",
    "hscan",
    "hdel",
    "hexists",
    "hgetall",
    "hmget",
    "hincrby",
    "hlen",
    "hstrlen",
    "lpush",
    "ltrim",
    "lrange",
    "zadd",
    "zrem",
    "zscore",
    "zcard",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
    "zrangebylex",
    "xadd",
    "xrange",
    "xrevrange",
    "publish",
    "spublish",
    "subscribe",
    "ssubscribe",
    "unsubscribe",
    "sunsubscribe",
)
"""Every command a node, the CLI and the Lua scripts run."""


SETINFO_SINCE: Final = (7, 2)
"""The Redis version that has ``CLIENT SETINFO`` (redis-py sends it on every connection)."""


def acl_setuser(
    prefix: str,
    user: str = "router",
    password: str = "CHANGE-ME",
    redis_version: tuple[int, int] = SETINFO_SINCE,
) -> str:
    """The ``ACL SETUSER`` command (one line, for ``redis-cli``) for ``prefix``'s keys on
    a Redis of ``redis_version`` (older than 7.2: without ``CLIENT SETINFO``, which such a
    server does not know, so that redis-py's call fails as unknown, not as denied)."""
    Keys(prefix)  # an unusable prefix fails here
    known = (
        (*ROUTER_COMMANDS, "client|setinfo") if redis_version >= SETINFO_SINCE else ROUTER_COMMANDS
    )
    commands = " ".join(f"+{command}" for command in known)
    return (
        f"ACL SETUSER {user} on >{password} resetkeys ~{prefix}:* resetchannels "
        f"&{prefix}:* -@all {commands}"
    )
