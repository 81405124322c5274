"""``router dashboard users|keys ...``: the accounts of the dashboard and the HTTP API,
kept in Redis for every node (see :mod:`router.state.console_store`).

Passwords are read from the terminal (asked twice), or from standard input when it is
not one or ``--password-stdin`` is given (one line), never from the command line, and
have at least 12 characters (``MIN_PASSWORD``: a shorter one is refused before Redis is
reached, exit 1). An API key is printed once, when it is made; only its digest is kept.

JSON shapes (``--json``): ``users list`` prints ``[{"name", "role"}]``, ``keys list``
``[{"id", "name", "role"}]``, ``keys add`` ``{"id", "name", "role", "key"}``; the other
changes ``{"changed": true|false}``.
"""

from __future__ import annotations

import click

from router.state.console_store import ROLES, ConsoleStore, Role, check_password

from .common import (
    Target,
    echo_json,
    json_option,
    read_password,
    redis_client,
    report_change,
    run,
    target_options as target,
)

_name = click.argument("name")
_role = click.option(
    "--role",
    type=click.Choice(ROLES),
    default="viewer",
    show_default=True,
    help="admin: may change anything; viewer: may only read.",
)


@click.group()
def dashboard() -> None:
    """Accounts of the dashboard and the HTTP API (shared in Redis)."""


@dashboard.group()
def users() -> None:
    """People who log in to the dashboard."""


@users.command("add")
@target
@_name
@_role
@click.option("--replace", is_flag=True, help="Replace the user if it exists.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@json_option
def users_add(
    target: Target, name: str, role: Role, replace: bool, password_stdin: bool, as_json: bool
) -> None:
    """Add user NAME (exit 1 if it exists, unless --replace). The password has at least
    12 characters."""
    password = check_password(read_password(password_stdin))

    async def main() -> bool:
        async with redis_client(target) as redis:
            return await ConsoleStore(redis, target.keys).add_user(
                name, password, role, replace=replace
            )

    report_change(
        as_json, run(main()), f"added {role} {name}", f"user {name} exists (see --replace)"
    )


@users.command("remove")
@target
@_name
@json_option
def users_remove(target: Target, name: str, as_json: bool) -> None:
    """Remove user NAME; their logins end at once (exit 1 if there was none)."""

    async def main() -> bool:
        async with redis_client(target) as redis:
            return await ConsoleStore(redis, target.keys).remove_user(name)

    report_change(as_json, run(main()), f"removed user {name}", f"no user {name}")


@users.command("list")
@target
@json_option
def users_list(target: Target, as_json: bool) -> None:
    """The users and their roles, by name."""

    async def main() -> list[tuple[str, Role]]:
        async with redis_client(target) as redis:
            return await ConsoleStore(redis, target.keys).users()

    found = run(main())
    if as_json:
        echo_json([{"name": name, "role": role} for name, role in found])
        return
    if not found:
        click.echo("no users")
    for name, role in found:
        click.echo(f"{name}  ({role})")


@dashboard.group()
def keys() -> None:
    """API keys for scripts (sent as Authorization: Bearer KEY)."""


@keys.command("add")
@target
@_name
@_role
@json_option
def keys_add(target: Target, name: str, role: Role, as_json: bool) -> None:
    """Make an API key named NAME and print it (it is shown this once)."""

    async def main() -> str:
        async with redis_client(target) as redis:
            return await ConsoleStore(redis, target.keys).add_api_key(name, role)

    key = run(main())
    key_id = key.split("_")[1]
    if as_json:
        echo_json({"id": key_id, "name": name, "role": role, "key": key})
    else:
        click.echo(key)


@keys.command("list")
@target
@json_option
def keys_list(target: Target, as_json: bool) -> None:
    """The API keys (ids, names and roles; never the keys)."""

    async def main() -> list[tuple[str, str, Role]]:
        async with redis_client(target) as redis:
            found = await ConsoleStore(redis, target.keys).api_keys()
            return [(k.key_id, k.name, k.role) for k in found]

    found = run(main())
    if as_json:
        echo_json([{"id": i, "name": n, "role": r} for i, n, r in found])
        return
    if not found:
        click.echo("no API keys")
    for key_id, name, role in found:
        click.echo(f"{key_id}  {name}  ({role})")


@keys.command("remove")
@target
@click.argument("key_id", metavar="ID")
@json_option
def keys_remove(target: Target, key_id: str, as_json: bool) -> None:
    """Revoke the API key with id ID (exit 1 if there was none)."""

    async def main() -> bool:
        async with redis_client(target) as redis:
            return await ConsoleStore(redis, target.keys).remove_api_key(key_id)

    report_change(as_json, run(main()), f"removed key {key_id}", f"no key {key_id}")
