"""The root ``router`` command and its error handling.

Expected failures (bad input, unreachable Redis) print one line and exit non-zero;
tracebacks are for bugs only. The library raises :class:`RouterError` only (a Redis that
cannot be reached is a :class:`~router.errors.StateUnavailableError`, which says "cannot
reach Redis"); redis-py's own errors still come from the commands that talk to Redis
directly by design (the benchmarks, the Spark pipeline's loader), and are told in the same
words (:func:`router.state.failures.state_error`).

``--json`` may come before the command's name as well as after it (``router --json
nodes`` is ``router nodes --json``): given to the root, it becomes the default of every
command's own ``--json`` (click's ``default_map``); a command without one ignores it.
"""

from __future__ import annotations

from typing import Any

import click

from router import RouterError, __version__
from router.state.failures import REDIS_ERRORS, state_error

from .bans import bans
from .clients import clients


class RouterGroup(click.Group):
    """A click group that turns expected errors into one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RouterError as exc:
            raise click.ClickException(str(exc)) from None
        except REDIS_ERRORS as exc:  # (a benchmark's or the pipeline's own calls)
            raise click.ClickException(str(state_error(exc))) from None


def json_defaults(group: click.Group) -> dict[str, Any]:
    """A ``default_map`` that turns on ``--json`` (the parameter ``as_json``) in every
    command under ``group`` that has one, subcommands of subgroups included."""
    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        entry: dict[str, Any] = {}
        if any(param.name == "as_json" for param in command.params):
            entry["as_json"] = True
        if isinstance(command, click.Group):
            entry.update(json_defaults(command))
        if entry:
            found[name] = entry
    return found


@click.group(cls=RouterGroup)
@click.version_option(__version__, prog_name="router")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON for scripts (the command's own --json, given before its name).",
)
@click.pass_context
def app(ctx: click.Context, as_json: bool) -> None:
    """A Redis-backed, distributed, MQTT-style publish/subscribe router."""
    if as_json:  # (runs before the command's context is made: it inherits the defaults)
        ctx.default_map = {**json_defaults(app), **(ctx.default_map or {})}


app.add_command(bans)
app.add_command(clients)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="router")
