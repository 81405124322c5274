"""The built-in ACL: ordered allow/deny rules on publish and subscribe, first match wins.

Rules:

* A rule has a permission (``allow``/``deny``), a subject (everyone, one username or one
  client id), an action (``publish``, ``subscribe`` or ``all``) and a topic filter in which
  ``%c`` stands for the client id and ``%u`` for the username. Rules are tried in order;
  the first rule whose subject, action and filter match decides. If none does, the ACL's
  default (allow or deny, chosen when it is built) decides.
* Publish of topic ``t``: a rule's filter matches if it matches ``t`` (MQTT matching,
  :mod:`router.core.topics`).
* Subscribe to filter ``f`` (``$share/g/f`` is checked on ``f``): an ``allow`` rule with
  filter ``r`` matches only if ``r`` *covers* ``f``, i.e. every topic ``f`` can match is
  matched by ``r`` (``a/#`` covers ``a/b`` and ``a/+/c``; ``a/b`` does not cover ``a/#``);
  a ``deny`` rule matches if ``r`` and ``f`` *overlap*, i.e. some topic matches both
  (``deny secrets/#`` refuses a subscribe to ``#``). So an allowed subscription can only
  ever receive topics that a publish-style check would allow at that point of the list.
  The check is exact for a single rule and conservative across rules: a filter covered
  only by several allow rules together is not allowed by them.
* Substitution: ``%c`` and ``%u`` are replaced in one pass (a client id holding ``%u`` is
  not substituted again). A value that could widen or redirect a rule is *unsafe*: it holds
  ``+``, ``#``, ``/`` or U+0000, or starts with ``$``; a username that is missing is
  unusable too. A rule whose placeholders cannot be filled safely never allows anything,
  and as a ``deny`` rule it matches every topic of its action (fail closed: a client named
  ``+`` must not escape ``deny all publish private/%c/#`` either).
* Rule filters are plain MQTT filters (no ``$share/``); ``+`` and ``#`` in a rule are wildcards.

The file format, one rule a line (``#`` as the first non-blank character starts a comment;
blank lines are ignored)::

    # permission  subject           action     filter (the rest of the line)
    allow         user alice        publish    sensors/%u/#
    allow         client dash-1     subscribe  site/+/status
    deny          all               all        $SYS/#
    allow         all               subscribe  public/#

The filter is the rest of the line with surrounding blanks removed, so it may contain
inner spaces; usernames and client ids in a file cannot (build such rules in code).
A line that does not parse raises :class:`AclRuleError` naming the file and line number.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from router.core.hooks import ClientInfo, Decision, HookPoint, HookRegistry, HookResult, Ok, Stop
from router.core.topics import (
    MULTI_LEVEL,
    SEPARATOR,
    SINGLE_LEVEL,
    filter_matches_levels,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import AclRuleError, InvalidTopicError


class AclAction(enum.Flag):
    """What a client wants to do; ``ALL`` in a rule means both."""

    PUBLISH = 1
    SUBSCRIBE = 2
    ALL = PUBLISH | SUBSCRIBE


class Permission(enum.Enum):
    """What a matching rule (or the default) decides."""

    ALLOW = "allow"
    DENY = "deny"


_ACTION_WORDS = {
    "publish": AclAction.PUBLISH,
    "subscribe": AclAction.SUBSCRIBE,
    "all": AclAction.ALL,
}
_PLACEHOLDER = re.compile("%[cu]")
_UNSAFE = re.compile("[+#/\x00]")


# -- comparing filters ----------------------------------------------------------------
#
# A filter's topics: with no '#', the topics of exactly its level count whose levels fit
# (a literal equals, '+' takes anything); with '#' after k levels, the topics of at least
# max(k, 1) levels whose first k levels fit. A first-level wildcard (or a leading '#')
# never takes a '$' level, and the empty topic "" does not exist, so '/#' has no topic of
# one level. Two product sets compare level by level, which gives exact answers below.


def _split(levels: list[str]) -> tuple[list[str], bool]:
    if levels[-1] == MULTI_LEVEL:
        return levels[:-1], True
    return levels, False


def _min_length(prefix: list[str], is_hash: bool) -> int:
    if not is_hash:
        return len(prefix)
    if not prefix:
        return 1
    if len(prefix) == 1 and prefix[0] == "":
        return 2  # '/#': the one-level topic "" is not a topic
    return len(prefix)


def _dollar(level: str | None) -> bool:
    """True for a literal level that starts with '$' (None: the level is free)."""
    return level is not None and level != SINGLE_LEVEL and level.startswith("$")


def covers_levels(general: list[str], specific: list[str]) -> bool:
    """:func:`filter_covers` on split, valid, plain filters."""
    g_prefix, g_hash = _split(general)
    s_prefix, s_hash = _split(specific)
    s_min = _min_length(s_prefix, s_hash)
    if g_hash:
        if s_min < _min_length(g_prefix, g_hash):
            return False
    elif s_hash or len(s_prefix) != len(g_prefix):
        return False
    first = s_prefix[0] if s_prefix else None
    if (not g_prefix or g_prefix[0] == SINGLE_LEVEL) and _dollar(first):
        return False  # a '$' topic of the specific filter escapes the general wildcard
    for index, level in enumerate(g_prefix):
        if level == SINGLE_LEVEL:
            continue
        if index >= len(s_prefix) or s_prefix[index] != level:
            return False  # a free or '+' level (or another literal) escapes this literal
    return True


def overlap_levels(one: list[str], other: list[str]) -> bool:
    """:func:`filters_overlap` on split, valid, plain filters."""
    a_prefix, a_hash = _split(one)
    b_prefix, b_hash = _split(other)
    if a_hash and not b_hash:
        if len(b_prefix) < _min_length(a_prefix, a_hash):
            return False
    elif b_hash and not a_hash:
        if len(a_prefix) < _min_length(b_prefix, b_hash):
            return False
    elif not a_hash and len(a_prefix) != len(b_prefix):
        return False
    a_first = a_prefix[0] if a_prefix else None
    b_first = b_prefix[0] if b_prefix else None
    if _dollar(a_first) != _dollar(b_first):
        return False  # only one of them can match '$' topics
    for a_level, b_level in zip(a_prefix, b_prefix, strict=False):
        if SINGLE_LEVEL not in (a_level, b_level) and a_level != b_level:
            return False
    return True


def _plain_levels(topic_filter: str) -> list[str]:
    validate_filter(topic_filter)
    shared = parse_shared(topic_filter)
    return (shared.filter if shared is not None else topic_filter).split(SEPARATOR)


def filter_covers(general: str, specific: str) -> bool:
    """True if every topic that ``specific`` matches is also matched by ``general``.

    ``$share/g/f`` counts as ``f``. Raises :class:`InvalidTopicError` for an invalid filter.
    """
    return covers_levels(_plain_levels(general), _plain_levels(specific))


def filters_overlap(one: str, other: str) -> bool:
    """True if some topic name is matched by both filters (``$share/g/f`` counts as ``f``).

    Raises :class:`InvalidTopicError` for an invalid filter.
    """
    return overlap_levels(_plain_levels(one), _plain_levels(other))


# -- rules ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AclRule:
    """One rule; checks itself on creation (:class:`AclRuleError` if it is unusable).

    ``username`` or ``client_id`` (at most one) narrows the rule to one subject; neither
    means everyone. ``source`` says where the rule came from (``acl.conf:7``) for reasons.
    """

    permission: Permission
    action: AclAction
    topic_filter: str
    username: str | None = None
    client_id: str | None = None
    source: str | None = field(default=None, compare=False)
    _levels: list[str] = field(init=False, repr=False, compare=False)
    _templated: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.permission, Permission):
            raise AclRuleError(f"permission must be a Permission, not {self.permission!r}")
        if not isinstance(self.action, AclAction) or not self.action:
            raise AclRuleError(f"action must be an AclAction, not {self.action!r}")
        if self.username is not None and self.client_id is not None:
            raise AclRuleError("a rule names a username or a client id, not both")
        for name, value in (("username", self.username), ("client id", self.client_id)):
            if value is not None and (type(value) is not str or not value):
                raise AclRuleError(f"a rule's {name} must be a non-empty str, not {value!r}")
        try:
            validate_filter(self.topic_filter)
        except InvalidTopicError as error:
            raise AclRuleError(f"bad topic filter: {error.reason}") from None
        if parse_shared(self.topic_filter) is not None:
            raise AclRuleError(
                "a rule filter cannot be a $share filter (its plain part is checked)"
            )
        object.__setattr__(self, "_levels", self.topic_filter.split(SEPARATOR))
        object.__setattr__(self, "_templated", _PLACEHOLDER.search(self.topic_filter) is not None)

    def __str__(self) -> str:
        """The rule in the file format."""
        if self.username is not None:
            subject = f"user {self.username}"
        elif self.client_id is not None:
            subject = f"client {self.client_id}"
        else:
            subject = "all"
        action = next(word for word, value in _ACTION_WORDS.items() if value == self.action)
        return f"{self.permission.value} {subject} {action} {self.topic_filter}"

    def applies_to(self, client: ClientInfo, action: AclAction) -> bool:
        """True if the rule's subject is ``client`` and its action includes ``action``."""
        if not action & self.action:
            return False
        if self.username is not None:
            return client.username == self.username
        return self.client_id is None or client.client_id == self.client_id

    def levels_for(self, client: ClientInfo) -> list[str] | None:
        """The rule filter's levels with ``%c``/``%u`` filled in for ``client``.

        Returns None if a placeholder has no safe value (see the module rules).
        """
        if not self._templated:
            return self._levels
        values = {"%c": client.client_id, "%u": client.username}
        for placeholder, value in values.items():
            if placeholder in self.topic_filter and (
                value is None or _UNSAFE.search(value) or value.startswith("$")
            ):
                return None
        filled = _PLACEHOLDER.sub(lambda m: values[m.group()] or "", self.topic_filter)
        return filled.split(SEPARATOR)

    def matches(self, client: ClientInfo, action: AclAction, levels: list[str]) -> bool:
        """True if this rule decides ``action`` on the (split, plain) topic or filter.

        For a publish ``levels`` is the topic; for a subscribe, the requested filter.
        """
        if not self.applies_to(client, action):
            return False
        mine = self.levels_for(client)
        allow = self.permission is Permission.ALLOW
        if mine is None:
            return not allow  # an unsafe substitution: never allow, deny everything
        if action is AclAction.PUBLISH:
            return filter_matches_levels(mine, levels)
        return covers_levels(mine, levels) if allow else overlap_levels(mine, levels)


