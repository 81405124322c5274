"""The node registry: which router nodes exist, which are alive, and cleaning up dead ones.

Three keys under the ``{nodes}`` hash tag (one slot), changed by scripts that read Redis
server time (``TIME`` inside Lua), never a node's wall clock::

    rt:{nodes}:registry     hash  node id -> incarnation id of its current process
    rt:{nodes}:heartbeats   zset  node id scored by heartbeat expiry (server ms)
    rt:{nodes}:retired      hash  node id -> the incarnation that retired (left gracefully)

A node process registers with a fresh *incarnation* id (``register`` returns the previous
incarnation, whose routes it should drop by claiming its route set), then heartbeats more
often than its TTL. A node is alive while its expiry is later than the server's time.

Purging a dead node deletes its route set (one script on the node's own tag) and then
removes it from the registry (one script on ``{nodes}``); both steps are idempotent and
guarded by the incarnation, so a purge interrupted halfway is finished by the next one
and never touches a newer incarnation. A node that finds itself unregistered
(:class:`NodeNotRegisteredError` from ``heartbeat``) must register again with a *new*
incarnation and claim its route set again.

A node that leaves gracefully while it holds persistent sessions *retires* instead of
purging itself (:meth:`NodeRegistry.retire`): its heartbeat expires at once and it is
marked retired, its route set stays. Every node then sees it not alive, and a live node
adopts its sessions and purges it, as it would a dead node's, without taking it for dead
(no ``node_down``). A new incarnation registering under the id clears the mark, and so
does the purge.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from router.core.peer_verdicts import is_alive
from router.errors import CorruptStateError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.routes import PurgeResult, RouteStore
from router.state.scripts import RedisClient, Scripts

DEFAULT_TTL: Final = 10.0


class NodeInfo(NamedTuple):
    """A registered node as seen at server time ``now_ms``; ``retired``: its incarnation
    left gracefully (:meth:`NodeRegistry.retire`) and awaits its purge."""

    node_id: str
    incarnation: str
    expires_ms: int
    now_ms: int
    retired: bool = False

    @property
    def alive(self) -> bool:
        """True while the node's heartbeat has not expired (by Redis server time) and it
        did not retire (:func:`router.core.peer_verdicts.is_alive`)."""
        return is_alive(self)


class Registration(NamedTuple):
    """The result of :meth:`NodeRegistry.register`."""

    previous_incarnation: str | None
    expires_ms: int


def _text(value: Any, what: str) -> str:
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise CorruptStateError(f"a stored {what} is not UTF-8 text: {value!r}") from None


def _millis(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        raise CorruptStateError(f"a heartbeat expiry is not a number: {value!r}") from None


class NodeRegistry:
    """Registration, heartbeats, liveness and purging of router nodes."""

    def __init__(
        self,
        redis: RedisClient,
        keys: Keys | None = None,
        *,
        ttl: float = DEFAULT_TTL,
        routes: RouteStore | None = None,
    ) -> None:
        """``ttl`` is the heartbeat time to live in seconds (at least 1 ms)."""
        if not isinstance(ttl, int | float) or ttl < 0.001:
            raise ValueError(f"ttl must be at least 0.001 seconds, not {ttl!r}")
        self.redis = redis
        self.keys = keys if keys is not None else Keys()
        self.ttl = ttl
        self.routes = routes if routes is not None else RouteStore(redis, self.keys)
        self._scripts = Scripts(redis)

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    def _registry_keys(self, *, retired: bool = True) -> list[str]:
        names = [self.keys.registry(), self.keys.registry_heartbeats()]
        return [*names, self.keys.registry_retired()] if retired else names

    async def register(self, node_id: str, incarnation: str) -> Registration:
        """Register the node's current process and start its heartbeat.

        Returns the incarnation registered before (None if none): if it differs, that
        process's routes are stale; claim the route set to drop them.
        """
        check_id(node_id, "node id")
        check_id(incarnation, "incarnation")
        previous, expires = await self._scripts.run(
            "node_register", self._registry_keys(), [node_id, incarnation, self._ttl_ms]
        )
        return Registration(
            None if previous is None else _text(previous, "incarnation"), _millis(expires)
        )

    async def heartbeat(self, node_id: str, incarnation: str) -> int:
        """Extend the node's heartbeat by the TTL; return the new expiry (server ms).

        Raises :class:`NodeNotRegisteredError` if the node is not registered (it was
        purged: register again with a new incarnation) and :class:`StaleIncarnationError`
        if another incarnation registered since.
        """
        check_id(node_id, "node id")
        check_id(incarnation, "incarnation")
        expires = await self._scripts.run(
            "node_heartbeat",
            self._registry_keys(retired=False),
            [node_id, incarnation, self._ttl_ms],
        )
        return _millis(expires)

    async def retire(self, node_id: str, incarnation: str) -> int:
        """The node leaves gracefully and leaves its sessions to a live node: its
        heartbeat expires now (every node sees it not alive at once) and it is marked
        retired (not dead: see the module docstring); its route set stays. Returns the
        server time of the retirement (ms). Raises :class:`NodeNotRegisteredError` if
        the node is not registered and :class:`StaleIncarnationError` if another
        incarnation registered since; nothing changes then."""
        check_id(node_id, "node id")
        check_id(incarnation, "incarnation")
        now = await self._scripts.run("node_retire", self._registry_keys(), [node_id, incarnation])
        return _millis(now)

    async def nodes(self) -> list[NodeInfo]:
        """Every registered node, alive or not, sorted by id, judged at one server time."""
        now, *flat = await self._scripts.run("node_list", self._registry_keys(), [])
        now_ms = _millis(now)
        found = [
            NodeInfo(
                _text(flat[i], "node id"),
                _text(flat[i + 1], "incarnation"),
                _millis(flat[i + 2]),
                now_ms,
                retired=flat[i + 3] == 1,
            )
            for i in range(0, len(flat), 4)
        ]
        return sorted(found)

    async def live_nodes(self) -> list[NodeInfo]:
        """The registered nodes whose heartbeat has not expired."""
        return [node for node in await self.nodes() if node.alive]

    async def dead_nodes(self) -> list[NodeInfo]:
        """The registered nodes whose heartbeat has expired (those that retired too)."""
        return [node for node in await self.nodes() if not node.alive]

    async def unregister(self, node_id: str, incarnation: str | None = None) -> bool:
        """Remove the node from the registry (only ``incarnation``, if given); True if removed."""
        check_id(node_id, "node id")
        if incarnation is not None:
            check_id(incarnation, "incarnation")
        removed = await self._scripts.run(
            "node_unregister", self._registry_keys(), [node_id, incarnation or ""]
        )
        return int(removed) == 1

    async def lease_adoption(self, dead: str, holder: str, seconds: float) -> bool:
        """Take (or, held by ``holder`` already, extend) the lease on adopting ``dead``'s
        sessions for ``seconds``; False when another node holds it. The holder adopts,
        then purges the node; should it die first, its lease runs out and another live
        node takes it over (adoption is idempotent: each session is adopted once)."""
        check_id(dead, "node id")
        check_id(holder, "node id")
        key, ms = self.keys.node_adoption(dead), max(1, int(seconds * 1000))
        with translating:
            if await self.redis.set(key, holder, nx=True, px=ms):
                return True
            current = await self.redis.get(key)
            if current is None or _text(current, "adoption lease holder") != holder:
                return False
            return bool(await self.redis.pexpire(key, ms))

    async def end_adoption(self, dead: str) -> None:
        """Drop the lease on adopting ``dead``'s sessions (the node was purged)."""
        key = self.keys.node_adoption(check_id(dead, "node id"))
        with translating:
            await self.redis.delete(key)

    async def purge(self, node_id: str, incarnation: str | None = None) -> PurgeResult:
        """Delete the node's route set, stream and meta, then unregister it (idempotent).

        With ``incarnation``, a newer incarnation's route set and registration are left
        alone. Returns what the route purge did.
        """
        result = await self.routes.purge(node_id, incarnation)
        await self.unregister(node_id, incarnation)
        return result

    async def purge_dead(self) -> list[PurgeResult]:
        """Purge every node whose heartbeat has expired (or that retired); return what
        each purge did."""
        return [
            await self.purge(node.node_id, node.incarnation) for node in await self.dead_nodes()
        ]
