"""Waiting on a condition with a deadline: the one poll loop of the test suite.

Tests never sleep a guessed time; they poll a condition every ``POLL`` seconds until it
holds, and fail with a description of what they waited for once the deadline passed.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

POLL = 0.01

Described = str | Callable[[], object]


def _describe(what: Described) -> str:
    return what if isinstance(what, str) else repr(what())


def wait_until(
    condition: Callable[[], bool], timeout: float, what: Described, poll: float = POLL
) -> float:
    """Poll ``condition`` until it holds; return the seconds it took.

    Raises ``TimeoutError`` naming ``what`` after ``timeout`` seconds.
    """
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not within {timeout} s: {_describe(what)}")
        time.sleep(poll)
    return time.monotonic() - start


def pace(start: float, seq: int, rate: float) -> None:
    """Hold item ``seq`` of a load until its time at ``rate`` per second from ``start``
    (the one sleep of a paced load: it waits for a time, not for a condition)."""
    delay = start + seq / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]],
    timeout: float,
    what: Described,
    poll: float = POLL,
) -> float:
    """The asyncio form of :func:`wait_until`; ``condition`` may be a coroutine function."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return loop.time() - start
        if loop.time() - start > timeout:
            raise TimeoutError(f"not within {timeout} s: {_describe(what)}")
        await asyncio.sleep(poll)


async def retried(
    attempt: Callable[[], Awaitable[T]],
    timeout: float,
    errors: tuple[type[BaseException], ...],
    poll: float = 0.1,
) -> T:
    """Await ``attempt()`` until it returns without raising one of ``errors`` (a server on
    its way back, say); return what it returned. After ``timeout`` seconds the last error
    is raised."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        try:
            return await attempt()
        except errors:
            if loop.time() - start > timeout:
                raise
        await asyncio.sleep(poll)
