"""The node's ledger of unfinished packets without I/O (:mod:`router.mqtt.unfinished`),
and the packet reader's part in it: it holds what arrived, never what a fixed header
announces."""

from __future__ import annotations

import tracemalloc

from router.mqtt.codec import MAX_PACKET_SIZE, PacketReader
from router.mqtt.packets import MQTT_5
from router.mqtt.unfinished import UnfinishedPackets


def test_bytes_past_the_bound_are_refused_and_not_counted() -> None:
    ledger: UnfinishedPackets[str] = UnfinishedPackets(max_bytes=100, timeout=0)
    assert ledger.take(60) and ledger.take(40)
    assert not ledger.take(1)
    assert (ledger.held, ledger.peak) == (100, 100)
    ledger.give(70)
    assert ledger.take(50) and (ledger.held, ledger.peak) == (80, 100)
    unbounded: UnfinishedPackets[str] = UnfinishedPackets(max_bytes=0, timeout=0)
    assert unbounded.take(1 << 40)


def test_packets_are_overdue_oldest_first_and_a_new_start_moves_to_the_end() -> None:
    ledger: UnfinishedPackets[str] = UnfinishedPackets(max_bytes=0, timeout=10)
    assert ledger.next_due() is None and ledger.overdue(100) == []
    ledger.begin("a", 1.0)
    ledger.begin("b", 2.0)
    ledger.begin("c", 3.0)
    ledger.begin("a", 4.0)  # (a began a new packet: now the latest)
    assert len(ledger) == 3 and ledger.next_due() == 12.0
    assert ledger.overdue(11.9) == []
    assert ledger.overdue(13.0) == ["b", "c"]
    assert len(ledger) == 1 and ledger.next_due() == 14.0
    ledger.end("a")
    ledger.end("a")  # (ending twice is harmless)
    assert len(ledger) == 0 and ledger.next_due() is None


def test_no_timeout_means_nothing_is_ever_overdue() -> None:
    ledger: UnfinishedPackets[str] = UnfinishedPackets(max_bytes=0, timeout=0)
    ledger.begin("a", 0.0)
    assert ledger.next_due() is None and ledger.overdue(1e9) == []


def test_the_reader_holds_what_arrived_not_what_the_header_announced() -> None:
    """A fixed header announcing 256 MB and ten bytes of body cost ten bytes."""
    reader = PacketReader(MAX_PACKET_SIZE)
    reader.level = MQTT_5
    tracemalloc.start()
    try:
        assert reader.feed(b"\x30\xff\xff\xff\x7f" + b"\x00\x01t" + b"x" * 7) == []
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.buffered == 15
    assert peak < 64 << 10, f"{peak} bytes allocated for 15 bytes received"
    reader.discard()
    assert reader.buffered == 0
