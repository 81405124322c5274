"""Short-lived nodes for tools: join the cluster, do one thing, leave gracefully.

``router publish`` and ``router subscribe`` join as a node of their own (a publish must
know the route table, and a subscriber needs an inbox). :func:`ephemeral_node` starts a
node, waits until its route mirror holds the route set of every live node (a node's
``start`` loads the other nodes in the background, and a publish sent before that would
miss them), and stops it on exit: its routes are removed and it is deregistered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from router.api import connect
from router.node import RouterNode
from router.routes import RouteSnapshot

log = logging.getLogger(__name__)

MIRROR_TIMEOUT: Final = 10.0
_POLL: Final = 0.01


def tool_node_id(kind: str = "cli") -> str:
    """``<kind>-<hostname>-<pid>``: a node id of its own for each tool process."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"


def _caught_up(node: RouterNode, snapshot: RouteSnapshot) -> bool:
    position = node.mirror.position(snapshot.node_id)
    if position is None:
        return False
    generation, version = position
    return generation != snapshot.generation or version >= snapshot.version


async def wait_for_mirror(node: RouterNode, timeout: float = MIRROR_TIMEOUT) -> bool:
    """Wait until the node's mirror holds every live node's route set as of now.

    Returns True when it does, False (and logs a warning) when ``timeout`` seconds
    passed first: the mirror then lacks some nodes, which the node keeps loading.
    """
    expected = []
    for info in await node.registry.live_nodes():
        if info.node_id == node.node_id:
            continue
        snapshot = await node.routes.snapshot(info.node_id)
        if snapshot.generation is not None:
            expected.append(snapshot)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        missing = [s.node_id for s in expected if not _caught_up(node, s)]
        if not missing:
            return True
        if loop.time() > deadline:
            log.warning("route mirror still lacks nodes %s after %.1f s", missing, timeout)
            return False
        await asyncio.sleep(_POLL)


@asynccontextmanager
async def ephemeral_node(
    url: str | None, *, node_id: str | None = None, wait_mirror: bool = True, **config: Any
) -> AsyncIterator[RouterNode]:
    """A node that has joined the cluster (with a caught-up mirror unless ``wait_mirror``
    is False: a node that only subscribes needs none); stopped gracefully on exit.

    ``node_id`` defaults to :func:`tool_node_id`; ``config`` takes the fields of
    :class:`NodeConfig` (``prefix``, ``heartbeat_ttl``, ...).
    """
    async with connect(url, node_id=node_id or tool_node_id(), **config) as node:
        if wait_mirror:
            await wait_for_mirror(node)
        yield node
