"""Users and ACL rules where EMQX keeps them in Redis, so teams moving from EMQX keep
their data: ``router node run --auth-emqx-redis URL --emqx-password-hash SPEC``.

The layout (EMQX 5's Redis authenticator and authorizer with their documented commands;
``PREFIX`` is ``mqtt_user:`` and ``mqtt_acl:`` unless told)::

    mqtt_user:NAME   hash   password_hash (or EMQX 4's password), salt, is_superuser
    mqtt_acl:NAME    hash   topic filter -> publish | subscribe | all  (or a JSON object
                            with an "action" member, as EMQX 5.1+ writes)

* **Authentication**, at each CONNECT: ``HMGET mqtt_user:NAME password_hash password
  salt is_superuser``; the password must hash to ``password_hash`` with the algorithm
  of ``--emqx-password-hash`` (:class:`EmqxPasswordHash`), else CONNACK 0x86 (3.1.1: 4).
  No user name: allowed only with anonymous clients allowed (else 0x87).
* **Authorization** (``client.check_acl``): a superuser (``is_superuser`` ``1`` or
  ``true``) may do anything; anyone else may publish or subscribe where one of their
  ``mqtt_acl:NAME`` filters matches with that action (the entries only allow, as in
  EMQX), and ``default`` decides the rest (deny unless set). A user's entries are read
  at CONNECT and again when they are older than ``refresh`` seconds at a check, so a
  change applies within that time. Entries are MQTT filters with ``%u`` / ``%c``
  placeholders (EMQX's ``${username}`` / ``${clientid}`` are taken too); one that does
  not parse is left out.
* What EMQX does not judge, neither does this: the copies a subscription brings are not
  checked against the entries one by one (the node's own ACL, ``--acl``, does that; it
  cannot be combined with this source).

Hashes (``SPEC``, as EMQX's ``password_hash_algorithm``): ``plain``; ``md5``, ``sha``,
``sha256``, ``sha512`` with ``,prefix`` (salt + password), ``,suffix`` (password + salt)
or ``,disable`` (no salt), compared as lowercase hex; ``pbkdf2,MAC,ITERATIONS[,DK_LENGTH]``
(MAC ``sha``, ``sha256`` or ``sha512``; hex of the derived key); ``bcrypt`` (the stored
hash carries its salt). Digests are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import bcrypt

from router.core.acl import AclAction, AclRule, Permission
from router.core.hooks import ClientInfo, Decision, HookResult, Stop
from router.core.topics import parse_shared
from router.errors import AclRuleError, InvalidSettingError
from router.state.emqx_records import EmqxRecords
from router.state.scripts import RedisClient

SALTED: Final = ("md5", "sha", "sha256", "sha512")
SALT_POSITIONS: Final = ("prefix", "suffix", "disable")
MACS: Final = {"sha": "sha1", "sha256": "sha256", "sha512": "sha512"}
ACTIONS: Final = {
    "publish": AclAction.PUBLISH,
    "subscribe": AclAction.SUBSCRIBE,
    "all": AclAction.ALL,
}
REFRESH: Final = 1.0
"""Seconds a user's ACL entries are used before a check reads them again."""
TRUE: Final = ("1", "true")


@dataclass(frozen=True)
class EmqxPasswordHash:
    """How EMQX hashed the passwords (see the module docstring for ``SPEC``)."""

    name: str
    salt_position: str = "disable"
    mac: str = "sha256"
    iterations: int = 0
    dk_length: int | None = None

    @classmethod
    def parse(cls, spec: str) -> EmqxPasswordHash:
        """The algorithm ``spec`` names; :class:`InvalidSettingError` for a bad one."""
        name, *rest = [part.strip() for part in spec.split(",")]
        if name in ("plain", "bcrypt") and not rest:
            return cls(name)
        if name in SALTED and len(rest) <= 1:
            position = rest[0] if rest else "prefix"
            if position in SALT_POSITIONS:
                return cls(name, position)
        if name == "pbkdf2" and len(rest) in (2, 3) and rest[0] in MACS:
            numbers = rest[1:]
            if all(n.isdigit() and 0 < int(n) < 1 << 31 for n in numbers):
                length = int(numbers[1]) if len(numbers) == 2 else None
                return cls(name, mac=rest[0], iterations=int(numbers[0]), dk_length=length)
        raise InvalidSettingError(
            f"not an EMQX password hash: {spec!r} (plain, bcrypt, md5|sha|sha256|sha512"
            "[,prefix|suffix|disable], pbkdf2,sha|sha256|sha512,ITERATIONS[,DK_LENGTH])"
        )

    def verify(self, password: bytes, stored: str, salt: str) -> bool:
        """True if ``password`` hashes to ``stored`` with ``salt``."""
        if self.name == "plain":
            return hmac.compare_digest(password, stored.encode())
        if self.name == "bcrypt":
            try:
                return bcrypt.checkpw(password, stored.encode())
            except ValueError:  # (not a bcrypt hash)
                return False
        if self.name == "pbkdf2":
            mac = MACS[self.mac]
            key = hashlib.pbkdf2_hmac(mac, password, salt.encode(), self.iterations, self.dk_length)
            return hmac.compare_digest(key.hex(), stored.lower())
        salted = {"prefix": salt.encode() + password, "suffix": password + salt.encode()}
        digest = hashlib.new(
            MACS.get(self.name, self.name), salted.get(self.salt_position, password)
        )
        return hmac.compare_digest(digest.hexdigest(), stored.lower())