def parse_rule(line: str, path: str = "<acl>", number: int = 1) -> AclRule | None:
    """Parse one line of the file format; None for a blank line or a comment.

    Raises :class:`AclRuleError` with ``path`` and ``number`` if the line is not a rule.
    """

    def fail(reason: str) -> AclRuleError:
        return AclRuleError(reason, path, number)

    text = line.strip()
    if not text or text.startswith("#"):
        return None
    words = text.split(None, 2)
    if len(words) < 3:
        raise fail(f"expected '<allow|deny> <subject> <action> <filter>', got {text!r}")
    try:
        permission = Permission(words[0])
    except ValueError:
        raise fail(f"the permission must be 'allow' or 'deny', not {words[0]!r}") from None
    username = client_id = None
    subject, rest = words[1], words[2]
    if subject in ("user", "client"):
        named = rest.split(None, 1)
        if len(named) < 2:
            raise fail(f"'{subject}' needs a name, an action and a filter")
        if subject == "user":
            username = named[0]
        else:
            client_id = named[0]
        rest = named[1]
    elif subject != "all":
        raise fail(f"the subject must be 'all', 'user NAME' or 'client ID', not {subject!r}")
    tail = rest.split(None, 1)
    if len(tail) < 2:
        raise fail("a rule needs an action and a topic filter")
    action = _ACTION_WORDS.get(tail[0])
    if action is None:
        raise fail(f"the action must be 'publish', 'subscribe' or 'all', not {tail[0]!r}")
    try:
        return AclRule(
            permission, action, tail[1].strip(), username, client_id, source=f"{path}:{number}"
        )
    except AclRuleError as error:
        raise fail(error.reason) from None


