"""The alias mirror without Redis (:class:`router.mqtt.alias_mirror.AliasMirror`): what one
flush writes, for the real tables of a connection (:class:`InboundLimits`,
:class:`PublishEncoder`) and a store that records the copies."""

from __future__ import annotations

from router.core.messages import Delivery
from router.errors import RouterError
from router.mqtt.alias_mirror import AliasMirror
from router.mqtt.inbound import InboundLimits
from router.mqtt.outgoing import PublishEncoder
from router.mqtt.packets import MQTT_5, Publish
from router.mqtt.properties import Properties
from router.state.alias_store import AliasCopy
from router.state.subscriptions import Owner

OWNER = Owner("n1", 7)


class Recorder:
    """A store that keeps every batch of copies it was given."""

    def __init__(self) -> None:
        self.batches: list[list[AliasCopy]] = []

    async def mirror(self, copies: list[AliasCopy]) -> list[int | RouterError]:
        self.batches.append(list(copies))
        return [0 for _ in copies]


def no_bug(where: str, error: BaseException) -> None:
    raise AssertionError(f"a bug in {where}: {error!r}")


def recorded(claim: Owner | None) -> tuple[Recorder, AliasMirror]:
    """A mirror writing to a :class:`Recorder`, this node holding ``claim`` on every client."""
    store = Recorder()
    return store, AliasMirror(store, lambda client_id: claim, no_bug)


def bind(limits: InboundLimits, alias: int, topic: str) -> None:
    limits.topic(Publish(topic, b"", properties=Properties(topic_alias=alias)))


def send(encoder: PublishEncoder, topic: str) -> None:
    encoder.encode(Delivery(topic, b"", 0, False, b"id"), None, dup=False)


def connection(mirror: AliasMirror, client_id: str) -> tuple[InboundLimits, PublishEncoder]:
    limits, encoder = InboundLimits(10, 10), PublishEncoder(MQTT_5, 3)
    mirror.opened(client_id, limits, encoder, resumed=False)
    return limits, encoder


async def test_a_client_remapping_all_the_time_costs_one_write_per_flush() -> None:
    store, mirror = recorded(OWNER)
    limits, encoder = connection(mirror, "busy")
    for round_ in range(100):
        bind(limits, 1 + round_ % 10, f"t/{round_}")
        send(encoder, f"t/{round_ % 5}")
    await mirror.flush()
    [[copy]] = store.batches
    assert copy.tables == (
        (10, {1 + r % 10: f"t/{r}" for r in range(90, 100)}),
        (3, {1: "t/0", 2: "t/1", 3: "t/2"}),
    )
    for _ in range(50):  # (bound again to the same topic: nothing changed, nothing to write)
        bind(limits, 1, "t/90")
        send(encoder, "t/0")
    await mirror.flush()
    assert len(store.batches) == 1


async def test_a_connection_without_aliases_writes_nothing() -> None:
    store, mirror = recorded(OWNER)
    limits, _ = connection(mirror, "plain")
    limits.topic(Publish("no/alias", b""))
    mirror.closed("plain", limits)
    await mirror.flush()
    assert store.batches == []


async def test_the_old_connections_end_on_this_node_writes_the_new_ones_tables() -> None:
    store, mirror = recorded(OWNER)
    old, _ = connection(mirror, "again")
    bind(old, 1, "old/topic")
    await mirror.flush()
    new, _ = connection(mirror, "again")  # (before the old one closed: it closes late)
    mirror.closed("again", old)
    bind(old, 2, "late")  # (its table no longer marks anything)
    await mirror.flush()  # (the copy is the new connection's: empty)
    assert [copy.tables for copy in store.batches[1]] == [((10, {}), (3, {}))]
    bind(new, 3, "new/topic")
    mirror.closed("again", old)
    await mirror.flush()
    assert [copy.tables for copy in store.batches[2]] == [((10, {3: "new/topic"}), (3, {}))]
    mirror.closed("again", new)
    await mirror.flush()
    assert [(c.client_id, c.owner, c.tables) for c in store.batches[3]] == [("again", OWNER, None)]
    await mirror.flush()
    assert len(store.batches) == 4


async def test_a_client_this_node_holds_no_claim_for_is_skipped() -> None:
    store, mirror = recorded(None)
    limits, _ = connection(mirror, "gone")
    bind(limits, 1, "t")
    await mirror.flush()
    assert store.batches == [] and mirror.stats()["mqtt_alias_clients_marked"] == 0
