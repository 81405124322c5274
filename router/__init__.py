"""router: a Redis-backed, distributed, MQTT-style publish/subscribe router.

The names below are the public API; see README.md for how they fit together.
"""

from router.acl import Acl
from router.alias_store import RedisAliasTable
from router.aliases import AliasTable
from router.api import connect
from router.cache import CacheSettings
from router.channels import Channel, FetchedMessage, FetchResult, Published
from router.errors import (
    ChannelArgumentError,
    CorruptStateError,
    InvalidAliasError,
    InvalidIdError,
    InvalidOptionsError,
    InvalidTopicError,
    MalformedAckHandle,
    NodeNotRegisteredError,
    NotAuthorizedError,
    ResyncRequired,
    RouterError,
    RouteSetMissingError,
    ScriptError,
    SessionOwnershipError,
    StaleIncarnationError,
    StateError,
    SubscriptionNotFound,
    UnknownStrategyError,
)
from router.messages import Delivery
from router.node import NodeConfig, PublishResult, RouterNode
from router.nodes import NodeInfo, NodeRegistry
from router.options import SubscriptionOptions
from router.retained import (
    RetainedConfig,
    RetainedMessage,
    RetainedPayloadTooLargeError,
    RetainedStore,
    RetainedStoreFullError,
)
from router.routes import RouteChange, RouteSnapshot, RouteStore
from router.sharing import (
    HashClientStrategy,
    HashTopicStrategy,
    LocalFirstStrategy,
    RandomStrategy,
    RoundRobinStrategy,
    ShareStrategy,
    strategy_by_name,
)
from router.subscriptions import Owner, SubscriptionStore
from router.topics import matches, validate_filter, validate_topic
from router.trie import MatchedSubscription, SubscriptionTrie

__version__ = "0.1.0"

__all__ = [
    "Acl",
    "AliasTable",
    "CacheSettings",
    "Channel",
    "ChannelArgumentError",
    "CorruptStateError",
    "Delivery",
    "FetchResult",
    "FetchedMessage",
    "HashClientStrategy",
    "HashTopicStrategy",
    "InvalidAliasError",
    "InvalidIdError",
    "InvalidOptionsError",
    "InvalidTopicError",
    "LocalFirstStrategy",
    "MalformedAckHandle",
    "MatchedSubscription",
    "NodeConfig",
    "NodeInfo",
    "NodeNotRegisteredError",
    "NodeRegistry",
    "NotAuthorizedError",
    "Owner",
    "PublishResult",
    "Published",
    "RandomStrategy",
    "RedisAliasTable",
    "ResyncRequired",
    "RetainedConfig",
    "RetainedMessage",
    "RetainedPayloadTooLargeError",
    "RetainedStore",
    "RetainedStoreFullError",
    "RoundRobinStrategy",
    "RouteChange",
    "RouteSetMissingError",
    "RouteSnapshot",
    "RouteStore",
    "RouterError",
    "RouterNode",
    "ScriptError",
    "SessionOwnershipError",
    "ShareStrategy",
    "StaleIncarnationError",
    "StateError",
    "SubscriptionNotFound",
    "SubscriptionOptions",
    "SubscriptionStore",
    "SubscriptionTrie",
    "UnknownStrategyError",
    "__version__",
    "connect",
    "matches",
    "strategy_by_name",
    "validate_filter",
    "validate_topic",
]
