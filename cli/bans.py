"""``router bans add|list|remove``: client ids, user names and source addresses every
node refuses before authentication (see :mod:`router.state.ban_store`); a ban reaches every
node within about a second.

JSON shapes (``--json``): ``list`` prints ``[{"kind", "value", "until", "reason"}]``
(``until``: Unix seconds, null for a ban without an end); ``add`` prints the ban it
wrote; ``remove`` prints ``{"removed": true|false}``.
"""

from __future__ import annotations

import time
from typing import Any

import click

from router.state.ban_store import KINDS, Ban, BanStore, ban_event, ban_lifted_event
from router.state.event_log import EventLog

from .common import (
    Target,
    echo_json,
    json_option,
    note,
    redis_client,
    run,
    target_options as target,
)

_kind = click.argument("kind", type=click.Choice(KINDS))
_value = click.argument("value")


def ban_record(ban: Ban) -> dict[str, Any]:
    return {
        "kind": ban.kind,
        "value": ban.value,
        "until": ban.until or None,
        "reason": ban.reason,
    }


def _line(ban: Ban) -> str:
    ends = "until removed" if not ban.until else f"{max(ban.until - time.time(), 0):.0f} s left"
    reason = f"  ({ban.reason})" if ban.reason else ""
    return f"{ban.kind} {ban.value}  {ends}{reason}"


@click.group()
def bans() -> None:
    """Client ids, users and addresses every node refuses (shared in Redis)."""


@bans.command("add")
@target
@_kind
@_value
@click.option(
    "--for",
    "seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds the ban lasts [default: until removed].",
)
@click.option("--reason", default="", help="Why (shown by list).")
@json_option
def bans_add(
    target: Target, kind: str, value: str, seconds: float | None, reason: str, as_json: bool
) -> None:
    """Ban VALUE, a client id, a user name or an IP address (KIND)."""

    async def main() -> Ban:
        async with redis_client(target) as redis:
            ban = await BanStore(redis, target.keys).add(
                kind, value, seconds=seconds, reason=reason
            )
            await EventLog(redis, target.keys).add(ban_event(ban, "cli"))
            return ban

    ban = run(main())
    if as_json:
        echo_json(ban_record(ban))
    else:
        click.echo(f"banned {_line(ban)}")


@bans.command("list")
@target
@json_option
def bans_list(target: Target, as_json: bool) -> None:
    """The bans in force."""

    async def main() -> list[Ban]:
        async with redis_client(target) as redis:
            return await BanStore(redis, target.keys).bans()

    found = run(main())
    if as_json:
        echo_json([ban_record(ban) for ban in found])
    elif not found:
        click.echo("no bans")
    for ban in [] if as_json else found:
        click.echo(_line(ban))


@bans.command("remove")
@target
@_kind
@_value
@json_option
def bans_remove(target: Target, kind: str, value: str, as_json: bool) -> None:
    """Lift the ban of VALUE (exit 1 when there was none)."""

    async def main() -> bool:
        async with redis_client(target) as redis:
            removed = await BanStore(redis, target.keys).remove(kind, value)
            if removed:
                await EventLog(redis, target.keys).add(ban_lifted_event(kind, value, "cli"))
            return removed

    removed = run(main())
    if as_json:
        echo_json({"removed": removed})
    elif removed:
        click.echo(f"lifted the ban of {kind} {value}")
    else:
        note(f"no ban of {kind} {value}")  # (a failure's one line, on stderr)
    if not removed:
        raise SystemExit(1)
