"""Inbox records: batches of forwards and takeover notices, packed and read back."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from router.cluster.forwarding import SeenIds
from router.cluster.inbox import (
    Forward,
    Kick,
    Reload,
    Takeover,
    pack_batch,
    pack_notice,
    unpack_record,
)
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
        Reload("router node reload"),
    ):
        assert unpack_record(pack_notice(notice)) == notice


def test_a_takeover_notice_of_the_version_before_does_not_resume() -> None:
    old = msgpack.packb({"takeover": ["phone", 12]}, use_bin_type=True)
    assert unpack_record(old) == Takeover("phone", 12, resume=False)


def test_a_row_of_the_version_before_is_a_message_without_expiry() -> None:
    row = [b"\x01" * 16, "a/b", b"x", 1, True, "pub", 2.5, ["$share/g/a/#"], ["n1"], None]
    [forward] = unpack_record(msgpack.packb([row], use_bin_type=True))
    message = Message(b"\x01" * 16, "a/b", b"x", 1, True, "pub", 2.5, None, None)
    assert forward == Forward(message, ("$share/g/a/#",), ("n1",))


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
        [[5, "t", b"", 0, False, None, 0.0, [], [], None]],  # an id that is not bytes
        [[b"\x01" * 16, b"t", b"", 0, False, None, 0.0, [], [], None]],  # a topic not text
        [[b"\x01" * 16, "t", "text", 0, False, None, 0.0, [], [], None]],  # a payload not bytes
        [[b"\x01" * 16, "t", b"", 3, False, None, 0.0, [], [], None]],  # QoS 3
        [[b"\x01" * 16, "t", b"", 0, 1, None, 0.0, [], [], None]],  # retain not a flag
        [[b"\x01" * 16, "t", b"", 0, False, 7, 0.0, [], [], None]],  # a publisher not text
        "text",
    ],
)
def test_records_this_router_did_not_write_are_refused(record: Any) -> None:
    with pytest.raises(MalformedMessageError):
        unpack_record(msgpack.packb(record, use_bin_type=True))


def test_the_ids_remembered_against_repeats_are_bounded_by_time() -> None:
    """Found by `router bench soak`: 200,000 remembered ids grew a node's memory for
    ten minutes at a few hundred copies per second. Ids are kept for half a window of
    seconds at least (a repeat comes from a retry, within seconds), a window at most."""
    now = [0.0]
    seen = SeenIds(limit=100, window=60.0, clock=lambda: now[0])
    seen.add_many([b"a"])
    now[0] = 29.0
    seen.add_many([b"b"])
    now[0] = 31.0
    seen.add_many([b"c"])
    assert seen.known(b"a") and seen.known(b"b") and seen.known(b"c")
    now[0] = 62.0  # a and b were added more than 60 s ago
    seen.add_many([b"d"])
    assert not seen.known(b"a") and not seen.known(b"b")
    assert seen.known(b"c") and seen.known(b"d")
    now[0] = 200.0  # long quiet: everything is forgotten at the next add
    seen.add(b"e")
    assert len(seen) == 1 and seen.known(b"e")


def test_the_ids_remembered_against_repeats_are_bounded_by_count() -> None:
    now = [0.0]
    seen = SeenIds(limit=10, window=60.0, clock=lambda: now[0])
    for number in range(100):
        seen.add(b"%d" % number)
        assert len(seen) <= 10
    assert all(seen.known(b"%d" % number) for number in range(95, 100))
    assert not seen.known(b"0")
    seen.add_many([])
    assert len(seen) <= 10
