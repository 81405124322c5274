"""The supervisor of a node's background tasks: restart with backoff, count, report."""

from __future__ import annotations

import asyncio

from router.cluster.supervisor import Supervisor
from tests.support import waiting


async def test_a_failing_task_is_restarted_counted_and_reported_down_after_the_grace() -> None:
    supervisor = Supervisor("n", first_delay=0.01, max_delay=0.02, healthy_after=0.5, grace=0.1)
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError(f"failure {calls}")

    supervisor.start("broken", broken)
    await waiting.eventually(lambda: calls >= 3, 5.0, "three attempts")
    assert supervisor.restarts >= 3
    assert supervisor.failing()["broken"].startswith("RuntimeError: failure")
    await waiting.eventually(lambda: "broken" in supervisor.down(), 5.0, "down after the grace")
    await supervisor.stop()


async def test_a_task_that_recovers_is_healthy_again() -> None:
    supervisor = Supervisor("n", first_delay=0.01, healthy_after=0.2, grace=10.0)
    recovered = asyncio.Event()

    async def flaky() -> None:
        if not recovered.is_set():
            recovered.set()
            raise ConnectionError("once")
        await asyncio.Event().wait()  # (runs until cancelled)

    supervisor.start("flaky", flaky)
    await waiting.eventually(lambda: supervisor.restarts == 1, 5.0, "one restart")
    assert "flaky" in supervisor.failing() and not supervisor.down()
    await waiting.eventually(lambda: not supervisor.failing(), 5.0, "healthy after 0.2 s")
    await supervisor.stop()


async def test_a_task_that_returns_is_finished_not_restarted() -> None:
    supervisor = Supervisor("n", first_delay=0.01)
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1

    supervisor.start("once", once)
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "once:n"]
    await asyncio.wait_for(task, 5.0)  # the supervising task ends: no restart follows
    assert runs == 1 and supervisor.restarts == 0 and not supervisor.failing()
    await supervisor.stop()
