"""Route fences: how a node asks its peers to settle the subscriptions they have read.

A SUBSCRIBE applies on its own node to every PUBLISH that node reads after it
(:class:`~router.cluster.visibility.ArrivalOrder`); another node learns of it once the
route change is in Redis and read from the writer's stream. A node that wants every
subscription its peers had *read* by now to apply to a publish (a new connection's
first PUBLISH: :mod:`router.cluster.route_fence`) asks them over pub/sub, and each
answers once the changes it had open then are applied and durable::

    rt:route-fences   channel   ["ask", ASKER, NUMBER]              a node asks
                                ["settled", PEER, ASKER, NUMBER]    a peer answers

Messages are JSON arrays (node ids may hold any character). Pub/sub is fire-and-forget:
an ask or an answer may be lost, so the asker bounds its wait.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from router.state.failures import translating
from router.state.keys import Keys
from router.state.reads import command
from router.state.scripts import RedisClient


class FenceAsked(NamedTuple):
    """``asker`` asks every peer to settle; ``number`` grows with each of its asks."""

    asker: str
    number: int


class FenceSettled(NamedTuple):
    """``peer`` settled what it had read when it heard ``asker``'s ask ``number``."""

    peer: str
    asker: str
    number: int


def parse_fence(data: bytes) -> FenceAsked | FenceSettled | None:
    """The ask or answer a channel message carries; None for anything else."""
    try:
        message = json.loads(data)
    except ValueError:
        return None
    if not isinstance(message, list) or not message:
        return None
    kind, *fields = message
    if kind == "ask" and _shaped(fields, 1):
        return FenceAsked(fields[0], fields[1])
    if kind == "settled" and _shaped(fields, 2):
        return FenceSettled(fields[0], fields[1], fields[2])
    return None


def _shaped(fields: list[object], ids: int) -> bool:
    """``ids`` non-empty str fields, then one int."""
    if len(fields) != ids + 1 or type(fields[-1]) is not int:
        return False
    return all(type(field) is str and field for field in fields[:ids])


class RouteFences:
    """Sends the asks and answers of one namespace (raises :class:`StateFailureError`
    when Redis fails a PUBLISH)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self._redis = redis
        self.channel = keys.route_fences()

    async def ask(self, asker: str, number: int) -> None:
        """Ask every peer to settle (:class:`FenceAsked`)."""
        await self._publish(["ask", asker, number])

    async def settled(self, peer: str, asker: str, number: int) -> None:
        """Answer ``asker``'s ask ``number`` (:class:`FenceSettled`)."""
        await self._publish(["settled", peer, asker, number])

    async def _publish(self, message: list[object]) -> None:
        with translating:
            await command(self._redis, "PUBLISH", self.channel, json.dumps(message))
