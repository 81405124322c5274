"""Draining a node before it leaves: its clients go to the other nodes, and its sessions
with them, losing nothing.

``router node run`` drains on SIGTERM or SIGINT, and when ``router node drain`` asks it
(:mod:`router.ops.drain_requests`), unless ``--drain-grace 0``. :func:`drain_node`:

1. tells the cluster (event ``node_draining``) and writes the node's figures at once
   with ``draining`` 1, so the dashboard and ``router nodes`` show it and no draining
   node is named as the server to use;
2. drains the MQTT front end (:mod:`router.mqtt.drain`): the listeners close
   (``/healthz`` answers 503), the connections end ``rate`` a second; an MQTT 5.0 client
   gets 0x9C with the address a live peer advertises (``--mqtt-advertise``), else 0x8B;
3. stays while the clients it ended resume their sessions elsewhere (it hands each on
   itself: a handoff, :mod:`router.cluster.sessions.keeper`), until none moved for
   :data:`LINGER` seconds, and waits for the handoffs under way to finish with their
   grace;
4. tells ``node_drained`` with what it did.

Then the node leaves (:meth:`RouterNode.stop <router.cluster.node.RouterNode.stop>`): the
persistent sessions whose clients did not come back yet stay in Redis, away, with their
queues and routes, and a live peer adopts them at once (the node retires rather than
purging itself), so what is published for them meanwhile is queued, not lost. The whole
drain takes at most ``grace`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from router.cluster.node import RouterNode
from router.errors import StateError
from router.mqtt.drain import DrainReport, DrainSettings, drain
from router.mqtt.server import MqttServer
from router.ops.telemetry import Telemetry
from router.state.node_history import NodeHistoryStore

log = logging.getLogger(__name__)

LINGER: Final = 1.5
"""Seconds without a session moving elsewhere after which a drained node leaves the
sessions still away for a peer to adopt. Until then it hands each one on itself as its
client resumes it on another node (paho and the mosquitto clients retry after 1 s)."""
POLL: Final = 0.05


async def peer_references(node: RouterNode) -> list[str]:
    """The MQTT addresses that live peers not draining advertise, sorted by node id
    (where a draining node sends its MQTT 5.0 clients); [] when Redis fails."""
    store = NodeHistoryStore(node.registry.redis, node.keys)
    try:
        records = await store.live(node.registry)
    except StateError:  # (a drain goes on without references: 0x8B)
        log.warning("node %s: peers' addresses unread", node.node_id, exc_info=True)
        return []
    except Exception as error:  # (a bug: the drain goes on all the same)
        node.internal_error("reading the peers' addresses for a drain", error)
        return []
    return [
        record.telemetry.advertised
        for node_id, record in records.items()
        if node_id != node.node_id
        and record.telemetry is not None
        and record.telemetry.advertised
        and not record.telemetry.draining
    ]


async def drain_node(
    node: RouterNode,
    front: MqttServer,
    settings: DrainSettings,
    telemetry: Telemetry | None = None,
    references: Sequence[str] | None = None,
) -> DrainReport:
    """Drain ``node`` (see the module docstring; ``references`` None: the peers'
    advertised addresses) and return what its front end did."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    held = len(front.open_connections())
    told = f"node {node.node_id} is draining: {held} connections to end"
    node.events.tell("node_draining", node.node_id, told)
    log.info("%s", told)
    front.stop_listening()
    if telemetry is not None:
        try:
            await telemetry.tick()
        except StateError:
            log.warning("node %s: figures not written", node.node_id, exc_info=True)
        except Exception as error:  # (a bug: the drain goes on all the same)
            node.internal_error("the figures of a drain", error)
    if references is None:
        references = await peer_references(node)
    report = await drain(front, settings, references)
    deadline = began + settings.grace
    await _linger(node, deadline)
    settled = await node.moves_done(max(0.0, deadline - loop.time()))
    away = node.stats().get("sessions_away", 0)
    text = (
        f"node {node.node_id} drained in {loop.time() - began:.1f} s: {report.ended} "
        f"connections ended ({report.redirected} sent to a peer), {away} sessions left "
        "for a peer to adopt"
        + ("" if settled else ", some handoffs still under way")
        + (f", {report.unfinished} connections not finished" if report.unfinished else "")
    )
    node.events.tell("node_drained", node.node_id, text)
    log.info("%s", text)
    return report


async def _linger(node: RouterNode, deadline: float) -> None:
    """While sessions are away here and one of them moved to another node within the
    last :data:`LINGER` seconds (the first ones from the drain's last disconnect on),
    until loop time ``deadline``."""
    loop = asyncio.get_running_loop()
    away = node.stats().get("sessions_away", 0)
    moved = loop.time()
    while away and loop.time() < deadline and loop.time() - moved < LINGER:
        await asyncio.sleep(POLL)
        now = node.stats().get("sessions_away", 0)
        if now < away:
            moved = loop.time()
        away = now
