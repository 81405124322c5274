"""Prometheus metrics and a health check for one running node.

The node's HTTP listener (:mod:`router.web.listener`: ``router node run --http HOST:PORT`` or
``--metrics HOST:PORT``) serves them:

- ``GET /metrics``: the node's figures in the Prometheus text format, read at scrape
  time (the ``prometheus_client`` library writes it): counters from ``node.stats()`` and
  the MQTT server's stats, the inbox lag (records stored and not acknowledged, read from
  Redis), the number of routes, the publish latency histogram, and ``router_up``;
- ``GET /healthz``: ``200 ok`` while Redis answers a PING within the node's Redis timeout
  and every supervised task runs; ``503`` with the reason otherwise (a task failing, the
  heartbeat withheld, Redis not answering).

Counters are named ``router_<figure>_total`` (the figures count since the node started);
the few figures that go up and down (routes, connections, the inbox lag) are gauges, and
so are when the node's last adoption of a dead node's sessions ended (Unix time, ms) and
how long it took, and when it last reloaded (``router_reload_last_ms``; the reloads
applied and refused are ``router_reloads_total`` and ``router_reload_failures_total``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from router.cluster.node import RouterNode
from router.errors import StateError
from router.mqtt.server import MqttServer
from router.state.failures import REDIS_ERRORS

log = logging.getLogger(__name__)

GAUGES: Final = frozenset(
    {
        "routes",
        "route_changes_unwritten",
        "tasks_failing",
        "mqtt_connections",
        "mqtt_clients",
        "mqtt_unfinished_packets",
        "mqtt_unfinished_bytes",
        "mqtt_unfinished_bytes_peak",
        "mqtt_proxy_pending",
        "mqtt_overloaded",
        "mqtt_overload_busy",
        "mqtt_loop_busy_percent",
        "mqtt_draining",
        "mqtt_alias_clients_marked",
        "adoption_last_finished_ms",
        "adoption_last_took_ms",
        "reload_last_ms",
    }
)
"""Figures of ``stats()`` that go up and down; every other one is a counter."""
PING_TIMEOUT: Final = 2.0


class NodeCollector(Collector):
    """The figures of one node (and its MQTT server) at the last :meth:`refresh`."""

    def __init__(self, node: RouterNode, mqtt: MqttServer | None = None) -> None:
        self.node = node
        self.mqtt = mqtt
        self._inbox_lag: int | None = None

    async def refresh(self) -> None:
        """Read the figures that need Redis (the inbox lag) before a scrape."""
        try:
            self._inbox_lag = await self.node.inbox_backlog()
        except StateError:  # (Redis not answering: the lag is left out of this scrape)
            log.warning("inbox lag of node %s unread", self.node.node_id, exc_info=True)
            self._inbox_lag = None
        except Exception as error:
            self.node.internal_error("the inbox lag for /metrics", error)
            self._inbox_lag = None

    def collect(self) -> Iterable[Metric]:
        node = self.node
        figures: dict[str, int] = dict(node.stats())
        if self.mqtt is not None:
            figures.update(self.mqtt.stats())
        labels = ["node"], [node.node_id]
        for name, value in sorted(figures.items()):
            if name in GAUGES:
                family: Metric = GaugeMetricFamily(f"router_{name}", name, labels=labels[0])
            else:
                family = CounterMetricFamily(f"router_{name}", name, labels=labels[0])
            family.add_metric(labels[1], value)  # type: ignore[attr-defined]
            yield family
        up = GaugeMetricFamily("router_up", "1 while the node claims liveness", labels=labels[0])
        up.add_metric(labels[1], 1 if node.running and node.health()["ok"] else 0)
        yield up
        if self._inbox_lag is not None:
            lag = GaugeMetricFamily(
                "router_inbox_lag", "inbox records not acknowledged", labels=labels[0]
            )
            lag.add_metric(labels[1], self._inbox_lag)
            yield lag
        histogram = node.publish_latency
        buckets = [(str(bound), count) for bound, count in histogram.cumulative()]
        buckets.append(("+Inf", histogram.count))
        latency = HistogramMetricFamily(
            "router_publish_seconds", "seconds per publish call", labels=labels[0]
        )
        latency.add_metric(labels[1], buckets, histogram.total)
        yield latency


async def health(node: RouterNode, mqtt: MqttServer | None = None) -> tuple[bool, str]:
    """(healthy, why): Redis answers a PING, every supervised task runs, and the MQTT
    front end (if any) is not draining (a load balancer then sends clients elsewhere)."""
    report = node.health()
    if not node.running:
        return False, "the node is not running"
    if mqtt is not None and mqtt.draining:
        return False, "the node is draining: it accepts no new client"
    if report["failing"]:
        failing = "; ".join(f"{name}: {error}" for name, error in sorted(report["failing"].items()))
        return False, f"tasks failing: {failing}"
    if not report["ok"]:
        return False, "the node withholds its heartbeat"
    try:
        async with asyncio.timeout(PING_TIMEOUT):
            await node.registry.redis.ping()
    except (*REDIS_ERRORS, TimeoutError) as exc:
        return False, f"Redis does not answer: {exc!r}"
    return True, "ok"
