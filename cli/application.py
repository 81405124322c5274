"""The root ``router`` command and its error handling.

Expected failures (bad input, unreachable Redis) print one line and exit non-zero;
tracebacks are for bugs only.
"""

from __future__ import annotations

from typing import Any

import click
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ConnectionError as RedisConnectionError,
    NoPermissionError,
    RedisClusterException,
    RedisError,
    TimeoutError as RedisTimeoutError,
)

from router import RouterError, __version__

from .bans import bans
from .clients import clients


class RouterGroup(click.Group):
    """A click group that turns expected errors into one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RouterError as exc:
            raise click.ClickException(str(exc)) from None
        except (AuthenticationError, AuthorizationError) as exc:
            raise click.ClickException(f"Redis refused the credentials: {exc}") from None
        except NoPermissionError as exc:
            raise click.ClickException(
                f"Redis denies a command the router needs (see README, Redis ACL): {exc}"
            ) from None
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise click.ClickException(f"cannot reach Redis: {exc}") from None
        except RedisClusterException as exc:
            raise click.ClickException(f"Redis Cluster error: {exc}") from None
        except RedisError as exc:
            raise click.ClickException(f"Redis error: {exc}") from None


@click.group(cls=RouterGroup)
@click.version_option(__version__, prog_name="router")
def app() -> None:
    """A Redis-backed, distributed, MQTT-style publish/subscribe router."""


app.add_command(bans)
app.add_command(clients)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="router")
