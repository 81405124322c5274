"""Starting, waiting for and stopping child processes (router.ops.processes).

The children are small Python programs: one that listens on a port, one that writes a
line, one that exits at once, one that ignores SIGTERM.
"""

from __future__ import annotations

import functools
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from router.errors import ListenerError, ProcessStartError
from router.ops.processes import (
    answers_ping,
    free_port,
    kill_process,
    listening,
    log_tail,
    logged,
    port_is_free,
    redis_server_command,
    running,
    spawn,
    stop_process,
    wait_ready,
)
from tests.support.servers import require_binary

LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', flush=True)\n"
    "time.sleep(60)\n"
)
SAY = "import sys, time; print(sys.argv[1], flush=True); time.sleep(60)"
FAIL = "import sys; print('no luck', flush=True); sys.exit(3)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def test_a_free_port_can_be_listened_on_and_a_taken_one_cannot() -> None:
    port = free_port()
    assert port_is_free(port) and not listening(port)
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        assert listening(port) and not port_is_free(port)
    assert port_is_free(port)


def test_a_port_with_a_bus_port_has_both_free() -> None:
    port = free_port(bus_offset=10000)
    assert port + 10000 < 65536 and port_is_free(port) and port_is_free(port + 10000)


def test_no_port_pair_fits_past_the_last_port() -> None:
    with pytest.raises(ListenerError):
        free_port(bus_offset=65536)


def test_running_waits_for_the_port_and_stops_the_process(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "listener.log"
    args = python(LISTEN, str(port))
    with running(args, lambda: listening(port), name="listener", log=log) as process:
        assert process.poll() is None and listening(port)
        assert logged(log, "listening")
    assert process.returncode == -signal.SIGTERM  # reaped
    assert not listening(port)


def test_a_log_line_counts_each_time_it_is_written(tmp_path: Path) -> None:
    log = tmp_path / "say.log"
    assert not logged(log, "hello") and log_tail(log) == ""
    for start in (1, 2):
        process = spawn(python(SAY, "node n1 ready"), log=log)
        try:
            said = functools.partial(logged, log, "node n1 ready", start)
            wait_ready(process, said, name="sayer", log=log)
        finally:
            stop_process(process)
    assert log.read_text().count("node n1 ready") == 2  # appended, not overwritten


def test_a_process_that_exits_first_is_one_error_with_its_status_and_log(tmp_path: Path) -> None:
    log = tmp_path / "fail.log"
    started = time.monotonic()
    with (
        pytest.raises(ProcessStartError) as caught,
        running(python(FAIL), lambda: False, name="failing", log=log, timeout=30),
    ):
        pytest.fail("the block ran")  # pragma: no cover
    assert time.monotonic() - started < 10  # the exit was seen, not the deadline
    error = caught.value
    assert (error.name, error.returncode) == ("failing", 3)
    assert "no luck" in error.log_tail
    assert str(error).startswith("failing exited with 3:\n")


def test_a_process_not_ready_by_the_deadline_is_stopped(tmp_path: Path) -> None:
    with (
        pytest.raises(ProcessStartError) as caught,
        running(python(SAY, "hi"), lambda: False, name="slow", timeout=0.3),
    ):
        pytest.fail("the block ran")  # pragma: no cover
    assert caught.value.returncode is None
    assert str(caught.value) == "slow was not ready in time"


def test_waiting_without_a_process_only_has_a_deadline() -> None:
    assert wait_ready(None, lambda: True, name="in-process") >= 0
    with pytest.raises(ProcessStartError, match="in-process was not ready in time"):
        wait_ready(None, lambda: False, name="in-process", timeout=0.1, poll=0.01)


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    process = spawn(python(STUBBORN), log=log)
    wait_ready(process, lambda: logged(log, "up"), name="stubborn", log=log)
    started = time.monotonic()
    assert stop_process(process, timeout=0.3) == -signal.SIGKILL
    assert 0.3 <= time.monotonic() - started < 10
    assert stop_process(process) == -signal.SIGKILL  # already reaped: same status


def test_kill_is_sigkill_and_reaps() -> None:
    process = spawn(python(SAY, "x"))
    assert kill_process(process) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL


def test_a_redis_server_command_keeps_nothing_on_disk_unless_append_only(tmp_path: Path) -> None:
    plain = redis_server_command("redis-server", 7000, tmp_path)
    assert plain[:5] == ["redis-server", "--bind", "127.0.0.1", "--port", "7000"]
    assert plain[plain.index("--save") + 1] == "" and plain[plain.index("--appendonly") + 1] == "no"
    durable = redis_server_command("redis-server", 7000, tmp_path, append_only=True)
    assert durable[durable.index("--appendonly") + 1] == "yes"
    assert durable[durable.index("--appendfsync") + 1] == "always"


@pytest.mark.redis
def test_a_redis_server_answers_once_started(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    assert not answers_ping(url, timeout=0.2)
    command = redis_server_command(require_binary("redis-server"), port, tmp_path)
    with running(command, lambda: answers_ping(url), name="redis-server", timeout=10):
        assert answers_ping(url)
    assert not answers_ping(url, timeout=0.2)
