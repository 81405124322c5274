"""Where ``router node run`` takes its users and ACL rules from: one source of each.

* ``--password-file FILE`` (users, mosquitto_passwd's format) and ``--acl FILE`` (rules);
* ``--auth-redis``: users and rules in Redis, shared by the cluster
  (:mod:`router.cluster.shared_auth`, changed by ``router users`` and ``router acl``);
* ``--auth-emqx-redis URL --emqx-password-hash SPEC``: users and ACL entries where EMQX
  keeps them (:mod:`router.cluster.emqx_auth`).

:func:`auth_sources` checks the options before the node starts (a conflict or a bad
file is one error line); :func:`install` puts the chosen sources on the running node,
before its listeners open.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import click

from router.cluster.emqx_auth import EmqxAuth, EmqxPasswordHash
from router.cluster.node import RouterNode
from router.cluster.policy import load_acl, password_authenticator
from router.cluster.shared_auth import SharedAuth
from router.core.acl import Acl, Permission
from router.core.hooks import HookPoint
from router.core.passwords import PasswordFile
from router.state.auth_store import AuthStore
from router.state.connection import open_redis


@dataclass(frozen=True)
class AuthSources:
    """The checked sources of users and rules of one node."""

    default: Permission
    passwords: PasswordFile | None = None
    password_file: str | None = None
    acl: Acl | None = None
    acl_file: str | None = None
    shared: bool = False
    emqx_url: str | None = None
    emqx_hash: EmqxPasswordHash | None = None

    @property
    def authenticates(self) -> bool:
        """True when some source checks user names and passwords."""
        return self.passwords is not None or self.shared or self.emqx_url is not None


def auth_sources(
    password_file: str | None,
    acl_file: str | None,
    acl_default: str | None,
    shared: bool,
    emqx_url: str | None,
    emqx_hash: str | None,
) -> AuthSources:
    """The sources the options name, checked; raises ``click.BadParameter`` for a
    conflict, and the library's typed errors for a bad file or hash spec."""
    for flag, given in (("--auth-redis", shared), ("--auth-emqx-redis", emqx_url)):
        if given and any([password_file, acl_file, shared and emqx_url]):
            raise click.BadParameter(
                "is the one source of users and rules: drop --password-file, --acl and "
                "the other Redis source",
                param_hint=flag,
            )
    if (emqx_url is None) != (emqx_hash is None):
        raise click.BadParameter("goes with --auth-emqx-redis", param_hint="--emqx-password-hash")
    default = Permission(acl_default or "deny")
    if shared:  # (no rule until the first read from Redis: everything denied)
        return AuthSources(default, acl=Acl((), Permission.DENY), shared=True)
    if emqx_url is not None and emqx_hash is not None:
        return AuthSources(default, emqx_url=emqx_url, emqx_hash=EmqxPasswordHash.parse(emqx_hash))
    passwords = None if password_file is None else PasswordFile.from_file(password_file)
    acl = load_acl(acl_file, acl_default)
    return AuthSources(default, passwords, password_file, acl, acl_file)


async def install(
    sources: AuthSources,
    node: RouterNode,
    allow_anonymous: bool,
    stack: contextlib.AsyncExitStack,
    log: logging.Logger,
) -> None:
    """Authenticate and authorize ``node``'s clients with ``sources`` (what must be
    stopped goes on ``stack``)."""
    hooks = node.hooks
    if sources.passwords is not None:
        check = password_authenticator(sources.passwords, allow_anonymous=allow_anonymous)
        hooks.register(HookPoint.CLIENT_AUTHENTICATE, check)
        log.info("password file %s: %d users", sources.password_file, len(sources.passwords))
    if sources.acl is not None and not sources.shared:
        rules, default = len(sources.acl.rules), sources.acl.default.value
        log.info("ACL %s: %d rules, default %s", sources.acl_file, rules, default)
    if sources.shared:
        store = AuthStore(node.registry.redis, node.keys)
        shared = SharedAuth(node, store, allow_anonymous=allow_anonymous, default=sources.default)
        await shared.start()
        stack.push_async_callback(shared.stop)
    if sources.emqx_url is not None and sources.emqx_hash is not None:
        redis = await open_redis(sources.emqx_url)
        stack.push_async_callback(redis.aclose)
        emqx = EmqxAuth(
            redis, sources.emqx_hash, allow_anonymous=allow_anonymous, default=sources.default
        )
        hooks.register(HookPoint.CLIENT_AUTHENTICATE, emqx.authenticate)
        hooks.register(HookPoint.CLIENT_CHECK_ACL, emqx.check_acl)
        log.info("users and ACL entries of EMQX in Redis at %s", sources.emqx_url)
