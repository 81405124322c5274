"""Bans shared by the cluster: client ids, user names and source addresses that every
node refuses before it looks at their credentials.

One hash holds them all (a ban list stays small: an operator's and the flapping
detector's entries)::

    rt:{bans}:list   hash   KIND:VALUE -> packed [until, reason]

``KIND`` is ``client``, ``user`` or ``address``; ``until`` is when the ban ends, in Unix
seconds of the Redis server's clock (0: never). An ended ban is invisible at once and
removed by the next :meth:`BanStore.bans` (an add that keeps a ban in force runs one).
Nodes read the whole hash every second or so into a local copy
(:mod:`router.mqtt.ban_list`), so a ban reaches every node within that time, and
checking one costs a dictionary lookup.
"""

from __future__ import annotations

import ipaddress
import math
import time
from dataclasses import dataclass
from typing import Final, Literal

import msgpack  # type: ignore[import-untyped,unused-ignore]

from router.errors import InvalidSettingError
from router.state.event_log import Event
from router.state.failures import translating
from router.state.keys import Keys, check_id
from router.state.scripts import RedisClient

BanKind = Literal["client", "user", "address"]
KINDS: Final[tuple[BanKind, ...]] = ("client", "user", "address")


@dataclass(frozen=True)
class Ban:
    """One ban: what it names, until when (Unix seconds; 0: never) and why."""

    kind: BanKind
    value: str
    until: float = 0.0
    reason: str = ""

    def live(self, now: float) -> bool:
        return not self.until or self.until > now


def ban_event(ban: Ban, by: str) -> Event:
    """The event that tells ``ban`` was added by ``by`` (a node id, ``cli`` or ``api``),
    for the cluster's event log."""
    subject = f"{ban.kind}:{ban.value}"
    ends = (
        "until removed"
        if not ban.until
        else time.strftime("until %Y-%m-%d %H:%M:%S UTC", time.gmtime(ban.until))
    )
    why = f": {ban.reason}" if ban.reason else ""
    return Event("ban_added", "info", by, subject, f"{ban.kind} {ban.value} banned {ends}{why}")


def ban_lifted_event(kind: str, value: str, by: str) -> Event:
    """The event that tells the ban of ``value`` of ``kind`` was lifted by ``by``."""
    return Event("ban_removed", "info", by, f"{kind}:{value}", f"ban of {kind} {value} lifted")


def ban_field(kind: str, value: object) -> str:
    """The hash field of a ban, ``value`` checked (an address is normalised: ``::1`` and
    ``0:0::1`` are one); :class:`InvalidSettingError` for a kind or value it cannot be."""
    if kind not in KINDS:
        raise InvalidSettingError(f"a ban names a client, user or address, not {kind!r}")
    text = check_id(value, f"banned {kind}")
    if kind == "address":
        try:
            text = str(ipaddress.ip_address(text))
        except ValueError:
            raise InvalidSettingError(f"not an IP address: {text!r}") from None
    return f"{kind}:{text}"


def parse_ban(field: bytes | str, packed: bytes | str) -> Ban | None:
    """The ban stored under ``field``; None for an entry the router did not write."""
    text = field.decode(errors="replace") if isinstance(field, bytes) else field
    kind, _, value = text.partition(":")
    try:
        until, reason = msgpack.unpackb(packed)
        if kind not in KINDS or not value or not isinstance(reason, str):
            return None
        return Ban(kind, value, float(until), reason)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


class BanStore:
    """The cluster's bans in Redis (see the module docstring)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.key = f"{keys.prefix}:{{bans}}:list"

    async def _now(self) -> float:
        with translating:
            seconds, micros = await self.redis.time()
        return float(seconds) + micros / 1e6

    async def add(
        self,
        kind: str,
        value: str,
        *,
        seconds: float | None = None,
        reason: str = "",
        replace: bool = True,
    ) -> Ban:
        """Ban ``value`` of ``kind`` for ``seconds`` (None: until removed), replacing a
        ban of it already there (unless not ``replace``: then that one stays, and is
        returned). :class:`InvalidSettingError` for a bad kind, value or duration
        (nothing is written)."""
        field = ban_field(kind, value)
        if seconds is not None and not (0 < seconds < math.inf):
            raise InvalidSettingError(f"a ban lasts a positive number of seconds, not {seconds!r}")
        if not isinstance(reason, str):
            raise InvalidSettingError(f"a ban's reason is a str, not {reason!r}")
        kind_of, _, value_of = field.partition(":")
        if not replace:
            held = [
                ban for ban in await self.bans() if (ban.kind, ban.value) == (kind_of, value_of)
            ]
            if held:  # (bans() removed the ended ones: this one is in force)
                return held[0]
        now = await self._now()
        until = 0.0 if seconds is None else now + seconds
        entry = msgpack.packb([until, reason])
        with translating:
            if replace:
                await self.redis.hset(self.key, field, entry)
            written = replace or bool(await self.redis.hsetnx(self.key, field, entry))
        if not written:  # (one came meanwhile)
            return next(b for b in await self.bans() if (b.kind, b.value) == (kind_of, value_of))
        return Ban(kind_of, value_of, until, reason)  # type: ignore[arg-type]

    async def remove(self, kind: str, value: str) -> bool:
        """Lift the ban of ``value`` of ``kind``; False when there was none."""
        field = ban_field(kind, value)
        with translating:
            return bool(await self.redis.hdel(self.key, field))

    async def bans(self) -> list[Ban]:
        """Every ban in force, sorted by kind and value (ended ones are removed)."""
        now = await self._now()
        with translating:
            stored = await self.redis.hgetall(self.key)
        found = [ban for f, packed in stored.items() if (ban := parse_ban(f, packed)) is not None]
        ended = [f"{ban.kind}:{ban.value}" for ban in found if not ban.live(now)]
        if ended:
            with translating:
                await self.redis.hdel(self.key, *ended)
        return sorted((ban for ban in found if ban.live(now)), key=lambda b: (b.kind, b.value))
