"""``router users add|passwd|remove|list`` and ``router acl add|remove|list``: the users
and ACL rules nodes started with ``--auth-redis`` share (see
:mod:`router.state.auth_store`); a change reaches every node within about a second.

Passwords are read from the terminal (asked twice), or from standard input when it is
not one (one line), never from the command line, where other users of the machine and
the shell's history would see them.

JSON shapes (``--json``): ``users list`` prints ``[{"name", "superuser"}]``; ``acl list``
prints ``[{"position", "rule"}]``; the changes print ``{"changed": true|false}`` (``acl
add``: ``{"position": N}``).
"""

from __future__ import annotations

import click

from router.state.auth_store import AuthStore

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


@click.group()
def users() -> None:
    """Users nodes started with --auth-redis accept (shared in Redis)."""


@users.command("add")
@target
@_name
@click.option("--superuser", is_flag=True, help="Allowed every topic, whatever the ACL says.")
@click.option("--replace", is_flag=True, help="Replace the user if it exists.")
@json_option
def users_add(target: Target, name: str, superuser: bool, replace: bool, as_json: bool) -> None:
    """Add user NAME (exit 1 if it exists, unless --replace)."""
    password = read_password()

    async def main() -> bool:
        async with redis_client(target) as redis:
            store = AuthStore(redis, target.keys)
            return await store.add_user(name, password, superuser=superuser, replace=replace)

    report_change(as_json, run(main()), f"added user {name}", f"user {name} exists (see --replace)")


@users.command("passwd")
@target
@_name
@json_option
def users_passwd(target: Target, name: str, as_json: bool) -> None:
    """Give user NAME a new password (exit 1 if there is no such user)."""
    password = read_password()

    async def main() -> bool:
        async with redis_client(target) as redis:
            return await AuthStore(redis, target.keys).set_password(name, password)

    report_change(as_json, run(main()), f"changed the password of {name}", f"no user {name}")


@users.command("remove")
@target
@_name
@json_option
def users_remove(target: Target, name: str, as_json: bool) -> None:
    """Remove user NAME (exit 1 if there was none); its clients stay connected until
    they reconnect (router clients kick ends them now)."""

    async def main() -> bool:
        async with redis_client(target) as redis:
            return await AuthStore(redis, target.keys).remove_user(name)

    report_change(as_json, run(main()), f"removed user {name}", f"no user {name}")


@users.command("list")
@target
@json_option
def users_list(target: Target, as_json: bool) -> None:
    """The users, by name."""

    async def main() -> list[tuple[str, bool]]:
        async with redis_client(target) as redis:
            found = await AuthStore(redis, target.keys).users()
            return [(user.name, user.superuser) for user in found]

    found = run(main())
    if as_json:
        echo_json([{"name": name, "superuser": superuser} for name, superuser in found])
    elif not found:
        click.echo("no users")
    for name, superuser in [] if as_json else found:
        click.echo(f"{name}  (superuser)" if superuser else name)


@click.group()
def acl() -> None:
    """ACL rules nodes started with --auth-redis judge by, in order (shared in Redis)."""


_rule = click.argument("rule", nargs=-1, required=True)


@acl.command("add")
@target
@_rule
@click.option(
    "--at",
    "position",
    type=click.IntRange(min=1),
    default=None,
    help="Put it before the rule at this position (see list) [default: last].",
)
@json_option
def acl_add(target: Target, rule: tuple[str, ...], position: int | None, as_json: bool) -> None:
    """Add RULE, in the ACL file format: PERMISSION SUBJECT ACTION FILTER, for example
    ``allow user alice publish sensors/%u/#`` (the first matching rule decides)."""

    async def main() -> int:
        async with redis_client(target) as redis:
            return await AuthStore(redis, target.keys).add_rule(" ".join(rule), position or 0)

    taken = run(main())
    if as_json:
        echo_json({"position": taken})
    else:
        click.echo(f"rule {taken}: {' '.join(rule)}")


@acl.command("remove")
@target
@_rule
@json_option
def acl_remove(target: Target, rule: tuple[str, ...], as_json: bool) -> None:
    """Remove the first rule equal to RULE (exit 1 if there is none)."""

    async def main() -> int:
        async with redis_client(target) as redis:
            return await AuthStore(redis, target.keys).remove_rule(" ".join(rule))

    position = run(main())
    text = " ".join(rule)
    report_change(as_json, bool(position), f"removed rule {position}: {text}", f"no rule {text}")


@acl.command("list")
@target
@json_option
def acl_list(target: Target, as_json: bool) -> None:
    """The rules, in the order they are tried."""

    async def main() -> list[str]:
        async with redis_client(target) as redis:
            return [str(rule) for rule in await AuthStore(redis, target.keys).rules()]

    found = run(main())
    if as_json:
        echo_json([{"position": n, "rule": rule} for n, rule in enumerate(found, 1)])
    elif not found:
        click.echo("no rules")
    for n, rule in [] if as_json else enumerate(found, 1):
        click.echo(f"{n:>4}  {rule}")
