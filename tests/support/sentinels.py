"""Redis behind Sentinel for the tests: a master, its replicas and three real
``redis-sentinel`` processes watching it as ``mymaster`` (quorum 2).

Every process binds 127.0.0.1 on a free port and lives in a temporary directory of its
own (a sentinel rewrites its configuration file as it learns; it keeps it there).
:meth:`SentinelServers.start` returns once every sentinel knows the master, every
replica and the other sentinels, and every replica is in sync: the deployment can fail
over. Readiness is polled against deadlines, never slept for; :meth:`stop` kills every
process and removes every directory, whatever the test did.

A sentinel judges a master down after ``down_after_ms`` without an answer (1 s here:
``kill -9`` of the master fails over within a few seconds); ``SENTINEL FAILOVER``
(:meth:`SentinelServers.fail_over`) promotes a replica at once, without agreement.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

import redis

from router.errors import ProcessStartError
from router.ops.processes import answers_ping, free_port, spawn, stop_process, wait_ready
from tests.support.pki import Pki
from tests.support.servers import RedisServer, replica_in_sync, require_binary
from tests.support.waiting import wait_until

MASTER_NAME: Final = "mymaster"
QUORUM: Final = 2
START_TIMEOUT: Final = 10.0
SETTLE_TIMEOUT: Final = 20.0  # sentinels find each other by hello messages every 2 s
FAILOVER_TIMEOUT: Final = 20.0
DOWN_AFTER_MS: Final = 1000


def clients_of(server: RedisServer) -> list[dict[str, object]]:
    """The client connections on ``server`` (CLIENT LIST) but the sentinels', the
    replicas' and the one that asks."""
    client = redis.Redis.from_url(server.url, socket_timeout=1)
    try:
        listed = client.client_list()
    finally:
        client.close()
    return [
        entry
        for entry in listed
        if not str(entry.get("name", "")).startswith("sentinel-")
        and "S" not in str(entry.get("flags", ""))
        and entry.get("cmd") != "client|list"
    ]


def role(server: RedisServer) -> str:
    """``master`` or ``slave``, as ``server`` says (INFO replication)."""
    client = redis.Redis.from_url(server.url, socket_timeout=1)
    try:
        return str(client.info("replication")["role"])
    finally:
        client.close()


class SentinelProcess:
    """One ``redis-sentinel`` on a free loopback port watching the master on
    ``master_port``, in its own temporary directory."""

    def __init__(self, master_port: int, down_after_ms: int, tls: Pki | None = None) -> None:
        self.binary = require_binary("redis-sentinel")
        self.tls = tls  # TLS only, to its clients and to the servers it watches
        self.dir = Path(tempfile.mkdtemp(prefix="router-sentinel-"))
        self.master_port = master_port
        self.down_after_ms = down_after_ms
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def _config(self) -> str:
        tls = self.tls
        ports = [f"port {self.port}"]
        if tls is not None:
            ports = [
                "port 0",
                f"tls-port {self.port}",
                f"tls-cert-file {tls.server_cert}",
                f"tls-key-file {tls.server_key}",
                f"tls-ca-cert-file {tls.ca}",
                "tls-auth-clients no",
                "tls-replication yes",
            ]
        return "\n".join(
            [
                *ports,
                "bind 127.0.0.1",
                "protected-mode no",
                f"dir {self.dir}",
                "logfile sentinel.log",
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master_port} {QUORUM}",
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                f"sentinel failover-timeout {MASTER_NAME} 10000",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
                "",
            ]
        )

    def start(self) -> None:
        for _attempt in range(5):
            self.port = free_port()
            config = self.dir / "sentinel.conf"
            config.write_text(self._config())
            self.process = spawn([self.binary, str(config)], cwd=self.dir, die_with_parent=True)
            try:
                wait_ready(
                    self.process,
                    lambda: answers_ping(self.url),
                    name=f"redis-sentinel on port {self.port}",
                    timeout=START_TIMEOUT,
                )
                return
            except ProcessStartError as exc:
                if exc.returncode is None:
                    raise
                self.process = None  # lost a race for the port: try another one
        raise RuntimeError(f"redis-sentinel did not start; see {self.dir / 'sentinel.log'}")

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=1)

    def master(self) -> dict[str, object] | None:
        """What this sentinel says of the master (``SENTINEL MASTER``), or None."""
        client = self.client()
        try:
            state: dict[str, object] = client.sentinel_master(MASTER_NAME)
            return state
        except redis.RedisError:
            return None
        finally:
            client.close()

    def stop(self) -> None:
        try:
            process, self.process = self.process, None
            if process is not None:
                stop_process(process, timeout=5)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class SentinelServers:
    """A master with ``replicas`` replicas and ``sentinels`` sentinels (see the module
    docstring); :attr:`url` is the ``redis+sentinel://`` URL of them all."""

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        down_after_ms: int = DOWN_AFTER_MS,
        tls: Pki | None = None,
    ) -> None:
        self.tls = tls  # every server and sentinel TLS only (the URL: rediss+sentinel://)
        self.replicas = replicas
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        if self.tls is not None:
            return f"rediss+sentinel://{hosts}/{MASTER_NAME}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def start(self) -> None:
        master = RedisServer(tls=self.tls)
        self.servers.append(master)
        master.start()
        for _ in range(self.replicas):
            replica = RedisServer(replica_of=master.port, tls=self.tls)
            self.servers.append(replica)
            replica.start()
        for _ in range(self.sentinel_count):
            sentinel = SentinelProcess(master.port, self.down_after_ms, self.tls)
            self.sentinels.append(sentinel)
            sentinel.start()
        wait_until(self.settled, SETTLE_TIMEOUT, "every sentinel knowing everyone, in sync")

    def running(self) -> list[SentinelProcess]:
        return [s for s in self.sentinels if s.process is not None and s.process.poll() is None]

    def master(self) -> RedisServer | None:
        """The server every running sentinel names the master, or None while they differ."""
        ports = set()
        for sentinel in self.running():
            state = sentinel.master()
            if state is None:
                return None
            ports.add(int(str(state["port"])))
        if len(ports) != 1:
            return None
        (port,) = ports
        return next((server for server in self.servers if server.port == port), None)

    def settled(self) -> bool:
        """Every running sentinel names the same master, in good standing, and knows the
        other sentinels and every replica, each in sync with the master."""
        master = self.master()
        if master is None:
            return False
        others = len(self.running()) - 1
        for sentinel in self.running():
            state = sentinel.master()
            if state is None or state.get("is_sdown") or state.get("is_odown"):
                return False
            if state.get("num-other-sentinels") != others:
                return False
            if state.get("num-slaves") != self.replicas:
                return False
        replicas = [server for server in self.servers if server is not master]
        return all(replica_in_sync(server.url) for server in replicas)

    def fail_over(self) -> tuple[RedisServer, RedisServer, float]:
        """``SENTINEL FAILOVER`` (a replica promoted at once); returns the old master, the
        new one, and the seconds until every sentinel named the new one."""
        old = self.master()
        assert old is not None
        client = self.running()[0].client()
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        finally:
            client.close()
        took = wait_until(
            lambda: self.master() not in (None, old), FAILOVER_TIMEOUT, "a new master"
        )
        new = self.master()
        assert new is not None
        return old, new, took

    def stop(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            with contextlib.suppress(Exception):
                process.stop()
