"""A router node on a thread of its own, serving callers on any event loop or thread.

Django runs the same code on many loops: Daphne's or Uvicorn's loop, and a new loop for
every ``async_to_sync`` call from a view or a Celery task. A node per loop would join
and leave the cluster at every such call; a :class:`NodeThread` keeps one node per
process instead, on a daemon thread running its own loop::

    caller's loop ----- call(factory) ------> node's loop (thread "router-...")
       await  <-------- result / exception ---   factory() runs to the end there

* ``start`` (idempotent, safe from any thread) starts the thread and returns once
  ``body`` reported the node ready; a body that fails first raises its error to every
  caller waiting, and the next ``start`` tries again.
* ``call(factory)`` runs ``factory()`` on the node's loop. A caller that is cancelled
  stops waiting, but the coroutine runs to its end there: the node's state never stops
  half-way through a subscribe.
* ``stop`` sets the body's stop event and waits until the thread ended (the body
  leaves the cluster gracefully); at interpreter exit a running thread is stopped the
  same way (:mod:`atexit`).
* After ``os.fork()`` the child has no thread: :attr:`running` is False there, and the
  owner starts a new one (with a new identity: see the layer).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

EXIT_TIMEOUT = 10.0
"""Seconds a thread still running at interpreter exit has to leave the cluster."""
READ_TIMEOUT = 5.0
"""Seconds :meth:`NodeThread.read` waits for the node's loop by default."""

Body = Callable[[Callable[[], None], asyncio.Event], Coroutine[Any, Any, None]]
"""``body(ready, stop)``: serve, call ``ready()`` once callers may use it, return after
``stop`` is set (or raise)."""


class NodeThread:
    """Runs ``body`` on a daemon thread with its own event loop (see the module docstring)."""

    def __init__(self, name: str, body: Body) -> None:
        self._name = name
        self._body = body
        self._guard = threading.Lock()
        self._pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready: concurrent.futures.Future[None] | None = None
        self._finished: concurrent.futures.Future[None] | None = None
        self._stop: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        """True while this process's thread serves (started and not stopped)."""
        ready = self._ready
        return (
            self._pid == os.getpid()
            and ready is not None
            and ready.done()
            and ready.exception() is None
            and not self._finished_now()
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The node's loop (only while started)."""
        if self._loop is None:
            raise RuntimeError("the node thread is not started")
        return self._loop

    async def start(self) -> None:
        """Start the thread unless it runs; return once ``body`` is ready."""
        await asyncio.wrap_future(self._launch())

    def start_blocking(self) -> None:
        """:meth:`start` for a caller outside any event loop."""
        self._launch().result()

    async def call(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``factory()`` on the node's loop and return its result (see the module)."""
        if not self.running:  # (awaiting a done start would cost a wake-up of this loop)
            await self.start()
        future = asyncio.run_coroutine_threadsafe(_to_the_end(factory), self.loop)
        return await asyncio.wrap_future(future)

    def read(self, function: Callable[[], T], timeout: float = READ_TIMEOUT) -> T:
        """``function()`` run on the node's loop, waited for here (a read of state that
        only the node's thread changes); ``TimeoutError`` after ``timeout`` seconds.
        Called from the node's thread itself, or while it does not run, it runs here."""
        loop = self._loop
        if loop is None or not self.running or threading.current_thread() is self._thread:
            return function()
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                answer.set_result(function())
            except BaseException as error:
                answer.set_exception(error)

        loop.call_soon_threadsafe(run)
        return answer.result(timeout)

    async def stop(self) -> None:
        """Stop the thread and wait until it ended; nothing when it does not run."""
        finished = self._request_stop()
        if finished is not None:
            await asyncio.wrap_future(finished)
            self._join()

    def stop_blocking(self, timeout: float | None = None) -> None:
        """:meth:`stop` for a caller outside any event loop (at exit)."""
        finished = self._request_stop()
        if finished is not None:
            concurrent.futures.wait([finished], timeout)
            self._join()

    # -- inside ----------------------------------------------------------------------

    def _launch(self) -> concurrent.futures.Future[None]:
        with self._guard:
            if self._pid != os.getpid():  # (forked: the parent's thread is not here)
                self._pid = os.getpid()
                self._ready = self._finished = None
            ready = self._ready
            failed = ready is not None and ready.done() and ready.exception() is not None
            if ready is not None and not failed and not self._finished_now():
                return ready
            ready = self._ready = concurrent.futures.Future()
            finished = self._finished = concurrent.futures.Future()
            # (a loop factory: a Runner would otherwise set its loop as this thread's)
            runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
            self._loop = runner.get_loop()
            stop = self._stop = asyncio.Event()
            self._thread = threading.Thread(
                target=self._run, args=(runner, stop, ready, finished), name=self._name, daemon=True
            )
            self._thread.start()
            atexit.register(self.stop_blocking, EXIT_TIMEOUT)
            return ready

    def _run(
        self,
        runner: asyncio.Runner,
        stop: asyncio.Event,
        ready: concurrent.futures.Future[None],
        finished: concurrent.futures.Future[None],
    ) -> None:
        try:
            with runner:  # (closing it cancels what still runs, then closes the loop)
                runner.run(self._body(lambda: ready.set_result(None), stop))
        except BaseException as error:  # (reported to the callers through ``ready``)
            if not ready.done():
                ready.set_exception(error)
            elif not isinstance(error, Exception):
                raise
            else:
                log.error("%s ended: %r", self._name, error)
        finally:
            atexit.unregister(self.stop_blocking)
            if not ready.done():
                ready.set_exception(RuntimeError(f"{self._name} ended before it was ready"))
            finished.set_result(None)

    def _request_stop(self) -> concurrent.futures.Future[None] | None:
        with self._guard:
            finished, loop = self._finished, self._loop
            if finished is None or loop is None or self._pid != os.getpid():
                return None
        if not finished.done():
            with contextlib.suppress(RuntimeError):  # (a closed loop: the thread is ending)
                loop.call_soon_threadsafe(self._set_stop)
        return finished

    def _set_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _join(self) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _finished_now(self) -> bool:
        finished = self._finished
        return finished is not None and finished.done()


async def _to_the_end(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``factory()``, shielded: a cancelled caller does not cut it short."""
    return await asyncio.shield(factory())
