"""Real ``redis-server`` processes for the tests: a standalone server and a Redis Cluster
(3 masters, with or without a replica each).

Each server binds 127.0.0.1 on a free port (its cluster bus port, port + 10000, is free
too), keeps nothing on disk (``save ""``, ``appendonly no``) and lives in its own temporary
directory. Readiness is polled against a deadline, never slept for. ``stop()`` always
kills the process and removes the directory. Starting, waiting and stopping go through
:mod:`router.ops.processes`, as the demo's and the benches' servers do.

The test fixtures in ``tests/conftest.py`` build on these classes; a test that needs a
throwaway server of its own (to restart it, say) uses the ``redis_server_factory`` fixture.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import redis

from router.errors import ProcessStartError
from router.ops import processes
from router.ops.processes import (
    answers_ping,
    port_is_free,
    redis_server_command,
    spawn,
    stop_process,
    wait_ready,
)
from tests.support.pki import Pki
from tests.support.waiting import wait_until

START_TIMEOUT: Final = 10.0
POLL: Final = 0.01
CLUSTER_TIMEOUT: Final = 30.0
CLUSTER_SLOTS: Final = 16384
NODE_TIMEOUT_MS: Final = 5000  # --cluster-node-timeout of a cluster node, unless told
BUS_PORT_OFFSET: Final = 10000


def require_binary(name: str) -> str:
    """The path of a system binary; fails the test loudly (never skips) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: the state tests need a real Redis "
            "(`make test` installs redis-server and redis-tools)",
            pytrace=False,
        )
    return path


def free_port() -> int:
    """A loopback port that is free, and whose cluster bus port (port + 10000) is free too."""
    return processes.free_port(bus_offset=BUS_PORT_OFFSET)


