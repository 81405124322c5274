"""The filter index: which subscribed filters match a published topic.

A filter index maps each plain (non-shared) topic filter to one *terminal*, any object
its owner keeps there (the trie keeps who subscribed), and answers
``terminals(topic)``: the terminals of every filter that matches a topic name. Two
implementations keep one contract:

* :class:`PureFilterIndex`, below, in Python: the fallback that always works;
* ``router.core._filter_index.FilterIndex``, the same in C (``_filter_index.c``), built
  when the package is installed with a compiler at hand.

:data:`FilterIndex` is the compiled one when it was built, else the pure one (set
``ROUTER_PURE_CORE=1`` to choose the pure one anyway); :data:`COMPILED` tells which.
:data:`Terminal` is the terminal type that goes with it (the compiled index reads a
compiled terminal's fields directly, any other through attribute lookups).

Contract (both):

* ``add(filter, terminal)``: map a plain filter to its terminal, replacing any;
  ``get(filter)``: its terminal or None; ``remove(filter)``: drop it and return its
  terminal (``KeyError`` if absent), freeing every node that became empty.
  Filters are validated by the caller (:func:`router.core.topics.validate_filter`).
* ``terminals(topic)``: a new list of the terminals of every filter matching the topic
  name, in no particular order, each once; None when ``topic`` is not a valid topic name
  (the caller raises the typed error). MQTT rules (4.7): ``+`` matches one level, ``#`` its
  parent level and everything below, first-level wildcards never match ``$`` topics.
* ``clients(topic)``: for terminals with ``subs`` (a dict or None) and ``groups`` (None
  or not) attributes, as the trie's: a new set, the union of the matching terminals'
  ``subs`` keys; None when the topic is invalid or a matching terminal has ``groups`` (the caller
  then chooses group members from ``terminals``).
* ``items()``: every (filter, terminal); ``len()``: how many filters;
  ``node_count()``: the nodes held (0 once every filter was removed).
* Not thread-safe; a terminal must not refer back to its index.

Layout of the pure index. Filters without wildcards (most of them, in practice) are kept in
a hash map from the whole filter to its terminal: one lookup answers them all. Filters with
a wildcard live in a trie with one node per level; each node keeps its literal children in
a dict and its ``+`` and ``#`` children in their own slots, so a level boundary is always
a node boundary (``a/b`` and ``ab`` never collide)::

    filters: sport/+/score   sport/#   +/news   $SYS/#   sport/tennis (exact map)

    (root) ── "sport" ── "+" ── "score" *
      │          └── "#" *
      ├── "+" ── "news" *
      └── "$SYS" ── "#" *
    (* = a node with a terminal)

While there are at most ``max_shapes`` wildcard shapes, a match makes one lookup per shape
(:mod:`router.core.shapes`); beyond, it walks the trie level by level. The compiled index
always walks: in C a walk costs less than building one key per shape.
"""

from __future__ import annotations

import os
from typing import Any, Final, cast

from router.core.options import SubscriptionOptions
from router.core.shapes import ShapeIndex
from router.core.topics import MULTI_LEVEL, SEPARATOR, SINGLE_LEVEL, TopicFilter, has_wildcard

_SAFE_CHARS: Final = 65535 // 4  # this many characters or fewer never exceed 65535 bytes


def is_topic_name(topic: object) -> bool:
    """True if ``topic`` is a valid topic name (what ``validate_topic`` accepts)."""
    if type(topic) is not str or not topic or "+" in topic or "#" in topic or "\x00" in topic:
        return False
    if len(topic) <= _SAFE_CHARS and topic.isascii():
        return True
    try:
        return len(topic.encode()) <= 65535
    except UnicodeEncodeError:
        return False


class PureTerminal:
    """Who subscribed to one plain ``filter``: ``subs``, client id -> options of plain
    subscriptions (None while empty), and ``groups``, shared filter -> group (None while
    empty). The trie owns the contents; an index reads them in ``clients``."""

    __slots__ = ("filter", "groups", "subs")

    def __init__(self, plain: str) -> None:
        self.filter = plain
        self.subs: dict[str, SubscriptionOptions] | None = None
        self.groups: dict[TopicFilter, Any] | None = None


class _Level:
    """One level of a wildcard filter: literal ``children`` (None while empty), the
    ``plus`` and ``hash`` children, the ``terminal`` of a filter ending here, and
    ``level``: its name, the one string object the shape index shares for it."""

    __slots__ = ("children", "hash", "level", "plus", "terminal")

    def __init__(self, level: str) -> None:
        self.level = level
        self.children: dict[str, _Level] | None = None
        self.plus: _Level | None = None
        self.hash: _Level | None = None
        self.terminal: Any = None

    def is_empty(self) -> bool:
        return self.terminal is None and not (self.children or self.plus or self.hash)


