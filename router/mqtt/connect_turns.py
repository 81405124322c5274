"""The turn a CONNECT holds while the node works on it, lent out while it only waits.

The MQTT listener bounds the CONNECTs the node works on at once (``max_connecting``,
:class:`~router.mqtt.settings.MqttSettings`): one waiting for a turn past its connect
timeout is refused with 0x89. A resume of a session that another node hands on waits for
that node's handoff marker (:func:`router.cluster.sessions.resumes.wait_for_marker`),
which costs this node nothing; holding the turn meanwhile made the CONNECTs behind it
wait, and a storm of resumes from a draining node queued past their timeout (822 of 4,001
reconnects refused in a rolling upgrade under load). :class:`ConnectTurn` is the turn of
one CONNECT: the connect lends it out while it waits
(:data:`~router.cluster.sessions.resumes.LENT_WHILE_WAITING`) and takes a turn again,
without a deadline, to finish: the client's CONNECT is already under way, and the turns
only bound the work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class ConnectTurn:
    """One CONNECT's share of ``turns`` (``held`` while it has it)."""

    def __init__(self, turns: asyncio.Semaphore) -> None:
        self.turns = turns
        self.held = False

    async def take(self) -> None:
        await self.turns.acquire()
        self.held = True

    def give_back(self) -> None:
        """Give the turn back (no-op when not held)."""
        if self.held:
            self.held = False
            self.turns.release()

    @contextlib.asynccontextmanager
    async def lent(self) -> AsyncIterator[None]:
        """The turn is given back for the block and taken again after it (when it was
        held on entry: otherwise nothing happens)."""
        if not self.held:
            yield
            return
        self.give_back()
        try:
            yield
        finally:
            await self.take()
