"""The limits file (:mod:`router.mqtt.live_limits`): what it may name, how it is read,
and the errors that name the line."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from router.core.trusted_proxies import TrustedProxies
from router.errors import InvalidSettingError
from router.mqtt.live_limits import LIVE, changed, option_name, parse_limits
from router.mqtt.settings import DEFAULT_SETTINGS, MqttSettings


def test_the_named_limits_replace_the_options_and_the_rest_stay() -> None:
    base = MqttSettings(max_connections=50)
    text = """
        # a comment line, and a blank one

        mqtt-max-publish-rate = 5000   # (a comment after a value)
        --mqtt-receive-maximum=20
    """
    read = parse_limits(text, base)
    assert (read.max_publish_rate, read.receive_maximum) == (5000.0, 20)
    assert read.max_connections == 50
    assert changed(base, read) == {
        "mqtt-max-publish-rate": (DEFAULT_SETTINGS.max_publish_rate, 5000.0),
        "mqtt-receive-maximum": (DEFAULT_SETTINGS.receive_maximum, 20),
    }
    assert parse_limits("", read) == read


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("mqtt-max-connecting = 5", "line 1: mqtt-max-connecting is not a limit that can change"),
        ("mqtt-max-packet-size = 100", "mqtt-max-packet-size is not a limit"),
        ("no-such-limit = 1", "no-such-limit is not a limit"),
        ("\nmqtt-max-connections 5", "line 2: a line is NAME = VALUE"),
        ("mqtt-max-connections =", "a line is NAME = VALUE"),
        ("mqtt-max-connections = many", "mqtt-max-connections is a number, not 'many'"),
        ("mqtt-max-connections = 1.5", "is a number"),
        (
            "mqtt-max-connections = 1\nmqtt-max-connections = 2",
            "line 2: mqtt-max-connections is given twice",
        ),
        ("mqtt-receive-maximum = 0", "receive_maximum is out of range"),
    ],
)
def test_a_line_that_cannot_be_used_is_an_error_naming_it(text: str, words: str) -> None:
    with pytest.raises(InvalidSettingError, match=r"^limits\.conf") as raised:
        parse_limits(text, DEFAULT_SETTINGS, "limits.conf")
    assert words in str(raised.value)


def test_every_live_limit_has_an_option_and_only_those_may_change() -> None:
    names = {field.name for field in dataclasses.fields(MqttSettings)}
    assert names >= LIVE
    shares = {"overload_busy_load"}  # (a share of the time, 0 to 1)
    for name in LIVE:
        value = "0.5" if name in shares else "7"
        assert parse_limits(f"{option_name(name)} = {value}", DEFAULT_SETTINGS) != DEFAULT_SETTINGS
    behind = {"proxy_trusted": TrustedProxies.parse("127.0.0.1")}  # (what a protocol needs)
    for name in sorted(names - LIVE):
        value = getattr(DEFAULT_SETTINGS, name)
        if isinstance(value, bool):
            new: dict[str, Any] = {name: not value}
        elif isinstance(value, int | float):
            new = {name: value + 1}
        elif name == "proxy_protocol":
            new = {name: frozenset({"mqtt"}), **behind}
        else:
            new = behind
        other = dataclasses.replace(DEFAULT_SETTINGS, **new)
        with pytest.raises(InvalidSettingError, match=f"{option_name(name)} cannot change live"):
            changed(DEFAULT_SETTINGS, other)
