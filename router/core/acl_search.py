"""Whether ordered ACL rules let a subscription receive anything: a search of its topics.

The question (mosquitto's semantics, see :mod:`router.core.acl`): rules are tried in
order on each *topic name*, the first whose filter matches it decides, the default
decides a topic that no rule matches. A subscription to filter ``F`` is granted if at
least one topic that ``F`` matches is allowed that way, and refused only when every one
of them is denied. Topic names are infinitely many, so the search works on classes of
them:

* At each level a topic either names a literal that some live pattern names at that
  level, or it names none of them ("fresh": any other string; all fresh strings behave
  alike). A first-level wildcard never takes a ``$`` level, and the one-level topic
  ``""`` does not exist (see :mod:`router.core.topics`).
* The search walks the topics of ``F`` level by level, keeping the rules whose filter
  can still match (*live* rules, in order). At each depth it judges the topic that ends
  there (the first live rule that matches a topic of exactly that length decides), and
  it stops going deeper where the rest is uniform: when the first live rule ends in
  ``#`` and its levels are used up, it decides every deeper topic; with no live rule
  the default does; when no live pattern names a level any deeper, the first live rule
  ending in ``#`` (else the default) decides every deeper topic.

Sketch: rules ``deny a/b``, ``allow a/+``, default deny; ``F = a/#``::

    depth 0   F names "a"          live: [deny a/b, allow a/+]
    depth 1   topic "a"            no live rule takes it: the default denies it
              level "b"            live: [deny a/b, allow a/+]
    depth 2     topic "a/b"        deny a/b denies it
                deeper "a/b/..."   no live rule ends in '#': the default denies them
              level fresh "x"      live: [allow a/+]
    depth 2     topic "a/x"        allow a/+ allows it: granted, by rule 2

The answer is exact: a refusal means that no topic of ``F`` is allowed, a grant names
the rule (or the default) that allows one of them. The work is bounded
(``budget``: live rules visited); past it the search gives up and the caller grants,
which is the safe side here because every delivery is checked again on its topic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from router.core.topics import MULTI_LEVEL, SINGLE_LEVEL

DEFAULT_BUDGET: Final = 50_000
"""Live rules the search may visit before it gives up (a few milliseconds)."""

_FRESH: Final = "\x00"  # a level no pattern names (U+0000 is in no topic)
_DEFAULT: Final = -1  # "the default decided", where a rule index goes
_GAVE_UP: Final = -2  # "past the budget"


@dataclass(frozen=True, slots=True)
class Pattern:
    """The topics of one plain filter: ``prefix`` holds its levels before a final ``#``
    (None for ``+``), ``open`` says it ends in ``#``. ``dollar`` lets a first-level
    wildcard take a ``$`` level too (only :data:`EVERY_TOPIC` does)."""

    prefix: tuple[str | None, ...]
    open: bool
    dollar: bool = False

    @classmethod
    def of(cls, levels: Sequence[str]) -> Pattern:
        """The pattern of a valid, plain filter split into ``levels``."""
        is_open = levels[-1] == MULTI_LEVEL
        body = levels[:-1] if is_open else levels
        return cls(tuple(None if level == SINGLE_LEVEL else level for level in body), is_open)

    def fits(self, depth: int, level: str) -> bool:
        """True if a topic of this pattern may have ``level`` at ``depth`` (its levels
        before ``depth`` fitted)."""
        if depth < len(self.prefix):
            mine = self.prefix[depth]
            if mine is not None:
                return mine == level
        elif not self.open:
            return False
        return depth > 0 or self.dollar or not level.startswith("$")

    def ends(self, depth: int) -> bool:
        """True if a topic of exactly ``depth`` levels (whose levels fitted) is one of this
        pattern's."""
        return len(self.prefix) <= depth if self.open else len(self.prefix) == depth


EVERY_TOPIC: Final = Pattern((), True, dollar=True)
"""Every topic name, ``$`` topics too (a deny rule whose placeholders failed)."""

