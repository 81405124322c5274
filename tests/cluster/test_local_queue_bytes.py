"""A local client's delivery queue is bounded in deliveries and in payload bytes
(router.cluster.sessions.local_sessions): random interleavings of what fills and empties it,
checked against a model of what a client must observe; and a slow MQTT client whose
queue outgrows its bytes, seen from a raw client on a node in process."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings, strategies as st

from router.cluster.sessions.local_sessions import ClientSession
from router.core.messages import Delivery
from router.mqtt.server import serve
from router.mqtt.settings import MqttSettings
from tests.support.nodes import StartNode
from tests.support.raw_mqtt import RawClient

LIMIT, LIMIT_BYTES = 5, 1_000


def delivery(number: int, size: int) -> Delivery:
    return Delivery("t", bytes(size), 1, False, number.to_bytes(16, "big"))


operations = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(0, 1_500)),
        st.tuples(st.just("take"), st.integers(1, 4)),
        st.tuples(st.just("take_all"), st.just(0)),
        st.tuples(st.just("put_first"), st.integers(0, 700)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.sampled_from(["drop_oldest", "drop_newest"]))
def test_the_queue_keeps_its_bounds_and_counts_every_drop(
    ops: list[tuple[str, int]], overflow: str
) -> None:
    session = ClientSession("c", LIMIT, overflow, LIMIT_BYTES)  # type: ignore[arg-type]
    model: deque[Delivery] = deque()
    dropped = 0
    for number, (op, value) in enumerate(ops):
        if op == "offer":
            new = delivery(number, value)
            lost = session.offer(new)
            while model and (
                len(model) >= LIMIT or sum(len(d.payload) for d in model) + value > LIMIT_BYTES
            ):
                dropped += 1
                if overflow == "drop_newest":
                    assert lost is new
                    break
                model.popleft()
            else:
                model.append(new)
        elif op == "take":
            assert session.take(value) == [model.popleft() for _ in range(min(value, len(model)))]
        elif op == "take_all":
            assert session.take_all() == list(model)
            model.clear()
        else:  # (what a session held before its client came back: not bounded)
            first = delivery(number, value)
            session.put_first([first])
            model.appendleft(first)
        assert session.take(0) == [] and session.pending() == len(model)
        assert session.queued_bytes == sum(len(d.payload) for d in model)
        assert session.dropped == dropped
    assert session.take_all() == list(model)


@pytest.mark.parametrize("redis_backend", ["fake"], indirect=True)
async def test_a_slow_clients_queue_keeps_its_newest_bytes(start_node: StartNode) -> None:
    """Receive Maximum 1 and no PUBACK: what comes meanwhile waits in the client's queue
    on the node, which keeps 3 of 10 messages of 100 kB (--queue-bytes 300000)."""
    node = await start_node("n1", queue_bytes=300_000)
    async with serve(node, ["127.0.0.1:0"], MqttSettings(sys_interval=0)) as server:
        port = server.addresses[0][1]
        slow = await RawClient.connect(port, "slow", clean_start=True, expiry=0, receive_maximum=1)
        try:
            await slow.subscribe("big/#", 1)
            await node.publish("big/0", bytes([0]) * 100_000, qos=1)
            [first] = await slow.take(1)  # (in flight, not acknowledged: the window is full)
            for n in range(1, 10):
                await node.publish(f"big/{n}", bytes([n]) * 100_000, qos=1)
            session = node.sessions.session("slow")
            assert session.dropped == 6 and session.queued_bytes == 300_000
            slow.acknowledge([first])
            got = []
            for _ in range(3):
                got += await slow.take(1)
                slow.acknowledge(got[-1:])
            assert [p.payload[0] for p in got] == [7, 8, 9]  # (the oldest made room)
        finally:
            slow.drop()