@dataclass
class _Entries:
    """A user's ACL entries as last read, and when."""

    superuser: bool
    rules: list[AclRule] = field(default_factory=list)
    read_at: float = 0.0


def entry_rules(name: str, entries: dict[str, str]) -> list[AclRule]:
    """The allowing rules of user ``name``'s ``mqtt_acl`` hash (entries that do not parse
    are left out)."""
    rules = []
    for topic, value in entries.items():
        action = ACTIONS.get(value)
        if action is None and value.startswith("{"):
            try:
                action = ACTIONS.get(str(json.loads(value).get("action")))
            except (ValueError, AttributeError):
                action = None
        if action is None:
            continue
        topic_filter = topic.replace("${username}", "%u").replace("${clientid}", "%c")
        try:
            rules.append(AclRule(Permission.ALLOW, action, topic_filter, username=name))
        except AclRuleError:
            continue
    return rules


class EmqxAuth:
    """The ``client.authenticate`` and ``client.check_acl`` callbacks over EMQX's layout."""

    def __init__(
        self,
        redis: RedisClient,
        password_hash: EmqxPasswordHash,
        *,
        allow_anonymous: bool = True,
        default: Permission = Permission.DENY,
        user_prefix: str = "mqtt_user:",
        acl_prefix: str = "mqtt_acl:",
        refresh: float = REFRESH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.password_hash = password_hash
        self.allow_anonymous = allow_anonymous
        self.default = Decision(default is Permission.ALLOW, f"{default.value}: no entry matched")
        self.user_prefix, self.acl_prefix = user_prefix, acl_prefix
        self.records = EmqxRecords(redis, user_prefix, acl_prefix)
        self.refresh, self.clock = refresh, clock
        self._entries: dict[str, _Entries] = {}

    async def authenticate(
        self, client: ClientInfo, password: str | bytes | None, _: Decision
    ) -> Stop[Decision]:
        """The ``client.authenticate`` callback (one HMGET)."""
        name = client.username
        if name is None:
            if self.allow_anonymous:
                return Stop(Decision.allow("anonymous"))
            return Stop(Decision.deny("a user name is required"))
        found = await self.records.user(name)
        stored, salt = found.password_hash or found.password, found.salt
        superuser = found.is_superuser.lower() in TRUE
        secret = password.encode() if isinstance(password, str) else password
        if not stored or not secret or not self.password_hash.verify(secret, stored, salt):
            return Stop(Decision.deny("bad user name or password"))
        await self._read_entries(name, superuser)
        return Stop(Decision.allow("EMQX users in Redis"))

    async def _read_entries(self, name: str, superuser: bool) -> _Entries:
        entries = await self.records.acl(name)
        read = self._entries[name] = _Entries(superuser, entry_rules(name, entries), self.clock())
        return read

    async def check_acl(
        self, client: ClientInfo, action: AclAction, topic: str, _: Decision
    ) -> HookResult:
        """The ``client.check_acl`` callback: a superuser, else the user's entries."""
        name = client.username
        if name is None:
            return Stop(self.default)
        held = self._entries.get(name)
        if held is None or self.clock() - held.read_at > self.refresh:
            superuser = held.superuser if held is not None else False
            held = await self._read_entries(name, superuser)
        if held.superuser:
            return Stop(Decision.allow(f"superuser {name}"))
        shared = parse_shared(topic) if action is AclAction.SUBSCRIBE else None
        levels = (topic if shared is None else shared[1]).split("/")
        for rule in held.rules:
            if rule.matches(client, action, levels):
                return Stop(Decision.allow(f"allowed by mqtt_acl:{name} {rule.topic_filter}"))
        return Stop(self.default)
