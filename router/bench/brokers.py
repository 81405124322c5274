"""The brokers ``router bench mqtt`` starts and stops: router nodes, mosquitto, amqtt.

Each runs as a child process on a free loopback port, its output in a log file; a start
waits until it is ready (a log line, or its port listening) within :data:`START_TIMEOUT`,
and a stop sends SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`. amqtt comes from a
virtualenv of its own under ``~/.cache/router/`` (it pins ``websockets==15.0.1``, which
would downgrade the project's). The router nodes run with :data:`ROUTER_OPTIONS` (queues
and inflight windows as unbounded as mosquitto's here) and whatever options the run adds
(an ACL file, say).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import redis

from router.errors import BenchSetupError, ProcessStartError
from router.ops.processes import (
    free_port,
    listening as port_listening,
    logged as log_has,
    running,
    stop_process,
)
from router.state.keys import Keys

AMQTT_VERSION: Final = "0.12.1"
ROUTER_OPTIONS: Final = ("--queue-limit", "1000000", "--mqtt-max-inflight", "65535")
MOSQUITTO_CONFIG: Final = """\
listener {port} 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
persistence false
max_queued_messages 10000000
max_inflight_messages 0
log_dest stderr
"""
AMQTT_CONFIG: Final = """\
listeners:
  default:
    type: tcp
    bind: 127.0.0.1:{port}
plugins:
  amqtt.plugins.authentication.AnonymousAuthPlugin:
    allow_anonymous: true
