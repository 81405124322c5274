"""How one node behaves: :class:`NodeConfig`, the fields ``router.connect`` and
``router node run`` accept."""

from __future__ import annotations

from dataclasses import dataclass

from router.cluster.sessions.local_sessions import Overflow
from router.core.acl import Acl
from router.core.hot_topics import DEFAULT_CACHE, CacheSettings
from router.core.sharing import LocalFirstStrategy, ShareStrategy, strategy_by_name
from router.state.retained_store import DEFAULT_RETAINED, RetainedConfig


@dataclass(frozen=True)
class NodeConfig:
    """How one node behaves. Times are seconds."""

    node_id: str
    prefix: str = "rt"
    heartbeat_interval: float = 1.0
    heartbeat_ttl: float = 3.0
    inbox_expire: float = 300.0
    inbox_poll: float = 5.0
    queue_limit: int = 10_000
    queue_bytes: int = 16 << 20  # payload bytes a local client's queue holds (0: no bound)
    overflow: Overflow = "drop_oldest"
    share_strategy: str = "random"
    stream_length: int = 10_000
    acl: Acl | None = None  # registered at client.check_acl of the node's hooks
    retained: RetainedConfig = DEFAULT_RETAINED  # limits of the shared retained store
    traffic_dir: str | None = None  # the traffic log's directory (None: no log)
    traffic_sample: float = 1.0  # the fraction of publishes the traffic log keeps
    match_cache: CacheSettings | None = DEFAULT_CACHE  # hot-topic match caches (None: off)
    max_queued: int = 1_000  # messages a persistent session's Redis queue keeps while away
    max_queued_bytes: int = 16 << 20  # ... and bytes (packed; 0: no bound; one always fits)
    handoff_timeout: float = 5.0  # the longest a resume waits for the previous node's handoff
    handoff_grace: float = 1.0  # a moved session's late copies: queued this long, without a fence
    publish_timeout: float = 10.0  # a publish not done by then raises PublishTimeoutError
    allow_eviction: bool = False  # start on a Redis that may evict keys (logged as an error)
    shared_sessions: bool = False  # any user may resume a client id's session (else its user's)
    events: bool = True  # tell the cluster's events and alarms (router.cluster.events; tools: off)

    def strategy(self) -> ShareStrategy:
        """How this node picks a share group's member (``local``: its own members first)."""
        if self.share_strategy == "local":
            return LocalFirstStrategy(lambda member: member == self.node_id)
        return strategy_by_name(self.share_strategy)
