"""Each node's live figures in Redis, so that any node can add up the cluster's.

One hash per node under the node's hash tag, rewritten by the node every interval and
expiring after a few intervals, so that the figures of a node that died vanish on their
own (a node that stops gracefully deletes its hash at once)::

    rt:{n:ID}:figures   hash   field -> ASCII decimal (version: text)   (node)

    clients                MQTT clients connected to the node
    messages_received      PUBLISH packets the node received from clients
    messages_sent          PUBLISH packets the node sent to clients
    subscriptions          subscriptions of the node's local clients
    uptime                 seconds since the node's MQTT front end started
    version                "router 0.2.0"

The hash is written with HSET and PEXPIRE in one MULTI/EXEC (one key, so it runs on Redis
Cluster too): a node that dies between the two never leaves a hash without an expiry.
Readers look only at live nodes (:class:`~router.state.node_registry.NodeRegistry`), so a
figure of a dead node never counts, even before its hash expires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from redis.typing import EncodableT, FieldT

from router.errors import CorruptStateError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.reads import read_each
from router.state.scripts import RedisClient

MIN_TTL: Final = 0.001  # seconds; PEXPIRE takes whole milliseconds, at least one

_COUNTS: Final = ("clients", "messages_received", "messages_sent", "subscriptions", "uptime")


@dataclass(frozen=True)
class NodeFigures:
    """One node's figures at one moment (counts are non-negative integers)."""

    clients: int = 0
    messages_received: int = 0
    messages_sent: int = 0
    subscriptions: int = 0
    uptime: int = 0  # seconds
    version: str = ""

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"figure {name} must be a non-negative int, not {value!r}")
        if not isinstance(self.version, str):
            raise TypeError(f"figure version must be a str, not {self.version!r}")

    def as_hash(self) -> dict[FieldT, EncodableT]:
        """The stored form: field name -> text."""
        return {field.name: str(getattr(self, field.name)) for field in fields(self)}

    @classmethod
    def from_hash(cls, stored: Mapping[Any, Any]) -> NodeFigures:
        """The figures of a stored hash (bytes or str fields and values). A missing field
        is 0 (or ""), an unknown one is ignored, so nodes of neighbouring versions can read
        each other's; a count that is not a decimal raises :class:`CorruptStateError`."""
        text = {_text(name): _text(value) for name, value in stored.items()}
        counts: dict[str, int] = {}
        for name in _COUNTS:
            raw = text.get(name, "0")
            if not raw.isascii() or not raw.isdigit():
                raise CorruptStateError(f"a stored node figure {name} is not a count: {raw!r}")
            counts[name] = int(raw)
        return cls(**counts, version=text.get("version", ""))


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored node figure is not UTF-8 text: {value!r}") from None


class NodeFigureStore:
    """Writes a node's figures, reads those of many nodes (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys if keys is not None else Keys()

    async def write(self, node_id: str, figures: NodeFigures, ttl: float) -> None:
        """Replace the node's figures; they expire ``ttl`` seconds from now (at least 1 ms).

        Raises :class:`InvalidIdError` for a bad node id, ``ValueError`` for a bad ttl."""
        if not isinstance(ttl, int | float) or ttl < MIN_TTL:
            raise ValueError(f"ttl must be at least {MIN_TTL} seconds, not {ttl!r}")
        key = self.keys.node_figures(node_id)
        with translating:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=figures.as_hash())
                pipe.pexpire(key, max(1, round(ttl * 1000)))
                await pipe.execute()

    async def delete(self, node_id: str) -> bool:
        """Remove the node's figures (a node leaving); True if there were any."""
        key = self.keys.node_figures(node_id)
        with translating:
            return int(await self.redis.delete(key)) == 1

    async def read(self, node_ids: Iterable[str]) -> dict[str, NodeFigures]:
        """node id -> figures, for each of ``node_ids`` that has figures stored (see
        :func:`read_each`); :class:`CorruptStateError` for a bad hash."""
        wanted = sorted({check_id(node_id, "node id") for node_id in node_ids})
        stored = await read_each(
            self.redis, "HGETALL", [self.keys.node_figures(node_id) for node_id in wanted]
        )
        return {
            node_id: NodeFigures.from_hash(found)
            for node_id, found in zip(wanted, stored, strict=True)
            if found
        }

    async def live(self, registry: NodeRegistry) -> dict[str, NodeFigures]:
        """The figures of every live node that has written some, by node id (sorted)."""
        return await self.read(node.node_id for node in await registry.live_nodes())