"""
START_TIMEOUT: Final = 30.0
STOP_TIMEOUT: Final = 10.0
Address = tuple[str, int]


@contextlib.contextmanager
def broker_process(
    name: str, args: list[str], ready: Callable[[Path], bool], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``args`` with its output in a log file, wait until ``ready(log)``; on exit
    SIGTERM, then SIGKILL after ``STOP_TIMEOUT``. Raises :class:`BenchSetupError` (with
    the end of the log) if it exits or is not ready within ``START_TIMEOUT``."""
    with tempfile.TemporaryDirectory(prefix="router-bench-mqtt-") as directory:
        log = Path(directory) / f"{name}.log"
        try:
            with running(
                args,
                lambda: ready(log),
                name=name,
                log=log,
                env=env,
                cwd=directory,
                timeout=START_TIMEOUT,
                stop_timeout=STOP_TIMEOUT,
            ) as process:
                yield process
        except ProcessStartError as exc:
            raise BenchSetupError(str(exc)) from None


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`; returns once it exited."""
    stop_process(process, STOP_TIMEOUT)


def listening(port: int) -> Callable[[Path], bool]:
    return lambda _: port_listening(port)


def logged(text: str) -> Callable[[Path], bool]:
    return lambda log: log_has(log, text)


def node_command(node_id: str) -> tuple[list[str], dict[str, str]]:
    """How to start ``router node run`` in this interpreter (under cProfile when
    ``ROUTER_BENCH_PROFILE`` names a directory)."""
    env = dict(os.environ)
    profile = os.environ.get("ROUTER_BENCH_PROFILE")
    if not profile:
        return [sys.executable, "-c", "from router.cli import main; main()"], env
    env["ROUTER_BENCH_PROFILE_OUT"] = str(Path(profile).resolve() / f"{node_id}.prof")
    code = (
        "import cProfile, os; from router.cli import main; "
        "cProfile.run('main()', os.environ['ROUTER_BENCH_PROFILE_OUT'])"
    )
    return [sys.executable, "-c", code], env


def node_run(
    url: str, prefix: str, node_id: str, port: int, *options: str
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of ``router node run`` as ``node_id`` on ``url``
    under ``prefix``, its MQTT listener on loopback ``port``, with ``options``."""
    command, env = node_command(node_id)
    args = [*command, "node", "run", "--redis", url, "--prefix", prefix, "--node-id", node_id]
    return [*args, "--mqtt", f"127.0.0.1:{port}", *options], env


@contextlib.contextmanager
def router_nodes(
    url: str,
    count: int,
    pids: list[int],
    options: tuple[str, ...] = ROUTER_OPTIONS,
    prefix: str | None = None,
) -> Iterator[list[Address]]:
    """``count`` router nodes on ``url`` under ``prefix`` (default: a fresh one), node
    ids :func:`router_node_id` 1 and on, run with ``options``; yields their MQTT addresses (their
    process ids appended to ``pids``) and deletes the prefix's keys after the nodes
    stopped."""
    prefix = prefix if prefix is not None else fresh_prefix()
    addresses: list[Address] = []
    try:
        with contextlib.ExitStack() as stack:
            for number in range(1, count + 1):
                node_id, port = router_node_id(prefix, number), free_port()
                args, env = node_run(url, prefix, node_id, port, *options)
                ready = logged(f"node {node_id} ready")
                pids.append(stack.enter_context(broker_process(node_id, args, ready, env)).pid)
                addresses.append(("127.0.0.1", port))
            yield addresses
    finally:
        delete_prefix(url, prefix)


def router_node_id(prefix: str, number: int) -> str:
    """The id of node ``number`` (from 1) that :func:`router_nodes` runs under ``prefix``."""
    return f"{prefix}-{number}"


def fresh_prefix() -> str:
    """A key prefix no other run uses."""
    return f"mb{uuid.uuid4().hex[:8]}"


def delete_prefix(url: str, prefix: str) -> None:
    """Best effort: the keys the nodes left (none if they left cleanly)."""
    client = redis.Redis.from_url(url)
    try:
        names = list(client.scan_iter(match=Keys(prefix).pattern(), count=1000))
        for first in range(0, len(names), 1000):
            client.unlink(*names[first : first + 1000])
    except redis.RedisError:
        pass  # (Redis stopped with us on Ctrl-C: nothing to clean)
    finally:
        client.close()


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise BenchSetupError("no mosquitto: apt-get install mosquitto, or --skip-mosquitto")
    return found


def mosquitto_version() -> str:
    answer = subprocess.run(
        [mosquitto_binary(), "-h"], capture_output=True, text=True, timeout=10, check=False
    )
    return answer.stdout.split("\n", 1)[0].removeprefix("mosquitto version ").strip()


@contextlib.contextmanager
def mosquitto(pids: list[int]) -> Iterator[Address]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="router-bench-mosquitto-") as directory:
        config = Path(directory) / "mosquitto.conf"
        config.write_text(MOSQUITTO_CONFIG.format(port=port))
        config.chmod(0o644)
        args = [mosquitto_binary(), "-c", str(config)]
        with broker_process("mosquitto", args, listening(port)) as process:
            pids.append(process.pid)
            yield ("127.0.0.1", port)


def amqtt_home() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "router" / f"bench-amqtt-{AMQTT_VERSION}"


def ensure_amqtt() -> Path:
    """The ``amqtt`` script of the bench's own virtualenv, created (under a file lock)
    on first use with pip; raises :class:`BenchSetupError` if pip cannot install it."""
    home = amqtt_home()
    script, complete = home / "bin" / "amqtt", home / ".complete"
    if complete.exists():
        return script
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / f"{home.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete.exists():
            return script
        shutil.rmtree(home, ignore_errors=True)
        own_pip = importlib.util.find_spec("pip") is not None
        steps = [[sys.executable, "-m", "venv", *(["--without-pip"] if own_pip else []), str(home)]]
        pip = [sys.executable, "-m", "pip", "--python", str(home / "bin" / "python")]
        if not own_pip:
            pip = [str(home / "bin" / "python"), "-m", "pip"]
        steps.append(
            [*pip, "install", "-q", "--disable-pip-version-check", f"amqtt=={AMQTT_VERSION}"]
        )
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                raise BenchSetupError(f"installing amqtt failed: {done.stderr[-2000:]}")
        complete.write_text(AMQTT_VERSION)
    return script


@contextlib.contextmanager
def amqtt(pids: list[int]) -> Iterator[Address]:
    script = ensure_amqtt()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="router-bench-amqtt-") as directory:
        config = Path(directory) / "amqtt.yaml"
        config.write_text(AMQTT_CONFIG.format(port=port))
        with broker_process("amqtt", [str(script), "-c", str(config)], listening(port)) as process:
            pids.append(process.pid)
            yield ("127.0.0.1", port)
