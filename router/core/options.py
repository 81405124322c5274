"""Subscription options (MQTT 5.0, 3.8.3.1) as a small, validated, immutable value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from router.errors import InvalidOptionsError

MAX_SUBSCRIPTION_IDENTIFIER: Final = 268_435_455


@dataclass(frozen=True, slots=True)
class SubscriptionOptions:
    """What a subscriber asked for along with its filter.

    ``qos`` 0..2; ``no_local`` (do not send the client its own publishes);
    ``retain_as_published`` (keep the retain flag on live messages); ``retain_handling``
    0 (send retained on every subscribe), 1 (only on a new subscription), 2 (never);
    ``subscription_identifier`` 1..268435455 or None.
    """

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int | None = None

    def __post_init__(self) -> None:
        if type(self.qos) is not int or not 0 <= self.qos <= 2:
            raise InvalidOptionsError(f"qos must be 0, 1 or 2, not {self.qos!r}")
        if type(self.retain_handling) is not int or not 0 <= self.retain_handling <= 2:
            raise InvalidOptionsError(
                f"retain_handling must be 0, 1 or 2, not {self.retain_handling!r}"
            )
        for flag in ("no_local", "retain_as_published"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidOptionsError(f"{flag} must be a bool")
        ident = self.subscription_identifier
        if ident is not None and (
            type(ident) is not int or not 1 <= ident <= MAX_SUBSCRIPTION_IDENTIFIER
        ):
            raise InvalidOptionsError(
                f"subscription_identifier must be 1..{MAX_SUBSCRIPTION_IDENTIFIER}, not {ident!r}"
            )

    def as_dict(self) -> dict[str, Any]:
        """The options as plain data (for JSON output and storage)."""
        return {
            "qos": self.qos,
            "no_local": self.no_local,
            "retain_as_published": self.retain_as_published,
            "retain_handling": self.retain_handling,
            "subscription_identifier": self.subscription_identifier,
        }


DEFAULT_OPTIONS: Final = SubscriptionOptions()

_interned: dict[SubscriptionOptions, SubscriptionOptions] = {DEFAULT_OPTIONS: DEFAULT_OPTIONS}
_INTERN_LIMIT: Final = 4096


def make_options(**options: Any) -> SubscriptionOptions:
    """Build (and share) the options value for keyword arguments.

    Equal option sets share one object, so a million subscriptions with the same options
    cost one object. Unknown keywords raise :class:`InvalidOptionsError`.
    """
    if not options:
        return DEFAULT_OPTIONS
    try:
        value = SubscriptionOptions(**options)
    except TypeError as exc:
        raise InvalidOptionsError(str(exc)) from None
    shared = _interned.get(value)
    if shared is not None:
        return shared
    if len(_interned) < _INTERN_LIMIT:
        _interned[value] = value
    return value
