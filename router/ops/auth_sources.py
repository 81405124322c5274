"""Where a node process takes its users and ACL rules from: one source of each.

* a password file (users, mosquitto_passwd's format) and an ACL file (rules);
* Redis, shared by the cluster (:mod:`router.cluster.shared_auth`, changed by
  ``router users`` and ``router acl``);
* the Redis where EMQX keeps its users and ACL entries, with the way EMQX hashed the
  passwords (:mod:`router.cluster.emqx_auth`).

:func:`check_auth_sources` refuses a combination that names more than one source
(:class:`NodeSettingError`, without reading anything); :func:`auth_sources` reads the
files and parses the hash spec before the node starts (a bad one: the library's typed
error naming the file and line); :func:`install` puts the chosen sources on the running
node, before its listeners open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from router.cluster.emqx_auth import EmqxAuth, EmqxPasswordHash
from router.cluster.node import RouterNode
from router.cluster.policy import load_acl, password_authenticator
from router.cluster.shared_auth import SharedAuth
from router.core.acl import Acl, Permission
from router.core.hooks import HookPoint
from router.core.passwords import PasswordFile
from router.errors import NodeSettingError
from router.state.auth_store import AuthStore
from router.state.connection import open_redis
from router.state.node_history import SHARED_AUTH

log = logging.getLogger(__name__)


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

    def kind(self, jwt: bool = False) -> str:
        """The word for where these users and rules come from, as the node's telemetry
        tells the cluster: :data:`SHARED_AUTH` (Redis, ``--auth-redis``: what
        ``router users|acl`` and the dashboard edit), ``emqx``, ``files``, ``jwt``
        (``jwt``: the node checks tokens, and no other source), ``none``."""
        if self.shared:
            return SHARED_AUTH
        if self.emqx_url is not None:
            return "emqx"
        if self.passwords is not None or self.acl_file is not None:
            return "files"
        return "jwt" if jwt else "none"

    def reread(self) -> AuthSources:
        """These sources with their password and ACL files read again (the others as they
        are): :class:`PasswordFileError`, :class:`AclRuleError`."""
        passwords = self.passwords
        if self.password_file is not None:
            passwords = PasswordFile.from_file(self.password_file)
        acl = self.acl
        if self.acl_file is not None:
            acl = load_acl(self.acl_file, self.default.value)
        return dataclasses.replace(self, passwords=passwords, acl=acl)

    def describe(self) -> str:
        """The words of what the files hold (empty without files)."""
        told = []
        if self.passwords is not None:
            told.append(f"password file {self.password_file} ({len(self.passwords)} users)")
        if self.acl is not None and self.acl_file is not None:
            rules, default = len(self.acl.rules), self.acl.default.value
            told.append(f"ACL {self.acl_file} ({rules} rules, default {default})")
        return ", ".join(told)


def check_auth_sources(
    password_file: str | None,
    acl_file: str | None,
    shared: bool,
    emqx_url: str | None,
    emqx_password_hash: str | None,
) -> None:
    """Raise :class:`NodeSettingError` if the settings name more than one source of users
    and rules (``auth_redis`` or ``emqx_url`` beside the files or each other), or an EMQX
    hash without its Redis (or the other way round). Reads nothing."""
    for setting, given in (("auth_redis", shared), ("emqx_url", emqx_url)):
        if given and any([password_file, acl_file, shared and emqx_url]):
            raise NodeSettingError(
                setting,
                "is the one source of users and rules: drop {}, {} and the other Redis source",
                ("password_file", "acl_file"),
            )
    if (emqx_url is None) != (emqx_password_hash is None):
        raise NodeSettingError("emqx_password_hash", "goes with {}", ("emqx_url",))


def auth_sources(
    password_file: str | None,
    acl_file: str | None,
    acl_default: str | None,
    shared: bool,
    emqx_url: str | None,
    emqx_password_hash: str | None,
) -> AuthSources:
    """The sources the settings name, checked (:func:`check_auth_sources`) and read: the
    password file (:class:`PasswordFileError`), the ACL file and its default
    (:class:`AclRuleError`), the EMQX hash spec (:class:`InvalidSettingError`)."""
    check_auth_sources(password_file, acl_file, shared, emqx_url, emqx_password_hash)
    default = Permission(acl_default or "deny")
    if shared:  # (no rule until the first read from Redis: everything denied)
        return AuthSources(default, acl=Acl((), Permission.DENY), shared=True)
    if emqx_url is not None and emqx_password_hash is not None:
        emqx_hash = EmqxPasswordHash.parse(emqx_password_hash)
        return AuthSources(default, emqx_url=emqx_url, emqx_hash=emqx_hash)
    passwords = None if password_file is None else PasswordFile.from_file(password_file)
    acl = load_acl(acl_file, acl_default)
    return AuthSources(default, passwords, password_file, acl, acl_file)


async def install(
    sources: AuthSources,
    node: RouterNode,
    allow_anonymous: bool,
    stack: contextlib.AsyncExitStack,
    passwords: Callable[[], PasswordFile] | None = None,
) -> None:
    """Authenticate and authorize ``node``'s clients with ``sources`` (what must be
    stopped goes on ``stack``); ``passwords``, when given, is asked for the current
    password file at each CONNECT (a reload replaces it)."""
    hooks = node.hooks
    if sources.passwords is not None:
        current = passwords or sources.passwords
        check = password_authenticator(current, allow_anonymous=allow_anonymous)
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
