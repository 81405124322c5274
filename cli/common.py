"""What the operator commands share: connection options, running, printing.

Every command that talks to Redis takes ``--redis URL`` (or ``$ROUTER_REDIS_URL``) and
``--prefix`` (or ``$ROUTER_PREFIX``, default ``rt``), prints a table for people and JSON
with ``--json`` (given before or after the command's name: ``router --json nodes``) and
tables that fit the terminal (``--wide``: every value whole; :mod:`router.cli.tables`).

Exit codes: 0 when the command did what it says (a list that is empty included); 1 for
every expected failure, one line on stderr and never a traceback: bad input, Redis
unreachable or refusing, and *not found* (no such client, node, channel, user, ban...).
Failures are library errors (:class:`RouterError`: the state layer tells Redis's failures
as its own); the root group (``cli/application.py``) prints them as that line.

A namespace with no node registered (a mistyped ``--prefix``, or a cluster that is down)
is worth a warning but not a failure: what the read-only views show is still true of it
(an away session outlives its node), and a script listing an empty cluster should not
fail. Those views open Redis with ``redis_client(target, expect_nodes=True)``, which
says so in one line on stderr (:func:`warn_without_nodes`) once the command succeeded,
so a failure stays one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import click

from router.api import DEFAULT_URL, URL_VARIABLE
from router.core.options import SubscriptionOptions
from router.state.connection import open_redis
from router.state.keys import DEFAULT_PREFIX, Keys
from router.state.node_registry import NodeRegistry
from router.state.scripts import RedisClient

from .tables import Column, print_table

__all__ = [  # (Column and print_table live in cli.tables; the commands import them here)
    "CONNECT_TIMEOUT",
    "PREFIX_VARIABLE",
    "SUBSCRIPTION_COLUMNS",
    "Column",
    "Target",
    "echo_json",
    "json_option",
    "note",
    "print_table",
    "read_password",
    "redis_client",
    "report_change",
    "run",
    "subscription_cells",
    "target_options",
    "warn_without_nodes",
    "wide_option",
]

T = TypeVar("T")

PREFIX_VARIABLE: Final = "ROUTER_PREFIX"
CONNECT_TIMEOUT: Final = 5.0


@dataclass(frozen=True)
class Target:
    """Where a command works: a Redis URL and a key namespace prefix."""

    url: str
    prefix: str

    @property
    def keys(self) -> Keys:
        """Key names under the prefix (:class:`InvalidIdError` for an unusable prefix)."""
        return Keys(self.prefix)


def target_options(func: Callable[..., T]) -> Callable[..., T]:
    """Add ``--redis`` and ``--prefix``; the command receives them as ``target``."""

    @click.option(
        "--redis",
        "redis_url",
        envvar=URL_VARIABLE,
        default=DEFAULT_URL,
        show_default=True,
        help=f"Redis URL: standalone, cluster or redis+sentinel:// (env {URL_VARIABLE}).",
    )
    @click.option(
        "--prefix",
        envvar=PREFIX_VARIABLE,
        default=DEFAULT_PREFIX,
        show_default=True,
        help=f"Key namespace prefix (env {PREFIX_VARIABLE}).",
    )
    @functools.wraps(func)
    def wrapper(redis_url: str, prefix: str, **kwargs: Any) -> T:
        return func(Target(redis_url, prefix), **kwargs)

    return wrapper


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
wide_option = click.option(
    "--wide", is_flag=True, help="Print every column and every value whole (lines may be long)."
)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine on a fresh event loop."""
    return asyncio.run(coroutine)


@contextlib.asynccontextmanager
async def redis_client(target: Target, *, expect_nodes: bool = False) -> AsyncIterator[RedisClient]:
    """A client for the target's Redis (standalone, cluster or Sentinel), closed on exit; with
    ``expect_nodes``, a block that ends without an error is followed by
    :func:`warn_without_nodes`."""
    Keys(target.prefix)  # an unusable prefix fails before connecting
    redis = await open_redis(target.url, socket_connect_timeout=CONNECT_TIMEOUT)
    try:
        yield redis
        if expect_nodes:
            await warn_without_nodes(redis, target)
    finally:
        await redis.aclose()


async def warn_without_nodes(redis: RedisClient, target: Target) -> bool:
    """Say on stderr (one line) that no node is registered under the target's prefix,
    alive or not; returns whether it said so (see the module docstring)."""
    if await NodeRegistry(redis, target.keys).nodes():
        return False
    note(
        f"warning: no node is registered under prefix {target.prefix!r} "
        f"(a mistyped --prefix or ${PREFIX_VARIABLE}?)"
    )
    return True


def echo_json(data: Any) -> None:
    """Print one JSON document (one line)."""
    click.echo(json.dumps(data, ensure_ascii=False, sort_keys=False))


def note(message: str) -> None:
    """A remark for people on stderr (kept out of JSON on stdout)."""
    click.echo(message, err=True)


def read_password(from_stdin: bool = False) -> str:
    """A password from the terminal (asked twice), or one line of standard input when it
    is not a terminal or ``from_stdin``: never from the command line, where other users
    of the machine and the shell's history would see it."""
    if sys.stdin.isatty() and not from_stdin:
        return str(click.prompt("Password", hide_input=True, confirmation_prompt=True))
    return sys.stdin.readline().rstrip("\r\n")


def report_change(as_json: bool, changed: bool, done: str, not_done: str) -> None:
    """Say whether a change was made (``{"changed": ...}`` with ``as_json``); exit 1 if
    it was not, ``not_done`` then going to stderr (a failure's one line)."""
    if as_json:
        echo_json({"changed": changed})
    elif changed:
        click.echo(done)
    else:
        note(not_done)
    if not changed:
        raise SystemExit(1)


#: The columns of a subscription (``router subs``, ``router clients show``).
SUBSCRIPTION_COLUMNS: Final = (
    Column("filter"),
    Column("qos", fixed=True),
    Column("no local", fixed=True),
    Column("as published", fixed=True),
    Column("retain handling", fixed=True),
    Column("sub id", fixed=True),
)


def subscription_cells(topic_filter: str, options: SubscriptionOptions) -> tuple[object, ...]:
    """One row of :data:`SUBSCRIPTION_COLUMNS`."""
    return (
        topic_filter,
        options.qos,
        options.no_local,
        options.retain_as_published,
        options.retain_handling,
        options.subscription_identifier,
    )
