"""``router node drain``: ask running nodes to drain and leave, and wait until each left.

A request is a drain notice in the node's inbox (:class:`~router.cluster.inbox.Drain`,
as ``router node reload`` reaches a node: wherever it runs, where a signal cannot). The
node drains (:mod:`router.ops.draining`) and tells ``node_drained`` with what it did;
:func:`drain_nodes` reads that event back and waits until the node is no longer alive
in the registry (it left). SIGTERM to the process does the same on one machine.

Only nodes named are asked: draining every node at once would leave the clients nowhere
to go.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Drain
from router.errors import InvalidSettingError
from router.state.event_log import EventLog
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient

POLL: Final = 0.1
"""Seconds between two looks at the event log and the registry."""
NOTICE_EXPIRE: Final = 60.0
"""Seconds a drain notice waits in an inbox for its node."""


@dataclass(frozen=True)
class DrainAnswer:
    """What became of one node: ``ok`` True (it drained and left), None (it did not
    within the wait, or was not alive); ``text`` says what it did, naming it."""

    node_id: str
    ok: bool | None
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node_id, "ok": self.ok, "text": self.text}


async def drain_nodes(
    redis: RedisClient,
    keys: Keys,
    node_ids: Sequence[str],
    *,
    timeout: float = 60.0,
    asked_by: str = "router node drain",
) -> list[DrainAnswer]:
    """Ask each of ``node_ids`` to drain and wait up to ``timeout`` seconds until each
    told ``node_drained`` and left; one answer per node, sorted by id. Raises
    :class:`InvalidSettingError` for no node named, :class:`InvalidIdError` for a name
    that cannot be a node id, and :class:`StateFailureError` when Redis fails."""
    if not node_ids:
        raise InvalidSettingError(
            "name the nodes to drain (draining every node at once "
            "leaves their clients nowhere to go)"
        )
    for node_id in node_ids:
        check_id(node_id, "node id")
    registry = NodeRegistry(redis, keys)
    live = {info.node_id for info in await registry.live_nodes()}
    answers = {
        node: DrainAnswer(node, None, f"node {node} is not alive")
        for node in node_ids
        if node not in live
    }
    asked = sorted(set(node_ids) & live)
    now_s, now_us = await redis.time()
    since_ms = int(now_s) * 1000 + int(now_us) // 1000 - 1
    forwarder = Forwarder(redis, keys, NOTICE_EXPIRE)
    try:
        for node_id in asked:
            await forwarder.notify(node_id, Drain(asked_by))
    finally:
        await forwarder.stop()
    events = EventLog(redis, keys)
    deadline = time.monotonic() + timeout
    told: dict[str, str] = {}
    waiting = set(asked)
    while waiting:
        for event in await events.recent(1_000, since_ms=since_ms, kinds=("node_drained",)):
            if event.node in waiting:
                told[event.node] = event.text
        alive = {info.node_id for info in await registry.live_nodes()}
        for node_id in [n for n in waiting if n in told and n not in alive]:
            waiting.discard(node_id)
            answers[node_id] = DrainAnswer(node_id, True, told[node_id])
        if not waiting or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL)
    for node_id in waiting:
        said = f" (it said: {told[node_id]})" if node_id in told else ""
        answers[node_id] = DrainAnswer(
            node_id, None, f"node {node_id} did not leave within {timeout:g} s{said}"
        )
    return [answers[node] for node in sorted(answers)]
