"""The cluster's users and ACL on one node (router.cluster.shared_auth): a refresh that
fails because Redis is away keeps the copy and is an outage; one that fails for a bug is
counted as a bug (``internal_errors``), logged at ERROR with its type, and the refreshes
go on."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from router.cluster.shared_auth import SharedAuth
from router.core.acl import Acl, Permission
from router.errors import StateUnavailableError
from router.state.auth_store import AuthSnapshot, AuthStore
from router.state.keys import Keys
from tests.support.nodes import StartNode
from tests.support.waiting import eventually


class FaultyStore(AuthStore):
    """The users and ACL in Redis, as read by a store that fails when told to: ``down``
    stands for Redis being away, ``garbled`` for a reader that hands on a rule it did not
    parse (a bug: the text instead of an :class:`AclRule`)."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        super().__init__(redis, keys)
        self.down = False
        self.garbled = False
        self.reads = 0

    async def count(self) -> int:
        self.reads += 1
        if self.down:
            raise StateUnavailableError(ConnectionError("Redis is away"))
        return await super().count()

    async def snapshot(self) -> AuthSnapshot:
        snapshot = await super().snapshot()
        if not self.garbled:
            return snapshot
        garbled: Any = "allow all all #"
        return AuthSnapshot(snapshot.count, snapshot.users, (*snapshot.rules, garbled))


async def test_a_bug_in_a_refresh_is_told_as_a_bug_not_as_redis_away(
    start_node: StartNode, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    node = await start_node("n1", acl=Acl((), Permission.DENY))
    store = FaultyStore(node.registry.redis, keys)
    shared = await SharedAuth(node, store, refresh=0.01).start()
    try:
        store.down = True
        reads = store.reads
        await eventually(lambda: store.reads > reads + 3, 5.0, "refreshes while Redis is away")
        assert node.stats()["internal_errors"] == 0  # (an outage: the copy stays)
        store.down = False

        with caplog.at_level(logging.ERROR, logger="router.cluster.supervisor"):
            store.garbled = True
            await store.add_user("bob", "b0b")
            await eventually(lambda: node.stats()["internal_errors"] >= 1, 5.0, "the bug counted")
        told = [r for r in caplog.records if r.name == "router.cluster.supervisor"]
        assert told and told[0].levelno == logging.ERROR
        assert "AclRuleError" in told[0].getMessage()
        assert "users and ACL" in told[0].getMessage()

        store.garbled = False
        await eventually(lambda: shared.users == 1, 5.0, "the refreshes go on")
    finally:
        await shared.stop()
