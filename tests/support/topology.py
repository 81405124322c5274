"""Changing a running Redis Cluster the way an operator (or a crash) does: who serves a
slot, a manual failover, a live slot migration.

Everything here talks to the servers of a :class:`~tests.support.servers.RedisClusterServers`
directly (plain ``redis.Redis`` connections, one command at a time), never through the
router, so what a test measures is the router's reaction, not this module's.

A live migration of slot S from node A to node B, as ``redis-cli --cluster reshard`` does
it (https://redis.io/docs/latest/commands/cluster-setslot/)::

    B: CLUSTER SETSLOT S IMPORTING A      B takes S's commands that carry ASKING
    A: CLUSTER SETSLOT S MIGRATING B      A answers ASK for keys of S it no longer has
    A: CLUSTER GETKEYSINSLOT S n    }     repeated until S is empty on A; between two
    A: MIGRATE B's host port "" 0 t KEYS k1 k2 ...   }  batches the slot is split
    B, A, every other master: CLUSTER SETSLOT S NODE B   (MOVED from then on)

While S is split, a command on several keys of S that are not all on one side gets
TRYAGAIN, one whose keys are all gone from A gets ASK, and a script that reaches a key
moved away mid-run fails with an error.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import redis
from redis.crc import key_slot

from tests.support.servers import RedisClusterServers, RedisServer
from tests.support.waiting import wait_until

TIMEOUT: Final = 30.0
MIGRATE_TIMEOUT_MS: Final = 5000


def slot_of(key: str) -> int:
    """The cluster slot of ``key`` (its hash tag's, if it has one)."""
    return key_slot(key.encode())


@contextmanager
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    """A plain connection to one cluster node, closed on exit."""
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def _nodes(server: RedisServer) -> list[list[str]]:
    """The rows of ``CLUSTER NODES`` as ``server`` sees them."""
    with admin(server) as client:
        table = client.execute_command("CLUSTER", "NODES")
    text = table.decode() if isinstance(table, bytes) else str(table)
    return [line.split() for line in text.splitlines() if line.strip()]


def _server_at(cluster: RedisClusterServers, address: str) -> RedisServer:
    port = int(address.split("@", 1)[0].rsplit(":", 1)[1])
    return next(node for node in cluster.nodes if node.port == port)


def _serves(slots: list[str], slot: int) -> bool:
    for entry in slots:
        if entry.startswith("["):
            continue  # a migrating or importing mark, not ownership
        first, _, last = entry.partition("-")
        if int(first) <= slot <= int(last or first):
            return True
    return False


def owner_seen_by(server: RedisServer, slot: int) -> str | None:
    """The address of the master that serves ``slot`` in ``server``'s view (None if none
    does, or the one that does is flagged failing)."""
    for row in _nodes(server):
        flags = set(row[2].split(","))
        if "master" in flags and not flags & {"fail", "fail?"} and _serves(row[8:], slot):
            return row[1].split("@", 1)[0]
    return None


def owner(cluster: RedisClusterServers, slot: int) -> RedisServer:
    """The master that serves ``slot``, as the first running node sees it."""
    address = owner_seen_by(cluster.running()[0], slot)
    assert address is not None, f"no node serves slot {slot}"
    return _server_at(cluster, address)


def agreed_owner(cluster: RedisClusterServers, slot: int) -> RedisServer | None:
    """The master that every running node says serves ``slot``, or None while they differ
    (or one cannot be asked)."""
    try:
        seen = {owner_seen_by(server, slot) for server in cluster.running()}
    except redis.RedisError:
        return None
    if len(seen) != 1 or None in seen:
        return None
    (address,) = seen
    assert address is not None
    return _server_at(cluster, address)


def replica_of(cluster: RedisClusterServers, master: RedisServer) -> RedisServer:
    """A replica of ``master``."""
    rows = _nodes(master)
    mine = next(row[0] for row in rows if "myself" in row[2])
    address = next(row[1] for row in rows if row[3] == mine and "slave" in row[2])
    return _server_at(cluster, address)


def first_slot(server: RedisServer) -> int:
    """The first slot master ``server`` serves, in its own view."""
    row = next(row for row in _nodes(server) if "myself" in row[2])
    entry = next(entry for entry in row[8:] if not entry.startswith("["))
    return int(entry.partition("-")[0])


def fail_over(cluster: RedisClusterServers, master: RedisServer) -> tuple[RedisServer, float]:
    """``CLUSTER FAILOVER`` (the safe, manual form) on a replica of ``master``; returns
    the replica, master now, and the seconds until every node agreed on it."""
    replica = replica_of(cluster, master)
    slot = first_slot(master)
    started = time.monotonic()
    with admin(replica) as client:
        client.execute_command("CLUSTER", "FAILOVER")
    wait_until(
        lambda: agreed_owner(cluster, slot) is replica and cluster.settled(),
        TIMEOUT,
        f"replica {replica.port} serving slot {slot} in every node's view",
    )
    return replica, time.monotonic() - started


def _id_of(server: RedisServer) -> str:
    with admin(server) as client:
        node_id = client.execute_command("CLUSTER", "MYID")
    return node_id.decode() if isinstance(node_id, bytes) else str(node_id)


class Migration:
    """A live migration of ``slot`` to master ``target``, step by step (see the module
    docstring): :meth:`begin`, :meth:`move` (some or all keys), :meth:`finish`."""

    def __init__(self, cluster: RedisClusterServers, slot: int, target: RedisServer) -> None:
        self.cluster = cluster
        self.slot = slot
        self.source = owner(cluster, slot)
        self.target = target
        assert self.source is not target, f"slot {slot} is on {target.port} already"
        self.moved = 0

    def begin(self) -> int:
        """Mark the slot importing on the target, migrating on the source; the number of
        keys it holds."""
        with admin(self.target) as into, admin(self.source) as out:
            into.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", _id_of(self.source))
            out.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", _id_of(self.target))
            return int(out.execute_command("CLUSTER", "COUNTKEYSINSLOT", self.slot))

    def move(self, batch: int = 10, limit: int | None = None, pace: float = 0.0) -> int:
        """MIGRATE the slot's keys, ``batch`` a call, ``limit`` at most (None: all), a
        batch every ``pace`` seconds; the number moved."""
        moved, start = 0, time.monotonic()
        with admin(self.source) as out:
            while limit is None or moved < limit:
                size = batch if limit is None else min(batch, limit - moved)
                keys = out.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, size)
                if not keys:
                    break
                out.execute_command(
                    "MIGRATE",
                    "127.0.0.1",
                    self.target.port,
                    "",
                    0,
                    MIGRATE_TIMEOUT_MS,
                    "KEYS",
                    *keys,
                )
                moved += len(keys)
                delay = start + pace * moved / batch - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # pacing the migration
        self.moved += moved
        return moved

    def finish(self) -> None:
        """Move what is left, give the slot to the target (the target first: it owns the
        slot from then on; then the source: it answers MOVED instead of ASK; then every
        other master) and wait until every node agrees."""
        self.move()
        target_id = _id_of(self.target)
        others = [m for m in masters(self.cluster) if m not in (self.target, self.source)]
        for server in [self.target, self.source, *others]:
            with admin(server) as client:
                client.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        wait_until(
            lambda: agreed_owner(self.cluster, self.slot) is self.target and self.cluster.settled(),
            TIMEOUT,
            f"slot {self.slot} on {self.target.port} in every node's view",
        )


