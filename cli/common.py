"""What the operator commands share: connection options, running, printing.

Every command that talks to Redis takes ``--redis URL`` (or ``$ROUTER_REDIS_URL``) and
``--prefix`` (or ``$ROUTER_PREFIX``, default ``rt``), prints a table for people and JSON
with ``--json``. Failures are library errors (:class:`RouterError`: the state layer tells
Redis's failures as its own); the root group (``cli/application.py``) prints them as one
line and exits non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import click
from rich.console import Console
from rich.table import Table

from router.api import DEFAULT_URL, URL_VARIABLE
from router.state.connection import open_redis
from router.state.keys import DEFAULT_PREFIX, Keys
from router.state.scripts import RedisClient

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
        help=f"Redis URL, standalone or cluster (env {URL_VARIABLE}).",
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


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine on a fresh event loop."""
    return asyncio.run(coroutine)


@contextlib.asynccontextmanager
async def redis_client(target: Target) -> AsyncIterator[RedisClient]:
    """A client for the target's Redis (standalone or cluster), closed on exit."""
    Keys(target.prefix)  # an unusable prefix fails before connecting
    redis = await open_redis(target.url, socket_connect_timeout=CONNECT_TIMEOUT)
    try:
        yield redis
    finally:
        await redis.aclose()


def echo_json(data: Any) -> None:
    """Print one JSON document (one line)."""
    click.echo(json.dumps(data, ensure_ascii=False, sort_keys=False))


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a title line and a table for people (rich); values are shown with ``str``."""
    if title:
        click.echo(title)
    table = Table()
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if value is None else str(value) for value in row))
    Console().print(table)


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
    it was not."""
    if as_json:
        echo_json({"changed": changed})
    else:
        click.echo(done if changed else not_done)
    if not changed:
        raise SystemExit(1)
