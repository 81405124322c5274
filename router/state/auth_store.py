"""Users and ACL rules shared by the cluster, in Redis.

Three keys, under one hash tag (one slot on a Redis Cluster)::

    rt:{auth}:users   hash     user name -> "FLAG HASH"
    rt:{auth}:acl     list     rules in the ACL file format, tried in order
    rt:{auth}:count   string   changes made so far

``HASH`` is a password hash in the format ``mosquitto_passwd`` writes
(:mod:`router.core.passwords`; PBKDF2-HMAC-SHA512 with :data:`ITERATIONS` iterations
for a user added here), ``FLAG`` is ``s`` for a superuser (allowed everything the ACL
governs) and ``-`` otherwise. Rule lines are stored as :class:`~router.core.acl.AclRule`
prints them, so one rule has one spelling and :meth:`AuthStore.remove_rule` finds it by
its text.

Every change is one script (``lua/auth_change.lua``) that writes and moves the count in
the same step; a node compares the count with the one it read last (one ``GET`` a
second, :mod:`router.cluster.shared_auth`) and reads users and rules again only when it
moved. A reader that sees the count move while it reads reads again, so the copy it
returns was whole at one moment.

What the operator writes is checked here, before anything is written
(:class:`InvalidSettingError`, :class:`AclRuleError`, :class:`PasswordFileError`);
what a node reads is checked again (an entry written by hand that does not parse is
skipped and reported, :attr:`AuthSnapshot.skipped`, never trusted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from router.core.acl import AclRule, parse_rule
from router.core.passwords import PasswordFile, PasswordHash
from router.errors import AclRuleError, InvalidSettingError, PasswordFileError
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.scripts import RedisClient, Scripts

ITERATIONS: Final = 1_000
"""PBKDF2 iterations of a password set here, as mosquitto_passwd 2.1 writes (2.0 wrote
101). More slows a guesser who stole the hashes, and costs the node as much on every
CONNECT: about 0.5 ms of CPU at 1,000 on a 2-core test machine, 5 ms at 10,000 (a
reconnect storm of 10,000 clients would then cost 50 s of CPU). A hash keeps the count
it was made with."""

READS: Final = 3
"""Reads of users and rules before a snapshot is taken as is (the count kept moving)."""
MAX_POSITION: Final = 999_999_999
"""The largest rule position :meth:`AuthStore.add_rule` takes (what its script reads)."""

_SUPERUSER, _USER = "s", "-"


@dataclass(frozen=True)
class User:
    """One user: its name, password hash and whether it is a superuser."""

    name: str
    password: PasswordHash = field(repr=False)
    superuser: bool = False


@dataclass(frozen=True)
class AuthSnapshot:
    """Users and rules as one read found them, with the change count they belong to;
    ``skipped``: entries that did not parse (user names, or rule positions), left out."""

    count: int
    users: tuple[User, ...]
    rules: tuple[AclRule, ...]
    skipped: tuple[str, ...] = ()


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _user(name: str, record: str) -> User | None:
    flag, _, encoded = record.partition(" ")
    if flag not in (_SUPERUSER, _USER):
        return None
    try:
        password = PasswordHash.parse(encoded)
        PasswordFile([(name, password)])  # (a name a password file could hold)
    except PasswordFileError:
        return None
    return User(name, password, flag == _SUPERUSER)


def rule_line(rule: str | AclRule) -> AclRule:
    """``rule`` (a line of the ACL file format, or a rule) as a rule; raises
    :class:`AclRuleError` for a line that is not one rule."""
    if isinstance(rule, AclRule):
        return rule
    parsed = parse_rule(rule, "<rule>") if isinstance(rule, str) else None
    if parsed is None:
        raise AclRuleError(f"not an ACL rule: {rule!r}")
    return parsed


class AuthStore:
    """The cluster's users and ACL rules (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        tag = f"{keys.prefix}:{{auth}}"
        self.users_key, self.rules_key, self.count_key = (
            f"{tag}:users",
            f"{tag}:acl",
            f"{tag}:count",
        )
        self._scripts = Scripts(redis)

    async def _change(self, *args: str | int) -> int:
        keys = [self.users_key, self.rules_key, self.count_key]
        return int(await self._scripts.run("auth_change", keys, list(args)))

    # -- users -----------------------------------------------------------------------

    async def add_user(
        self, name: str, password: str, *, superuser: bool = False, replace: bool = False
    ) -> bool:
        """Add user ``name``; False (nothing written) when it exists, unless ``replace``.
        Raises :class:`InvalidSettingError` for a bad name and :class:`PasswordFileError`
        for a password that can never be checked (empty, or holding NUL)."""
        record = self._record(name, password, superuser)
        return bool(await self._change("user_add", name, record, "1" if replace else "0"))

    async def set_password(self, name: str, password: str) -> bool:
        """Give user ``name`` a new password (superuser or not, as it was); False when
        there is no such user (nothing written)."""
        encoded = self._record(name, password, False).partition(" ")[2]
        return bool(await self._change("user_password", name, encoded))

    async def remove_user(self, name: str) -> bool:
        """Remove user ``name``; False when there was none. Its connected clients stay
        connected (kick them to end them); its sessions can no longer be resumed."""
        return bool(await self._change("user_remove", check_id(name, "user name")))

    @staticmethod
    def _record(name: str, password: str, superuser: bool) -> str:
        check_id(name, "user name")
        hashed = PasswordHash.create(password, iterations=ITERATIONS)
        PasswordFile([(name, hashed)])  # (the names a password file takes: no ':' ...)
        return f"{_SUPERUSER if superuser else _USER} {hashed.encode()}"

    async def users(self) -> list[User]:
        """Every user that parses, sorted by name."""
        return list((await self.snapshot()).users)

    # -- rules -----------------------------------------------------------------------

    async def add_rule(self, rule: str | AclRule, position: int = 0) -> int:
        """Add ``rule`` (a line of the ACL file format) before the rule at ``position``
        (1-based; 0 or past the end: last); returns the position it took. Raises
        :class:`AclRuleError` for a line that is not one rule and
        :class:`InvalidSettingError` for a position outside 0 to :data:`MAX_POSITION`."""
        if type(position) is not int or not 0 <= position <= MAX_POSITION:
            shown = f"{position!r}" if len(repr(position)) <= 20 else "a larger number"
            raise InvalidSettingError(
                f"a rule position is a whole number from 0 to {MAX_POSITION:,}, not {shown}"
            )
        return await self._change("acl_insert", position, str(rule_line(rule)))

    async def remove_rule(self, rule: str | AclRule) -> int:
        """Remove the first rule equal to ``rule``; the position it had, 0 if none."""
        return await self._change("acl_remove", str(rule_line(rule)))

    async def rules(self) -> list[AclRule]:
        """The rules that parse, in the order they are tried."""
        return list((await self.snapshot()).rules)

    # -- reading ---------------------------------------------------------------------

    async def count(self) -> int:
        """The change count (0 before the first change)."""
        with translating:
            return int(await self.redis.get(self.count_key) or 0)

    async def snapshot(self) -> AuthSnapshot:
        """Users and rules as they were at one change count (see the module docstring)."""
        for _ in range(READS):
            count = await self.count()
            with translating:
                stored_users = await self.redis.hgetall(self.users_key)
                stored_rules = await self.redis.lrange(self.rules_key, 0, -1)
            if await self.count() == count:
                break
        # (unsettled: the data is at least as new as ``count``; the next read catches up)
        users, rules, skipped = [], [], []
        for raw_name, record in stored_users.items():
            name = _text(raw_name)
            user = _user(name, _text(record))
            if user is None:
                skipped.append(f"user {name}")
            else:
                users.append(user)
        for position, line in enumerate(stored_rules, 1):
            try:
                rules.append(rule_line(_text(line)))
            except AclRuleError:
                skipped.append(f"rule {position}")
        users.sort(key=lambda user: user.name)
        return AuthSnapshot(count, tuple(users), tuple(rules), tuple(skipped))