def migrate_slot(
    cluster: RedisClusterServers,
    slot: int,
    target: RedisServer,
    *,
    batch: int = 10,
    split_for: float = 0.0,
) -> int:
    """Move ``slot`` to master ``target`` live, ``batch`` keys per MIGRATE. With
    ``split_for``, the batches are paced so that the slot stays split about that many
    seconds (as a slot of many keys would be). Returns the number of keys moved."""
    migration = Migration(cluster, slot, target)
    keys = migration.begin()
    migration.move(batch, pace=split_for / max(-(-keys // batch), 1))
    migration.finish()
    return migration.moved


def _is_master(server: RedisServer) -> bool:
    with admin(server) as client:
        role = client.execute_command("ROLE")
    kind = role[0]
    return (kind.decode() if isinstance(kind, bytes) else str(kind)) == "master"


def redirects(cluster: RedisClusterServers) -> Counter[str]:
    """How many ASK, MOVED, TRYAGAIN and CLUSTERDOWN replies the running nodes have
    sent since they started (``INFO errorstats``)."""
    counts: Counter[str] = Counter()
    for server in cluster.running():
        with admin(server) as client:
            stats = client.info("errorstats")
        for name in ("ASK", "MOVED", "TRYAGAIN", "CLUSTERDOWN"):
            counts[name] += int(stats.get(f"errorstat_{name}", {}).get("count", 0))
    return counts


def masters(cluster: RedisClusterServers) -> list[RedisServer]:
    """The running masters."""
    return [server for server in cluster.running() if _is_master(server)]