class PureFilterIndex:
    """The filter index in Python (see the module docstring for the contract).

    ``max_shapes``: above this many wildcard shapes, matching walks the trie instead of
    making one lookup per shape (0: always walk).
    """

    def __init__(self, max_shapes: int = 64) -> None:
        self.max_shapes = max_shapes
        self._exact: dict[str, Any] = {}
        self._root = _Level("")
        self._shapes: ShapeIndex[Any] = ShapeIndex()
        self._wild = 0

    def __len__(self) -> int:
        return len(self._exact) + self._wild

    def get(self, topic_filter: str) -> Any:
        if not has_wildcard(topic_filter):
            return self._exact.get(topic_filter)
        node = self._find(topic_filter)
        return node.terminal if node is not None else None

    def add(self, topic_filter: str, terminal: Any) -> None:
        if not has_wildcard(topic_filter):
            self._exact[topic_filter] = terminal
            return
        node = self._root
        levels = []
        for level in topic_filter.split(SEPARATOR):
            if level in (SINGLE_LEVEL, MULTI_LEVEL):
                slot = "plus" if level == SINGLE_LEVEL else "hash"
                child = getattr(node, slot)
                if child is None:
                    child = _Level(level)
                    setattr(node, slot, child)
                node = child
                levels.append(level)
                continue
            if node.children is None:
                node.children = {}
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Level(level)
            levels.append(child.level)  # shared: thousands of filters hold one "site"
            node = child
        if node.terminal is None:
            self._wild += 1
        node.terminal = terminal
        self._shapes.add(levels, terminal)

    def remove(self, topic_filter: str) -> Any:
        if not has_wildcard(topic_filter):
            terminal = self._exact.pop(topic_filter)
            if not self._exact:
                self._exact = {}  # a dict never shrinks its table: start a new one
            return terminal
        path = self._path(topic_filter)
        node = path[-1][1] if path else None
        if node is None or node.terminal is None:
            raise KeyError(topic_filter)
        terminal, node.terminal = node.terminal, None
        self._wild -= 1
        self._shapes.remove(topic_filter)
        for index in range(len(path) - 1, 0, -1):
            level, node = path[index]
            if not node.is_empty():
                break
            parent = path[index - 1][1]
            if level == SINGLE_LEVEL:
                parent.plus = None
            elif level == MULTI_LEVEL:
                parent.hash = None
            else:
                assert parent.children is not None
                del parent.children[level]
                if not parent.children:
                    parent.children = None
        return terminal

    def _find(self, topic_filter: str) -> _Level | None:
        path = self._path(topic_filter)
        return path[-1][1] if path else None

    def _path(self, topic_filter: str) -> list[tuple[str, _Level]]:
        """The nodes from the root to where the wildcard filter ends ([] if absent)."""
        node = self._root
        path = [("", node)]
        for level in topic_filter.split(SEPARATOR):
            if level == SINGLE_LEVEL:
                child = node.plus
            elif level == MULTI_LEVEL:
                child = node.hash
            else:
                child = node.children.get(level) if node.children is not None else None
            if child is None:
                return []
            path.append((level, child))
            node = child
        return path

    def terminals(self, topic: str) -> list[Any] | None:
        if not is_topic_name(topic):
            return None
        found: list[Any] = []
        exact = self._exact.get(topic)
        if exact is not None:
            found.append(exact)
        if not self._wild:
            return found
        levels = topic.split(SEPARATOR)
        plan = self._shapes.plan(len(levels), topic[0] == "$")
        if len(plan) > self.max_shapes:
            self._walk(topic, levels, found)
            return found
        for key, lookup in plan:
            terminal = lookup(key(levels))
            if terminal is not None:
                found.append(terminal)
        return found

    def clients(self, topic: str) -> set[str] | None:
        found = self.terminals(topic)
        if found is None:
            return None
        clients: set[str] = set()
        for terminal in found:
            if terminal.groups is not None:
                return None
            if terminal.subs is not None:
                clients.update(terminal.subs)
        return clients

    def _walk(self, topic: str, levels: list[str], found: list[Any]) -> None:
        """Append the terminals of matching wildcard filters, walking the trie level by
        level and keeping the nodes whose path matches the levels so far."""
        root = self._root
        current: list[_Level] = []
        if topic[0] != "$":  # first-level wildcards never match a topic that starts with '$'
            if root.hash is not None:
                found.append(root.hash.terminal)
            if root.plus is not None:
                current.append(root.plus)
        if root.children is not None:
            child = root.children.get(levels[0])
            if child is not None:
                current.append(child)
        for level in levels[1:]:
            if not current:
                return
            following: list[_Level] = []
            for node in current:
                if node.hash is not None:
                    found.append(node.hash.terminal)
                if node.plus is not None:
                    following.append(node.plus)
                if node.children is not None:
                    child = node.children.get(level)
                    if child is not None:
                        following.append(child)
            current = following
        for node in current:
            if node.hash is not None:
                found.append(node.hash.terminal)
            if node.terminal is not None:
                found.append(node.terminal)

    def items(self) -> list[tuple[str, Any]]:
        result = list(self._exact.items())
        stack: list[tuple[str, _Level]] = [("", self._root)]
        while stack:
            prefix, node = stack.pop()
            if node.terminal is not None:
                result.append((prefix, node.terminal))
            below = [(SINGLE_LEVEL, node.plus), (MULTI_LEVEL, node.hash)]
            below += list((node.children or {}).items())
            for level, child in below:
                if child is not None:
                    path = f"{prefix}/{level}" if node is not self._root else level
                    stack.append((path, child))
        return result

    def node_count(self) -> int:
        count = len(self._exact)
        stack = [self._root]
        while stack:
            node = stack.pop()
            for child in (node.plus, node.hash, *(node.children or {}).values()):
                if child is not None:
                    count += 1
                    stack.append(child)
        return count


def _compiled() -> tuple[type[Any], type[Any]] | None:
    if os.environ.get("ROUTER_PURE_CORE"):
        return None
    try:
        from router.core._filter_index import FilterIndex as Compiled, Terminal
    except ImportError:
        return None
    return Compiled, Terminal


_COMPILED_TYPES: Final = _compiled()
#: True when :data:`FilterIndex` is the C implementation.
COMPILED: Final = _COMPILED_TYPES is not None
#: The filter index to use: compiled when built (and not refused), else pure.
FilterIndex: Final[type[Any]] = _COMPILED_TYPES[0] if _COMPILED_TYPES else PureFilterIndex
#: The terminal type to use with it (the compiled one has the same fields as PureTerminal).
Terminal: Final = cast(
    "type[PureTerminal]", _COMPILED_TYPES[1] if _COMPILED_TYPES else PureTerminal
)
