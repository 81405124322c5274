"""Shared-subscription strategies: which member of a share group gets a message.

A share group is one ``$share/{name}/{filter}``: every message matching the filter goes
to exactly one of its members. A strategy picks that member. Strategies are pluggable per
trie (``SubscriptionTrie(strategy=...)``) and must return one of ``group.members``.

Members are kept sorted, so the hash strategies give the same answer on every node that
has the same members, whatever the order they joined in.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from typing import Protocol

from router.errors import UnknownStrategyError


class ShareGroup:
    """The members of one shared subscription, as a strategy sees them.

    ``filter`` is the whole ``$share/{name}/{filter}``; ``members`` a sorted list of
    member ids; ``cursor`` is free for a strategy's own state (round robin uses it).
    """

    __slots__ = ("cursor", "filter", "members")

    def __init__(self, share_filter: str, members: list[str]) -> None:
        self.filter = share_filter
        self.members = members
        self.cursor = 0


class ShareStrategy(Protocol):
    """Chooses the member of ``group`` that receives a message published to ``topic``."""

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        """Return one of ``group.members`` (never empty when called)."""
        ...


class RandomStrategy:
    """A uniformly random member (the default, as in EMQX)."""

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        members = group.members
        return members[self._random.randrange(len(members))]


class RoundRobinStrategy:
    """Members in turn, per group: with n members each one gets every n-th message."""

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        members = group.members
        index = group.cursor % len(members)
        group.cursor = index + 1
        return members[index]


def _stable_hash(text: str) -> int:
    # crc32, not hash(): Python's str hash differs between processes, and every node
    # must choose the same member for the same input.
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


class HashClientStrategy:
    """The same member for the same publisher (random when the publisher is unknown)."""

    def __init__(self, seed: int | None = None) -> None:
        self._fallback = RandomStrategy(seed)

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        if publisher is None:
            return self._fallback.choose(group, topic, publisher)
        return group.members[_stable_hash(publisher) % len(group.members)]


class HashTopicStrategy:
    """The same member for the same topic."""

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        return group.members[_stable_hash(topic) % len(group.members)]


class LocalFirstStrategy:
    """Prefer members for which ``is_local`` holds; fall back to all members.

    The route mirror uses node ids as members, so ``is_local`` is "is this node me".
    """

    def __init__(
        self,
        is_local: Callable[[str], bool],
        fallback: ShareStrategy | None = None,
        seed: int | None = None,
    ) -> None:
        self._is_local = is_local
        self._fallback = fallback if fallback is not None else RandomStrategy(seed)
        self._random = random.Random(seed)

    def choose(self, group: ShareGroup, topic: str, publisher: str | None) -> str:
        """A random local member if there is one, else the fallback's choice among all."""
        local = [member for member in group.members if self._is_local(member)]
        if not local:
            return self._fallback.choose(group, topic, publisher)
        return local[self._random.randrange(len(local))]


STRATEGY_NAMES = ("random", "round_robin", "hash_client", "hash_topic")


def strategy_by_name(name: str, seed: int | None = None) -> ShareStrategy:
    """Build a strategy from its configuration name (one of :data:`STRATEGY_NAMES`).

    ``local`` needs to know which members are local, so it is built with
    :class:`LocalFirstStrategy` by the node that knows.
    """
    if name == "random":
        return RandomStrategy(seed)
    if name == "round_robin":
        return RoundRobinStrategy()
    if name == "hash_client":
        return HashClientStrategy(seed)
    if name == "hash_topic":
        return HashTopicStrategy()
    raise UnknownStrategyError(f"unknown share strategy {name!r}; choose one of {STRATEGY_NAMES}")
