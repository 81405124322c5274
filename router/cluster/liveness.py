"""A node's heartbeat, sent only while the node can do its job.

Every ``interval`` seconds :class:`Liveness` renews the node's registration (its
heartbeat) and starts an audit of the claims of its local sessions, in the background
and one at a time: a heartbeat never waits for an audit (an audit that reads a claim on
a Redis Cluster master that just died waits out the failover, and peers would purge a
node whose heartbeat waited with it). It withholds the heartbeat while
the node's :class:`~router.cluster.supervisor.Supervisor` reports a task *down* (failing
for longer than its grace): a node that cannot read its inbox must not let peers forward
to it. Peers then purge it once its heartbeat expires, as they would a dead node; when
the task recovers, the heartbeat finds the node unregistered and ``rejoin`` registers it
again as a new incarnation. Withholding starts and ends with one log line each, and
:meth:`Liveness.health` says why. A node whose heartbeats fail for longer than the TTL
(cut off from Redis: the others purge it) tells its :meth:`~Liveness.on_cut_off`
listeners, so that its MQTT clients are disconnected with a reason, and rejoins once a
heartbeat reaches Redis again.

A stall of Redis itself (paused, swapping, a slow disk under ``appendfsync always``)
stops every node's heartbeat at once, and expiry is judged on Redis server time: when
Redis answers again, every node looks dead to every other. An outage shorter than the
TTL does it too: another node's last beat may have landed up to an interval before it
began, and its next one lands up to an interval after it ended. So a node purges others
(and drops them from its route mirror) only while it is :meth:`~Liveness.steady`: its own
heartbeats have landed for a TTL and an interval without missing one (none failed, none
came more than two intervals after the one before), which gives the others time to beat
again after a stall. A node that really died is still purged: the live ones stay steady.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from router.cluster.supervisor import Supervisor
from router.cluster.tasks import stop_task
from router.errors import NodeNotRegisteredError, StaleIncarnationError, StateError
from router.state.connection import URGENT
from router.state.node_registry import NodeRegistry

log = logging.getLogger(__name__)


class Liveness:
    """The heartbeat loop of one node (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        registry: NodeRegistry,
        supervisor: Supervisor,
        interval: float,
        ttl: float,
        *,
        incarnation: Callable[[], str],
        rejoin: Callable[[], Awaitable[None]],
        audit: Callable[[], Awaitable[None]],
        taken_over: asyncio.Event,
    ) -> None:
        self._node_id = node_id
        self._registry = registry
        self._supervisor = supervisor
        self._interval = interval
        self._ttl = ttl
        self._last_beat: float | None = None
        self._steady_since: float | None = None
        self._missed = False  # a heartbeat failed since the last one that landed
        self._incarnation = incarnation
        self._rejoin = rejoin
        self._audit = audit
        self._taken_over = taken_over
        self.withheld = False
        self.cut_off = False  # no heartbeat landed for longer than the TTL
        self.beats_withheld = 0
        self.beats_failed = 0
        self._cut_off_listeners: list[Callable[[], None]] = []
        self._auditing: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Beat until another process takes the node id (then set ``taken_over``). Its
        Redis calls skip the node's pool turns (:data:`~router.state.connection.URGENT`)."""
        URGENT.set(True)
        try:
            while True:
                await asyncio.sleep(self._interval)
                if self._withhold():
                    continue
                try:
                    await self._registry.heartbeat(self._node_id, self._incarnation())
                    self._landed()
                except NodeNotRegisteredError:
                    await self._rejoin()
                except StaleIncarnationError:
                    log.error("node %s was taken over by another process; stopping", self._node_id)
                    self._taken_over.set()
                    return
                except StateError:  # (Redis unreachable: the next beat tries again)
                    log.warning("heartbeat of node %s failed", self._node_id, exc_info=True)
                    self._beat_failed()
                except Exception as error:  # (a bug: the beat did not land either)
                    self._supervisor.caught("heartbeat", error)
                    self._beat_failed()
                if self._auditing is None or self._auditing.done():
                    self._auditing = asyncio.create_task(
                        self._audit_once(), name=f"audit:{self._node_id}"
                    )
        finally:
            await stop_task(self._auditing)

    async def _audit_once(self) -> None:
        try:
            await self._audit()
        except StateError:
            log.warning("session claims of node %s unchecked", self._node_id, exc_info=True)
        except Exception as error:
            self._supervisor.caught("session claims audit", error)

    def _beat_failed(self) -> None:
        self.beats_failed += 1
        self._missed = True
        self._check_cut_off()

    def on_cut_off(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the node finds itself cut off from Redis (the MQTT
        server disconnects its clients then, rather than leave them stalled)."""
        self._cut_off_listeners.append(listener)

    def forget_cut_off(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (a server that closed)."""
        if listener in self._cut_off_listeners:
            self._cut_off_listeners.remove(listener)

    def _check_cut_off(self) -> None:
        last = self._last_beat
        if self.cut_off or last is None or time.monotonic() - last <= self._ttl:
            return
        self.cut_off = True
        log.error(
            "node %s has not reached Redis for longer than its TTL: the others purge it; "
            "its clients are disconnected",
            self._node_id,
        )
        for listener in list(self._cut_off_listeners):
            listener()

    def _landed(self) -> None:
        if self.cut_off:
            self.cut_off = False
            log.warning("node %s reaches Redis again", self._node_id)
        now = time.monotonic()
        if self._missed or self._last_beat is None or now - self._last_beat > 2 * self._interval:
            self._steady_since = now  # (the first beat, or after a gap: others may lag)
        self._missed = False
        self._last_beat = now

    def steady(self) -> bool:
        """True when this node may judge others dead (see the module docstring)."""
        if self._missed or self._steady_since is None or self._last_beat is None:
            return False
        now = time.monotonic()
        return (
            now - self._last_beat <= self._ttl
            and now - self._steady_since >= self._ttl + self._interval
        )

    def _withhold(self) -> bool:
        down = self._supervisor.down()
        if down and not self.withheld:
            log.error(
                "node %s stops claiming liveness: %s",
                self._node_id,
                "; ".join(f"{name} failing ({error})" for name, error in sorted(down.items())),
            )
        elif self.withheld and not down:
            log.warning("node %s claims liveness again", self._node_id)
        self.withheld = bool(down)
        self.beats_withheld += self.withheld
        return self.withheld

    def health(self) -> dict[str, Any]:
        """``ok`` while the node claims liveness, and the tasks failing now."""
        ok = not self.withheld and not self.cut_off
        return {"ok": ok, "failing": self._supervisor.failing()}
