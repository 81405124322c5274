"""A node's copy of the bans (router.mqtt.ban_list): a read that fails because Redis is
away keeps the bans it had and is no bug; one that fails for a bug is handed to the
node's ``caught`` (counted ``internal_errors``), and the reads go on."""

from __future__ import annotations

from router.cluster.supervisor import Supervisor
from router.errors import StateUnavailableError
from router.mqtt.ban_list import REFRESH, BanList
from router.state.ban_store import Ban
from tests.support.waiting import eventually


class FaultyBans:
    """A ban store that fails each read with ``fault`` (None: reads no ban)."""

    def __init__(self) -> None:
        self.fault: BaseException | None = None
        self.reads = 0

    async def bans(self) -> list[Ban]:
        self.reads += 1
        if self.fault is not None:
            raise self.fault
        return []


async def test_a_bug_reading_the_bans_is_told_as_a_bug_not_as_redis_away() -> None:
    store = FaultyBans()
    supervisor = Supervisor("n1")
    bans = BanList(store, supervisor.caught)
    store.fault = StateUnavailableError(ConnectionError("Redis is away"))
    bans.start()
    try:
        await eventually(lambda: store.reads >= 1, 5.0, "a read while Redis is away")
        assert supervisor.internal_errors == 0
        store.fault = KeyError("a field the code forgot")
        await eventually(lambda: supervisor.internal_errors >= 1, 5.0, "the bug counted")
        assert "reading the bans: KeyError" in supervisor.last_internal_error
        store.fault = None
        reads = store.reads
        await eventually(lambda: store.reads > reads, 3 * REFRESH, "the reads go on")
    finally:
        await bans.stop()
