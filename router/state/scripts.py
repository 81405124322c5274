"""Lua scripts from ``lua/``: loaded once, called through redis-py ``Script`` objects.

Each script is registered once per Redis client and called with EVALSHA; it is loaded
again when the server answers NOSCRIPT (after SCRIPT FLUSH or a restart, or on a replica
just promoted). Batches travel inside one call as ARGV items. On a standalone server the
calls made in one turn of the event loop share one pipeline (:mod:`router.state.turn_batch`);
a cluster refuses pipelined EVALSHA, so there each call goes on its own.

On a Redis Cluster a script is loaded on each master that answers, one by one (see
:meth:`Scripts._load`): redis-py sends SCRIPT LOAD to all masters as one command, which
fails as a whole while any master is down, so a master that died would stop the first
use of every script, on every master, until its failover ended.

Scripts report refusals as error replies whose first word is a code
(``redis.error_reply("ROUTER_INVALID <message>")``); :meth:`Scripts.run` turns each code
into the matching :class:`RouterError` subclass, and any other Redis error into a
:class:`~router.errors.StateFailureError` (:mod:`router.state.failures`), so callers catch
the router's errors only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Final
from weakref import WeakKeyDictionary

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import ScriptTextT

from router.errors import (
    CorruptStateError,
    InvalidAliasError,
    InvalidIdError,
    MalformedAckHandleError,
    NodeNotRegisteredError,
    RouterError,
    RouteSetMissingError,
    ScriptError,
    SessionOwnershipError,
    SessionUserError,
    StaleIncarnationError,
    StateFailureError,
    SubscriptionNotFoundError,
)
from router.state.failures import REDIS_ERRORS, state_error
from router.state.turn_batch import TurnBatch

RedisClient = Redis | RedisCluster


def _bad_alias(message: str) -> RouterError:
    """``ROUTER_BAD_ALIAS <alias> <reason>`` -> InvalidAliasError with the alias on it."""
    alias, _, reason = message.partition(" ")
    return InvalidAliasError(int(alias) if alias.isdigit() else alias, reason)


# The error codes scripts may reply with, and the exception (factory) each becomes.
ERROR_CODES: Final[dict[str, Callable[[str], RouterError]]] = {
    "ROUTER_INVALID": ScriptError,
    "ROUTER_BAD_ID": InvalidIdError,
    "ROUTER_CORRUPT": CorruptStateError,
    "ROUTER_NOT_OWNER": SessionOwnershipError,
    "ROUTER_OTHER_USER": lambda message: SessionUserError(reason=message),
    "ROUTER_NO_SUBSCRIPTION": SubscriptionNotFoundError,
    "ROUTER_BAD_HANDLE": MalformedAckHandleError,
    "ROUTER_BAD_ALIAS": _bad_alias,
    "ROUTER_STALE_INCARNATION": StaleIncarnationError,
    "ROUTER_NOT_REGISTERED": NodeNotRegisteredError,
    "ROUTER_NO_ROUTES": RouteSetMissingError,
}


#: A script line ``--! include NAME`` stands for the text of ``lua/lib/NAME.lua``.
INCLUDE: Final = "--! include "


@cache
def script_source(name: str) -> str:
    """The text of ``lua/{name}.lua`` as shipped in the package, its includes expanded.

    Scripts share helpers through ``lua/lib/``: each ``--! include NAME`` line (a Lua
    comment, so a script file stays valid Lua) becomes the text of ``lua/lib/NAME.lua``.
    Redis still gets one self-contained script body; libraries include nothing themselves.
    """
    lua = resources.files("router.lua")
    lines = lua.joinpath(f"{name}.lua").read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(
        lua.joinpath("lib", f"{line.removeprefix(INCLUDE).strip()}.lua").read_text(encoding="utf-8")
        if line.startswith(INCLUDE)
        else line
        for line in lines
    )


def translate_error(exc: ResponseError) -> RouterError | None:
    """The domain error for a script's coded error reply, or None for any other error."""
    message = str(exc)
    code, _, rest = message.partition(" ")
    kind = ERROR_CODES.get(code)
    if kind is None:
        return None
    return kind(rest or code)


_errors: WeakKeyDictionary[RedisClient, int] = WeakKeyDictionary()


def redis_errors(redis: RedisClient) -> int:
    """How many script calls through ``redis`` failed with a Redis error (no connection,
    a timeout, OOM, READONLY, a redirect that failed...), not a script's refusal. Nearly
    all of the router's Redis traffic goes through its scripts."""
    return _errors.get(redis, 0)


#: The scripts registered with each client, shared by every :class:`Scripts` of it (a
#: session queue or a channel makes one each: the script is loaded once per client, not
#: once per object), and the loads under way.
_registered: WeakKeyDictionary[RedisClient, dict[str, AsyncScript]] = WeakKeyDictionary()
_loading: WeakKeyDictionary[RedisClient, dict[str, asyncio.Future[AsyncScript]]] = (
    WeakKeyDictionary()
)
#: The calls of one loop turn to each standalone client, sent together (see turn_batch.py).
_batches: WeakKeyDictionary[Redis, TurnBatch] = WeakKeyDictionary()


def turn_batch(redis: Redis) -> TurnBatch | None:
    """The :class:`TurnBatch` of a standalone client (None for a stand-in of a test that
    cannot be weakly referenced: its calls go one by one)."""
    try:
        batch = _batches.get(redis)
        if batch is None:
            batch = _batches[redis] = TurnBatch(redis)
    except TypeError:
        return None
    return batch