def parse_rules(text: str, path: str = "<acl>") -> list[AclRule]:
    """Every rule in ``text`` (the file format), in order.

    Raises :class:`AclRuleError` naming ``path`` and the line number of the first bad line.
    """
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        rule = parse_rule(line, path, number)
        if rule is not None:
            rules.append(rule)
    return rules


# -- the ACL --------------------------------------------------------------------------


class Acl:
    """Rules tried in order, and the decision when none matches (``default``)."""

    def __init__(self, rules: Iterable[AclRule] = (), default: Permission = Permission.DENY):
        self._rules = tuple(rules)
        for rule in self._rules:
            if not isinstance(rule, AclRule):
                raise AclRuleError(f"an ACL holds AclRule values, not {rule!r}")
        if not isinstance(default, Permission):
            raise AclRuleError(f"the default must be a Permission, not {default!r}")
        self._default = default
        verb = "allowed" if default is Permission.ALLOW else "denied"
        self._default_decision = Decision(default is Permission.ALLOW, f"{verb}: no rule matched")

    @classmethod
    def parse(cls, text: str, path: str = "<acl>", default: Permission = Permission.DENY) -> Acl:
        """An ACL from text in the file format; raises :class:`AclRuleError` for a bad line."""
        return cls(parse_rules(text, path), default)

    @classmethod
    def from_file(cls, path: str | Path, default: Permission = Permission.DENY) -> Acl:
        """An ACL read from a UTF-8 file in the file format.

        Raises :class:`AclRuleError` naming the file (and the line, for a bad line) if it
        cannot be read, is not UTF-8 or holds a bad line.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise AclRuleError(f"cannot read the ACL file {str(path)!r}: {error}") from error
        return cls.parse(text, str(path), default)

    @property
    def rules(self) -> tuple[AclRule, ...]:
        """The rules, in the order they are tried."""
        return self._rules

    @property
    def default(self) -> Permission:
        """What decides when no rule matches."""
        return self._default

    def first_match(self, client: ClientInfo, action: AclAction, topic: str) -> AclRule | None:
        """The rule that decides, or None if the default does.

        ``action`` is PUBLISH (``topic`` is a topic name) or SUBSCRIBE (``topic`` is a
        filter, possibly ``$share/g/f``). Raises :class:`InvalidTopicError` for an invalid
        topic or filter and :class:`AclRuleError` for an action that is not exactly one.
        """
        if action is AclAction.PUBLISH:
            levels = validate_topic(topic).split(SEPARATOR)
        elif action is AclAction.SUBSCRIBE:
            levels = _plain_levels(topic)
        else:
            raise AclRuleError(f"check one action at a time (PUBLISH or SUBSCRIBE), not {action!r}")
        for rule in self._rules:
            if rule.matches(client, action, levels):
                return rule
        return None

    def check(self, client: ClientInfo, action: AclAction, topic: str) -> Decision:
        """Allow or deny ``action`` on ``topic`` for ``client``, with the reason.

        Raises like :meth:`first_match`.
        """
        rule = self.first_match(client, action, topic)
        if rule is None:
            return self._default_decision
        return _decision(rule)

    def check_publish(self, client: ClientInfo, topic: str) -> Decision:
        """:meth:`check` for a publish to the topic name ``topic``."""
        return self.check(client, AclAction.PUBLISH, topic)

    def check_subscribe(self, client: ClientInfo, topic_filter: str) -> Decision:
        """:meth:`check` for a subscribe to ``topic_filter`` (``$share/g/f``: on ``f``)."""
        return self.check(client, AclAction.SUBSCRIBE, topic_filter)

    # -- as a hook -------------------------------------------------------------------

    def hook(self, client: ClientInfo, action: AclAction, topic: str, acc: Decision) -> HookResult:
        """The ``client.check_acl`` callback.

        A matching rule ends the chain with its decision (``Stop``); with no matching
        rule the chain goes on with the default as the accumulator (``Ok``), so a later,
        lower-priority hook may still decide. Start the fold with a denying decision:
        if this callback raises (an invalid topic), the registry skips it and that stays.
        """
        rule = self.first_match(client, action, topic)
        if rule is None:
            return Ok(self._default_decision)
        return Stop(_decision(rule))

    def register(self, registry: HookRegistry, priority: int = 0) -> None:
        """Register :meth:`hook` at ``client.check_acl`` of ``registry``.

        Raises :class:`DuplicateHookError` if this ACL is already registered there.
        """
        registry.register(HookPoint.CLIENT_CHECK_ACL, self.hook, priority)

    def unregister(self, registry: HookRegistry) -> bool:
        """Remove :meth:`hook` from ``registry``; True if it was there."""
        return registry.unregister(HookPoint.CLIENT_CHECK_ACL, self.hook)


def _decision(rule: AclRule) -> Decision:
    verb = "allowed" if rule.permission is Permission.ALLOW else "denied"
    where = f" ({rule.source})" if rule.source else ""
    return Decision(rule.permission is Permission.ALLOW, f"{verb} by rule{where}: {rule}")
