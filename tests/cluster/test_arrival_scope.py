"""Which subscription changes a publish waits for (router.cluster.visibility): only those
whose filters can match its topics, by their first levels."""

from __future__ import annotations

import asyncio

from router.cluster.visibility import ArrivalOrder, first_levels

WAIT = 5.0


def test_a_change_concerns_the_first_levels_of_its_filters() -> None:
    assert first_levels(["hoard/1", "hoard/2/+", "kept/#"]) == {"hoard", "kept"}
    assert first_levels(["$share/group/sensors/#"]) == {"sensors"}
    assert first_levels(["a/b", "+/b"]) is None  # (a wildcard first: any topic)
    assert first_levels(["#"]) is None
    assert first_levels(["/leading"]) == {""}


async def test_a_publish_waits_for_the_changes_that_can_concern_its_topics() -> None:
    order = ArrivalOrder()
    hoard, anything = order.open(frozenset({"hoard"})), order.open(None)
    order.close(anything)
    await asyncio.wait_for(order.settled(topics=["elsewhere/x"]), WAIT)  # (not hoard's)
    waiting = asyncio.create_task(order.settled(topics=["elsewhere/x", "hoard/1"]))
    await asyncio.sleep(0)
    assert not waiting.done()
    order.close(hoard)
    await asyncio.wait_for(waiting, WAIT)
    wildcard = order.open(None)
    waiting = asyncio.create_task(order.settled(topics=["elsewhere/x"]))
    await asyncio.sleep(0)
    assert not waiting.done()
    order.close(wildcard)
    await asyncio.wait_for(waiting, WAIT)