class Scripts:
    """The router's scripts, registered with one Redis (or Redis Cluster) client."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        #: Whether the client is a Redis Cluster's (a slow check: made once).
        self.cluster = isinstance(redis, RedisCluster)
        self._batch = turn_batch(redis) if isinstance(redis, Redis) else None
        try:
            self._scripts = _registered.setdefault(redis, {})
        except TypeError:  # (no weak reference to it: a stand-in client of a test)
            self._scripts = {}

    async def _script(self, name: str) -> AsyncScript:
        script = self._scripts.get(name)
        if script is not None:
            return script
        loading = _loading.setdefault(self._redis, {}) if self._redis is not None else {}
        pending = loading.get(name)
        if pending is not None:  # (another caller loads it: one SCRIPT LOAD)
            return await asyncio.shield(pending)
        pending = loading[name] = asyncio.get_running_loop().create_future()
        try:
            source = script_source(name)
            # Loaded up front: saves the NOSCRIPT round trip of the first call, and
            # fakeredis's TCP server (the embedded fallback) drops the connection on
            # SCRIPT LOAD right after a NOSCRIPT reply. It is loaded again on NOSCRIPT
            # later (after SCRIPT FLUSH or a restart).
            await self._load(source)
            script = self._scripts[name] = self._redis.register_script(source)
            pending.set_result(script)
            return script
        except asyncio.CancelledError:
            pending.cancel()
            raise
        except BaseException as error:
            pending.set_exception(error)
            pending.exception()  # (retrieved: no waiter may be left to retrieve it)
            raise
        finally:
            del loading[name]

    async def _load(self, source: ScriptTextT) -> None:
        """SCRIPT LOAD ``source``: on a cluster, on each master on its own; raises the
        first error only when no master took it (a master that is down fails the
        scripts of its own slots, and only those)."""
        redis = self._redis
        if not isinstance(redis, RedisCluster):
            await redis.script_load(source)
            return
        masters = redis.get_primaries()
        replies = await asyncio.gather(
            *(redis.execute_command("SCRIPT LOAD", source, target_nodes=node) for node in masters),
            return_exceptions=True,
        )
        errors = [reply for reply in replies if isinstance(reply, BaseException)]
        if errors and len(errors) == len(replies):
            raise errors[0]

    async def _call(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA; on NOSCRIPT, load the script (see :meth:`_load`) and call it again."""
        redis = self._redis
        if not self.cluster:
            batch = self._batch
            if batch is None:
                return await script(keys=keys, args=args)
            reply = await batch.evalsha(script.sha, keys, args)
            if isinstance(reply, NoScriptError):  # (flushed meanwhile: loaded again)
                await self._load(script.script)
                reply = await batch.evalsha(script.sha, keys, args)
            if isinstance(reply, Exception):
                raise reply
            return reply
        try:
            return await redis.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._load(script.script)
            return await redis.evalsha(script.sha, len(keys), *keys, *args)

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` with KEYS and ARGV; coded error replies raise domain errors,
        any other Redis error a :class:`StateFailureError` (see router.state.failures)."""
        try:
            script = self._scripts.get(name) or await self._script(name)
            return await self._call(script, keys, args)
        except ResponseError as exc:
            domain = translate_error(exc)
            if domain is None:
                _errors[self._redis] = _errors.get(self._redis, 0) + 1
                raise state_error(exc) from exc
            raise domain from None
        except REDIS_ERRORS as exc:
            _errors[self._redis] = _errors.get(self._redis, 0) + 1
            raise state_error(exc) from exc

    async def run_many(
        self, name: str, calls: Sequence[tuple[list[str], list[Any]]]
    ) -> list[Any | RouterError]:
        """Run script ``name`` once per (KEYS, ARGV) of ``calls``: on a standalone server
        in one pipeline (one round trip for all), on a cluster concurrently (a cluster
        pipelines no EVALSHA). Returns each call's reply, or the domain error its coded
        refusal stands for (the others still ran); raises a :class:`StateFailureError`
        (no connection, say) as :meth:`run` does, after which some calls may have run."""
        if not calls:
            return []
        redis = self._redis
        if self.cluster:
            return list(await asyncio.gather(*(self._run_one(name, k, a) for k, a in calls)))
        try:
            script = self._scripts.get(name) or await self._script(name)
            if self._batch is not None:
                replies = await self._batch.evalsha_now(script.sha, list(calls))
            else:
                async with redis.pipeline(transaction=False) as pipe:
                    for keys, args in calls:
                        pipe.evalsha(script.sha, len(keys), *keys, *args)
                    replies = await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            _errors[redis] = _errors.get(redis, 0) + 1
            raise state_error(exc) from exc
        results: list[Any | RouterError] = []
        for (keys, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, NoScriptError):  # (flushed meanwhile: loaded again)
                results.append(await self._run_one(name, keys, args))
            elif isinstance(reply, ResponseError):
                domain = translate_error(reply)
                if domain is None:
                    _errors[redis] = _errors.get(redis, 0) + 1
                    raise state_error(reply) from reply
                results.append(domain)
            else:
                results.append(reply)
        return results

    async def _run_one(self, name: str, keys: list[str], args: list[Any]) -> Any | RouterError:
        """:meth:`run`, returning a refusal instead of raising it (a failure of Redis is
        raised)."""
        try:
            return await self.run(name, keys, args)
        except StateFailureError:
            raise
        except RouterError as error:
            return error
