"""Script calls and single commands made in one event-loop turn, sent to a standalone
server together; and the pipelines of plain commands that the router's batched reads
send (:meth:`TurnBatch.commands_now`).

A node under a storm of CONNECTs makes several script calls and commands per client
(claim, session mark, subscriptions, retained messages, its queue), hundreds of clients
at once. Sent one by one,
each call takes a pooled connection, a write and a wake-up of its own, and the node's
one core spends more on that than on the calls. :class:`TurnBatch` gathers the calls
made during one turn of the event loop and sends them in one pipeline at the end of it
(as ioredis's auto-pipelining does): the same commands, in the order they were made,
one round trip for all of them.

**Writes a failover cannot lose** (:meth:`TurnBatch.require_replicas`, a node's
``--redis-replicas N``): every pipeline of script calls and single commands then ends
with ``WAIT N TIMEOUT`` on its connection, and unless N replicas acknowledged every
write of the pipeline within the timeout, each caller gets
redis-py's ``TimeoutError`` (the state layer makes it a
:class:`~router.errors.StateUnavailableError`, which says that a write may or may not
have happened) instead of its reply. An MQTT publish then gets no acknowledgement, and
its client sends it again. The batched reads (:meth:`TurnBatch.commands_now`) wait for
no replica.

What a caller sees does not change: its reply, or its error reply as an exception
object (the caller raises it), or the Redis error that failed the pipeline (no
connection, say; some calls of it may have run, as a single call that fails may have).
A caller cancelled before the pipeline is sent takes its call out of it; one cancelled
later does not stop the others (nor its own: it was sent). A cluster pipelines no
EVALSHA: :class:`~router.state.scripts.Scripts` calls a cluster one by one. Single
commands reach it through :func:`router.state.reads.command`, which applies redis-py's
response callbacks to what the batch returns.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, Final

from hiredis import pack_command
from redis.asyncio import Redis
from redis.exceptions import DataError, ResponseError, TimeoutError as RedisTimeoutError

#: Calls sent in one pipeline at most; a turn that made more sends several.
BATCH_LIMIT: Final = 512

Command = tuple[Any, ...]
"""A command as redis-py's ``execute_command`` takes it: ``(name, *args)``."""
_Call = tuple[Command, bytes, "asyncio.Future[Any]"]


