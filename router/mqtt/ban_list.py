"""A node's copy of the cluster's bans, and its flapping detector.

The bans live in Redis (:mod:`router.state.ban_store`); each node reads them every
:data:`REFRESH` seconds into a dictionary, so the listeners check a connection against
them with a lookup: its source address at accept (the socket is closed before a byte is
read), its client id and user name at CONNECT, before authentication (CONNACK 0x8A
Banned; 3.1.1: return code 5). A ban read for the first time is handed to ``on_new``,
so that the node ends the connections it names that are open already (DISCONNECT 0x98:
:meth:`MqttServer.end_banned <router.mqtt.server.MqttServer.end_banned>`). A node that
cannot read Redis keeps the bans it had; any other failure of a read (or of writing a
flapping ban) is a bug, handed to ``caught`` (the node's ``internal_error``: counted).

Flapping: a client id that connects more than ``max_connects`` times within ``window``
seconds on one node is banned for ``ban_seconds``, in Redis, so every node refuses it
(EMQX's flapping detection, with its defaults: 15 in a minute, banned 5 minutes). The
node counts each ban it makes (``mqtt_flapping_banned``) and each connection it refuses
for a ban (``mqtt_banned``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from router.cluster.events import EventReporter
from router.cluster.tasks import stop_task
from router.errors import StateError
from router.state.ban_store import Ban, BanStore

log = logging.getLogger(__name__)

#: Seconds between two reads of the cluster's bans.
REFRESH: Final = 1.0


def peer_address(peer: str) -> str:
    """The normalised address of a transport's ``HOST:PORT`` peer (IPv6 too: the port
    follows the last colon), as a ban names it; the text before the port if it is not
    an address."""
    host = peer.rpartition(":")[0].strip("[]")
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host))
    return host


@dataclass(frozen=True)
class Flapping:
    """More than ``max_connects`` CONNECTs of one client id within ``window`` seconds
    ban it for ``ban_seconds`` (``max_connects`` 0: never)."""

    max_connects: int = 15
    window: float = 60.0
    ban_seconds: float = 300.0


class BanList:
    """The bans a node's listeners check (see the module docstring). ``caught`` is told
    of a bug in a read or a write of the bans (the node's
    :meth:`~router.cluster.node.RouterNode.internal_error`)."""

    def __init__(
        self,
        store: BanStore,
        caught: Callable[[str, BaseException], None],
        flapping: Flapping = Flapping(),
        on_new: Callable[[list[Ban]], None] | None = None,
        events: EventReporter | None = None,
    ) -> None:
        self._store = store
        self._caught = caught
        self._events = events
        self._flapping = flapping
        self._on_new = on_new
        self._bans: dict[str, Ban] = {}
        self._connects: dict[str, deque[float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self.banned = 0
        self.flapping_banned = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="bans")

    async def stop(self) -> None:
        """Stop reading the bans and cancel the ban writes under way, waiting for each
        a bounded time (:func:`~router.cluster.tasks.stop_task` logs one that does not
        end)."""
        for task in [*self._writes, *filter(None, [self._task])]:
            await stop_task(task)
        self._task = None

    async def refresh(self) -> None:
        """Read the cluster's bans now; hand those it had not read before to ``on_new``
        (a ban this node made itself is not new: its client is refused already)."""
        known = self._bans
        self._bans = {f"{ban.kind}:{ban.value}": ban for ban in await self._store.bans()}
        now = time.time()
        fresh = [
            ban
            for key, ban in self._bans.items()
            if ban.live(now) and (key not in known or known[key].until < ban.until)
        ]
        if fresh and self._on_new is not None:
            self._on_new(fresh)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except StateError as error:
                log.warning("could not read the bans (keeping the last ones): %s", error)
            except Exception as error:  # (a bug: told as one, the next read goes on)
                self._caught("reading the bans", error)
            self._forget_quiet(time.monotonic())
            await asyncio.sleep(REFRESH)

    def _find(self, field: str) -> Ban | None:
        ban = self._bans.get(field)
        if ban is None or not ban.live(time.time()):
            return None
        self.banned += 1
        return ban

    def address(self, host: str | None) -> Ban | None:
        """The ban on a connection from ``host``, if any."""
        if host is None or not self._bans:
            return None
        with contextlib.suppress(ValueError):
            host = str(ipaddress.ip_address(host))
        return self._find(f"address:{host}")

    def connect(self, client_id: str, user: str | None) -> Ban | None:
        """The ban on a CONNECT of ``client_id`` by ``user``, if any; else the CONNECT
        counts towards the client id's flapping."""
        if self._bans:
            ban = self._find(f"client:{client_id}")
            if ban is None and user is not None:
                ban = self._find(f"user:{user}")
            if ban is not None:
                return ban
        self._count(client_id)
        return None

    def _count(self, client_id: str) -> None:
        flapping = self._flapping
        if not flapping.max_connects:
            return
        now = time.monotonic()
        times = self._connects.setdefault(client_id, deque())
        times.append(now)
        while times and times[0] < now - flapping.window:
            times.popleft()
        if len(times) > flapping.max_connects:
            del self._connects[client_id]
            self._ban_flapping(client_id)

    def _ban_flapping(self, client_id: str) -> None:
        seconds = self._flapping.ban_seconds
        self.flapping_banned += 1
        reason = f"flapping: more than {self._flapping.max_connects} connects"
        self._bans[f"client:{client_id}"] = Ban("client", client_id, time.time() + seconds, reason)
        if self._events is not None:
            self._events.tell(
                "ban_added",
                f"client:{client_id}",
                f"client {client_id} banned for {seconds:.0f} s: {reason}",
                "warning",
            )
        else:
            log.warning("client %s banned for %.0f s (%s)", client_id, seconds, reason)
        write = asyncio.ensure_future(self._write(client_id, seconds, reason))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def _write(self, client_id: str, seconds: float, reason: str) -> None:
        try:
            await self._store.add(
                "client", client_id, seconds=seconds, reason=reason, replace=False
            )
        except StateError as error:
            log.warning("the flapping ban of %s is this node's only: %s", client_id, error)
        except Exception as error:  # (a bug: told as one; the ban holds on this node)
            self._caught("writing a flapping ban", error)

    def _forget_quiet(self, now: float) -> None:
        """Drop the connect times of client ids quiet for a whole window."""
        window = self._flapping.window
        quiet = [c for c, times in self._connects.items() if not times or times[-1] < now - window]
        for client_id in quiet:
            del self._connects[client_id]
