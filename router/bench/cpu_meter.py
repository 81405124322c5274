"""CPU time of processes, read from ``/proc``: what a broker spent per message of a load.

The benches run on a shared, noisy machine where throughput swings with what else runs;
the CPU a broker's process spent per delivered message moves much less, so it shows an
improvement of the publish path that a rate alone could hide.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (clock-tick resolution), or
    None where ``/proc`` cannot tell (not Linux, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after its ")" do not.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND


def cpu_us_per_message(before: float | None, after: float | None, messages: int) -> float | None:
    """Microseconds of CPU per message between two :func:`cpu_seconds` readings; None if
    either reading failed or no message went through."""
    if before is None or after is None or messages <= 0:
        return None
    return round(1e6 * (after - before) / messages, 2)
