"""Topic names and filters: the rules of MQTT 5.0 section 4.7, case by case."""

from __future__ import annotations

import pytest

from router import InvalidTopicError, RouterError, matches, validate_filter, validate_topic

VALID_TOPICS = [
    "a",
    "a/b/c",
    "/",
    "//",
    "/a",
    "a/",
    "a//b",
    " ",
    "$SYS/broker/uptime",
    "$share/not/a/subscription",
    "sport/tennis/player1/ranking",
    "wetter/zürich/°C",
    "emoji/😀",
    "a" * 65535,
    "é" * 32767,  # 65534 bytes
]

INVALID_TOPICS = [
    ("", "empty"),
    ("a/+", "wildcard"),
    ("#", "wildcard"),
    ("a/#", "wildcard"),
    ("a+b", "wildcard"),
    ("a\x00b", "U+0000"),
    ("a" * 65536, "65535"),
    ("é" * 32768, "65535"),  # 65536 bytes
    ("bad/\udc80", "surrogate"),
]

VALID_FILTERS = [
    "#",
    "+",
    "+/+",
    "/+",
    "+/",
    "a/#",
    "a/+/b",
    "+/tennis/#",
    "sport/+",
    "a//#",
    "$SYS/#",
    "$share/group/a/b",
    "$share/group/#",
    "$share/g/$SYS/#",
    "$share/g//",
    "$share",
    "$shared/x",
    "$share/g/$share/h/x",
]

INVALID_FILTERS = [
    ("", "empty"),
    ("a+", "whole level"),
    ("+a", "whole level"),
    ("a/b#", "whole level"),
    ("#/a", "last level"),
    ("a/#/b", "last level"),
    ("##", "whole level"),
    ("++", "whole level"),
    ("a\x00", "U+0000"),
    ("\ud800", "surrogate"),
    ("a" * 65536, "65535"),
    ("$share/", "needs"),
    ("$share/g", "needs"),
    ("$share//a", "share name must not be empty"),
    ("$share/g/", "empty"),
    ("$share/g+/a", "share name"),
    ("$share/#/a", "share name"),
    ("$share/g/a#", "whole level"),
    ("$share/g/#/a", "last level"),
]


@pytest.mark.parametrize("name", VALID_TOPICS, ids=lambda t: repr(t[:30]))
def test_valid_topic_names(name: str) -> None:
    assert validate_topic(name) == name


@pytest.mark.parametrize(("name", "reason"), INVALID_TOPICS, ids=lambda t: repr(t[:30]))
def test_invalid_topic_names(name: str, reason: str) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic(name)
    assert reason in info.value.reason
    assert info.value.topic == name
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, RouterError)


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_filters(topic_filter: str) -> None:
    assert validate_filter(topic_filter) == topic_filter


@pytest.mark.parametrize(("topic_filter", "reason"), INVALID_FILTERS, ids=lambda t: repr(t[:30]))
def test_invalid_filters(topic_filter: str, reason: str) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_filter(topic_filter)
    assert reason in info.value.reason


@pytest.mark.parametrize("value", [None, b"a/b", 3, ["a"]])
def test_non_text_is_refused(value: object) -> None:
    with pytest.raises(InvalidTopicError, match="must be a str"):
        validate_topic(value)  # type: ignore[arg-type]
    with pytest.raises(InvalidTopicError, match="must be a str"):
        validate_filter(value)  # type: ignore[arg-type]


# (filter, topic, expected): the spec's own examples (4.7.1.2, 4.7.1.3, 4.7.2) and more.
MATCH_CASES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("sport/tennis/#", "sport/tennis", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("+/#", "$SYS", False),
    ("a/+/#", "$x/b/c", False),
    # mr_rax defects the router must not have
    ("+/#", "sport", True),
    ("foo/+/#", "foo/bar", True),
    ("a/b/c", "ab/c", False),
    ("ab/c", "a/b/c", False),
    ("a/b/c", "abc", False),
    # empty levels are real levels
    ("a//b", "a//b", True),
    ("a/+/b", "a//b", True),
    ("a/b", "a//b", False),
    ("+", "", None),  # an empty topic is invalid, not a match
    ("/#", "/", True),
    ("#", "/", True),
    ("+", "a", True),
    ("+/+/+", "a/b", False),
    ("a/#", "a/", True),
    ("A/b", "a/b", False),
    ("x/#", "x/" + "/".join(["l"] * 200), True),
    # shared subscriptions match what their filter matches
    ("$share/g/sport/#", "sport/tennis", True),
    ("$share/g/sport/#", "news", False),
    ("$share/g/$SYS/#", "$SYS/x", True),
    ("$share/g/#", "$SYS/x", False),
    ("$share/g/+", "g", True),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCH_CASES)
def test_matches(topic_filter: str, topic: str, expected: bool | None) -> None:
    if expected is None:
        with pytest.raises(InvalidTopicError):
            matches(topic_filter, topic)
    else:
        assert matches(topic_filter, topic) is expected


def test_matches_validates_both_sides() -> None:
    with pytest.raises(InvalidTopicError):
        matches("a/+", "a/+")
    with pytest.raises(InvalidTopicError):
        matches("a+", "a")