Rule = tuple[bool, Pattern]  # (allows?, its topics)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the search found: ``allowed`` (some topic of the filter is allowed);
    ``decider``, the index of the rule that allows it, or of the first rule that denies
    some of its topics when none is allowed (None: the default); ``by_default`` says
    that the default denied some of them too; ``exact`` is False when the search gave
    up (``allowed`` is then True and ``decider`` None)."""

    allowed: bool
    decider: int | None
    exact: bool = True
    by_default: bool = False


def search(
    target: Pattern, rules: Sequence[Rule], default: bool, budget: int = DEFAULT_BUDGET
) -> Verdict:
    """Whether any topic of ``target`` is allowed by ``rules`` (first match wins) and
    ``default``; see the module docstring."""
    walk = _Walk(target, rules, default)
    found = walk.run(budget)
    if found == _GAVE_UP:
        return Verdict(True, None, exact=False)
    if found is not None:
        return Verdict(True, None if found == _DEFAULT else found)
    denying = walk.deniers - {_DEFAULT}
    return Verdict(False, min(denying) if denying else None, by_default=_DEFAULT in walk.deniers)


class _Walk:
    """One search: a depth-first walk over classes of topics (a stack, not recursion:
    a filter may have thousands of levels)."""

    def __init__(self, target: Pattern, rules: Sequence[Rule], default: bool) -> None:
        self.target = target
        self.rules = rules
        self.default = default
        self.deniers: set[int] = set()  # rules that denied some topics seen (-1: default)

    def run(self, budget: int) -> int | None:
        """The index of a rule that allows a topic of the target (``_DEFAULT``: the
        default does), None when none is allowed, ``_GAVE_UP`` past the budget."""
        target, rules = self.target, self.rules
        stack: list[tuple[int, str, list[int]]] = [(0, "", list(range(len(rules))))]
        while stack:
            depth, first, live = stack.pop()
            budget -= len(live) + 1
            if budget < 0:
                return _GAVE_UP
            # The topic that ends here (no topic has 0 levels; "" is not a topic).
            if depth and target.ends(depth) and not (depth == 1 and first == ""):
                decider = next((i for i in live if rules[i][1].ends(depth)), _DEFAULT)
                if self.allows(decider):
                    return decider
            if not (target.open or len(target.prefix) > depth):
                continue  # the target has no deeper topic here
            deeper = self.deeper(depth, live)
            if deeper is not None:
                if self.allows(deeper):
                    return deeper
                continue
            for level in reversed(self.levels(depth, live)):
                if target.fits(depth, level):
                    fitting = [i for i in live if rules[i][1].fits(depth, level)]
                    stack.append((depth + 1, level if depth == 0 else first, fitting))
        return None

    def deeper(self, depth: int, live: list[int]) -> int | None:
        """Who decides every deeper topic of the target here, when one does (see the
        module docstring); None when the walk must go on level by level."""
        if not depth:
            return None  # (a first-level wildcard may yet meet a '$' level)
        rules = self.rules
        if not live:
            return _DEFAULT
        head = rules[live[0]][1]
        if head.open and len(head.prefix) <= depth:
            return live[0]
        if len(self.target.prefix) <= depth and all(len(rules[i][1].prefix) <= depth for i in live):
            return next((i for i in live if rules[i][1].open), _DEFAULT)
        return None

    def allows(self, decider: int) -> bool:
        """True if ``decider`` (a rule index, or ``_DEFAULT``) allows; a denier is noted."""
        if self.default if decider == _DEFAULT else self.rules[decider][0]:
            return True
        self.deniers.add(decider)
        return False

    def levels(self, depth: int, live: list[int]) -> list[str]:
        """One level of each class at ``depth``: the literals named there, and a fresh one."""
        prefix = self.target.prefix
        if depth < len(prefix):
            mine = prefix[depth]
            if mine is not None:
                return [mine]
        named = set()
        for i in live:
            theirs = self.rules[i][1].prefix
            if depth < len(theirs):
                level = theirs[depth]
                if level is not None:
                    named.add(level)
        return [*sorted(named), _FRESH]
