"""docker-compose.yml: Redis, three nodes configured by environment, and a demo client;
every router command it runs parses with the real CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from router.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def parse_command(args: list[str]) -> click.Context:
    """Parse ``router ARGS`` down to the leaf command, raising on anything the CLI refuses."""
    ctx = app.make_context("router", list(args))
    command: click.Command = app
    while isinstance(command, click.Group):
        name, sub, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return ctx


def test_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"redis", "node-1", "node-2", "node-3", "subscriber", "publisher"} <= set(services)
    node_ids = set()
    host_ports = set()
    for name in ("node-1", "node-2", "node-3"):
        service = services[name]
        assert service["command"] == ["node", "run"]
        assert service["environment"]["ROUTER_REDIS_URL"] == "redis://redis:6379/0"
        node_ids.add(service["environment"]["ROUTER_NODE_ID"])
        assert "redis" in service["depends_on"]
        assert service["environment"]["ROUTER_MQTT"] == "0.0.0.0:1883"
        address, host_port, _ = service["ports"][0].split(":")
        assert address == "127.0.0.1"  # (the host's loopback unless an operator opens it)
        host_ports.add(host_port)
    assert len(node_ids) == 3
    assert len(host_ports) == 3  # a listener per node, each on a port of its own
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes"  # (sessions survive a restart)


def test_every_router_command_exists(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if name == "redis":
            continue
        ctx = parse_command(service["command"])
        assert ctx.command.callback is not None, name


def test_a_wrong_command_would_be_caught() -> None:
    with pytest.raises(click.UsageError):
        parse_command(["node", "run", "--no-such-option"])
    with pytest.raises(click.UsageError):
        parse_command(["nodes-and-more"])


def test_dockerfile_copies_what_exists() -> None:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
