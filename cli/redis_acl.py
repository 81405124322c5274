"""``router redis-acl``: print the ``ACL SETUSER`` line of the Redis user the router needs
(the commands it runs, keys and pub/sub channels under the prefix); see docs/operations.md."""

from __future__ import annotations

import click

from router.ops.redis_acl import SETINFO_SINCE, acl_setuser
from router.state.keys import DEFAULT_PREFIX

from .common import PREFIX_VARIABLE


def _version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    if not major.isdigit() or not minor.split(".")[0].isdigit():
        raise click.BadParameter(f"a Redis version is MAJOR.MINOR, not {text!r}")
    return int(major), int(minor.split(".")[0])


@click.command("redis-acl")
@click.option(
    "--prefix",
    envvar=PREFIX_VARIABLE,
    default=DEFAULT_PREFIX,
    show_default=True,
    help="Key namespace prefix the user may touch.",
)
@click.option("--user", default="router", show_default=True, help="The ACL user's name.")
@click.option("--password", default="CHANGE-ME", show_default=True, help="Its password.")
@click.option(
    "--redis-version",
    default=".".join(map(str, SETINFO_SINCE)),
    show_default=True,
    help="The servers' Redis version (before 7.2: no CLIENT SETINFO).",
)
def redis_acl(prefix: str, user: str, password: str, redis_version: str) -> None:
    """Print the ACL SETUSER line for the router's Redis user."""
    click.echo(acl_setuser(prefix, user, password, _version(redis_version)))
