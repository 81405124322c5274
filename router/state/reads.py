"""Reading one key each of many entities (session owners, session descriptions, node
figures): one pipeline on a standalone Redis, one command per key on a Redis Cluster; a
single command sent with the others of its loop turn (:func:`command`); and the few
plain reads the operator views make (a key with its TTL, the server's clock).

Why not a cluster pipeline: redis-py's (8.x) non-transactional ``ClusterPipeline``
answers a connection error by closing the whole client, and the slot map it then reads
again comes with a command table asked of its *default node*. While that node is a
master that died (the first one the client met, say) and no replica has taken over
yet, that read fails, and with it every command of every task sharing the client, for
the whole ``cluster-node-timeout``: the node's heartbeats and publishes to the healthy
masters included (redis/redis-py#3130). A plain command that meets a dead master moves
it to the end of the client's node list instead, so the rest of the cluster stays
usable. Reads go out :data:`CONCURRENCY` at a time.

What each reply is: as the command's. The errors: as :mod:`router.state.failures` tells
redis-py's (:class:`~router.errors.StateUnavailableError` for a key on a master that
cannot be reached; the reads of the other keys still complete).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError
from redis.typing import EncodableT

from router.state.failures import REDIS_ERRORS, state_error, translating
from router.state.scripts import RedisClient, turn_batch

CONCURRENCY: Final = 16
"""Single-key reads in flight at once on a cluster (each takes a pooled connection)."""


async def read_each(
    redis: RedisClient, command: str, keys: Sequence[str], *args: EncodableT
) -> list[Any]:
    """The reply of ``command key *args`` for each of ``keys``, in order.

    Raises the first error met (after every read has ended) when some key could not be
    read."""
    if not keys:
        return []
    if not isinstance(redis, RedisCluster):
        return await _pipelined(redis, [(command, key, *args) for key in keys])
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(key: str) -> Any:
        async with gate:
            return await redis.execute_command(command, key, *args)

    results = await asyncio.gather(*(one(key) for key in keys), return_exceptions=True)
    _raise_first(results)
    return results


async def command(redis: RedisClient, *args: EncodableT) -> Any:
    """The reply of ``redis.execute_command(*args)`` as redis-py gives it (its response
    callback applied); an error reply or a failure raised as the router's error. On a
    standalone server it goes with the other calls of this loop turn in one pipeline
    (:class:`~router.state.turn_batch.TurnBatch`): a node's single commands under a storm
    of CONNECTs cost a share of a round trip each, not a pooled connection and a timer
    of their own."""
    with translating:
        if (
            isinstance(redis, RedisCluster)
            or redis.connection is not None
            or (batch := turn_batch(redis)) is None
        ):
            return await redis.execute_command(*args)
        reply = await batch.call(args)
        if isinstance(reply, ResponseError):
            raise reply
    callback = redis.response_callbacks.get(str(args[0]))
    return reply if callback is None else callback(reply)


async def _pipelined(redis: Redis, calls: Sequence[tuple[EncodableT, ...]]) -> list[Any]:
    """The reply of each command of ``calls`` (``(name, *args)``) on a standalone
    server, as redis-py's pipeline gives it (its response callback applied), in one
    round trip; raises the first error reply or failure, as the router's error, once
    every reply is read (the other commands ran). Sent through the client's
    :class:`~router.state.turn_batch.TurnBatch`, which packs in C and skips redis-py's
    pipeline machinery (the node's reads of many sessions at once: an adoption, a storm
    of resumes)."""
    batch = turn_batch(redis)
    try:
        replies = None if batch is None else await batch.commands_now(calls)
        if replies is None:
            pipe = redis.pipeline(transaction=False)
            for call in calls:
                pipe.execute_command(*call)
            return list(await pipe.execute())
    except REDIS_ERRORS as exc:
        raise state_error(exc) from exc
    callbacks = redis.response_callbacks
    results: list[Any] = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, REDIS_ERRORS):
            raise state_error(reply) from reply
        callback = callbacks.get(str(call[0]))
        results.append(reply if callback is None else callback(reply))
    return results


async def read_with_ttl(redis: RedisClient, key: str) -> tuple[Any, float | None] | None:
    """The value of the string ``key`` and its TTL in seconds (None: no expiry); None when
    there is no such key (or it expired between the two reads)."""
    with translating:
        value = await redis.get(key)
        if value is None:
            return None
        pttl = int(await redis.pttl(key))
    if pttl == -2:
        return None
    return value, (None if pttl < 0 else pttl / 1000)


async def server_ms(redis: RedisClient) -> int:
    """The Redis server's clock in milliseconds (a cluster answers from one of its nodes)."""
    with translating:
        reply: Any = await redis.time()
    if isinstance(reply, dict):  # a cluster may answer per node
        reply = next(iter(reply.values()))
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def _raise_first(results: list[Any]) -> None:
    """Raise the first error among ``results`` (redis-py's as the router's), if any."""
    for result in results:
        if isinstance(result, REDIS_ERRORS):
            raise state_error(result) from result
        if isinstance(result, BaseException):
            raise result


async def commands_each(
    redis: RedisClient, groups: Sequence[Sequence[tuple[EncodableT, ...]]]
) -> list[list[Any]]:
    """The replies of each group of commands (each ``(name, key, *args)``; the commands
    of one group name one key and run in order), in order: one pipeline on a standalone
    Redis; on a cluster one command at a time per group, :data:`CONCURRENCY` groups at
    once (see the module docstring). Raises as :func:`read_each` does."""
    if not groups:
        return []
    if not isinstance(redis, RedisCluster):
        replies = iter(await _pipelined(redis, [call for group in groups for call in group]))
        return [[next(replies) for _ in group] for group in groups]
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(group: Sequence[tuple[EncodableT, ...]]) -> list[Any]:
        async with gate:
            return [await redis.execute_command(*call) for call in group]

    results = await asyncio.gather(*(one(group) for group in groups), return_exceptions=True)
    _raise_first(results)
    return [result for result in results if not isinstance(result, BaseException)]
