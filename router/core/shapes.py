"""An index of wildcard filters by shape: a faster way to find the trie's matching ends.

The *shape* of a wildcard filter is where its wildcards stand: ``site/+/temp`` and
``home/+/humidity`` share the shape "3 levels, ``+`` at level 1"; ``site/4/#`` has the
shape "``#`` after 2 literal levels". All filters of one shape are told apart by their
literal levels alone, so each shape keeps a hash map from those literal levels to the
filter's terminal node in the trie::

    shape (3 levels, + at 1):   ("site", "temp") -> node of site/+/temp
                                ("home", "humidity") -> node of home/+/humidity
    shape (# after 2 levels):   ("site", "4") -> node of site/4/#

To match a topic, each shape that can fit its level count builds the key from the topic's
levels at the literal positions (one C-level ``itemgetter`` call) and makes one lookup.
A topic costs one lookup per shape instead of a walk over trie nodes, which in Python is
several times faster while deployments use a few dozen shapes. The trie keeps its own walk
for the rare table with very many shapes (see ``SubscriptionTrie``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Generic, TypeVar

from router.core.topics import MULTI_LEVEL, SINGLE_LEVEL

Node = TypeVar("Node")
KeyFunction = Callable[[Sequence[str]], Any]


def _no_literals(levels: Sequence[str]) -> tuple[()]:
    return ()


class _Shape(Generic[Node]):
    __slots__ = ("is_hash", "key", "length", "table", "wild_first")

    def __init__(self, length: int, literal_positions: tuple[int, ...], is_hash: bool) -> None:
        self.length = length
        self.is_hash = is_hash
        self.key: KeyFunction = (
            itemgetter(*literal_positions) if literal_positions else _no_literals
        )
        self.table: dict[Any, Node] = {}
        # A shape with a wildcard at level 0 never matches a topic that starts with '$'.
        self.wild_first = length == 0 or 0 not in literal_positions

    def fits(self, levels: int, dollar: bool) -> bool:
        """Can a filter of this shape match a topic of ``levels`` levels?"""
        if dollar and self.wild_first:
            return False
        return self.length <= levels if self.is_hash else self.length == levels


# The lookups one topic needs: (key function, the shape's table.get) for each shape.
Plan = list[tuple[KeyFunction, Callable[[Any], Any]]]

# How many plans (one per topic level count and '$' flag) are kept before starting over.
_PLAN_CACHE_LIMIT = 1024


class ShapeIndex(Generic[Node]):
    """Terminal nodes of wildcard filters, found by shape and literal levels."""

    def __init__(self) -> None:
        self._shapes: dict[tuple[int, tuple[int, ...], bool], _Shape[Node]] = {}
        # Plans by topic level count, for topics without and with a leading '$'.
        self._plans: tuple[dict[int, Plan], dict[int, Plan]] = ({}, {})

    def __len__(self) -> int:
        """The number of shapes in use."""
        return len(self._shapes)

    @staticmethod
    def _describe(levels: list[str]) -> tuple[tuple[int, tuple[int, ...], bool], list[str]]:
        is_hash = levels[-1] == MULTI_LEVEL
        if is_hash:
            levels = levels[:-1]
        literal = tuple(i for i, level in enumerate(levels) if level != SINGLE_LEVEL)
        return (len(levels), literal, is_hash), levels

    def add(self, levels: list[str], node: Node) -> None:
        """Index the terminal ``node`` of the wildcard filter with these ``levels``.

        The key keeps references to the given level strings: pass the trie's own, so that
        thousands of filters share one "site" instead of holding a copy each.
        """
        ident, levels = self._describe(levels)
        shape = self._shapes.get(ident)
        if shape is None:
            shape = self._shapes[ident] = _Shape(*ident)
            self._forget_plans()
        shape.table[shape.key(levels)] = node

    def remove(self, plain: str) -> None:
        """Forget the wildcard filter ``plain`` (it must be indexed)."""
        ident, levels = self._describe(plain.split("/"))
        shape = self._shapes[ident]
        del shape.table[shape.key(levels)]
        if not shape.table:
            del self._shapes[ident]
            self._forget_plans()

    def _forget_plans(self) -> None:
        for plans in self._plans:
            plans.clear()

    def plan(self, levels: int, dollar: bool) -> Plan:
        """The lookups for a topic of ``levels`` levels (``dollar``: it starts with ``$``)."""
        plans = self._plans[dollar]
        plan = plans.get(levels)
        if plan is None:
            if len(plans) >= _PLAN_CACHE_LIMIT:
                plans.clear()
            plan = [
                (shape.key, shape.table.get)
                for shape in self._shapes.values()
                if shape.fits(levels, dollar)
            ]
            plans[levels] = plan
        return plan
