"""The route fence (router.cluster.route_fence) between nodes joined by an in-memory
channel that can lose messages: a live peer that is slow to settle is waited for, a lost
ask is asked again, and a silent peer costs the bound once, not at every round."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from router.cluster.route_fence import RouteFence
from router.cluster.visibility import ArrivalOrder

BOUND = 2.0
RETRY = 0.05


class Channel:
    """Pub/sub for fences: every message reaches every fence but those muted, unless
    ``lose`` says it is lost."""

    def __init__(self) -> None:
        self.fences: dict[str, RouteFence] = {}
        self.muted: set[str] = set()
        self.asks = 0
        self.lose: Callable[[list[object]], bool] = lambda message: False

    def node(self, node_id: str, arrivals: ArrivalOrder) -> RouteFence:
        fence = RouteFence(
            Fences(self),
            node_id,
            arrivals,
            lambda: [n for n in self.fences if n != node_id],
            _caught_up,
            BOUND,
            RETRY,
        )
        self.fences[node_id] = fence
        return fence

    def publish(self, message: list[object]) -> None:
        self.asks += message[0] == "ask"
        if self.lose(message):
            return
        data = json.dumps(message).encode()
        for node_id, fence in self.fences.items():
            if node_id not in self.muted:
                asyncio.get_running_loop().call_soon(fence.heard, data)


class Fences:
    """What RouteFence sends through (router.state.route_fence_channel.RouteFences)."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    async def ask(self, asker: str, number: int) -> None:
        self._channel.publish(["ask", asker, number])

    async def settled(self, peer: str, asker: str, number: int) -> None:
        self._channel.publish(["settled", peer, asker, number])


async def _caught_up() -> None:
    """The asker's mirror reads the peers' streams (nothing to read here)."""


async def test_a_peer_slower_than_a_retry_is_waited_for_until_it_settled() -> None:
    """Peer B read a SUBSCRIBE that takes 10 retries to apply (a loaded Redis Cluster):
    A's fence passes only once it applied. Before, the fence gave up after 0.25 s and
    the publish was matched without the route (the CI flake of
    tests/mqtt/test_visibility.py, new publisher on another node)."""
    channel, b_arrivals = Channel(), ArrivalOrder()
    a = channel.node("a", ArrivalOrder())
    channel.node("b", b_arrivals)
    subscribe = b_arrivals.open()
    applied = asyncio.get_running_loop().call_later(10 * RETRY, b_arrivals.close, subscribe)
    await a.passed()
    assert subscribe.done()
    assert a.stats()["route_fence_unanswered"] == 0
    applied.cancel()


async def test_a_lost_ask_is_asked_again() -> None:
    channel = Channel()
    a = channel.node("a", ArrivalOrder())
    channel.node("b", ArrivalOrder())
    lost: list[list[object]] = []

    def lose_the_first_ask(message: list[object]) -> bool:
        if message[0] == "ask" and not lost:
            lost.append(message)
            return True
        return False

    channel.lose = lose_the_first_ask
    await a.passed()
    assert lost == [["ask", "a", 1]]
    assert channel.asks == 2
    assert a.stats() == {"route_fence_rounds": 1, "route_fence_unanswered": 0}


async def test_a_silent_peer_costs_the_bound_once_then_a_retry_until_it_answers() -> None:
    """B hears nothing (its pub/sub broken): the first round asks until the bound, the
    next asks once; once B answered again, it is waited for again."""
    channel = Channel()
    a = channel.node("a", ArrivalOrder())
    channel.node("b", ArrivalOrder())
    channel.muted.add("b")
    await a.passed()
    first_round = channel.asks
    assert first_round >= BOUND / RETRY / 2
    await a.passed()
    assert channel.asks == first_round + 1
    assert a.stats()["route_fence_unanswered"] == 2
    channel.muted.clear()
    b_arrivals = ArrivalOrder()
    channel.node("b", b_arrivals)
    await a.passed()
    subscribe = b_arrivals.open()
    asyncio.get_running_loop().call_later(4 * RETRY, b_arrivals.close, subscribe)
    await a.passed()
    assert subscribe.done()
    assert a.stats()["route_fence_unanswered"] == 2


async def test_a_peer_that_leaves_during_a_round_is_not_waited_for() -> None:
    channel = Channel()
    a = channel.node("a", ArrivalOrder())
    channel.node("b", ArrivalOrder())
    channel.muted.add("b")
    asyncio.get_running_loop().call_later(3 * RETRY, channel.fences.pop, "b")
    await a.passed()
    assert channel.asks < BOUND / RETRY / 2
    assert a.stats()["route_fence_unanswered"] == 0


async def test_callers_that_come_while_a_round_runs_share_the_next() -> None:
    channel, b_arrivals = Channel(), ArrivalOrder()
    a = channel.node("a", ArrivalOrder())
    channel.node("b", b_arrivals)
    subscribe = b_arrivals.open()
    asyncio.get_running_loop().call_later(3 * RETRY, b_arrivals.close, subscribe)
    await asyncio.gather(*(a.passed() for _ in range(50)))
    assert a.stats()["route_fence_rounds"] <= 2
