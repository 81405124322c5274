"""router: a Redis-backed, distributed, MQTT-style publish/subscribe router.

The names below are the public API; see docs/embedding.md for how they fit together. They are
imported lazily (PEP 562): ``import router.core.trie`` (or ``router.SubscriptionTrie``)
loads the pure core only, never Redis, msgpack or the asyncio runtime.

Where each name lives, by layer (a layer imports only the layers below it)::

    router.core     pure: topics, options, trie, sharing, aliases, acl, hot-topic cache
    router.state    Redis: keys, scripts, subscriptions, routes, nodes, channels, retained
    router.cluster  the asyncio runtime: RouterNode and what it wires together
    router.api      connect(): a node embedded in an asyncio program
    router.errors   every exception, rooted at RouterError
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "connect": "router.api",
    # errors
    **dict.fromkeys(
        (
            "ChannelArgumentError",
            "CorruptStateError",
            "InvalidAliasError",
            "InvalidIdError",
            "InvalidOptionsError",
            "InvalidTopicError",
            "MalformedAckHandleError",
            "NodeNotRegisteredError",
            "NotAuthorizedError",
            "ResyncRequiredError",
            "RetainedPayloadTooLargeError",
            "RetainedStoreFullError",
            "RouterError",
            "RouteSetMissingError",
            "ScriptError",
            "SessionOwnershipError",
            "StaleIncarnationError",
            "StateAccessError",
            "StateError",
            "StateFailureError",
            "StateUnavailableError",
            "SubscriptionNotFoundError",
            "UnknownStrategyError",
        ),
        "router.errors",
    ),
    # core
    "Acl": "router.core.acl",
    "AliasTable": "router.core.aliases",
    "CacheSettings": "router.core.hot_topics",
    **dict.fromkeys(("Delivery", "Outgoing", "PublishResult"), "router.core.messages"),
    "SubscriptionOptions": "router.core.options",
    **dict.fromkeys(
        (
            "HashClientStrategy",
            "HashTopicStrategy",
            "LocalFirstStrategy",
            "RandomStrategy",
            "RoundRobinStrategy",
            "ShareStrategy",
            "strategy_by_name",
        ),
        "router.core.sharing",
    ),
    **dict.fromkeys(
        ("TopicFilter", "TopicName", "matches", "validate_filter", "validate_topic"),
        "router.core.topics",
    ),
    **dict.fromkeys(("MatchedSubscription", "SubscriptionTrie"), "router.core.trie"),
    # state
    "RedisAliasTable": "router.state.alias_store",
    **dict.fromkeys(
        ("Channel", "FetchedMessage", "FetchResult", "Published"), "router.state.channels"
    ),
    **dict.fromkeys(("NodeInfo", "NodeRegistry"), "router.state.node_registry"),
    **dict.fromkeys(
        ("RetainedConfig", "RetainedMessage", "RetainedStore"), "router.state.retained_store"
    ),
    **dict.fromkeys(("RouteChange", "RouteSnapshot", "RouteStore"), "router.state.routes"),
    **dict.fromkeys(("Owner", "SubscriptionStore"), "router.state.subscriptions"),
    # cluster
    "NodeConfig": "router.cluster.config",
    "RouterNode": "router.cluster.node",
}

__all__ = [*_EXPORTS, "__version__"]  # noqa: PLE0604 (every key of _EXPORTS is a str)


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562) and cache the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'router' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # what static tools see; at run time __getattr__ imports on demand
    from router.api import connect as connect
    from router.cluster.config import NodeConfig as NodeConfig
    from router.cluster.node import RouterNode as RouterNode
    from router.core.acl import Acl as Acl
    from router.core.aliases import AliasTable as AliasTable
    from router.core.hot_topics import CacheSettings as CacheSettings
    from router.core.messages import (
        Delivery as Delivery,
        Outgoing as Outgoing,
        PublishResult as PublishResult,
    )
    from router.core.options import SubscriptionOptions as SubscriptionOptions
    from router.core.sharing import (
        HashClientStrategy as HashClientStrategy,
        HashTopicStrategy as HashTopicStrategy,
        LocalFirstStrategy as LocalFirstStrategy,
        RandomStrategy as RandomStrategy,
        RoundRobinStrategy as RoundRobinStrategy,
        ShareStrategy as ShareStrategy,
        strategy_by_name as strategy_by_name,
    )
    from router.core.topics import (
        TopicFilter as TopicFilter,
        TopicName as TopicName,
        matches as matches,
        validate_filter as validate_filter,
        validate_topic as validate_topic,
    )
    from router.core.trie import (
        MatchedSubscription as MatchedSubscription,
        SubscriptionTrie as SubscriptionTrie,
    )
    from router.errors import (
        ChannelArgumentError as ChannelArgumentError,
        CorruptStateError as CorruptStateError,
        InvalidAliasError as InvalidAliasError,
        InvalidIdError as InvalidIdError,
        InvalidOptionsError as InvalidOptionsError,
        InvalidTopicError as InvalidTopicError,
        MalformedAckHandleError as MalformedAckHandleError,
        NodeNotRegisteredError as NodeNotRegisteredError,
        NotAuthorizedError as NotAuthorizedError,
        ResyncRequiredError as ResyncRequiredError,
        RetainedPayloadTooLargeError as RetainedPayloadTooLargeError,
        RetainedStoreFullError as RetainedStoreFullError,
        RouterError as RouterError,
        RouteSetMissingError as RouteSetMissingError,
        ScriptError as ScriptError,
        SessionOwnershipError as SessionOwnershipError,
        StaleIncarnationError as StaleIncarnationError,
        StateAccessError as StateAccessError,
        StateError as StateError,
        StateFailureError as StateFailureError,
        StateUnavailableError as StateUnavailableError,
        SubscriptionNotFoundError as SubscriptionNotFoundError,
        UnknownStrategyError as UnknownStrategyError,
    )
    from router.state.alias_store import RedisAliasTable as RedisAliasTable
    from router.state.channels import (
        Channel as Channel,
        FetchedMessage as FetchedMessage,
        FetchResult as FetchResult,
        Published as Published,
    )
    from router.state.node_registry import (
        NodeInfo as NodeInfo,
        NodeRegistry as NodeRegistry,
    )
    from router.state.retained_store import (
        RetainedConfig as RetainedConfig,
        RetainedMessage as RetainedMessage,
        RetainedStore as RetainedStore,
    )
    from router.state.routes import (
        RouteChange as RouteChange,
        RouteSnapshot as RouteSnapshot,
        RouteStore as RouteStore,
    )
    from router.state.subscriptions import (
        Owner as Owner,
        SubscriptionStore as SubscriptionStore,
    )
