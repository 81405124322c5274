"""Redis Cluster faults under QoS 1 load, with real processes (marked ``fault``; each
bounded, each prints its figures: run with ``-s`` to read them).

Each test starts a cluster of its own (3 masters, a replica each, 1.5 s node timeout),
two ``router node run`` processes (a and b, heartbeat TTL 2 s), a persistent QoS 1
subscriber on a (paho reconnects it should a node drop it) and a publisher on b that
sends until its message is acknowledged (as ``publish_until_acked`` of
``test_faults.py``: a message not acknowledged within a few seconds goes again on a new
connection). The copies travel through a's inbox channel, ``rt:{ch:inbox:a}:*``. In
every scenario no node may be purged: both stay alive throughout.

* ``CLUSTER FAILOVER`` of every master in turn (the safe manual form: the replica takes
  over once it has every write): nothing acknowledged is lost.
* ``kill -9`` of the master that holds a's inbox, or the one that holds the registry
  (and, with the slots of this test, a's route set and the subscriber's session): its
  replica is promoted after the node timeout. Replication is asynchronous, so writes
  acknowledged just before the kill may be gone: delivery must resume, everything
  acknowledged after the promotion must arrive, and what was lost before is counted
  and printed. With the registry's master down longer than the TTL, no heartbeat lands:
  each node disconnects its clients with 0x89 (they come back), nobody is purged.
* A live migration (``CLUSTER SETSLOT ... IMPORTING / MIGRATING``, ``MIGRATE`` in small
  batches, ``SETSLOT ... NODE``) of a's inbox slot, paced so that it stays split longer
  than the TTL, then of the registry's, a's route set's and the subscriber's session's
  slots, while the load runs. Nothing is lost; the router meets ASK, TRYAGAIN and MOVED.
  Delivery through the inbox pauses while its slot is split: the inbox scripts declare
  a key that never exists, so Redis answers TRYAGAIN until the last key has moved.
"""

from __future__ import annotations

import time
from typing import Final

import pytest

from router.state.keys import Keys
from tests.support.fault_load import DEADLINE, collect, loaded_nodes, longest_gap
from tests.support.servers import RedisClusterServers
from tests.support.topology import (
    agreed_owner,
    fail_over,
    masters,
    migrate_slot,
    owner,
    redirects,
    replica_of,
    slot_of,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.fault

SPLIT: Final = 5.0  # seconds a's inbox slot stays split by its migration (longer than the TTL)


def inbox_slot(keys: Keys, node_id: str = "a") -> int:
    """The slot of node ``node_id``'s inbox channel: every copy for its clients goes there."""
    return slot_of(keys.channel_clock(keys.inbox(node_id)))


def test_a_manual_failover_of_every_master_under_qos1_load_loses_nothing(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys
) -> None:
    cluster = redis_cluster_with_replicas
    with loaded_nodes(cluster.url, keys) as scene:
        took = []
        started = time.monotonic()
        for master in masters(cluster):
            _, seconds = fail_over(cluster, master)
            took.append(seconds)
        finished = time.monotonic()
        scene.load.run_on_until(finished)
        figures = collect(scene.subscriber, scene.load)
        counted, purged = scene.counted(), scene.purged()
    print(
        f"\nCLUSTER FAILOVER of each of 3 masters under QoS 1 load: {figures.line()}, "
        f"resent {scene.load.resent}; failovers took {', '.join(f'{s:.2f}' for s in took)} s "
        f"(until every node agreed); longest delivery gap meanwhile "
        f"{longest_gap(figures.received, started, finished):.2f} s; {counted}"
    )
    assert figures.lost == []
    assert purged == 0


@pytest.mark.parametrize("holding", ["a's inbox", "the registry"])
def test_kill_9_of_a_master_under_qos1_load_resumes_and_reports_losses(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys, holding: str
) -> None:
    cluster = redis_cluster_with_replicas
    slot = inbox_slot(keys) if holding == "a's inbox" else slot_of(keys.registry())
    victim = owner(cluster, slot)
    heir = replica_of(cluster, victim)
    with loaded_nodes(cluster.url, keys) as scene:
        assert victim.process is not None
        killed_at = time.monotonic()
        victim.process.kill()  # SIGKILL: what its replica has not got is gone
        victim.process.wait()
        wait_until(lambda: agreed_owner(cluster, slot) is heir, DEADLINE, "the replica promoted")
        promoted_at = time.monotonic()
        scene.load.run_on_until(promoted_at)
        figures = collect(scene.subscriber, scene.load)
        counted, purged = scene.counted(), scene.purged()
    after = [seq for seq, at in scene.load.acked if at >= promoted_at]
    lost_after = sorted(set(after) & set(figures.lost))
    last = max((at for _, at in figures.received), default=killed_at)
    resumed = min((at for _, at in figures.received if at > promoted_at), default=float("nan"))
    print(
        f"\nkill -9 of the master of {holding} under QoS 1 load: {figures.line()} (acked "
        f"before the promotion {len(figures.lost) - len(lost_after)}, after {len(lost_after)}), "
        f"resent {scene.load.resent}; replica promoted (every node agreeing) "
        f"{promoted_at - killed_at:.2f} s after the kill; longest delivery gap "
        f"{longest_gap(figures.received, killed_at, last):.2f} s; first delivery after the "
        f"promotion {resumed - promoted_at:.2f} s later; {counted}"
    )
    assert after, "nothing acknowledged after the promotion"
    assert lost_after == []
    assert purged == 0


def test_a_live_slot_migration_under_qos1_load_loses_nothing(
    redis_cluster_with_replicas: RedisClusterServers, keys: Keys
) -> None:
    cluster = redis_cluster_with_replicas
    slots = {
        "a's inbox": inbox_slot(keys),
        "the registry": slot_of(keys.registry()),
        "a's route set": slot_of(keys.node_routes("a")),
        "the subscriber's session": slot_of(keys.client_session("reader")),
    }
    with loaded_nodes(cluster.url, keys) as scene:
        redirected = redirects(cluster)
        started = time.monotonic()
        moves = []
        for what, slot in slots.items():
            source = owner(cluster, slot)
            target = next(m for m in masters(cluster) if m is not source)
            begun = time.monotonic()
            split = SPLIT if what == "a's inbox" else 0.0
            moved = migrate_slot(cluster, slot, target, batch=5, split_for=split)
            moves.append(f"{what} (slot {slot}, {moved} keys, {time.monotonic() - begun:.2f} s)")
        finished = time.monotonic()
        redirected = redirects(cluster) - redirected
        scene.load.run_on_until(finished)
        figures = collect(scene.subscriber, scene.load)
        counted, purged = scene.counted(), scene.purged()
    print(
        f"\nlive slot migration under QoS 1 load: {figures.line()}, resent {scene.load.resent}; "
        f"moved {'; '.join(moves)}; all in {finished - started:.2f} s; the servers answered "
        f"{', '.join(f'{name} {count}' for name, count in sorted(redirected.items()))}; "
        f"longest delivery gap {longest_gap(figures.received, started, finished):.2f} s; "
        f"{counted}"
    )
    assert figures.lost == []
    assert purged == 0
    assert redirected["TRYAGAIN"] > 0 and redirected["MOVED"] > 0  # the router met them
