"""The root ``router`` command and its error handling.

Expected failures (bad input, unreachable Redis) print one line and exit non-zero;
tracebacks are for bugs only. The library raises :class:`RouterError` only (a Redis that
cannot be reached is a :class:`~router.errors.StateUnavailableError`, which says "cannot
reach Redis"); redis-py's own errors still come from the commands that talk to Redis
directly by design (the benchmarks, the Spark pipeline's loader), and are told in the same
words (:func:`router.state.failures.state_error`).
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


@click.group(cls=RouterGroup)
@click.version_option(__version__, prog_name="router")
def app() -> None:
    """A Redis-backed, distributed, MQTT-style publish/subscribe router."""


app.add_command(bans)
app.add_command(clients)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="router")
