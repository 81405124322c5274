"""The dashboard's accounts, in Redis: users with a role, API keys, and logins.

Every node of the cluster reads the same keys, so an account made once logs in on any
node, and a login made on one node holds on the others. All keys share one hash tag (one
slot on a Redis Cluster)::

    rt:{console}:users          hash     user name -> "ROLE HASH"
    rt:{console}:keys           hash     key id -> "ROLE DIGEST NAME"
    rt:{console}:login:DIGEST   string   "ROLE CSRF USER", expiring    (one per login)

``ROLE`` is ``admin`` or ``viewer``. ``HASH`` is a PBKDF2-HMAC-SHA512 password hash in the
format ``mosquitto_passwd`` writes (:mod:`router.core.passwords`), with
:data:`ITERATIONS` rounds: checking one costs tens of milliseconds, so callers check in a
thread. An API key is ``rk_ID_SECRET``; only the SHA-256 digest of its secret is kept
(the secret is 32 random bytes, so a fast digest is enough). A login is named by the
SHA-256 digest of its cookie's token, so reading Redis never gives a usable cookie.

A user's login is checked against the user's current entry on every request
(:meth:`ConsoleStore.login`): removing a user or changing their role takes effect at once.
What the operator writes is checked before anything is written
(:class:`InvalidSettingError`, :class:`WeakPasswordError` for a password shorter than
:data:`MIN_PASSWORD`, :class:`PasswordFileError`). How many logins may fail is
:mod:`router.state.login_attempts`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Final, Literal

from router.core.passwords import PasswordHash
from router.errors import CorruptStateError, InvalidSettingError, WeakPasswordError
from router.state.failures import translating
from router.state.keys import Keys
from router.state.scripts import RedisClient

Role = Literal["admin", "viewer"]
ROLES: Final[tuple[Role, ...]] = ("admin", "viewer")
ITERATIONS: Final = 210_000
"""PBKDF2-HMAC-SHA512 rounds of a dashboard password (OWASP's figure for SHA-512)."""
LOGIN_SECONDS: Final = 12 * 3600
"""How long a login lasts."""
MIN_PASSWORD: Final = 12
"""Characters of a dashboard password at least (an admin may change the whole cluster)."""
MAX_NAME = 64
_NAME = re.compile(r"[A-Za-z0-9._@-]+")
_KEY = re.compile(r"rk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a user (by login or API key) and what they may do.
    ``user`` is None for the open access of a loopback listener with no account."""

    user: str | None
    role: Role
    csrf: str | None = None  # the login's token for state-changing requests (None: a key)

    @property
    def may_change(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    name: str
    role: Role


def check_name(name: object, what: str = "user name") -> str:
    """``name`` if it is a usable account name (letters, digits, ``._@-``, at most 64)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise InvalidSettingError(
            f"a {what} is 1-{MAX_NAME} letters, digits or ._@- characters, not {name!r}"
        )
    return name


def check_password(password: str) -> str:
    """``password`` if it is long enough for a dashboard account (:class:`WeakPasswordError`
    otherwise; checked before anything is hashed or written, so a front end may check
    first too)."""
    if len(password) < MIN_PASSWORD:
        raise WeakPasswordError(MIN_PASSWORD)
    return password


def check_role(role: object) -> Role:
    if role not in ROLES:
        raise InvalidSettingError(f"a role is admin or viewer, not {role!r}")
    return role


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class ConsoleStore:
    """The dashboard's accounts under ``keys`` (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    # -- users -----------------------------------------------------------------------

    async def add_user(
        self, name: str, password: str, role: Role, *, replace: bool = False
    ) -> bool:
        """Add (or with ``replace``, overwrite) a user; False if one exists already.
        Raises :class:`InvalidSettingError` for a bad name or role and
        :class:`WeakPasswordError` for a password shorter than :data:`MIN_PASSWORD`."""
        check_name(name)
        check_role(role)
        check_password(password)
        entry = f"{role} {PasswordHash.create(password, iterations=ITERATIONS).encode()}"
        with translating:
            if replace:
                await self.redis.hset(self.keys.console_users(), name, entry)
                return True
            return bool(await self.redis.hsetnx(self.keys.console_users(), name, entry))

    async def remove_user(self, name: str) -> bool:
        """Remove a user (their logins end with it); False if there was none."""
        check_name(name)
        with translating:
            return bool(await self.redis.hdel(self.keys.console_users(), name))

    async def users(self) -> list[tuple[str, Role]]:
        """Every user and their role, sorted by name."""
        with translating:
            found = await self.redis.hgetall(self.keys.console_users())
        return sorted((_text(name) or "", self._entry(value)[0]) for name, value in found.items())

    async def has_accounts(self) -> bool:
        """True if any user or API key exists."""
        with translating:
            counts = [
                await self.redis.hlen(self.keys.console_users()),
                await self.redis.hlen(self.keys.console_api_keys()),
            ]
        return any(counts)

    async def user_hash(self, name: str) -> tuple[Role, PasswordHash] | None:
        """The user's role and password hash, or None for no such user (checking the
        password is the caller's: it is slow on purpose)."""
        if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
            return None
        with translating:
            value = await self.redis.hget(self.keys.console_users(), name)
        return None if value is None else self._entry(value)

    def _entry(self, value: bytes | str) -> tuple[Role, PasswordHash]:
        text = _text(value) or ""
        role, _, encoded = text.partition(" ")
        if role not in ROLES:
            raise CorruptStateError(f"dashboard user entry with role {role!r}")
        try:
            return role, PasswordHash.parse(encoded)
        except ValueError as exc:
            raise CorruptStateError(f"dashboard user entry: {exc}") from None

    # -- logins ----------------------------------------------------------------------

    async def open_login(self, user: str, role: Role) -> tuple[str, str]:
        """A new login for ``user``: (the cookie's token, its CSRF token)."""
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        key = self.keys.console_login(_digest(token))
        with translating:
            await self.redis.set(key, f"{role} {csrf} {user}", ex=LOGIN_SECONDS)
        return token, csrf

    async def login(self, token: str) -> Principal | None:
        """The principal of a live login (its user still there, with their role now),
        or None."""
        if not token or len(token) > 128:
            return None
        with translating:
            value = _text(await self.redis.get(self.keys.console_login(_digest(token))))
        if value is None:
            return None
        parts = value.split(" ", 2)
        if len(parts) != 3:
            raise CorruptStateError("dashboard login entry without three fields")
        _, csrf, user = parts
        current = await self.user_hash(user)
        if current is None:
            return None
        return Principal(user, current[0], csrf)

    async def close_login(self, token: str) -> None:
        with translating:
            await self.redis.delete(self.keys.console_login(_digest(token)))

    # -- API keys --------------------------------------------------------------------

    async def add_api_key(self, name: str, role: Role) -> str:
        """A new API key (returned once; only its digest is kept)."""
        check_name(name, "key name")
        check_role(role)
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        entry = f"{role} {_digest(secret)} {name}"
        with translating:
            await self.redis.hset(self.keys.console_api_keys(), key_id, entry)
        return f"rk_{key_id}_{secret}"

    async def api_keys(self) -> list[ApiKey]:
        with translating:
            found = await self.redis.hgetall(self.keys.console_api_keys())
        keys = []
        for key_id, value in found.items():
            role, _, name = self._key_entry(value)
            keys.append(ApiKey(_text(key_id) or "", name, role))
        return sorted(keys, key=lambda k: (k.name, k.key_id))

    async def remove_api_key(self, key_id: str) -> bool:
        with translating:
            return bool(await self.redis.hdel(self.keys.console_api_keys(), key_id))

    async def api_key(self, presented: str) -> Principal | None:
        """The principal of a presented key, or None if it is not a live key."""
        found = _KEY.fullmatch(presented)
        if found is None:
            return None
        with translating:
            value = await self.redis.hget(self.keys.console_api_keys(), found[1])
        if value is None:
            return None
        role, digest, name = self._key_entry(value)
        if not hmac.compare_digest(digest, _digest(found[2])):
            return None
        return Principal(f"key:{name}", role)

    def _key_entry(self, value: bytes | str) -> tuple[Role, str, str]:
        parts = (_text(value) or "").split(" ", 2)
        if len(parts) != 3:
            raise CorruptStateError("dashboard API key entry without three fields")
        role, digest, name = parts
        if role not in ROLES:
            raise CorruptStateError(f"dashboard API key entry with role {role!r}")
        return role, digest, name
