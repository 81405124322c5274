"""Channel clocks against a brute-force model: random publishes (with repeated ids), fetches,
acks and expired bodies, starting just before the wrap so that every run crosses it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from router.state.channels import CLOCK_LIMIT, Channel, FetchedMessage, Published, next_clock
from router.state.keys import Keys
from router.state.scripts import RedisClient
from tests.state.test_channels import EXPIRE, NAME, plant_clock

SUBSCRIBERS = ("a", "b")


@dataclass
class Model:
    """What the channel should hold: plain dicts and the rules of router/state/channels.py."""

    clock: int
    cursors: dict[str, int] = field(default_factory=dict)
    bodies: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    dedup: dict[str, int] = field(default_factory=dict)

    def publish(self, batch: list[tuple[str, bytes]]) -> list[Published]:
        out = []
        for message_id, content in batch:
            if message_id in self.dedup:
                out.append(Published(message_id, self.dedup[message_id], True))
                continue
            self.clock = next_clock(self.clock)
            self.bodies[self.clock] = (message_id, content)
            self.dedup[message_id] = self.clock
            out.append(Published(message_id, self.clock, False))
        return out

    def fetch(self, subscriber: str, limit: int) -> tuple[list[FetchedMessage], int | None, bool]:
        found: list[FetchedMessage] = []
        position = self.cursors[subscriber]
        last = None
        while len(found) < limit and position != self.clock:
            position = last = next_clock(position)
            if position in self.bodies:
                found.append(FetchedMessage(*self.bodies[position], position))
        return found, last, position != self.clock

    def ack(self, subscriber: str, ack: int) -> bool:
        cursor = self.cursors[subscriber]
        if cursor <= self.clock:
            valid = cursor < ack <= self.clock
        else:
            valid = cursor < ack or ack <= self.clock
        if valid:
            self.cursors[subscriber] = ack
        return valid


@pytest.mark.parametrize("seed", range(3))
async def test_channel_matches_the_model(redis_client: RedisClient, keys: Keys, seed: int) -> None:
    rng = random.Random(seed)
    start = CLOCK_LIMIT - rng.randrange(5, 40)
    await plant_clock(redis_client, keys, start)
    model = Model(clock=start)
    handles: dict[str, list[str]] = {sub: [] for sub in SUBSCRIBERS}
    async with Channel(redis_client, NAME, expire=EXPIRE, keys=keys) as channel:
        for subscriber in SUBSCRIBERS:
            assert await channel.add_subscriber(subscriber) is True
            model.cursors[subscriber] = model.clock
        for step in range(150):
            action = rng.random()
            if action < 0.35:
                batch = [
                    (f"id{rng.randrange(60)}", rng.randbytes(rng.randrange(0, 8)))
                    for _ in range(rng.randrange(0, 6))
                ]
                assert await channel.publish(batch) == model.publish(batch), step
            elif action < 0.65:
                subscriber = rng.choice(SUBSCRIBERS)
                limit = rng.randrange(1, 6)
                result = await channel.fetch(subscriber, max=limit)
                messages, last, more = model.fetch(subscriber, limit)
                assert list(result.messages) == messages, step
                assert result.more is more, step
                assert result.ack_handle == (
                    None if last is None else channel.handle(subscriber, last)
                )
                if result.ack_handle is not None:
                    handles[subscriber].append(result.ack_handle)
            elif action < 0.9:
                subscriber = rng.choice(SUBSCRIBERS)
                if handles[subscriber]:
                    handle = rng.choice(handles[subscriber][-3:])  # sometimes a stale one
                    ack = int(handle.split(":")[0])
                    assert await channel.ack(subscriber, handle) is model.ack(subscriber, ack)
            elif model.bodies:
                clock = rng.choice(sorted(model.bodies))
                del model.bodies[clock]  # the body expired
                await redis_client.delete(keys.channel_body(NAME, clock))
        for subscriber in SUBSCRIBERS:
            cursor = await redis_client.get(keys.channel_cursor(NAME, subscriber))
            assert cursor is not None and int(cursor) == model.cursors[subscriber]
        stored = await redis_client.get(keys.channel_clock(NAME))
        assert stored is not None and int(stored) == model.clock
    assert model.clock < start, "the run did not cross the wrap"
