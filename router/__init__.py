"""router: a Redis-backed, distributed, MQTT-style publish/subscribe router.

The names below are the public API; see README.md for how they fit together.
"""

from router.aliases import AliasTable
from router.errors import (
    CorruptStateError,
    InvalidAliasError,
    InvalidIdError,
    InvalidOptionsError,
    InvalidTopicError,
    MalformedAckHandle,
    RouterError,
    ScriptError,
    SessionOwnershipError,
    StateError,
    SubscriptionNotFound,
    UnknownStrategyError,
)
from router.options import SubscriptionOptions
from router.sharing import (
    HashClientStrategy,
    HashTopicStrategy,
    LocalFirstStrategy,
    RandomStrategy,
    RoundRobinStrategy,
    ShareStrategy,
    strategy_by_name,
)
from router.topics import matches, validate_filter, validate_topic
from router.trie import MatchedSubscription, SubscriptionTrie

__version__ = "0.1.0"

__all__ = [
    "AliasTable",
    "CorruptStateError",
    "HashClientStrategy",
    "HashTopicStrategy",
    "InvalidAliasError",
    "InvalidIdError",
    "InvalidOptionsError",
    "InvalidTopicError",
    "LocalFirstStrategy",
    "MalformedAckHandle",
    "MatchedSubscription",
    "RandomStrategy",
    "RoundRobinStrategy",
    "RouterError",
    "ScriptError",
    "SessionOwnershipError",
    "ShareStrategy",
    "StateError",
    "SubscriptionNotFound",
    "SubscriptionOptions",
    "SubscriptionTrie",
    "UnknownStrategyError",
    "__version__",
    "matches",
    "strategy_by_name",
    "validate_filter",
    "validate_topic",
]
