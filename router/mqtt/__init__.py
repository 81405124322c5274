"""MQTT 3.1.1 and 5.0 (and 3.1) for router nodes: the front end that any MQTT client uses.

The protocol is kept free of I/O: :mod:`router.mqtt.packets` holds one packet model for
every protocol level, :mod:`router.mqtt.codec` turns bytes into packets and back, and
the listeners only move bytes. Imports :mod:`router.core`, :mod:`router.state` and
:mod:`router.cluster`.
"""

from router.mqtt.server import MqttServer, serve
from router.mqtt.settings import MqttSettings

__all__ = ["MqttServer", "MqttSettings", "serve"]
