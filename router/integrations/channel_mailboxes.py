"""Mailboxes: the bounded, expiring queues of one process's channels, shared between threads.

A channel layer's node runs on a thread of its own (:mod:`router.integrations.node_thread`)
while the receivers wait on the application's event loops, one or several (``async_to_sync``
runs each call on a loop of its own). :class:`Mailboxes` holds one queue per channel name,
all behind one lock, so any thread may put and any loop may take::

    put(channel, payload, deadline)          (the node's thread, or a sender's loop)
        |
        v
    +--------- channel "specific.ab12!x" -------------------+
    | items: (deadline, payload) (deadline, payload) ...    |  at most capacity(channel)
    | waiters: (loop A, future) (loop B, future) ...        |  receivers, oldest first
    +-------------------------------------------------------+
        |
        v
    await get(channel)                       (a receiver, on its own loop)

Rules:

* ``put`` never blocks: it refuses (returns False) when the channel holds ``capacity``
  items; the caller raises ``ChannelFull`` or counts the drop.
* ``get`` returns the oldest item whose deadline (wall-clock seconds) has not passed;
  older ones are dropped and counted (``expired``).
* An item leaves its mailbox only in the receiver that returns it, with no ``await`` in
  between, so a receiver that is cancelled never takes an item with it. A put wakes one
  waiter (through its loop's ``call_soon_threadsafe``); a woken waiter that was cancelled
  before it ran passes the wake on to the next one.
* ``clear`` (a layer's flush) empties every mailbox and wakes every waiter; their ``get``
  returns None so that the caller may start again.
* A mailbox with no item and no waiter is forgotten (mailboxes come and go with
  channels); :meth:`sweep` drops expired items of channels nobody reads.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

Item = tuple[float, bytes]
"""(deadline in wall-clock seconds, payload)."""
Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class _Mailbox:
    __slots__ = ("items", "waiters")

    def __init__(self) -> None:
        self.items: deque[Item] = deque()
        self.waiters: deque[Waiter] = deque()

    def wake_one(self) -> None:
        """Wake the oldest waiter (it takes an item, or passes the wake on if cancelled);
        a waiter whose loop closed meanwhile is skipped."""
        while self.waiters:
            loop, future = self.waiters.popleft()
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # (its loop is closed: nobody waits there any more)
                continue
            return


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Mailboxes:
    """One bounded queue per channel name; thread-safe (see the module docstring)."""

    def __init__(self, capacity: Callable[[str], int]) -> None:
        self.capacity = capacity
        """The most items a channel holds (channel name -> count)."""
        self._lock = threading.Lock()
        self._boxes: dict[str, _Mailbox] = {}
        self._generation = 0
        self.expired = 0
        """Items dropped because their deadline passed before a receiver took them."""
        self.malformed = 0
        """Items a receiver could not read (:meth:`count_malformed`)."""

    def put(self, channel: str, payload: bytes, deadline: float) -> bool:
        """Append an item; False (nothing changed) when the channel is at capacity."""
        with self._lock:
            box = self._boxes.get(channel)
            if box is None:
                box = self._boxes[channel] = _Mailbox()
            elif len(box.items) >= self.capacity(channel):
                self._drop_expired(box, time.time())
                if len(box.items) >= self.capacity(channel):
                    return False
            box.items.append((deadline, payload))
            box.wake_one()
            return True

    def put_many(self, channels: list[str], payload: bytes, deadline: float) -> list[str]:
        """:meth:`put` the same item into each channel; returns the channels that were full."""
        return [channel for channel in channels if not self.put(channel, payload, deadline)]

    async def get(self, channel: str) -> bytes | None:
        """The channel's oldest live item, waiting for one; None after a :meth:`clear`."""
        loop = asyncio.get_running_loop()
        generation = self._generation
        while True:
            with self._lock:
                if self._generation != generation:
                    return None
                box = self._boxes.get(channel)
                if box is None:
                    box = self._boxes[channel] = _Mailbox()
                self._drop_expired(box, time.time())
                if box.items:
                    _, payload = box.items.popleft()
                    self._forget_if_idle(channel, box)
                    return payload
                waiter: Waiter = (loop, loop.create_future())
                box.waiters.append(waiter)
            try:
                await waiter[1]
            except asyncio.CancelledError:
                with self._lock:
                    if waiter in box.waiters:
                        box.waiters.remove(waiter)
                    elif box.items:  # (woken, but gone: the next receiver takes it)
                        box.wake_one()
                    self._forget_if_idle(channel, box)
                raise

    def count_malformed(self) -> None:
        """Count an item a receiver took but could not read (any thread may call it)."""
        with self._lock:
            self.malformed += 1

    def pending(self, channel: str) -> int:
        """How many items the channel holds now (expired ones included until dropped)."""
        with self._lock:
            box = self._boxes.get(channel)
            return 0 if box is None else len(box.items)

    def sweep(self, now: float | None = None) -> int:
        """Drop every expired item and forget idle mailboxes; returns how many were dropped."""
        now = time.time() if now is None else now
        before = self.expired
        with self._lock:
            for channel, box in list(self._boxes.items()):
                self._drop_expired(box, now)
                self._forget_if_idle(channel, box)
        return self.expired - before

    def clear(self) -> None:
        """Drop every item and wake every waiter (their :meth:`get` returns None)."""
        with self._lock:
            self._generation += 1
            boxes, self._boxes = self._boxes, {}
            for box in boxes.values():
                while box.waiters:
                    box.wake_one()

    def __len__(self) -> int:
        with self._lock:
            return len(self._boxes)

    def _drop_expired(self, box: _Mailbox, now: float) -> None:
        items = box.items
        while items and items[0][0] <= now:
            items.popleft()
            self.expired += 1

    def _forget_if_idle(self, channel: str, box: _Mailbox) -> None:
        if not box.items and not box.waiters and self._boxes.get(channel) is box:
            del self._boxes[channel]
