"""EMQX's users and ACL entries, read where EMQX keeps them in Redis (never written).

The layout is EMQX's (its Redis authenticator and authorizer), under prefixes the user
names (``mqtt_user:`` and ``mqtt_acl:`` unless told): these keys are not the router's, so
they are not built by :mod:`router.state.keys`::

    mqtt_user:NAME   hash   password_hash (or EMQX 4's password), salt, is_superuser
    mqtt_acl:NAME    hash   topic filter -> action

What the values mean is :mod:`router.cluster.emqx_auth`'s business; this module reads them
as text (a missing field: ``""``). Redis failing raises as :mod:`router.state.failures`
says.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from router.state.failures import translating
from router.state.scripts import RedisClient

USER_FIELDS: Final = ("password_hash", "password", "salt", "is_superuser")


class EmqxUser(NamedTuple):
    """The fields of a user's ``mqtt_user:NAME`` hash, as text (``""`` when missing)."""

    password_hash: str
    password: str
    salt: str
    is_superuser: str


class EmqxRecords:
    """Reads EMQX's users and ACL entries under ``user_prefix`` and ``acl_prefix``."""

    def __init__(
        self, redis: RedisClient, user_prefix: str = "mqtt_user:", acl_prefix: str = "mqtt_acl:"
    ) -> None:
        self.redis = redis
        self.user_prefix, self.acl_prefix = user_prefix, acl_prefix

    async def user(self, name: str) -> EmqxUser:
        """User ``name``'s fields (one HMGET); every field ``""`` for no such user."""
        with translating:
            found = await self.redis.hmget(f"{self.user_prefix}{name}", USER_FIELDS)
        return EmqxUser(*(_text(value) for value in found))

    async def acl(self, name: str) -> dict[str, str]:
        """User ``name``'s ACL entries: topic filter -> action (one HGETALL)."""
        with translating:
            raw = await self.redis.hgetall(f"{self.acl_prefix}{name}")
        return {_text(topic): _text(action) for topic, action in raw.items()}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
