"""Inbox records: batches of forwards and takeover notices, packed and read back."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from router.cluster.forwarding import SeenIds
from router.cluster.inbox import Forward, Kick, Takeover, pack_batch, pack_notice, unpack_record
from router.core.messages import Message, MessageProperties
from router.errors import MalformedMessageError

PROPERTIES = MessageProperties(
    1, "text/plain", "re/ply", b"\x00c", (("k", "2"), ("a", ""), ("k", "1"))
)


def test_records_read_back_as_written() -> None:
    batch = [
        Forward(Message(b"\x01" * 16, "a/b", b"x", 1, True, "pub", 2.5), ("$share/g/a/#",)),
        Forward(Message(b"\x02" * 16, "c", b""), (), ("n1",)),
        Forward(Message(b"\x03" * 16, "p", b"y", 1, False, None, 0.0, PROPERTIES)),
    ]
    assert unpack_record(pack_batch(batch)) == batch
    for notice in (
        Takeover("phone ☎", 1_700_000_000_000_001),
        Takeover("phone", 2, resume=True),
        Kick("phone ☎"),
    ):
        assert unpack_record(pack_notice(notice)) == notice


def test_a_takeover_notice_of_the_version_before_does_not_resume() -> None:
    old = msgpack.packb({"takeover": ["phone", 12]}, use_bin_type=True)
    assert unpack_record(old) == Takeover("phone", 12, resume=False)


@pytest.mark.parametrize(
    "record",
    [
        {"takeover": ["phone", "12"]},
        {"takeover": [7, 12]},
        {"takeover": ["phone"]},
        {"takeover": ["phone", 12, "yes"]},
        {"takeover": ["phone", 12, True, 1]},
        {"kick": [7]},
        {"kick": ["a", "b"]},
        {"takeover": ["phone", 12], "extra": 1},
        {"other": ["phone", 12]},
        [["short row"]],
        [[b"\x01" * 16, "t", b"", 0, False, None, 0.0, [], [], ["not", "properties"]]],
        "text",
    ],
)
def test_records_this_router_did_not_write_are_refused(record: Any) -> None:
    with pytest.raises(MalformedMessageError):
        unpack_record(msgpack.packb(record, use_bin_type=True))


def test_the_ids_remembered_against_repeats_are_bounded_by_time_and_count() -> None:
    """Found by `router bench soak`: 200,000 remembered ids grew a node's memory for
    ten minutes at a few hundred copies per second. Ids are kept for a window of
    seconds (a repeat comes from a retry, within seconds), and at most ``limit``."""
    now = [0.0]
    seen = SeenIds(limit=5, window=60.0, clock=lambda: now[0])
    for number in range(3):
        seen.add(b"%d" % number)
        now[0] += 1.0
    assert seen.known(b"0") and len(seen) == 3
    now[0] = 61.5  # ids 0 and 1 are older than the window now
    seen.add(b"late")
    assert not seen.known(b"0") and not seen.known(b"1") and seen.known(b"2")
    for number in range(10, 20):
        seen.add(b"%d" % number)
    assert len(seen) == 5 and seen.known(b"19") and not seen.known(b"14")


def test_a_batch_of_ids_is_remembered_at_once_within_the_same_bounds() -> None:
    now = [0.0]
    seen = SeenIds(limit=5, window=60.0, clock=lambda: now[0])
    seen.add_many([b"a", b"b"])
    now[0] = 30.0
    seen.add_many([b"a", b"c"])  # a repeat is remembered as long as the batch
    now[0] = 61.0
    seen.add_many([b"d"])
    assert seen.known(b"a") and seen.known(b"c") and not seen.known(b"b")
    seen.add_many([b"%d" % number for number in range(7)])
    assert len(seen) == 5 and seen.known(b"6") and not seen.known(b"1")
    seen.add_many([])
    assert len(seen) == 5
