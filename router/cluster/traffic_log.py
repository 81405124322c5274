"""The traffic log: one JSON line per (sampled) publish, for the Spark pipeline.

A node writes it when it is given a directory (``NodeConfig.traffic_dir``, ``router node
run --traffic-dir``); it is off by default. Each record says what one publish did on the
node that routed it::

    {"time": 1732212345.123456, "node": "node-1", "topic": "sensors/a/t",
     "payload_bytes": 256, "qos": 1, "retain": false,
     "forwarded": ["node-2", "node-3"], "local_deliveries": 2}

``time`` is the publish time in seconds since the epoch (the node's clock), ``forwarded``
the other nodes that got one copy each, ``local_deliveries`` the copies queued for this
node's own clients. ``sample`` (0 < rate <= 1) keeps that fraction of the publishes,
chosen at random.

Files. Records go to a hidden file ``.traffic-NODE-STAMP-PID-SEQ.jsonl.part`` which is
renamed to ``traffic-NODE-STAMP-PID-SEQ.jsonl`` when it reaches ``max_bytes``, when it
is ``max_seconds`` old, or when the log closes. Readers (Spark, Hadoop, ``glob``) skip
names that start with ``.``, so a file is never read half-written: every visible file is
complete.

Never blocking the publish path. :meth:`TrafficLog.record` only appends a tuple to an
in-memory buffer; a background thread formats and writes the records every
``flush_interval`` seconds, handing the GIL back to the event loop every
:data:`FORMAT_SLICE` records. When the buffer holds ``buffer_limit`` records, new ones are
dropped and counted (:meth:`TrafficLog.stats`, and a warning in the log per flush that
saw drops); a failed write counts its records as dropped too. Nothing is lost silently.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections import deque
from collections.abc import Collection
from pathlib import Path
from typing import IO, Final

from router.core.messages import Message
from router.errors import InvalidSettingError

log = logging.getLogger(__name__)

FIELDS: Final = (
    "time",
    "node",
    "topic",
    "payload_bytes",
    "qos",
    "retain",
    "forwarded",
    "local_deliveries",
)
"""The fields of a record, in the order they are written."""
FILE_PREFIX: Final = "traffic-"
FILE_SUFFIX: Final = ".jsonl"
PART_SUFFIX: Final = ".part"
DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_SECONDS: Final = 60.0
DEFAULT_BUFFER_LIMIT: Final = 100_000
DEFAULT_FLUSH_INTERVAL: Final = 0.2
WRITE_BATCH: Final = 10_000  # records formatted into one write, at most
# Records formatted between two hand-overs of the GIL (a fraction of a millisecond): a
# thread that keeps the GIL delays the node's event loop by up to the interpreter's 5 ms
# switch interval, which showed as +4-6 ms of delivery latency p99 at 5,000 msg/s.
FORMAT_SLICE: Final = 64

# (time, topic, payload bytes, qos, retain, forwarded nodes, local deliveries)
_Entry = tuple[float, str, int, int, bool, tuple[str, ...], int]


def file_stem(node_id: str) -> str:
    """The node id as it appears in file names: safe characters only, still unique."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node_id)
    if safe != node_id:
        safe += "-" + hashlib.sha1(node_id.encode("utf-8")).hexdigest()[:8]
    return safe


def format_record(node_id: str, entry: _Entry) -> str:
    """One JSON line (with its newline) for a buffered entry."""
    when, topic, size, qos, retain, forwarded, local = entry
    return (
        json.dumps(
            {
                "time": round(when, 6),
                "node": node_id,
                "topic": topic,
                "payload_bytes": size,
                "qos": qos,
                "retain": retain,
                "forwarded": list(forwarded),
                "local_deliveries": local,
            },
            ensure_ascii=False,
        )
        + "\n"
    )


def _check(name: str, value: object, low: float, high: float, low_open: bool = True) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        number = float(value)  # type: ignore[arg-type]
        ok = (low < number if low_open else low <= number) and number <= high
    if not ok:
        bound = "(" if low_open else "["
        raise InvalidSettingError(f"{name} must be in {bound}{low}, {high}], not {value!r}")


