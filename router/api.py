"""The embedding API: ``async with router.connect(url, node_id=...) as node``."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from router.connection import open_redis
from router.node import NodeConfig, RouterNode

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_VARIABLE = "ROUTER_REDIS_URL"


def default_node_id() -> str:
    """``hostname-pid``: unique per process on one machine."""
    return f"{socket.gethostname()}-{os.getpid()}"


@asynccontextmanager
async def connect(
    url: str | None = None, *, node_id: str | None = None, **config: Any
) -> AsyncIterator[RouterNode]:
    """Start a router node on Redis at ``url`` and stop it (gracefully) on exit.

    ``url`` defaults to ``$ROUTER_REDIS_URL`` or the local Redis; a Redis Cluster is
    recognised by itself. ``config`` takes the fields of :class:`NodeConfig`.
    """
    redis = await open_redis(url or os.environ.get(URL_VARIABLE, DEFAULT_URL))
    try:
        node = RouterNode(redis, NodeConfig(node_id or default_node_id(), **config))
        async with node:
            yield node
    finally:
        await redis.aclose()
