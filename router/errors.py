"""The one exception hierarchy of the router.

Every error the library raises on purpose derives from :class:`RouterError`. Errors about
bad input also derive from :class:`ValueError`, so callers that already catch ``ValueError``
keep working. Data about the failure lives on attributes, not only in the message.
"""

from __future__ import annotations


class RouterError(Exception):
    """Base class of every error raised by the router."""


class InvalidTopicError(RouterError, ValueError):
    """A topic name or topic filter breaks the MQTT rules (MQTT 5.0, 4.7).

    ``topic`` is the offending string as given, ``reason`` says which rule it breaks.
    """

    def __init__(self, topic: str, reason: str) -> None:
        self.topic = topic
        self.reason = reason
        shown = topic if len(topic) <= 80 else topic[:77] + "..."
        super().__init__(f"invalid topic {shown!r}: {reason}")


class InvalidAliasError(RouterError, ValueError):
    """A topic alias is outside 1..maximum, or its namespace is unknown."""

    def __init__(self, alias: object, reason: str) -> None:
        self.alias = alias
        self.reason = reason
        super().__init__(f"invalid topic alias {alias!r}: {reason}")


class InvalidOptionsError(RouterError, ValueError):
    """Subscription options that MQTT does not allow (QoS 3, retain handling 5, ...)."""


class UnknownStrategyError(RouterError, ValueError):
    """A shared-subscription strategy name that the router does not know."""


class InvalidIdError(RouterError, ValueError):
    """An identifier (client, node, channel, subscriber) that cannot be stored."""


class StateError(RouterError):
    """Shared state in Redis failed an operation or holds something it should not."""


class CorruptStateError(StateError):
    """A value read from Redis is not what the router wrote there (a non-integer clock...)."""


class ScriptError(StateError):
    """A Lua script refused its arguments; nothing was changed."""


class SessionOwnershipError(StateError):
    """A node changed a client's state after another node (or a newer epoch) took it over."""


class SubscriptionNotFound(StateError, LookupError):
    """The channel subscriber (its cursor) or the channel clock does not exist (anymore)."""


class MalformedAckHandle(StateError, ValueError):
    """An ack handle that is not well formed or belongs to another channel or subscriber."""
