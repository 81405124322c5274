"""Where a python-socketio message goes: a topic named after its target, and the topics
one server subscribes to (the rooms it holds).

python-socketio's own pub/sub managers put every message on one channel that every
server reads. Here each message goes to the topic of what it addresses, and a server
subscribes to a topic only while it holds a member of its room, so the router carries
a message only to the servers that act on it::

    {channel}/r/{namespace}/{room}    an emit to a room, a close_room; every sid is a
                                      room of its own, so what addresses one sid
                                      (disconnect, enter_room, leave_room, an emit) too
    {channel}/n/{namespace}           an emit to everyone in a namespace (the servers
                                      with a client in it)
    {channel}/h/{host_id}             a callback's reply (and the router's acks), to the
                                      server that asked
    {channel}/all                     anything else, to every server

Each name becomes one topic level, escaped so that no name can break out of its level or
meet another's: ``%``, ``/``, ``+``, ``#``, ``$``, U+0000 and the other control
characters become ``%XX`` (a lone surrogate ``%uXXXX``); a room that is not a ``str``
(an ``int``, say: ``5`` and ``"5"`` are different rooms) is its JSON after ``%j``; a
level over :data:`MAX_LEVEL_BYTES` is ``%h`` and its SHA-256. ``""`` is a valid, empty
level. A topic only routes: the receiving server still reads the room from the message,
so two names sharing a topic (a digest collision) would cost a stray copy, never a
wrong delivery.

:class:`RoomInterest` keeps the subscriptions of one server's router client equal to
the rooms it holds: python-socketio changes its rooms in plain methods
(``basic_enter_room``, ``basic_leave_room``), which only mark the room; one task
subscribes (the room's first member) and unsubscribes (its last left) in the
background, and :meth:`RoomInterest.settled` waits for what was marked so far.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from router.cluster.node import RouterNode
from router.errors import RouterError

MAX_LEVEL_BYTES: Final = 200
"""An escaped name longer than this (UTF-8 bytes) is replaced by its digest."""

ROOM: Final = "r"
NAMESPACE: Final = "n"
HOST: Final = "h"
EVERYONE: Final = "all"
ACK: Final = "router_ack"
"""The method of the router's own replies (see the manager), addressed to one host."""

RETRY_FIRST: Final = 0.1
RETRY_MOST: Final = 5.0
"""Seconds before subscriptions that Redis refused are tried again (doubling)."""

_ESCAPES: Final = {
    **{code: f"%{code:02X}" for code in (*range(0x20), 0x7F)},
    **{ord(c): f"%{ord(c):02X}" for c in "%/+#$"},
    **{code: f"%u{code:04X}" for code in range(0xD800, 0xE000)},
}

Room = Hashable | None
"""A python-socketio room: None is everyone in the namespace, a sid is a room too."""

RoomKey = tuple[str, Room]
"""(namespace, room)."""


def escape_level(text: str) -> str:
    """``text`` as one topic level: no separator, wildcard, ``$``, U+0000 or lone
    surrogate left, one to one (``%`` is escaped too), shortened to a digest if long."""
    level = text.translate(_ESCAPES)
    if len(level) * 4 > MAX_LEVEL_BYTES and len(level.encode()) > MAX_LEVEL_BYTES:
        return "%h" + hashlib.sha256(level.encode()).hexdigest()
    return level


def room_level(room: object) -> str:
    """The topic level of a room name: a ``str`` escaped, anything else its JSON after
    ``%j`` (escaping never makes ``%j``, so the two never meet)."""
    if isinstance(room, str):
        return escape_level(room)
    return "%j" + escape_level(json.dumps(room, sort_keys=True, default=repr))


