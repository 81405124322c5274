"""Route acks: how far each reader's route mirror holds a writer node's route set.

A node acknowledges a subscription (SUBACK) only once every other live node's route
mirror holds the route change it made (:mod:`router.cluster.visibility`). Readers say so
here after they applied a writer's changes::

    rt:{n:WRITER}:route-acks   hash      reader node id -> "GENERATION VERSION"
    rt:{n:WRITER}:route-acks   channel   "GENERATION VERSION READER" per ack (pub/sub)

The hash is what a waiting writer reads when an ack on the channel may have been lost
(pub/sub is fire-and-forget); the channel is what makes the wait short. The hash expires
:data:`ACK_TTL_MS` after its last ack: a writer whose routes did not change for that long
waits for nothing, and the acks of a node that is gone do not stay.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from router.errors import InvalidIdError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.scripts import RedisClient, Scripts

ACK_TTL_MS: Final = 3_600_000


class RouteAck(NamedTuple):
    """A reader holds the writer's route set of ``generation`` up to ``version``."""

    reader: str
    generation: str
    version: int


def parse_ack(data: bytes | str) -> RouteAck | None:
    """The ack a channel message carries; None for a message that is not one."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    parts = text.split(" ", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[0] or not parts[2]:
        return None
    return RouteAck(parts[2], parts[0], int(parts[1]))


class RouteAcks:
    """Writes and reads the route acks of the nodes of one namespace."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._scripts = Scripts(redis)

    def channel(self, writer: str) -> str:
        """The channel where acks of ``writer``'s route set are announced."""
        return self.keys.route_acks_channel(writer)

    async def ack(self, writer: str, reader: str, generation: str, version: int) -> None:
        """Record and announce that ``reader`` holds ``writer``'s routes of ``generation``
        up to ``version`` (one script). Raises :class:`InvalidIdError` for a bad id or
        version, :class:`StateFailureError` if Redis cannot take it."""
        check_id(reader, "node id")
        check_id(generation, "generation")
        if " " in generation:
            raise InvalidIdError("a generation holds no space")
        if type(version) is not int or version < 0:
            raise InvalidIdError(f"a route version is an int >= 0, not {version!r}")
        await self._scripts.run(
            "route_ack",
            [self.keys.node_route_acks(writer)],
            [reader, generation, version, self.channel(writer), ACK_TTL_MS],
        )

    async def read(self, writer: str) -> dict[str, tuple[str, int]]:
        """Every reader's last ack of ``writer``'s routes: reader -> (generation, version)
        (unreadable entries are left out)."""
        with translating:
            raw = await self.redis.hgetall(self.keys.node_route_acks(writer))
        found: dict[str, tuple[str, int]] = {}
        for reader, value in raw.items():
            name = reader.decode("utf-8", "replace") if isinstance(reader, bytes) else reader
            parsed = parse_ack(f"{_text(value)} {name}")
            if parsed is not None:
                found[name] = (parsed.generation, parsed.version)
        return found


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
