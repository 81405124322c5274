"""Topics of python-socketio messages (pure: no server): any name stays in its level, no
two names share one, and each message goes to the topic of what it addresses."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from router.core.topics import validate_topic
from router.errors import InvalidSettingError
from router.integrations.socketio_manager import RouterManager
from router.integrations.socketio_rooms import MAX_LEVEL_BYTES, Topics, escape_level, room_level

TOPICS = Topics("socketio")

LEVELS = [
    ("lobby", "lobby"),
    ("", ""),
    ("a/b", "a%2Fb"),
    ("+", "%2B"),
    ("#", "%23"),
    ("$SYS", "%24SYS"),
    ("%2F", "%252F"),
    ("nul\x00", "nul%00"),
    ("tab\t", "tab%09"),
    ("é ü 漢", "é ü 漢"),
    ("\ud800", "%uD800"),
]


@pytest.mark.parametrize(("name", "level"), LEVELS)
def test_a_name_becomes_one_safe_level(name: str, level: str) -> None:
    assert escape_level(name) == level
    assert room_level(name) == level


@pytest.mark.parametrize(
    ("room", "level"),
    [(5, "%j5"), ("5", "5"), (None, "%jnull"), (["a", "b"], '%j["a", "b"]'), ("%j5", "%25j5")],
)
def test_a_room_that_is_not_a_str_is_its_json(room: Any, level: str) -> None:
    assert room_level(room) == level


def test_a_long_name_becomes_its_digest() -> None:
    level = escape_level("x" * 1000)
    assert level.startswith("%h") and len(level) == 2 + 64
    assert escape_level("x" * MAX_LEVEL_BYTES) == "x" * MAX_LEVEL_BYTES
    assert escape_level("é" * MAX_LEVEL_BYTES).startswith("%h")  # (bytes, not characters)


@given(st.text(), st.text())
def test_every_room_topic_is_a_valid_topic_of_four_levels(namespace: str, room: str) -> None:
    topic = TOPICS.room(namespace, room)
    assert validate_topic(topic) == topic
    assert topic.split("/")[:2] == ["socketio", "r"] and topic.count("/") == 3


NAMES = st.one_of(st.text(max_size=40), st.integers())


@given(NAMES, NAMES)
def test_no_two_rooms_share_a_level(one: str | int, other: str | int) -> None:
    if one != other or type(one) is not type(other):
        assert room_level(one) != room_level(other)
        if isinstance(one, str) and isinstance(other, str):
            assert escape_level(one) != escape_level(other)


@pytest.mark.parametrize(
    ("message", "topics"),
    [
        ({"method": "emit", "namespace": "/", "room": None}, ["socketio/n/%2F"]),
        ({"method": "emit", "namespace": "/chat", "room": "a"}, ["socketio/r/%2Fchat/a"]),
        (
            {"method": "emit", "namespace": "/", "room": ["a", "b", "a"]},
            ["socketio/r/%2F/a", "socketio/r/%2F/b"],
        ),
        ({"method": "disconnect", "namespace": "/", "sid": "S1"}, ["socketio/r/%2F/S1"]),
        (
            {"method": "enter_room", "namespace": "/", "sid": "S1", "room": "a"},
            ["socketio/r/%2F/S1"],
        ),
        (
            {"method": "leave_room", "namespace": "/", "sid": "S1", "room": "a"},
            ["socketio/r/%2F/S1"],
        ),
        ({"method": "close_room", "namespace": "/", "room": "a"}, ["socketio/r/%2F/a"]),
        ({"method": "callback", "host_id": "h1", "sid": "S1"}, ["socketio/h/h1"]),
        ({"method": "router_ack", "host_id": "h1"}, ["socketio/h/h1"]),
        ({"method": "something new"}, ["socketio/all"]),
    ],
)
def test_a_message_goes_to_the_topic_of_what_it_addresses(
    message: dict[str, Any], topics: list[str]
) -> None:
    assert TOPICS.of(message) == topics


def test_a_channel_starting_with_a_dollar_cannot_hide_its_topics() -> None:
    assert Topics("$SYS").everyone() == "%24SYS/all"


@pytest.mark.parametrize(
    "arguments",
    [
        {"channel": ""},
        {"url": "redis://127.0.0.1:6379/0", "node": object()},
        {"node_options": {"prefix": "p"}, "node": object()},
        {"ack_timeout": 0},
    ],
)
def test_bad_settings_raise_before_anything_starts(arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettingError):
        RouterManager(**arguments)