@dataclass(frozen=True)
class Topics:
    """The topics of one python-socketio channel (what ``channel=`` names)."""

    channel: str

    @cached_property
    def _base(self) -> str:
        return escape_level(self.channel)

    def room(self, namespace: str, room: object) -> str:
        """The topic of an emit to ``room`` of ``namespace`` (None: everyone in it)."""
        if room is None:
            return f"{self._base}/{NAMESPACE}/{escape_level(namespace)}"
        return f"{self._base}/{ROOM}/{escape_level(namespace)}/{room_level(room)}"

    def host(self, host_id: str) -> str:
        """The topic of the server whose manager has ``host_id``."""
        return f"{self._base}/{HOST}/{escape_level(host_id)}"

    def everyone(self) -> str:
        return f"{self._base}/{EVERYONE}"

    def of(self, message: Mapping[str, Any]) -> list[str]:
        """The topics a python-socketio pub/sub message goes to (one per room of an emit
        to several rooms: the receivers drop the copies after the first)."""
        method = message.get("method")
        namespace = message.get("namespace") or "/"
        if method == "emit":
            room = message.get("room")
            if isinstance(room, list | tuple):
                return list(dict.fromkeys(self.room(namespace, r) for r in room))
            return [self.room(namespace, room)]
        if method in ("disconnect", "enter_room", "leave_room"):
            return [self.room(namespace, message.get("sid"))]
        if method == "close_room":
            return [self.room(namespace, message.get("room"))]
        if method in ("callback", ACK):
            return [self.host(str(message.get("host_id")))]
        return [self.everyone()]


class RoomInterest:
    """Subscribes one router client to the topic of each room its server holds.

    ``held(key)`` says whether the server holds room ``key`` now; :meth:`mark` records
    that it may have changed. The task of :meth:`run` subscribes and unsubscribes
    (QoS 1, ``no_local``: a server never gets its own messages back) until the
    subscriptions match; Redis refusing one is logged, counted (``failures``) and
    tried again later.
    """

    def __init__(
        self,
        topics: Topics,
        held: Callable[[RoomKey], bool],
        logger: Callable[[], logging.Logger],
    ) -> None:
        self._topics = topics
        self._held = held
        self._logger = logger
        self._dirty: set[RoomKey] = set()
        self._subscribed: set[str] = set()
        self._marked = 0  # marks so far
        self._applied = 0  # marks taken into account by a finished pass
        self._wake = asyncio.Event()
        self._passes = asyncio.Condition()
        self.failures = 0

    @property
    def subscribed(self) -> frozenset[str]:
        """The room topics the client subscribes to now."""
        return frozenset(self._subscribed)

    def mark(self, key: RoomKey) -> None:
        """Room ``key`` may have gained its first or lost its last local member."""
        self._dirty.add(key)
        self._marked += 1
        self._wake.set()

    def forget(self, held: list[RoomKey]) -> None:
        """The client's subscriptions are gone (its session ended and began again):
        subscribe anew to the rooms ``held`` now."""
        self._subscribed.clear()
        for key in held:
            self.mark(key)
        self._marked += 1  # (settled() waits for a pass even when nothing is held)
        self._wake.set()

    async def settled(self) -> None:
        """Wait until a pass of :meth:`run` took in every mark made before the call (the
        subscriptions it asked for are confirmed on every live node; one that Redis
        refused is retried in the background)."""
        target = self._marked
        async with self._passes:
            await self._passes.wait_for(lambda: self._applied >= target)

    async def run(self, node: RouterNode, client_id: str) -> None:
        """Apply the marks, for ever (cancel to stop)."""
        backoff = RETRY_FIRST
        while True:
            await self._wake.wait()
            self._wake.clear()
            target, keys, self._dirty = self._marked, self._dirty, set()
            failed = await self._apply(node, client_id, keys)
            async with self._passes:
                self._applied = target
                self._passes.notify_all()
            if not failed:
                backoff = RETRY_FIRST
                continue
            self.failures += 1
            self._dirty |= failed
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, RETRY_MOST)
            self._wake.set()

    async def _apply(self, node: RouterNode, client_id: str, keys: set[RoomKey]) -> set[RoomKey]:
        """Subscribe or unsubscribe each room that changed; return those that failed."""
        failed: set[RoomKey] = set()
        added = False
        for key in keys:
            topic = self._topics.room(*key)
            wanted = self._held(key)
            if wanted == (topic in self._subscribed):
                continue
            try:
                if wanted:
                    await node.subscribe(client_id, topic, qos=1, no_local=True, confirm=False)
                    self._subscribed.add(topic)
                    added = True
                else:
                    await node.unsubscribe(client_id, topic)
                    self._subscribed.discard(topic)
            except RouterError as error:
                self._logger().error("cannot %s %s: %s", _verb(wanted), topic, error)
                failed.add(key)
        if added:
            with contextlib.suppress(RouterError):
                await node.confirm_routes()
        return failed


def _verb(wanted: bool) -> str:
    return "subscribe to" if wanted else "unsubscribe from"
