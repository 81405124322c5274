"""A node's copy of the cluster's users and ACL rules, kept current from Redis.

The users and rules live in Redis (:mod:`router.state.auth_store`; ``router users`` and
``router acl`` change them). A node with :class:`SharedAuth` started:

* reads them before its listeners open (:meth:`SharedAuth.start` raises when Redis
  cannot be read: a node must not serve clients with no users), then every
  :data:`REFRESH` seconds reads the change count and, only when it moved, the users and
  rules again, so a change reaches every node within about a second, without restart;
* authenticates each CONNECT against its copy (a ``client.authenticate`` hook, with the
  password file's rules: :func:`~router.cluster.policy.password_authenticator`);
* judges publishes, subscribes and every copy on its way to a client with the rules
  (:meth:`RouterNode.replace_acl <router.cluster.node.RouterNode.replace_acl>`), tried in
  their order; a superuser's rules ``allow user NAME all #`` and ``allow user NAME all
  $SYS/#`` come first; ``default`` decides what no rule matches (deny unless set).

A node that cannot read Redis keeps the copy it has (logged once per outage); any
other failure of a refresh is a bug, counted by the node (``internal_errors``). An entry
that does not parse (written by hand) is left out and logged. A removed user's clients
stay connected until they reconnect (``router clients kick`` ends them now); a changed
rule applies to the next publish, subscribe and copy, also of subscriptions already held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from router.cluster.policy import password_authenticator
from router.cluster.tasks import stop_task
from router.core.acl import Acl, AclAction, AclRule, Permission
from router.core.hooks import HookPoint
from router.core.passwords import PasswordFile
from router.errors import StateError
from router.state.auth_store import AuthSnapshot, AuthStore

if TYPE_CHECKING:
    from router.cluster.node import RouterNode

log = logging.getLogger(__name__)

#: Seconds between two reads of the change count.
REFRESH: Final = 1.0

#: What a superuser may do before any rule is tried.
SUPERUSER_FILTERS: Final = ("#", "$SYS/#")


def superuser_rules(name: str) -> list[AclRule]:
    """The rules that let superuser ``name`` publish and receive every topic."""
    source = f"superuser {name}"
    return [
        AclRule(Permission.ALLOW, AclAction.ALL, topic_filter, username=name, source=source)
        for topic_filter in SUPERUSER_FILTERS
    ]


class SharedAuth:
    """The users and rules of the cluster on one node (see the module docstring). The
    node must have been started with an ACL (``NodeConfig.acl``; its rules are replaced
    by the cluster's at :meth:`start`)."""

    def __init__(
        self,
        node: RouterNode,
        store: AuthStore,
        *,
        allow_anonymous: bool = True,
        default: Permission = Permission.DENY,
        refresh: float = REFRESH,
    ) -> None:
        self._node = node
        self._store = store
        self._default = default
        self._refresh_every = refresh
        self._passwords = PasswordFile(())
        self._count: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.users = 0
        self.rules = 0
        self._authenticator = password_authenticator(
            lambda: self._passwords, allow_anonymous=allow_anonymous, source="users in Redis"
        )

    async def start(self) -> SharedAuth:
        """Read the users and rules, authenticate with them, and follow their changes."""
        await self.refresh()
        self._node.hooks.register(HookPoint.CLIENT_AUTHENTICATE, self._authenticator)
        self._task = asyncio.create_task(self._run(), name="shared-auth")
        return self

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        self._node.hooks.unregister(HookPoint.CLIENT_AUTHENTICATE, self._authenticator)

    async def refresh(self) -> bool:
        """Read the change count, and the users and rules when it moved; True if they did."""
        count = await self._store.count()
        if count == self._count:
            return False
        self._apply(await self._store.snapshot())
        return True

    def _apply(self, snapshot: AuthSnapshot) -> None:
        rules: list[AclRule] = []
        for user in snapshot.users:
            if user.superuser:
                rules += superuser_rules(user.name)
        self._passwords = PasswordFile((user.name, user.password) for user in snapshot.users)
        self._node.replace_acl(Acl([*rules, *snapshot.rules], self._default))
        self._count = snapshot.count
        self.users, self.rules = len(snapshot.users), len(snapshot.rules)
        if snapshot.skipped:
            log.warning(
                "users and ACL in Redis: left out what does not parse: %s",
                ", ".join(snapshot.skipped),
            )
        log.info(
            "users and ACL in Redis (change %d): %d users, %d rules, default %s",
            snapshot.count,
            self.users,
            self.rules,
            self._default.value,
        )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_every)
            try:
                await self.refresh()
                self._failing = False
            except StateError as error:
                if not self._failing:
                    log.warning("users and ACL in Redis not read (the copy stays): %r", error)
                self._failing = True
            except Exception as error:  # (a bug: told as one, the next refresh goes on)
                self._node.internal_error("reading the users and ACL in Redis", error)
