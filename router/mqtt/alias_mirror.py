"""The topic aliases of a node's MQTT connections, mirrored to Redis for operators
(``router aliases CLIENT`` reads :class:`~router.state.alias_store.RedisAliasTable`).

The tables themselves stay in memory, one pair per connection (MQTT-3.3.2-7: an alias
lives as long as its network connection): ``client``, the inbound one a client binds with
its PUBLISH packets (:class:`~router.mqtt.inbound.InboundLimits`), and ``server``, the
outbound one the node assigns (:class:`~router.mqtt.outgoing.PublishEncoder`). Redis holds
a copy, a little behind:

* **Never on the publish path.** A table that changes calls its ``on_change``, which marks
  its client (a set add, only when a binding changes); every :data:`FLUSH_INTERVAL` the
  mirror writes the tables of the clients marked since, all in one pipeline
  (:meth:`RedisAliasTable.mirror <router.state.alias_store.RedisAliasTable.mirror>`),
  each whole (at most its Topic Alias Maximum bindings per namespace). A client that
  keeps re-mapping its aliases costs one write per interval.
* **Per connection.** A connection that resumed a session (Session Present) marks its
  client at once, so the copy its last connection left is replaced by its own, empty
  tables; a session started anew was cleared by its claim already
  (``lua/client_claim.lua``). When the connection ends its copy is forgotten (once it
  had anything). A session that ends deletes its aliases with the rest of the client
  (``remove_client``).
* **Fenced by the session's claim.** Each write carries the claim this node holds on the
  client's session (:meth:`RouterNode.claim_of
  <router.cluster.node.RouterNode.claim_of>`), and the script refuses it unless the
  claim is the client's owner in Redis now. A takeover on another node makes a newer
  claim, so what the old node writes or forgets after it is refused (counted as
  ``mqtt_alias_writes_fenced``, not retried) and the new connection's aliases stay. The
  claim is the project's fence for every write of a client's state already; a token of
  the connection's own would fence the same, one more key to keep. Two connections of a
  client on one node (one claim) follow each other instead: the old one has ended before
  the new one attaches, and the mirror keeps the newest connection's tables per client
  id, so what the old one's end asked for is the new one's write. A client this node
  holds no claim for when it flushes is skipped (its session ended, or moved: the new
  node writes).
* **Failures stay here.** Redis failing a flush never reaches a connection: it is counted
  (``mqtt_alias_write_failures``, logged) and the clients stay marked, for the next
  interval. A refusal other than the owner's (a key of another type) is counted the
  same, logged, and not retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Protocol

from router.cluster.tasks import stop_task
from router.errors import RouterError, SessionOwnershipError, StateError
from router.state.alias_store import AliasCopy
from router.state.subscriptions import Owner

log = logging.getLogger(__name__)

#: Seconds between two writes of the marked clients' aliases.
FLUSH_INTERVAL: Final = 1.0
#: Clients written in one call of the store, at most (one pipeline each).
FLUSH_BATCH: Final = 256
#: Seconds the last flush of a stopping mirror may take.
STOP_FLUSH: Final = 5.0


class AliasSource(Protocol):
    """One direction's alias table of a connection."""

    on_change: Callable[[], None] | None  # (called when a binding changed; set by the mirror)

    def alias_table(self) -> tuple[int, dict[int, str]]:
        """The table's maximum and a copy of its alias -> topic map."""
        ...


class AliasWriter(Protocol):
    """Where the copies go (a :class:`~router.state.alias_store.RedisAliasTable`)."""

    async def mirror(self, copies: list[AliasCopy]) -> list[int | RouterError]: ...