class RedisServer:
    """One ``redis-server`` process on a free loopback port, in its own temporary directory."""

    def __init__(
        self,
        *,
        cluster: bool = False,
        tls: Pki | None = None,
        aof: bool = False,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        replica_of: int | None = None,
    ) -> None:
        self.binary = require_binary("redis-server")
        self.cluster = cluster
        self.replica_of = replica_of  # a replica of the master on that loopback port
        self.node_timeout_ms = node_timeout_ms  # a cluster node: how long until a peer fails
        self.tls = tls  # TLS only: no plain port
        self.aof = aof  # appendonly yes, appendfsync always: a restart keeps every write
        self.dir = Path(tempfile.mkdtemp(prefix="router-redis-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.port}/0" if not self.cluster else self.node_url

    @property
    def node_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        args = redis_server_command(self.binary, self.port, self.dir, append_only=self.aof)
        args += ["--daemonize", "no", "--logfile", "redis.log"]
        if self.tls is not None:
            args[args.index("--port") + 1] = "0"
            args += [
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                str(self.tls.server_cert),
                "--tls-key-file",
                str(self.tls.server_key),
                "--tls-ca-cert-file",
                str(self.tls.ca),
                "--tls-auth-clients",
                "no",
            ]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
            if self.tls is not None:
                args += ["--tls-replication", "yes"]
        if self.cluster or self.replica_of is not None:
            # A replica's first sync starts at once (the default waits 5 s for others).
            args += ["--repl-diskless-sync-delay", "0"]
        if self.cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
            ]
        return args

    def start(self) -> None:
        """Start the server (on a fresh port the first time, the same port on a restart)."""
        for _attempt in range(5):
            if not self.port:
                self.port = free_port()
            self.process = spawn(self._args(), cwd=self.dir, die_with_parent=True)
            try:
                name = f"redis-server on port {self.port}"
                wait_ready(self.process, self._ready, name=name, timeout=START_TIMEOUT, poll=POLL)
                return
            except ProcessStartError as exc:
                if exc.returncode is None:
                    raise
                # Lost a race for the port (or a restart found it taken): try another one.
                self.process = None
                self.port = 0
        raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")

    def _ready(self) -> bool:
        return answers_ping(self.url if not self.cluster else self.node_url)

    def kill(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL); keep the directory and the port."""
        process, self.process = self.process, None
        if process is not None:
            stop_process(process, timeout=5)

    def restart(self) -> None:
        """Kill and start again on the same port: every loaded script is gone, and every
        key too unless the server keeps an append-only file (``aof``)."""
        self.kill()
        wait_until(lambda: port_is_free(self.port), START_TIMEOUT, f"port {self.port} to close")
        self.start()

    def stop(self) -> None:
        """Kill the process and remove its directory."""
        try:
            self.kill()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterServers:
    """Three masters joined into one Redis Cluster, with ``replicas`` replicas each.

    Without replicas (the session's shared cluster) a dead master stays dead. With them,
    a replica takes over when its master fails: a manual ``CLUSTER FAILOVER``, or the
    automatic one after ``node_timeout_ms`` without an answer (lower it to fail over
    quickly). :meth:`start` returns once every node agrees on the topology and every
    replica is in sync with its master; :meth:`settled` says the same later (after a
    failover, a slot migration...).
    """

    def __init__(
        self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = NODE_TIMEOUT_MS
    ) -> None:
        self.masters = masters
        self.replicas = replicas
        count = masters * (1 + replicas)
        self.nodes = [
            RedisServer(cluster=True, node_timeout_ms=node_timeout_ms) for _ in range(count)
        ]

    @property
    def url(self) -> str:
        """A URL of one node; redis-py's RedisCluster discovers the others from it."""
        return self.nodes[0].node_url

    def start(self) -> None:
        cli = require_binary("redis-cli")
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        result = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=CLUSTER_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed: {result.stdout!r} {result.stderr!r}"
            )
        wait_until(self.settled, CLUSTER_TIMEOUT, "every node agreeing, every replica in sync")

    def running(self) -> list[RedisServer]:
        """The nodes whose process runs (a test may have killed some)."""
        return [
            node for node in self.nodes if node.process is not None and node.process.poll() is None
        ]

    def settled(self) -> bool:
        """Every running node says ``cluster_state:ok`` with all slots served, knows every
        running node, and sees the same masters, replicas and slots as the others (no
        failed node left in a view, no slot migrating or importing); there are
        ``masters`` masters, each with ``replicas`` replicas whose link is up."""
        views: set[frozenset[Entry]] = set()
        running = self.running()
        for node in running:
            try:
                view = _view(node.port)
            except redis.RedisError:
                return False
            if view is None:
                return False
            views.add(view)
        if len(views) != 1:
            return False
        (topology,) = views
        live = {f"127.0.0.1:{node.port}" for node in running}
        if {address for address, _, _, _ in topology} != live:
            return False  # a node it knows is gone (its own entry is not forgotten yet)
        masters = [entry for entry in topology if entry[1] == "master"]
        replicas = [entry for entry in topology if entry[1] == "slave"]
        if len(masters) != self.masters or len(replicas) != self.masters * self.replicas:
            return False
        return all(
            replica_in_sync(f"redis://127.0.0.1:{address.rsplit(':', 1)[1]}")
            for address, *_ in replicas
        )

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()


Entry = tuple[str, str, str, tuple[str, ...]]  # address, role, master address, slot ranges


def _view(port: int) -> frozenset[Entry] | None:
    """What the node on ``port`` knows of the cluster, or None while it is not settled
    (state not ok, a slot not served, a node flagged failing or in handshake, a slot
    migrating or importing)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
    try:
        info = client.execute_command("CLUSTER", "INFO")
        nodes = client.execute_command("CLUSTER", "NODES")
    finally:
        client.close()
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)
    if fields.get("cluster_state") != "ok" or fields.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
        return None
    table = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
    rows = [line.split() for line in table.splitlines() if line.strip()]
    address_of = {row[0]: row[1].split("@", 1)[0] for row in rows}
    view: set[Entry] = set()
    for row in rows:  # id address flags master ping pong epoch link slot...
        address, flags, master, link, slots = row[1], row[2], row[3], row[7], row[8:]
        flag_set = set(flags.split(","))
        if flag_set & {"fail", "fail?", "handshake", "noaddr"} or link != "connected":
            return None
        if any(slot.startswith("[") for slot in slots):
            return None  # a slot migrating or importing
        role = "master" if "master" in flag_set else "slave"
        view.add((address.split("@", 1)[0], role, address_of.get(master, ""), tuple(sorted(slots))))
    return frozenset(view)


def replica_in_sync(url: str) -> bool:
    """True if the replica at ``url`` is connected to its master and in sync."""
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        info = client.info("replication")
    except redis.RedisError:
        return False
    finally:
        client.close()
    return bool(info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"))


@contextlib.contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """``server``'s process stopped by SIGSTOP (it keeps its connections and answers
    nothing: a Redis that hangs), continued on exit."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
