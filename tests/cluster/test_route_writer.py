"""The route writer's stop leaves no caller waiting: a change whose batch was being
written when the writer stopped, one still gathering, and one submitted after the stop
all fail with RouteWriteError (found by the model-based session test: a handoff ending
after its node stopped waited forever for its routes to be removed, and the node's stop
with it)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import cast

import pytest

from router.cluster.route_writer import RouteWriter
from router.core.topics import TopicFilter
from router.errors import RouteWriteError
from router.state.routes import RouteChange, RouteStore
from tests.support import waiting


class StuckStore:
    """A route store whose writes never end (Redis gone, retries under way)."""

    def __init__(self) -> None:
        self.writing = asyncio.Event()

    async def write(
        self, node_id: str, incarnation: str, batch: Mapping[TopicFilter, int]
    ) -> list[RouteChange]:
        self.writing.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def no_routes() -> dict[TopicFilter, int]:
    return {}


async def claimed(generation: str) -> None:
    return None


async def test_a_stopped_writer_leaves_no_caller_waiting() -> None:
    store = StuckStore()
    writer = RouteWriter(
        cast(RouteStore, store), "n", "i", no_routes, lambda changes: None, claimed
    )
    writer.start()
    under_way = writer.submit(TopicFilter("a"), 1)
    await waiting.eventually(store.writing.is_set, 5, "the first batch is being written")
    gathering = writer.submit(TopicFilter("b"), 1)

    await asyncio.wait_for(writer.stop(), 5)

    for waiter in (under_way, gathering, writer.submit(TopicFilter("c"), 1)):
        with pytest.raises(RouteWriteError):
            await asyncio.wait_for(waiter, 1)