class TrafficLog:
    """A node's traffic log in ``directory`` (created if missing).

    Call :meth:`start` before recording and :meth:`close` at the end (which writes what is
    buffered and completes the current file). Raises :class:`InvalidSettingError` for a
    sample outside (0, 1] or a non-positive limit.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        node_id: str,
        *,
        sample: float = 1.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_seconds: float = DEFAULT_MAX_SECONDS,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        rng: random.Random | None = None,
    ) -> None:
        _check("traffic sample", sample, 0.0, 1.0)
        _check("max_bytes", max_bytes, 0, float("inf"))
        _check("max_seconds", max_seconds, 0.0, float("inf"))
        _check("buffer_limit", buffer_limit, 0, float("inf"))
        _check("flush_interval", flush_interval, 0.0, float("inf"))
        self.directory = Path(directory)
        self.node_id = node_id
        self.sample = float(sample)
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.buffer_limit = buffer_limit
        self.flush_interval = flush_interval
        self._random = (rng or random.Random()).random
        self._buffer: deque[_Entry] = deque()
        self._stem = f"{FILE_PREFIX}{file_stem(node_id)}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: IO[str] | None = None
        self._part: Path | None = None
        self._opened_at = 0.0
        self._written_bytes = 0
        self._sequence = 0
        self.written = 0
        self.dropped = 0
        self.files = 0
        self._reported_drops = 0

    # -- the publish path ------------------------------------------------------------

    def record(self, message: Message, forwarded: Collection[str], local_deliveries: int) -> None:
        """Buffer one publish (if sampled); never blocks, never raises for a full buffer."""
        if self.sample < 1.0 and self._random() >= self.sample:
            return
        if len(self._buffer) >= self.buffer_limit:
            self.dropped += 1
            return
        self._buffer.append(
            (
                time.time(),
                message.topic,
                len(message.payload),
                message.qos,
                message.retain,
                tuple(forwarded),
                local_deliveries,
            )
        )

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Create the directory and start the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"traffic-log:{self.node_id}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the writer thread, write what is buffered, complete the current file."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()

    def stats(self) -> dict[str, int]:
        """Records written, records dropped (buffer full or write failed), files completed."""
        return {
            "traffic_records": self.written,
            "traffic_dropped": self.dropped,
            "traffic_files": self.files,
        }

    # -- the writer thread -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self._flush()
        self._flush()
        self._complete()

    def _flush(self) -> None:
        buffer = self._buffer
        while buffer:
            lines = []
            for _ in range(min(len(buffer), WRITE_BATCH)):
                lines.append(format_record(self.node_id, buffer.popleft()))
                if len(lines) % FORMAT_SLICE == 0:
                    time.sleep(0)  # hand the GIL back to the node's event loop
            self._write("".join(lines), len(lines))
        if self._file is not None and time.monotonic() - self._opened_at >= self.max_seconds:
            self._complete()
        if self.dropped != self._reported_drops:
            log.warning(
                "traffic log of node %s: %d records dropped so far (buffer full or write failed)",
                self.node_id,
                self.dropped,
            )
            self._reported_drops = self.dropped

    def _write(self, text: str, count: int) -> None:
        try:
            if self._file is None:
                self._open()
            assert self._file is not None
            self._file.write(text)
            self._file.flush()
        except OSError:
            log.exception("traffic log of node %s: write failed", self.node_id)
            self.dropped += count
            return
        self.written += count
        self._written_bytes += len(text.encode("utf-8")) if not text.isascii() else len(text)
        if self._written_bytes >= self.max_bytes:
            self._complete()

    def _open(self) -> None:
        self._sequence += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"{self._stem}-{stamp}-{os.getpid()}-{self._sequence:06d}{FILE_SUFFIX}"
        self._part = self.directory / f".{name}{PART_SUFFIX}"
        self._file = self._part.open("w", encoding="utf-8")
        self._opened_at = time.monotonic()
        self._written_bytes = 0

    def _complete(self) -> None:
        """Close the current file and give it its visible name (nothing if none is open)."""
        file, part = self._file, self._part
        if file is None or part is None:
            return
        self._file = self._part = None
        try:
            file.close()
            part.rename(part.with_name(part.name[1 : -len(PART_SUFFIX)]))
            self.files += 1
        except OSError:
            log.exception("traffic log of node %s: cannot complete %s", self.node_id, part)
            with contextlib.suppress(OSError):
                part.unlink()
