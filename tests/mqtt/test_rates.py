"""The token buckets behind the publish rate limits, on a clock the test moves."""

from __future__ import annotations

import pytest

from router.mqtt.rates import AddressRates, ClientRates, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_a_second_of_burst_then_owes_time() -> None:
    clock = Clock()
    bucket = TokenBucket(10, clock)
    bucket.take(10)
    assert bucket.debt() == 0
    bucket.take(5)
    assert bucket.debt() == pytest.approx(0.5)
    clock.now += 0.2
    assert bucket.debt() == pytest.approx(0.3)
    clock.now += 0.3
    assert bucket.debt() == 0
    clock.now += 100  # (it never holds more than a second's worth)
    bucket.take(11)
    assert bucket.debt() == pytest.approx(0.1)


def test_a_connection_waits_for_the_more_indebted_of_its_buckets() -> None:
    clock = Clock()
    rate = ClientRates(100, 1000, 10, clock=clock)
    rate.published(50, 3000)  # (half the messages, three seconds of bytes)
    assert rate.wait() == pytest.approx(2.0)
    rate.subscribed(40)  # (four seconds of filters)
    assert rate.wait() == pytest.approx(3.0)
    unlimited = ClientRates(0, 0, clock=clock)
    unlimited.published(10**6, 10**9)
    assert unlimited.wait() == 0


def test_each_address_opens_at_most_its_rate_and_idle_ones_are_forgotten() -> None:
    clock = Clock()
    rates = AddressRates(3, clock, keep=2)
    assert [rates.allows("10.0.0.1") for _ in range(5)] == [True, True, True, True, False]
    assert rates.allows("10.0.0.2")  # (an address of its own)
    clock.now += 1.5
    assert rates.allows("10.0.0.1")
    clock.now += 1.5
    rates.allows("10.0.0.3")  # (a third address: the full buckets go)
    assert len(rates) == 1
    assert all(AddressRates(0, clock).allows("10.0.0.1") for _ in range(100))
