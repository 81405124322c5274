"""Pure parts of the operator views: filter overlap, key-name parsing, clock arithmetic."""

from __future__ import annotations

import itertools

import pytest

from router.core.route_mirror import RouteMirror
from router.core.topics import matches
from router.errors import InvalidTopicError
from router.ops.channel_view import pending_between
from router.ops.route_view import filters_overlap, route_rows
from router.state.channels import CLOCK_LIMIT
from router.state.keys import Keys, escape_id, glob_escape, unescape_id

OVERLAPS = [
    ("sport/+/score", "sport/tennis/#", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("+/news", "$SYS/news", False),
    ("#", "$SYS/x", False),
    ("$SYS/#", "$SYS/x/y", True),
    ("a/+", "a/b/c", False),
    ("a/+", "a", False),
    ("a/b", "a/c", False),
    ("+/+", "+", False),
    ("+", "+", True),
    ("a//b", "a/+/b", True),
    ("$share/g/a/#", "a/b", True),
    ("$share/g/a/#", "$share/h/b/#", False),
    ("/#", "+", False),  # only the empty topic would match both, and topics are not empty
    ("/#", "/", True),
]


@pytest.mark.parametrize(("first", "second", "expected"), OVERLAPS)
def test_overlap_table(first: str, second: str, expected: bool) -> None:
    assert filters_overlap(first, second) is expected
    assert filters_overlap(second, first) is expected


def test_overlap_agrees_with_brute_force() -> None:
    """Every pair of small filters against every topic of up to three levels."""
    literals = ["a", "b", "$x", ""]
    levels = [*literals, "+", "#"]
    filters = []
    for depth in (1, 2, 3):
        for combo in itertools.product(levels, repeat=depth):
            if "#" not in combo[:-1] and combo != ("",):
                filters.append("/".join(combo))
    topics = [
        "/".join(combo)
        for depth in (1, 2, 3)
        for combo in itertools.product([*literals, "fresh"], repeat=depth)
        if combo != ("",)
    ]
    matched = {f: frozenset(t for t in topics if matches(f, t)) for f in filters}
    for first, second in itertools.combinations(filters, 2):
        expected = bool(matched[first] & matched[second])
        assert filters_overlap(first, second) is expected, (first, second)


def test_overlap_refuses_invalid_filters() -> None:
    with pytest.raises(InvalidTopicError):
        filters_overlap("a/#/b", "a")


def test_route_rows_sorted_with_members_for_share_groups() -> None:
    mirror = RouteMirror()
    mirror.load("n2", "g", 0, {"b/#": 1, "$share/w/j": 3})
    mirror.load("n1", "g", 0, {"b/#": 1, "a": 1, "$share/w/j": 1})
    assert [row.as_dict() for row in route_rows(mirror)] == [
        {"filter": "$share/w/j", "nodes": ["n1", "n2"], "members": {"n1": 1, "n2": 3}},
        {"filter": "a", "nodes": ["n1"]},
        {"filter": "b/#", "nodes": ["n1", "n2"]},
    ]
    assert [row.filter for row in route_rows(mirror, "b/x")] == ["b/#"]


@pytest.mark.parametrize("value", ["plain", "a{b}c", "%7B", "%", "%%7D{", "*?[]\\"])
def test_key_names_parse_back(value: str) -> None:
    keys = Keys("p*x")
    assert unescape_id(escape_id(value)) == value
    assert keys.node_of_key(keys.node_routes(value)) == value
    assert keys.node_of_key(keys.node_meta(value)) == value
    assert keys.client_of_owner_key(keys.client_owner(value)) == value
    assert keys.channel_of_clock_key(keys.channel_clock(value)) == value
    assert keys.subscriber_of_cursor_key("ch", keys.channel_cursor("ch", value)) == value


def test_key_parsing_ignores_other_keys() -> None:
    keys = Keys("rt")
    assert keys.node_of_key(keys.client_owner("n")) is None
    assert keys.node_of_key("rt:{n:x}:routes:extra") is None
    assert keys.node_of_key("other:{n:x}:routes") is None
    # A cursor whose subscriber id looks like a clock key suffix is not a clock key.
    assert keys.channel_of_clock_key(keys.channel_cursor("a", "b}:clock")) is None
    assert keys.client_of_owner_key(keys.client_subscriptions("c")) is None


def test_scan_patterns_escape_glob_characters() -> None:
    assert glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
    keys = Keys("p?")
    assert keys.node_keys_pattern() == "p\\?:{n:*}:*"
    assert keys.channel_cursors_pattern("q*") == "p\\?:{ch:q\\*}:sub:*"


@pytest.mark.parametrize(
    ("cursor", "clock", "pending"),
    [(0, 0, 0), (3, 10, 7), (CLOCK_LIMIT - 1, -CLOCK_LIMIT + 1, 3), (CLOCK_LIMIT, CLOCK_LIMIT, 0)],
)
def test_pending_counts_across_the_clock_wrap(cursor: int, clock: int, pending: int) -> None:
    assert pending_between(cursor, clock) == pending
