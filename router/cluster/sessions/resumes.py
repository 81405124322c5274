"""How far the resume of a moved session got: what a new owner reads back from the
session's queue (:mod:`router.cluster.sessions.keeper`), kept between attempts.

A resume drains the queue up to the previous node's handoff marker, then reads that
node's inbox if no handoff came. Redis may fail half-way: :class:`Resume` keeps what was
read and acknowledged (it is nowhere else now), what is still to do, and the deadline of
the wait, so the next attempt on the node goes on from there instead of starting over.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Final

from router.cluster.sessions.recovery import Recovery
from router.core.messages import Delivery
from router.state.session_queue import Drained, Handoff, SessionQueue
from router.state.subscriptions import Owner


@dataclass
class Markers:
    """The handoff markers one drain of a session queue read, and the epochs of the tail
    end markers among them."""

    handoffs: list[Handoff] = field(default_factory=list)
    tail_ends: set[int] = field(default_factory=set)


@dataclass
class Read:
    """What drains of a session's queue read so far: the live deliveries in order and
    the markers (kept as they come: a drain that fails half-way loses nothing it read)."""

    deliveries: list[Delivery] = field(default_factory=list)
    markers: Markers = field(default_factory=Markers)


@dataclass
class Resume:
    """A resume of a session here: what it was given, and how far it got. One that failed
    half-way (Redis failed under it) is kept: the next resume of the session here, or
    its handoff to another node, goes on with it. ``deadline`` (loop time) bounds the
    wait for the previous node's handoff over every attempt."""

    handoff: int | None
    previous: Owner | None
    recovery: Recovery | None
    deadline: float
    stored: set[int] = field(default_factory=set)
    read: Read = field(default_factory=Read)
    waited: bool = False  # the wait for the handoff marker ended
    handed: bool = False  # the marker came
    recovered: bool = False  # the previous node's inbox was read (or its mark released)


#: Seconds between looks at a queue (and at whether its previous owner died) in a wait.
LOOK: Final = 0.5
LENT_WHILE_WAITING: ContextVar[Callable[[], AbstractAsyncContextManager[object]] | None] = (
    ContextVar("lent_while_waiting", default=None)
)
"""What the caller of a connect lends out while its resume waits for another node to hand
the session on (a context manager: given back on entry, taken again on exit). The MQTT
listener sets its CONNECT turn there (:mod:`router.mqtt.connect_turns`): the turns
bound the CONNECTs working at once, and one that only waits for another node needs
none, while the CONNECTs queued behind it would wait past their connect timeout."""
MARKER_LOOKS: Final = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
"""Seconds a resume sleeps before each of its first looks for its handoff marker (one key
read each), then :data:`LOOK` between looks: a live node hands a session on within
milliseconds. The resume no longer subscribes to the queue's wake-ups for this wait: that
is a connection of its own, and when 600 clients resumed at once on a node from a draining
one the subscriptions were a third of the node's CPU (a sampling profile with py-spy),
each resume taking 2.5 s at the median; a kill -9 storm of 667 resumes that wait at once
(their turns lent out) made 667 such connections. A drain that waits for a marker in
what it reads (the tail end of a move) reads again after the same pauses."""


async def wait_for_marker(
    queue: SessionQueue, epoch: int, deadline: float, gone: Callable[[], bool]
) -> None:
    """Return once the handoff marker of ``epoch`` is in ``queue`` (nothing is read: until
    then the node that writes it may still be reading the queue, the tail of an earlier
    move to it), at ``deadline`` (loop time), or once ``gone()`` (its writer is dead).
    It looks :data:`MARKER_LOOKS` apart, then every :data:`LOOK` seconds, lending out
    what :data:`LENT_WHILE_WAITING` names once the first looks found nothing."""
    loop = asyncio.get_running_loop()
    if await _marked(queue, epoch, deadline, gone, MARKER_LOOKS):
        return
    lend = LENT_WHILE_WAITING.get()
    async with contextlib.nullcontext() if lend is None else lend():
        while not await _marked(queue, epoch, deadline, gone, (min(LOOK, deadline - loop.time()),)):
            pass


async def _marked(
    queue: SessionQueue,
    epoch: int,
    deadline: float,
    gone: Callable[[], bool],
    pauses: tuple[float, ...],
) -> bool:
    """True when the wait is over (the marker is there, the deadline passed or its writer
    is gone) at one of the looks after each of ``pauses``."""
    loop = asyncio.get_running_loop()
    for pause in pauses:
        await asyncio.sleep(max(0.0, pause))
        if await queue.handed_off(epoch) or loop.time() >= deadline or gone():
            return True
    return False


async def drain(
    queue: SessionQueue,
    came: Callable[[Drained], bool] | None,
    handoff: int | None,
    read: Read,
    deadline: float,
    gone: Callable[[], bool],
) -> tuple[bool, int]:
    """Drain ``queue`` for its client into ``read``: every delivery in order (expired
    ones dropped and counted) and the markers, until ``came`` finds the marker awaited in
    a read, at most until ``deadline`` (loop time) or ``gone()`` (the node that would
    write it is dead); returns whether it came, and the expired deliveries dropped.
    With ``came`` None: what the queue holds now. With ``handoff``, nothing is read
    before the handoff marker of that epoch is in the queue (within the same bounds)."""
    found = came is None
    expired = 0
    loop = asyncio.get_running_loop()
    pauses = itertools.chain(MARKER_LOOKS[1:], itertools.repeat(LOOK))  # (see MARKER_LOOKS)
    await queue.ensure()
    if handoff is not None:
        await wait_for_marker(queue, handoff, deadline, gone)
    while True:
        drained = await queue.drain()
        now = time.time()
        live = [d for d in drained.deliveries if d.expires_at is None or d.expires_at > now]
        expired += len(drained.deliveries) - len(live)
        read.deliveries += live
        read.markers.handoffs += drained.handoffs
        read.markers.tail_ends.update(drained.tail_ends)
        found = found or (came is not None and came(drained))
        if drained.more:
            continue
        remaining = deadline - loop.time()
        if found or remaining <= 0 or gone():
            break
        await asyncio.sleep(min(next(pauses), remaining))
    return found, expired


def tail_follows(resume: Resume) -> bool:
    """Whether the handoff marker the resume read says a tail follows (not read yet)."""
    markers = resume.read.markers
    marker = next((m for m in markers.handoffs if m.epoch == resume.handoff), None)
    return marker is not None and marker.tail and resume.handoff not in markers.tail_ends
