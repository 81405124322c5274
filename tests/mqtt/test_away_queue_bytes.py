"""An away session's Redis queue is bounded in bytes, not only in messages, with real
clients (paho-mqtt) against ``router node run --mqtt-max-queued-bytes N``: large messages
for an away client keep the newest that fit (the default overflow drops the oldest), the
drops are counted in ``/metrics``, and the client gets the rest when it comes back."""

from __future__ import annotations

from contextlib import ExitStack

from router.state.keys import Keys
from tests.support.metrics import scrape
from tests.support.mqtt import TIMEOUT, V5, Paho, connect_properties, mqtt_node
from tests.support.servers import free_port
from tests.support.waiting import wait_until

BOUND = 50_000
BODY = 12_000  # four fit in BOUND, a fifth does not
SENT = 10


def test_an_away_queue_keeps_the_newest_that_fit(redis_standalone_url: str, keys: Keys) -> None:
    env = {"ROUTER_REDIS_URL": redis_standalone_url, "ROUTER_PREFIX": keys.prefix}
    metrics = f"127.0.0.1:{free_port()}"
    bound = ("--mqtt-max-queued-bytes", str(BOUND), "--metrics", metrics)
    with ExitStack() as stack:
        _, port = stack.enter_context(mqtt_node("a", env, *bound))
        expiry = connect_properties(SessionExpiryInterval=600)
        phone = Paho(port, "phone", V5, clean=False, properties=expiry)
        assert phone.connected()[0] == 0
        phone.subscribe("big/#", 1)
        phone.close()  # away: its copies go to its Redis queue

        sender = Paho(port, "sender", V5)
        stack.callback(sender.close)
        assert sender.connected()[0] == 0
        for n in range(SENT):
            sender.publish(f"big/{n}", bytes([65 + n]) * BODY, 1)

        wait_until(
            lambda: scrape(metrics).get("router_session_queue_drops_total", 0) >= SENT - 4,
            TIMEOUT,
            "the drops are counted",
        )
        back = Paho(port, "phone", V5, clean=False, properties=expiry)
        stack.callback(back.close)
        assert back.connected()[0] == 0
        got = [m.topic for m in back.take(4)]
        assert got == [f"big/{n}" for n in range(SENT - 4, SENT)]
        assert back.nothing_more()
        assert scrape(metrics)["router_session_queue_drops_total"] == SENT - 4
