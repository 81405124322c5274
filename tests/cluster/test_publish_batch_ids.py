"""Ids for a batch of publishes, taken at once: the same as one call per message would give."""

from __future__ import annotations

import itertools

from router.core import guid
from router.core.guid import MAX_SEQUENCE, GuidGenerator


def test_a_batch_of_ids_increases_and_continues_the_sequence() -> None:
    ids = GuidGenerator(7, clock=lambda: 1_000)
    single = ids.new_bytes()
    batch = ids.new_bytes_many(4)
    after = ids.new_bytes()
    run = [single, *batch, after]
    assert all(a < b for a, b in itertools.pairwise(run))
    assert [guid.parse(i).sequence for i in run] == [0, 1, 2, 3, 4, 5]
    assert {guid.parse(i).node for i in run} == {7}
    assert ids.new_bytes_many(0) == []


def test_a_batch_that_would_wrap_the_sequence_borrows_the_next_microsecond() -> None:
    ids = GuidGenerator(7, clock=lambda: 1_000)
    for _ in range(MAX_SEQUENCE - 1):
        ids.new()
    batch = ids.new_bytes_many(3)
    parsed = [guid.parse(i) for i in batch]
    assert [(p.timestamp_us, p.sequence) for p in parsed] == [
        (1_000, MAX_SEQUENCE - 1),
        (1_000, MAX_SEQUENCE),
        (1_001, 0),
    ]
    assert all(a < b for a, b in itertools.pairwise(batch))
