"""A CONNECT's turn (:class:`router.mqtt.connect_turns.ConnectTurn`): lent out while its
resume waits for another node, taken again after, never given back twice."""

from __future__ import annotations

import asyncio

import pytest

from router.mqtt.connect_turns import ConnectTurn


async def test_a_lent_turn_lets_another_connect_in_and_is_taken_again_after() -> None:
    turns = asyncio.Semaphore(1)
    mine = ConnectTurn(turns)
    await mine.take()
    other = ConnectTurn(turns)
    async with mine.lent():
        await asyncio.wait_for(other.take(), 1.0)  # (the turn is free meanwhile)
        assert not mine.held
        other.give_back()
    assert mine.held and turns.locked()
    mine.give_back()
    mine.give_back()  # (once only)
    assert not turns.locked()
    await turns.acquire()  # (one turn, not two: one acquire takes it all)
    assert turns.locked()


async def test_a_turn_not_held_is_not_lent() -> None:
    turns = asyncio.Semaphore(1)
    turn = ConnectTurn(turns)
    async with turn.lent():
        assert not turn.held
    assert not turn.held and not turns.locked()


async def test_a_lent_turn_cancelled_while_taken_again_is_not_given_back_twice() -> None:
    turns = asyncio.Semaphore(1)
    mine = ConnectTurn(turns)
    await mine.take()
    other = ConnectTurn(turns)

    async def wait_lent() -> None:
        async with mine.lent():
            await other.take()  # (someone else has the turn when the block ends)

    task = asyncio.create_task(wait_lent())
    async with asyncio.timeout(1.0):  # (until the other connect holds the lent turn)
        while not other.held:
            await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    mine.give_back()  # (not held: nothing given back)
    other.give_back()
    await turns.acquire()  # (one turn, not two: one acquire takes it all)
    assert turns.locked()
