"""Whether a router node's heartbeats stay on time while a bench loads it.

A node renews its heartbeat every ``heartbeat_interval`` seconds: the script writes the
node's expiry (Redis server time + TTL, in ms) as its score in the registry's heartbeat
set. Two renewals' scores therefore differ by the time between them, on Redis's clock,
whatever the watcher's own delays. :class:`HeartbeatWatch` reads the score (with
``TIME``) every :data:`POLL` seconds in a thread of its own and reports the renewals it
saw, the longest gap between two, and whether the heartbeat ever expired (a score below
Redis's time: peers would judge the node dead).

On time means what the node's peers need (:mod:`router.cluster.liveness`): no gap longer
than two intervals, and never expired.
"""

from __future__ import annotations

import itertools
import threading
from types import TracebackType
from typing import Any, Final

import redis

from router.state.keys import Keys

POLL: Final = 0.05
"""Seconds between two reads of the heartbeat (well under any interval a node takes)."""


class HeartbeatWatch:
    """Watches node ``node_id`` under ``prefix`` on ``url`` while in its ``with`` block;
    :meth:`figures` then says what it saw."""

    def __init__(self, url: str, prefix: str, node_id: str, interval: float) -> None:
        self._client = redis.Redis.from_url(url)
        self._key = Keys(prefix).registry_heartbeats()
        self._node_id = node_id
        self._interval_ms = interval * 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="heartbeat-watch")
        self._scores: list[float] = []
        self._expired = False
        self._errors = 0

    def __enter__(self) -> HeartbeatWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _watch(self) -> None:
        while not self._stop.wait(POLL):
            try:
                pipe = self._client.pipeline(transaction=False)
                pipe.zscore(self._key, self._node_id)
                pipe.time()
                score, (seconds, micros) = pipe.execute()
            except redis.RedisError:
                self._errors += 1
                continue
            if score is None or score < seconds * 1000 + micros // 1000:
                self._expired = True
            elif not self._scores or score != self._scores[-1]:
                self._scores.append(score)

    def figures(self) -> dict[str, Any]:
        """``heartbeats`` (renewals seen), ``max_gap_ms`` (the longest between two, on
        Redis time; None with fewer than two), ``interval_ms``, ``expired`` and
        ``on_time`` (no gap over two intervals, never expired, every read answered)."""
        gaps = [b - a for a, b in itertools.pairwise(self._scores)]
        longest = max(gaps) if gaps else None
        return {
            "heartbeats": len(self._scores),
            "max_gap_ms": None if longest is None else round(longest),
            "interval_ms": round(self._interval_ms),
            "expired": self._expired,
            "unanswered_reads": self._errors,
            "on_time": (
                longest is not None
                and longest <= 2 * self._interval_ms
                and not self._expired
                and not self._errors
            ),
        }
