"""``router node reload``: ask running nodes to reread their files, and wait for each answer.

A request is a reload notice in each node's inbox (:class:`~router.cluster.inbox.Reload`,
the way ``router clients kick`` reaches a node): it reaches a node wherever it runs, in
a container or on another machine, where a signal cannot, and it waits in the inbox
while the node is busy. Each node answers with its reload's event
(``config_reloaded`` or ``config_reload_failed``, :mod:`router.cluster.reloads`), which
:func:`reload_nodes` reads back from the event log. SIGHUP to the process does the same
on one machine (:func:`router.ops.node_process.serve_forever`).

Asked for no node by name, it asks every live node that tells events (its last life
event is ``node_up``: the nodes an operator runs, not the short-lived nodes of tools
such as ``router subscribe``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from router.cluster.forwarding import Forwarder
from router.cluster.inbox import Reload
from router.state.event_log import EventLog
from router.state.keys import Keys, check_id
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient

ANSWERS: Final = ("config_reloaded", "config_reload_failed")
POLL: Final = 0.1
"""Seconds between two reads of the event log while answers are awaited."""
NOTICE_EXPIRE: Final = 60.0
"""Seconds a reload notice waits in an inbox for its node."""


@dataclass(frozen=True)
class ReloadAnswer:
    """What one node said: ``ok`` True (reloaded), False (kept its configuration), None
    (no answer within the wait, or not alive); ``text`` its words (its event's text),
    which name it."""

    node_id: str
    ok: bool | None
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node_id, "ok": self.ok, "text": self.text}


async def reload_nodes(
    redis: RedisClient,
    keys: Keys,
    node_ids: Sequence[str] = (),
    *,
    timeout: float = 10.0,
    asked_by: str = "router node reload",
) -> list[ReloadAnswer]:
    """Ask ``node_ids`` (none: every live node that tells events) to reload and wait up
    to ``timeout`` seconds for their answers; one answer per node, sorted by node id.
    Raises :class:`InvalidIdError` for a name that cannot be a node id, and
    :class:`StateFailureError` when Redis fails."""
    for node_id in node_ids:
        check_id(node_id, "node id")
    live = {info.node_id for info in await NodeRegistry(redis, keys).live_nodes()}
    events = EventLog(redis, keys)
    if node_ids:
        targets = set(node_ids)
    else:
        lives = await events.lives()
        targets = {node for node in live if node in lives and lives[node].kind == "node_up"}
    answers = {
        node: ReloadAnswer(node, None, f"node {node} is not alive")
        for node in targets
        if node not in live
    }
    asked = sorted(targets & live)
    now_s, now_us = await redis.time()
    since_ms = int(now_s) * 1000 + int(now_us) // 1000 - 1
    forwarder = Forwarder(redis, keys, NOTICE_EXPIRE)
    try:
        for node_id in asked:
            await forwarder.notify(node_id, Reload(asked_by))
    finally:
        await forwarder.stop()
    deadline = time.monotonic() + timeout
    waiting = set(asked)
    while waiting:
        for event in reversed(await events.recent(1_000, since_ms=since_ms, kinds=ANSWERS)):
            if event.node in waiting:  # (oldest first: a node's first answer since the ask)
                waiting.discard(event.node)
                answers[event.node] = ReloadAnswer(
                    event.node, event.kind == "config_reloaded", event.text
                )
        if not waiting or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL)
    for node_id in waiting:
        answers[node_id] = ReloadAnswer(
            node_id, None, f"node {node_id} did not answer within {timeout:g} s"
        )
    return [answers[node] for node in sorted(answers)]
