"""What the endpoints of one listener share: the node, its MQTT server, the accounts."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from router.cluster.node import RouterNode
from router.mqtt.server import MqttServer
from router.ops.telemetry import Telemetry
from router.state.console_store import ConsoleStore

TOPICS_SECONDS: Final = 10.0


@dataclass
class WebContext:
    """The node an API serves (``mqtt``: its MQTT server, None for an embedded node
    without one) and its telemetry (None until the listener has started it)."""

    node: RouterNode
    mqtt: MqttServer | None
    console: ConsoleStore
    telemetry: Telemetry | None = None
    _topics: tuple[float, int] = (-TOPICS_SECONDS, 0)  # (when counted, the count)

    def topics(self) -> int:
        """Distinct filters subscribed in the cluster (this node's mirror), counted at
        most every :data:`TOPICS_SECONDS`: a count walks the whole route table."""
        counted_at, count = self._topics
        now = time.monotonic()
        if now - counted_at >= TOPICS_SECONDS:
            count = len(self.node.mirror.table())
            self._topics = (now, count)
        return count


CONTEXT: Final = web.AppKey("router", WebContext)


def context_of(request: web.Request) -> WebContext:
    return request.app[CONTEXT]
