"""Short-lived nodes for tools: join the cluster, do one thing, leave gracefully.

``router publish`` and ``router subscribe`` join as a node of their own (a publish must
know the route table, and a subscriber needs an inbox). :func:`ephemeral_node` starts a
node, waits until its route mirror holds the route set of every live node (a node's
``start`` loads the other nodes in the background, and a publish sent before that would
miss them), and stops it on exit: its routes are removed and it is deregistered.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

from router.api import connect
from router.cluster.node import RouterNode

log = logging.getLogger(__name__)

MIRROR_TIMEOUT: Final = 10.0
_POLL: Final = 0.01


def tool_node_id(kind: str = "cli") -> str:
    """``<kind>-<hostname>-<pid>``: a node id of its own for each tool process."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"


@asynccontextmanager
async def ephemeral_node(
    url: str | None, *, node_id: str | None = None, **config: Any
) -> AsyncIterator[RouterNode]:
    """A node that has joined the cluster (its mirror holds every live node's routes:
    ``RouterNode.start`` loads them); stopped gracefully on exit.

    ``node_id`` defaults to :func:`tool_node_id`; ``config`` takes the fields of
    :class:`NodeConfig` (``prefix``, ``heartbeat_ttl``, ...). A tool's node tells no
    events (a ``router publish`` is not a node an operator runs) unless ``events=True``.
    """
    config.setdefault("events", False)
    async with connect(url, node_id=node_id or tool_node_id(), **config) as node:
        yield node
