"""The MQTT limits that may change while a node serves, and the file that changes them.

A limits file holds ``NAME = VALUE`` lines (``#`` starts a comment), each NAME one of
``router node run``'s options without its dashes::

    # /etc/router/limits.conf (router node run --limits-file ...)
    mqtt-max-publish-rate = 5000
    mqtt-max-connections = 20000

A node reads it when it starts and again on each reload; what it names replaces the
option's value, and a line taken out gives the option's value back. Only :data:`LIVE`
limits may be named; each changes safely while clients are connected:

* judged at once, for every connection: ``max_connections`` (a lower one closes
  nobody: it refuses new connections until the count is below it),
  ``max_connect_rate``, the limits of a SUBSCRIBE (``max_subscriptions``, and
  ``max_topic_levels`` and ``max_topic_length`` of a filter), and overload
  protection's levels (``overload_*``, from the next sample on);
* the others, for connections made after the reload: a connection keeps those it
  connected with, so what its CONNACK announced (Receive Maximum, Topic Alias Maximum,
  Server Keep Alive, Session Expiry) stays true.

Not live, because something was built from them when the node started:
``max_connecting`` (the turns of CONNECT work), ``connect_timeout`` and
``max_packet_size`` (the TLS and WebSocket listeners' handshake timeout and frame
size), ``allow_anonymous`` (decided with the source of users), ``sys_interval``, the
flapping detector's and the unfinished-packet ledger's bounds.

:func:`parse_limits` is pure; :func:`read_limits` reads the file. Both raise
:class:`InvalidSettingError` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from router.errors import InvalidSettingError
from router.mqtt.settings import MqttSettings

LIVE: Final = frozenset(
    {
        "max_connections",
        "max_connect_rate",
        "max_subscriptions",
        "max_topic_levels",
        "max_topic_length",
        "receive_maximum",
        "max_keepalive",
        "topic_alias_maximum",
        "max_inflight",
        "max_inflight_bytes",
        "session_expiry_max",
        "max_user_properties",
        "max_user_properties_bytes",
        "max_publish_rate",
        "max_publish_bytes_rate",
        "max_subscribe_rate",
        "overload_loop_lag",
        "overload_queued_bytes",
        "overload_memory",
        "overload_redis_latency",
        "overload_busy_lag",
        "overload_busy_load",
    }
)
"""The :class:`MqttSettings` fields that may change while the node serves."""


def option_name(field: str) -> str:
    """The option of a field, without its dashes: ``max_connections`` ->
    ``mqtt-max-connections`` (``session_expiry_max`` -> ``mqtt-session-expiry-max``)."""
    return "mqtt-" + field.replace("_", "-")


_FIELDS: Final = {option_name(name): name for name in LIVE}
_TYPES: Final = {field.name: field.type for field in dataclasses.fields(MqttSettings)}


def parse_limits(text: str, base: MqttSettings, source: str = "limits file") -> MqttSettings:
    """``base`` with the limits ``text`` names (see the module docstring)."""
    changes: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        content = line.partition("#")[0].strip()
        if not content:
            continue
        where = f"{source} line {number}"
        name, equals, raw = (part.strip() for part in content.partition("="))
        if not equals or not raw:
            raise InvalidSettingError(f"{where}: a line is NAME = VALUE, not {content!r}")
        field = _FIELDS.get(name.removeprefix("--"))
        if field is None:
            raise InvalidSettingError(f"{where}: {name} is not a limit that can change live")
        if field in changes:
            raise InvalidSettingError(f"{where}: {name} is given twice")
        try:
            changes[field] = int(raw) if _TYPES[field] in (int, "int") else float(raw)
        except ValueError:
            raise InvalidSettingError(f"{where}: {name} is a number, not {raw!r}") from None
    try:
        return dataclasses.replace(base, **changes)
    except InvalidSettingError as error:
        raise InvalidSettingError(f"{source}: {error}") from None


def read_limits(path: str, base: MqttSettings) -> MqttSettings:
    """:func:`parse_limits` of the file at ``path``."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidSettingError(f"limits file {path}: {error}") from None
    return parse_limits(text, base, f"limits file {path}")


def changed(old: MqttSettings, new: MqttSettings) -> dict[str, tuple[object, object]]:
    """The fields that differ, by option name: (old value, new value). Raises
    :class:`InvalidSettingError` when one that is not :data:`LIVE` differs."""
    found = {}
    for field in dataclasses.fields(MqttSettings):
        before, after = getattr(old, field.name), getattr(new, field.name)
        if before != after:
            if field.name not in LIVE:
                raise InvalidSettingError(f"{option_name(field.name)} cannot change live")
            found[option_name(field.name)] = (before, after)
    return found
