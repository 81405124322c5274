"""The embedding API: ``async with router.connect(url, node_id=...) as node``."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from router.cluster.config import NodeConfig
from router.cluster.node import RouterNode
from router.cluster.policy import load_acl
from router.core.acl import Acl, Permission
from router.errors import InvalidSettingError
from router.state.connection import DEFAULT_POOL_SIZE, open_redis, require_replicas

DEFAULT_URL = "redis://127.0.0.1:6379/0"
URL_VARIABLE = "ROUTER_REDIS_URL"
REDIS_TIMEOUT = 5.0
"""Seconds a Redis connect or reply may take by default (``connect(redis_timeout=...)``)."""


def default_node_id() -> str:
    """``hostname-pid``: unique per process on one machine."""
    return f"{socket.gethostname()}-{os.getpid()}"


@asynccontextmanager
async def connect(
    url: str | None = None,
    *,
    node_id: str | None = None,
    acl: Acl | str | Path | None = None,
    acl_default: str | Permission | None = None,
    redis_timeout: float = REDIS_TIMEOUT,
    redis_pool_size: int = DEFAULT_POOL_SIZE,
    redis_replicas: int = 0,
    **config: Any,
) -> AsyncIterator[RouterNode]:
    """Start a router node on Redis at ``url`` and stop it (gracefully) on exit.

    ``url`` defaults to ``$ROUTER_REDIS_URL`` or the local Redis; a Redis Cluster is
    recognised by itself, and a ``redis+sentinel://`` URL names a master's sentinels.
    ``acl`` is an :class:`Acl` or an ACL file's path and ``acl_default``
    (``"allow"``/``"deny"``, default deny) what no rule matches; a bad file raises
    :class:`AclRuleError` before anything connects. ``config`` takes the other fields of
    :class:`NodeConfig`. ``redis_timeout`` bounds each Redis connect and
    reply in seconds: a Redis that stops answering fails calls with a timeout instead
    of blocking them (``publish_timeout`` in ``config`` bounds a whole publish).
    ``redis_pool_size`` caps the node's Redis connections (to each master of a cluster):
    when all are busy a call waits its turn (within ``redis_timeout``) instead of failing.
    ``redis_replicas`` (standalone or Sentinel): every write waits for that many replicas
    to acknowledge it, for at most half of ``redis_timeout``, and fails otherwise (a
    publish then gets no acknowledgement: :mod:`router.state.turn_batch`), so that a
    failover keeps every write the node acknowledged; a Redis Cluster raises
    :class:`InvalidSettingError`.
    """
    checked_acl = load_acl(acl, acl_default)
    if not redis_timeout > 0:
        raise InvalidSettingError(f"redis_timeout must be > 0, not {redis_timeout!r}")
    redis = await open_redis(
        url or os.environ.get(URL_VARIABLE, DEFAULT_URL),
        socket_timeout=redis_timeout,
        socket_connect_timeout=redis_timeout,
        pool_size=redis_pool_size,
    )
    try:
        if redis_replicas:
            require_replicas(redis, redis_replicas, redis_timeout / 2)
        node = RouterNode(
            redis, NodeConfig(node_id or default_node_id(), acl=checked_acl, **config)
        )
        async with node:
            yield node
    finally:
        await redis.aclose()