class TurnBatch:
    """Script calls and single commands to one standalone client, gathered per loop turn
    (see the module)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._waiting: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()
        self.pipelines = 0  # pipelines sent (for tests and figures)
        self._wait: bytes | None = None  # (WAIT, packed, when replicas are required)
        self._replicas = 0
        self._wait_ms = 0
        self.replicas_behind = 0  # pipelines whose writes too few replicas acknowledged

    def require_replicas(self, replicas: int, timeout: float) -> None:
        """From now on, every pipeline of writes waits for ``replicas`` replicas to
        acknowledge it, at most ``timeout`` seconds (see the module; 0 replicas: none)."""
        self._replicas = replicas
        self._wait_ms = max(1, round(timeout * 1000))
        self._wait = pack(("WAIT", replicas, self._wait_ms)) if replicas else None

    async def evalsha(self, sha: str, keys: list[str], args: list[Any]) -> Any:
        """The reply of EVALSHA ``sha`` (an error reply as the exception object, not
        raised); raises the Redis error that failed the pipeline."""
        return await self.call(("EVALSHA", sha, len(keys), *keys, *args))

    async def call(self, command: Command) -> Any:
        """The reply of ``command``, sent with the others of this turn, as the server
        gave it (no response callback of redis-py applied; an error reply as the
        exception object, not raised); raises :class:`DataError` at once for an argument
        Redis cannot take (nothing sent), or the Redis error that failed the pipeline."""
        packed = pack(command)
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send_waiting)
        self._waiting.append((command, packed, reply))
        return await reply

    async def evalsha_now(self, sha: str, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """The reply of EVALSHA ``sha`` for each (KEYS, ARGV) of ``calls``, sent now in one
        pipeline (a batch its caller made: it waits for no turn); error replies as
        exception objects; raises the Redis error that failed the pipeline."""
        commands = [("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls]
        self.pipelines += 1
        return await self._pipeline(commands, [pack(command) for command in commands], True)

    def _send_waiting(self) -> None:
        calls = [call for call in self._waiting if not call[2].done()]
        self._waiting = []
        for start in range(0, len(calls), BATCH_LIMIT):
            task = asyncio.get_running_loop().create_task(
                self._send(calls[start : start + BATCH_LIMIT])
            )
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, calls: list[_Call]) -> None:
        self.pipelines += 1
        try:
            replies = await self._pipeline([c[0] for c in calls], [c[1] for c in calls], True)
        except Exception as error:  # (each caller raises it)
            for *_call, reply in calls:
                if not reply.done():
                    reply.set_exception(error)
            return
        except BaseException:  # (cancelled: the loop is closing)
            for *_call, reply in calls:
                reply.cancel()
            raise
        for (*_call, reply), value in zip(calls, replies, strict=True):
            if not reply.done():
                reply.set_result(value)

    async def commands_now(self, calls: Sequence[Command]) -> list[Any] | None:
        """The reply of each command of ``calls``, sent now in one pipeline, as the server
        gave it (no response callback of redis-py applied); error replies as exception
        objects; raises the Redis error that failed the pipeline. None for a client
        without a pool of its own connections (a single-connection client): the caller
        pipelines through redis-py then."""
        if self._redis.connection is not None:
            return None
        self.pipelines += 1
        return await self._exchange([pack(call) for call in calls])

    async def _pipeline(
        self, commands: list[Command], packed: list[bytes], writes: bool
    ) -> list[Any]:
        """Every command's reply (an error reply as its exception object), over one pooled
        connection (:meth:`_exchange`, ``packed`` the commands packed), ``writes`` waited
        for on the replicas required. redis-py's own pipeline serves a client without a
        pool of its own connections (a single-connection client)."""
        redis = self._redis
        wait = self._wait if writes else None
        if redis.connection is not None:
            async with redis.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                if wait is not None:
                    pipe.execute_command("WAIT", self._replicas, self._wait_ms)
                replies = list(await pipe.execute(raise_on_error=False))
        else:
            replies = await self._exchange(packed if wait is None else [*packed, wait])
        if wait is not None:
            acknowledged = replies.pop()
            if not isinstance(acknowledged, int) or acknowledged < self._replicas:
                self.replicas_behind += 1
                raise RedisTimeoutError(  # (they ran on the master: a failover may lose them)
                    f"{acknowledged} of the {self._replicas} replicas required acknowledged "
                    "the writes in time"
                )
        return replies

    async def _exchange(self, packed: list[bytes]) -> list[Any]:
        """The reply of each of the ``packed`` commands (an error reply as its exception
        object), over one pooled connection: the commands packed by hiredis in C
        (redis-py's asyncio client packs in Python, a tenth of a node's time under a
        storm of CONNECTs), written at once, the replies read in order, all of them
        within the connection's socket timeout (one timer, where redis-py arms one per
        reply: a third of the time an adoption spends reading replies). A connection
        that fails midway is dropped, never reused out of step."""
        pool = self._redis.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.send_packed_command(packed)
            replies: list[Any] = []
            try:
                async with asyncio.timeout(connection.socket_timeout):
                    for _ in packed:
                        try:
                            replies.append(await connection.read_response(timeout=math.inf))
                        except ResponseError as error:
                            replies.append(error)
            except TimeoutError:
                late = f"Timeout reading {len(packed)} replies from Redis"
                raise RedisTimeoutError(late) from None
        except BaseException:
            await connection.disconnect()
            raise
        finally:
            await pool.release(connection)
        return replies


def pack_evalsha(sha: str, keys: list[str], args: list[Any]) -> bytes:
    """EVALSHA in the wire format, each argument encoded as redis-py encodes it."""
    return pack(("EVALSHA", sha, len(keys), *keys, *args))


def pack(command: Sequence[Any]) -> bytes:
    """A command (``(name, *args)``) in the wire format, each argument encoded as
    redis-py encodes it."""
    try:
        packed: bytes = pack_command(tuple(command))  # (str, bytes, int, float: as they are)
    except TypeError:
        try:
            packed = pack_command(tuple(map(_wire, command)))
        except TypeError as error:
            raise DataError(str(error)) from None
    return packed


def _wire(value: Any) -> Any:
    kind = type(value)
    if kind is str or kind is bytes or kind is int:
        return value
    if kind is float:
        return repr(value)  # (as redis-py writes a float)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise DataError(f"cannot send {value!r} to Redis: a str, bytes, int or float")
