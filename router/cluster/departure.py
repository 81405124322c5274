"""How a node leaves the cluster at a graceful stop: purged, or retired for its sessions.

A node that holds no persistent session purges itself: its route set goes, it leaves the
registry, and a hint tells the others, which drop its routes. One that holds persistent
sessions (connected or away) *retires* instead (:meth:`NodeRegistry.retire
<router.state.node_registry.NodeRegistry.retire>`): first its route set is made the
routes of those sessions alone (those of its clean sessions, which ended, go; so do
changes its route writer had not written), guarded by its incarnation; then it is not
alive from that moment, marked retired; a hint and a departure
(:meth:`MirrorSync.depart <router.cluster.mirror_sync.MirrorSync.depart>`) tell the
others. Copies for its sessions go on reaching its inbox, and one live node adopts them
at once (:mod:`router.cluster.sessions.adoption`), reading that inbox, then purges it.
"""

from __future__ import annotations

import logging

from router.cluster.mirror_sync import MirrorSync
from router.core.topics import TopicFilter
from router.errors import (
    NodeNotRegisteredError,
    StaleIncarnationError,
    StateError,
    StateFailureError,
)
from router.state.node_registry import NodeRegistry

log = logging.getLogger(__name__)


async def leave(
    registry: NodeRegistry,
    sync: MirrorSync,
    node_id: str,
    incarnation: str,
    kept: dict[TopicFilter, int] | None,
) -> None:
    """Purge the node's ``incarnation`` (``kept`` None: no persistent session), or retire
    it keeping the routes ``kept`` (its persistent sessions'), as the module docstring
    says. A node purged meanwhile, or whose id another process took, is left alone (a
    warning). Raises what Redis raised at a purge; a retired node's hint and departure
    that fail are logged (its peers find it not alive at their next round)."""
    if kept is None:
        await registry.purge(node_id, incarnation)
        await sync.announce()
        return
    try:
        await _keep_routes(registry, node_id, incarnation, kept)
        await registry.retire(node_id, incarnation)
    except (NodeNotRegisteredError, StaleIncarnationError) as error:
        log.warning("node %s not retired (purged, or its id taken): %s", node_id, error)
        return
    try:
        await sync.announce()
        await sync.depart()
    except StateFailureError as error:
        log.warning("node %s retired, its departure not told: %s", node_id, error)


async def _keep_routes(
    registry: NodeRegistry, node_id: str, incarnation: str, wanted: dict[TopicFilter, int]
) -> None:
    """Make the node's route set in Redis ``wanted``, guarded by ``incarnation``
    (:class:`StaleIncarnationError`). Should Redis refuse it otherwise, the route set
    stays as it is (a warning): copies for the routes of ended sessions then reach the
    node's inbox until its purge, where nobody reads them."""
    routes = registry.routes
    try:
        stored = (await routes.snapshot(node_id)).routes
        changes = [
            (route, wanted.get(route, 0))
            for route in stored.keys() | wanted.keys()
            if stored.get(route, 0) != wanted.get(route, 0)
        ]
        await routes.apply(node_id, incarnation, changes)
    except StaleIncarnationError:
        raise
    except StateError as error:
        log.warning("routes of node %s left as they are: %s", node_id, error)
