"""Message ids: order from one generator, no collisions across nodes, forms and parsing."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, strategies as st

from router.core import guid
from router.core.guid import GuidGenerator, GuidParts
from router.errors import InvalidGuidError, InvalidIdError, RouterError

NODE_A = 0x0000_1234_5678
NODE_B = 0x0000_1234_5679


def stepping(values: list[int]) -> Callable[[], int]:
    """A clock that returns the given values, then repeats the last one."""
    iterator = iter(values)
    last = values[-1]
    return lambda: next(iterator, last)


def test_one_million_ids_strictly_increase_with_a_frozen_clock() -> None:
    generator = GuidGenerator(NODE_A, clock=lambda: 1_700_000_000_000_000)
    previous = -1
    new = generator.new
    for _ in range(1_000_000):
        value = new()
        assert value > previous
        previous = value
    # 1M ids at one frozen microsecond borrowed 1_000_000 // 65536 microseconds.
    parts = guid.parse(previous)
    assert parts == GuidParts(1_700_000_000_000_000 + 1_000_000 // 65536, NODE_A, 16_959)


def test_one_million_ids_strictly_increase_with_a_real_clock() -> None:
    generator = GuidGenerator(NODE_A)
    ids = [generator.new() for _ in range(1_000_000)]
    assert all(a < b for a, b in itertools.pairwise(ids))


def test_sequence_wraps_by_borrowing_the_next_microsecond() -> None:
    generator = GuidGenerator(NODE_A, clock=lambda: 500)
    ids = [guid.parse(generator.new()) for _ in range(65_536 + 2)]
    assert ids[0] == GuidParts(500, NODE_A, 0)
    assert ids[65_535] == GuidParts(500, NODE_A, 65_535)
    assert ids[65_536] == GuidParts(501, NODE_A, 0)
    assert ids[65_537] == GuidParts(501, NODE_A, 1)


def test_a_new_microsecond_restarts_the_sequence() -> None:
    generator = GuidGenerator(NODE_A, clock=stepping([10, 10, 10, 11, 20]))
    assert [guid.parse(generator.new()) for _ in range(5)] == [
        GuidParts(10, NODE_A, 0),
        GuidParts(10, NODE_A, 1),
        GuidParts(10, NODE_A, 2),
        GuidParts(11, NODE_A, 0),
        GuidParts(20, NODE_A, 0),
    ]


def test_a_clock_going_back_keeps_the_order_and_catches_up() -> None:
    generator = GuidGenerator(NODE_A, clock=stepping([1000, 400, 400, 999, 1000, 1001]))
    parts = [guid.parse(generator.new()) for _ in range(6)]
    # While the clock is behind, the generator counts on at its own last timestamp.
    assert parts[:5] == [GuidParts(1000, NODE_A, s) for s in range(5)]
    # Once the clock passes it, the wall clock is used again.
    assert parts[5] == GuidParts(1001, NODE_A, 0)


def test_a_clock_going_back_across_a_wrap_borrows_ahead() -> None:
    values = [1000] + [10] * 70_000
    generator = GuidGenerator(NODE_A, clock=stepping(values))
    ids = [generator.new() for _ in range(len(values))]
    assert all(a < b for a, b in itertools.pairwise(ids))
    assert guid.parse(ids[-1]).timestamp_us == 1001


def test_generators_with_different_node_parts_never_collide() -> None:
    clock = lambda: 42  # noqa: E731 - both generators stuck at the same microsecond
    first = GuidGenerator(NODE_A, clock=clock)
    second = GuidGenerator(NODE_B, clock=clock)
    a = {first.new() for _ in range(100_000)}
    b = {second.new() for _ in range(100_000)}
    assert len(a) == len(b) == 100_000
    assert not a & b
    assert {guid.parse(x).node for x in a} == {NODE_A}


def test_node_part_for_depends_on_node_and_process() -> None:
    parts = {
        guid.node_part_for(node, process)
        for node in ("n1", "n2", "n10", "1")
        for process in (1, 2, "7", 10)
    }
    assert len(parts) == 16
    assert all(0 <= part <= guid.MAX_NODE for part in parts)
    assert guid.node_part_for("n1", 5) == guid.node_part_for("n1", 5)
    assert guid.node_part_for("n1") == guid.node_part_for("n1")  # the pid by default
    with pytest.raises(InvalidGuidError):
        guid.node_part_for("")


def test_bytes_and_hex_forms_sort_like_the_numbers() -> None:
    generator = GuidGenerator(NODE_A, clock=stepping([1, 1, 2, 2**40, 2**40 + 1]))
    ids = [generator.new() for _ in range(5)]
    assert sorted(ids, key=guid.to_bytes) == ids
    assert sorted(ids, key=guid.to_hex) == ids
    raw = guid.to_bytes(ids[3])
    assert len(raw) == 16
    assert raw[:8] == (2**40).to_bytes(8, "big")
    text = guid.to_hex(ids[3])
    assert len(text) == 32
    assert text == raw.hex()


def test_the_generator_makes_every_form() -> None:
    generator = GuidGenerator(NODE_B, clock=lambda: 77)
    raw, text, number = generator.new_bytes(), generator.new_hex(), generator.new()
    assert guid.parse(raw) == GuidParts(77, NODE_B, 0)
    assert guid.parse(text) == GuidParts(77, NODE_B, 1)
    assert guid.parse(number) == GuidParts(77, NODE_B, 2)
    assert generator.node == NODE_B


@given(
    st.integers(0, guid.MAX_TIMESTAMP),
    st.integers(0, guid.MAX_NODE),
    st.integers(0, guid.MAX_SEQUENCE),
)
def test_round_trips(timestamp: int, node: int, sequence: int) -> None:
    value = guid.compose(timestamp, node, sequence)
    parts = GuidParts(timestamp, node, sequence)
    assert guid.parse(value) == parts
    assert guid.from_bytes(guid.to_bytes(value)) == value
    assert guid.from_hex(guid.to_hex(value)) == value
    assert guid.from_hex(guid.to_hex(value).upper()) == value
    assert guid.parse(guid.to_bytes(value)) == parts
    assert guid.parse(guid.to_hex(value)) == parts


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\x00" * 15,
        b"\x00" * 17,
        "0" * 31,
        "0" * 33,
        "g" * 32,
        " " + "0" * 31,
        "+" + "0" * 31,
        -1,
        2**128,
        True,
        1.5,
        None,
    ],
)
def test_malformed_ids_are_refused(bad: object) -> None:
    with pytest.raises(InvalidGuidError) as caught:
        guid.parse(bad)  # type: ignore[arg-type]
    assert isinstance(caught.value, InvalidIdError)
    assert isinstance(caught.value, RouterError)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("timestamp", "node", "sequence"),
    [(-1, 0, 0), (2**64, 0, 0), (0, 2**48, 0), (0, -1, 0), (0, 0, 2**16), (0, 0, -1)],
)
def test_compose_refuses_parts_out_of_range(timestamp: int, node: int, sequence: int) -> None:
    with pytest.raises(InvalidGuidError):
        guid.compose(timestamp, node, sequence)


@pytest.mark.parametrize("node", [-1, 2**48, "1", 1.0, True])
def test_generator_refuses_a_bad_node_part(node: object) -> None:
    with pytest.raises(InvalidGuidError):
        GuidGenerator(node)  # type: ignore[arg-type]


@pytest.mark.parametrize("reading", [-5, 1.5, "now"])
def test_generator_refuses_a_bad_clock_reading(reading: object) -> None:
    generator = GuidGenerator(NODE_A, clock=lambda: reading)  # type: ignore[arg-type, return-value]
    with pytest.raises(InvalidGuidError):
        generator.new()


def test_the_timestamp_cannot_leave_64_bits() -> None:
    generator = GuidGenerator(NODE_A, clock=lambda: guid.MAX_TIMESTAMP)
    for _ in range(65_536):
        generator.new()
    with pytest.raises(InvalidGuidError):
        generator.new()
