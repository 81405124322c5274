"""What the endpoints of one listener share: the node, its MQTT server, the accounts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiohttp import web

from router.cluster.node import RouterNode
from router.mqtt.server import MqttServer
from router.state.console_store import ConsoleStore
from router.web.telemetry import Telemetry


@dataclass
class WebContext:
    """The node an API serves (``mqtt``: its MQTT server, None for an embedded node
    without one) and its telemetry (None until the listener has started it)."""

    node: RouterNode
    mqtt: MqttServer | None
    console: ConsoleStore
    telemetry: Telemetry | None = None


CONTEXT: Final = web.AppKey("router", WebContext)


def context_of(request: web.Request) -> WebContext:
    return request.app[CONTEXT]
