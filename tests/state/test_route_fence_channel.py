"""The messages of the route fences channel (router.state.route_fence_channel): what is
read as an ask or an answer, and what is not (any client of the Redis may publish)."""

from __future__ import annotations

import json

import pytest

from router.state.route_fence_channel import FenceAsked, FenceSettled, parse_fence


@pytest.mark.parametrize(
    ("message", "parsed"),
    [
        (["ask", "node a", 3], FenceAsked("node a", 3)),
        (["settled", "b", "node a", 3], FenceSettled("b", "node a", 3)),
        (["ask", "", 3], None),
        (["ask", "a", "3"], None),
        (["ask", "a", True], None),
        (["settled", "b", 3], None),
        (["hello"], None),
        ({"ask": "a"}, None),
        ([], None),
    ],
)
def test_asks_and_answers_are_read_and_nothing_else(message: object, parsed: object) -> None:
    assert parse_fence(json.dumps(message).encode()) == parsed


def test_a_message_that_is_not_json_is_nothing() -> None:
    assert parse_fence(b"\xff not json") is None
