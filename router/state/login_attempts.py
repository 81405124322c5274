"""The dashboard's login throttle, in Redis: shared by every node of the cluster.

A login takes a *slot* before its password is checked (the check is slow on purpose:
:mod:`router.state.console_store`), in two sliding windows at once, its user's and its
source address's; each holds at most ``limit`` slots taken in the last ``window``
seconds (Redis time)::

    rt:{console}:attempts:user:DIGEST      zset   attempt id -> server ms it was taken
    rt:{console}:attempts:address:ADDR     zset   attempt id -> server ms it was taken

A login that succeeds gives its slot back (:meth:`LoginAttempts.release`); one that fails
keeps it until it leaves the window. So however many nodes and concurrent tries there
are, at most ``limit`` wrong passwords are checked per user and per address in any
``window``; a try refused (:class:`~router.errors.LoginThrottledError`) is never checked
and takes no slot. ``DIGEST`` is the SHA-256 of the user name as sent (a key of bounded
length whatever a client sends, and no name written in clear); both keys carry the
console's hash tag, so one script (``lua/login_attempt.lua``) takes both slots at once.

The cost of a throttle per user: whoever guesses at a user's password for ``window``
seconds keeps that user out of the dashboard meanwhile (not out of API keys); the
address's window keeps one source from spreading its guesses over every user.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import Final

from router.errors import InvalidSettingError, LoginThrottledError
from router.state.failures import translating
from router.state.keys import Keys
from router.state.scripts import RedisClient, Scripts

MAX_LIMIT: Final = 999_999
"""Slots of a window at most (what the script reads)."""
MAX_WINDOW_MS: Final = 999_999_999_999
_SHOWN: Final = 64  # characters of a user name a refusal quotes at most


@dataclass(frozen=True)
class Attempt:
    """A slot taken for one login (:meth:`LoginAttempts.take`)."""

    user_key: str
    address_key: str
    attempt_id: str


class LoginAttempts:
    """The login throttle under ``keys`` (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys, *, limit: int, window: float) -> None:
        if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
            raise InvalidSettingError(f"a login limit is 1 to {MAX_LIMIT}, not {limit!r}")
        window_ms = math.ceil(window * 1000) if math.isfinite(window) else 0
        if not 1 <= window_ms <= MAX_WINDOW_MS:
            raise InvalidSettingError(f"a login window is a positive number of s, not {window!r}")
        self.redis = redis
        self.keys = keys
        self.limit = limit
        self.window = window
        self._window_ms = window_ms
        self._scripts = Scripts(redis)

    async def take(self, user: str, address: str) -> Attempt:
        """A slot for one login of ``user`` from ``address``. Raises
        :class:`LoginThrottledError` (nothing taken) while either window is full."""
        digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()
        attempt = Attempt(
            self.keys.console_login_attempts("user", digest),
            self.keys.console_login_attempts("address", address),
            secrets.token_hex(12),
        )
        args = [attempt.attempt_id, self.limit, self._window_ms]
        full, wait_ms = await self._scripts.run(
            "login_attempt", [attempt.user_key, attempt.address_key], args
        )
        if not int(full):
            return attempt
        wait = max(1, math.ceil(int(wait_ms) / 1000))
        if int(full) == 1:
            shown = user if len(user) <= _SHOWN else user[: _SHOWN - 3] + "..."
            whom = f"for user {shown!r}"
        else:
            whom = f"from {address}"
        raise LoginThrottledError(
            f"too many failed logins {whom} (at most {self.limit} in {self.window:g} s): "
            f"try again in {wait} s",
            wait,
        )

    async def release(self, attempt: Attempt) -> None:
        """Give back the slot of a login that succeeded (nothing if it left the window)."""
        with translating:
            await self.redis.zrem(attempt.user_key, attempt.attempt_id)
            await self.redis.zrem(attempt.address_key, attempt.attempt_id)