class AliasMirror:
    """The aliases of one node's MQTT connections, copied to Redis (see the module).

    ``store`` takes the copies (public: a test may stand in front of it), ``claim_of``
    names the claim the node holds on a client's session (None: none), ``caught`` is told
    of a bug in a flush (the node's :meth:`~router.cluster.node.RouterNode.internal_error`)."""

    def __init__(
        self,
        store: AliasWriter,
        claim_of: Callable[[str], Owner | None],
        caught: Callable[[str, BaseException], None],
        interval: float = FLUSH_INTERVAL,
    ) -> None:
        self.store = store
        self._claim_of = claim_of
        self._caught = caught
        self.interval = interval
        self._live: dict[str, tuple[AliasSource, AliasSource]] = {}  # (client id: newest)
        self._marked: set[str] = set()  # clients whose copy is to write (or forget)
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()  # (one flush at a time: copies land in order)
        self.writes = 0  # copies stored or forgotten
        self.failures = 0  # flushes Redis failed, and copies refused but for the owner
        self.fenced = 0  # copies refused: the session has a newer claim

    def opened(
        self, client_id: str, inbound: AliasSource, outbound: AliasSource, resumed: bool
    ) -> None:
        """A connection of ``client_id`` attached with these tables (its newest);
        ``resumed``: it resumed a session, whose last connection's aliases Redis may hold
        (so may an older connection here that has not closed yet: its tables mark no more)."""
        previous = self._live.get(client_id)
        if previous is not None:
            for table in previous:
                table.on_change = None
            resumed = resumed or any(table.alias_table()[1] for table in previous)
        self._live[client_id] = (inbound, outbound)
        inbound.on_change = outbound.on_change = lambda: self._marked.add(client_id)
        if resumed:
            self._marked.add(client_id)

    def closed(self, client_id: str, inbound: AliasSource) -> None:
        """The connection whose inbound table is ``inbound`` ended: its copy is forgotten,
        unless a newer connection of the client holds the tables now."""
        tables = self._live.get(client_id)
        if tables is None or tables[0] is not inbound:
            return
        del self._live[client_id]
        for table in tables:
            table.on_change = None
        if any(table.alias_table()[1] for table in tables):
            self._marked.add(client_id)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="alias-mirror")

    async def stop(self) -> None:
        """Stop flushing, after a last flush (bounded by :data:`STOP_FLUSH`): the
        connections ended first, so their copies are forgotten."""
        await stop_task(self._task)
        self._task = None
        try:
            async with asyncio.timeout(STOP_FLUSH):
                await self.flush()
        except TimeoutError:
            self.failures += 1
            log.warning("the last write of the topic aliases did not end in time")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.flush()
            except Exception as error:  # (a bug: told as one, the next interval goes on)
                self._caught("the topic aliases' mirror", error)

    async def flush(self) -> None:
        """Write the copies of the clients marked so far now, after the flush under way
        (if any) ended; never raises for Redis."""
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        marked = list(self._marked)
        self._marked.clear()
        for start in range(0, len(marked), FLUSH_BATCH):
            copies = []
            for client_id in marked[start : start + FLUSH_BATCH]:
                owner = self._claim_of(client_id)
                if owner is None:
                    continue  # (its session ended here, or moved on)
                tables = self._live.get(client_id)
                copy = None
                if tables is not None:
                    copy = (tables[0].alias_table(), tables[1].alias_table())
                copies.append(AliasCopy(client_id, owner, copy))
            if copies:
                await self._write(copies)

    async def _write(self, copies: list[AliasCopy]) -> None:
        try:
            replies = await self.store.mirror(copies)
        except StateError as error:
            self.failures += 1
            self._marked.update(copy.client_id for copy in copies)  # (the next interval)
            log.warning("could not write the topic aliases of %d clients: %s", len(copies), error)
            return
        for copy, reply in zip(copies, replies, strict=True):
            if isinstance(reply, SessionOwnershipError):
                self.fenced += 1
            elif isinstance(reply, RouterError):
                self.failures += 1
                log.warning("the topic aliases of %s were refused: %s", copy.client_id, reply)
            else:
                self.writes += 1

    def stats(self) -> dict[str, int]:
        return {
            "mqtt_alias_writes": self.writes,
            "mqtt_alias_write_failures": self.failures,
            "mqtt_alias_writes_fenced": self.fenced,
            "mqtt_alias_clients_marked": len(self._marked),
        }
