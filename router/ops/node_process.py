"""Settings of a process whose whole life is one router node (``router node run``).

An application that embeds a node keeps its own garbage-collector policy: nothing here
runs unless such a process calls it.
"""

from __future__ import annotations

import gc

# Allocations (less deallocations) of tracked objects between two young collections.
YOUNG_THRESHOLD = 10_000


def settle_collector() -> None:
    """Collect once, take every object alive now out of the collector's scans, and
    collect the young generation only every ``YOUNG_THRESHOLD`` allocations.

    A started node holds what it will keep for its whole life (modules, its mirror,
    scripts, connections). ``gc.freeze`` moves those objects to the permanent
    generation, so later full collections scan only what was allocated since. On the
    2-core development machine full collections of a bench node took up to 57 ms, and
    delivery latency p99 at 5,000 msg/s fell from 2.8-7.6 ms to 2.4-3.3 ms with the
    freeze (``router bench cluster``).

    Every message makes about ten tracked objects (packet, message, forward, rows, ...)
    that live until its batch is written. At the default threshold of 700 a young
    collection ran every ~70 messages and scanned the batches in flight, then promoted
    them to be scanned again: a sampling profile (py-spy ``--native``) of
    ``router bench mqtt`` put 8-9% of each node's CPU in the collector. At 50,000 it
    measured under 0.1%, but the one 10-minute ``router bench soak`` run at 50,000
    measured RSS growth 1.05 MiB/min (target 1.0; 0.39-0.80 in five runs at 700): cyclic
    garbage of the reconnect storms after a fault may wait longer and raise the
    allocator's high-water mark (not proven by one run). At 10,000 the collector was
    again under 0.1% of the bench's profile and the soak measured 0.81 MiB/min.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
