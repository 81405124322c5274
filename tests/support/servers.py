"""Real ``redis-server`` processes for the tests: a standalone server and a 3-master cluster.

Each server binds 127.0.0.1 on a free port (its cluster bus port, port + 10000, is free
too), keeps nothing on disk (``save ""``, ``appendonly no``) and lives in its own temporary
directory. Readiness is polled against a deadline, never slept for. ``stop()`` always
kills the process and removes the directory.

The test fixtures in ``tests/conftest.py`` build on these classes; a test that needs a
throwaway server of its own (to restart it, say) uses the ``redis_server_factory`` fixture.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import redis

from tests.support.pki import Pki
from tests.support.waiting import wait_until

START_TIMEOUT: Final = 10.0
CLUSTER_TIMEOUT: Final = 30.0
CLUSTER_SLOTS: Final = 16384
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


def _port_is_free(port: int) -> bool:
    """True if redis-server could listen on ``port`` (it binds with SO_REUSEADDR, so
    connections in TIME_WAIT from a previous run of a server do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port that is free, and whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + BUS_PORT_OFFSET < 65536 and _port_is_free(port + BUS_PORT_OFFSET):
            return port
    raise RuntimeError("no free loopback port pair found")


def _die_with_parent() -> list[str]:
    """A command prefix that makes the server get SIGTERM when the test process dies, even
    if it is killed (util-linux ``setpriv``; without it a killed run may leave servers)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


class RedisServer:
    """One ``redis-server`` process on a free loopback port, in its own temporary directory."""

    def __init__(self, *, cluster: bool = False, tls: Pki | None = None, aof: bool = False) -> None:
        self.binary = require_binary("redis-server")
        self.cluster = cluster
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
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            "--daemonize", "no",
            "--protected-mode", "no",
            "--logfile", "redis.log",
        ]  # fmt: skip
        if self.aof:
            args += ["--appendfsync", "always"]
        if self.tls is not None:
            args[args.index("--port") + 1] = "0"
            args += [
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.server_cert),
                "--tls-key-file", str(self.tls.server_key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "no",
            ]  # fmt: skip
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000",
            ]  # fmt: skip
        return args

    def start(self) -> None:
        """Start the server (on a fresh port the first time, the same port on a restart)."""
        for _attempt in range(5):
            if not self.port:
                self.port = free_port()
            self.process = subprocess.Popen(
                [*_die_with_parent(), *self._args()],
                cwd=self.dir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_until(self._ready, START_TIMEOUT, f"redis-server on port {self.port}")
                return
            except _ServerExited:
                # Lost a race for the port (or a restart found it taken): try another one.
                self.process = None
                self.port = 0
        raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise _ServerExited
        client = redis.Redis.from_url(self.url if not self.cluster else self.node_url,
                                      socket_timeout=1)  # fmt: skip
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL); keep the directory and the port."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def restart(self) -> None:
        """Kill and start again on the same port: every loaded script is gone, and every
        key too unless the server keeps an append-only file (``aof``)."""
        self.kill()
        wait_until(lambda: _port_is_free(self.port), START_TIMEOUT, f"port {self.port} to close")
        self.start()

    def stop(self) -> None:
        """Kill the process and remove its directory."""
        try:
            self.kill()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class _ServerExited(Exception):
    """The redis-server process exited before it answered PING."""


class RedisClusterServers:
    """Three master ``redis-server`` processes joined into one Redis Cluster (no replicas)."""

    def __init__(self, masters: int = 3) -> None:
        self.nodes = [RedisServer(cluster=True) for _ in range(masters)]

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
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=CLUSTER_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed: {result.stdout!r} {result.stderr!r}"
            )
        wait_until(self._ready, CLUSTER_TIMEOUT, "cluster_state:ok with every slot covered")

    def _ready(self) -> bool:
        """Every node reports state ok, knows every node and sees all slots assigned."""
        for node in self.nodes:
            client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1)
            try:
                info = client.execute_command("CLUSTER", "INFO")
                slots = client.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                return False
            finally:
                client.close()
            text = info.decode() if isinstance(info, bytes) else str(info)
            fields = dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)
            if fields.get("cluster_state") != "ok":
                return False
            if fields.get("cluster_known_nodes") != str(len(self.nodes)):
                return False
            if fields.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
                return False
            covered = sum(int(entry[1]) - int(entry[0]) + 1 for entry in slots)
            if covered != CLUSTER_SLOTS:
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()


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
