"""The built-in ACL: ordered allow/deny rules on publish and subscribe, first match wins.

The semantics are mosquitto's: a rule's ``subscribe`` action governs what a client may
*receive* (mosquitto's ``read``), checked on every topic name, and a SUBSCRIBE is
refused only when no topic it could bring is receivable.

* A rule has a permission (``allow``/``deny``), a subject (everyone, one username or one
  client id), an action (``publish``, ``subscribe`` or ``all``) and a topic filter in which
  ``%c`` stands for the client id and ``%u`` for the username. Rules are tried in order;
  the first rule whose subject, action and filter match decides. If none does, the ACL's
  default (allow or deny, chosen when it is built) decides.
* Publish of topic ``t``: the first rule with action publish (or all) whose filter
  matches ``t`` decides (MQTT matching, :mod:`router.core.topics`).
* Receive of topic ``t`` (:meth:`Acl.check_receive`, each copy on its way to a client):
  the same with the rules whose action is subscribe (or all).
* Subscribe to filter ``f`` (``$share/g/f`` is checked on ``f``): granted if at least one
  topic that ``f`` matches may be received, refused only when every one of them is
  denied. With ``deny all subscribe test/nosubscribe`` and the default allow, ``#``,
  ``+/+`` and ``test/#`` are granted (the receive check keeps ``test/nosubscribe`` out)
  and ``test/nosubscribe`` is refused; with the default deny and ``allow all subscribe
  a/#``, ``#`` is granted and ``b/#`` refused. The answer is exact
  (:mod:`router.core.acl_search`), unless a search outgrows its bound, which grants.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from router.core.acl_search import EVERY_TOPIC, Pattern, search
from router.core.hooks import ClientInfo, Decision, HookPoint, HookRegistry, HookResult, Ok, Stop
from router.core.topics import (
    SEPARATOR,
    TopicName,
    filter_matches_levels,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import AclRuleError, InvalidTopicError


class AclAction(enum.Flag):
    """What a client wants to do; ``ALL`` in a rule means both. A rule's SUBSCRIBE also
    governs what a client may receive (:meth:`Acl.check_receive`: mosquitto's read)."""

    PUBLISH = 1
    SUBSCRIBE = 2
    ALL = PUBLISH | SUBSCRIBE


class Permission(enum.Enum):
    """What a matching rule (or the default) decides."""

    ALLOW = "allow"
    DENY = "deny"


#: The words for actions in the ACL file (and in EMQX's lists of rules).
ACTION_WORDS: Final = {
    "publish": AclAction.PUBLISH,
    "subscribe": AclAction.SUBSCRIBE,
    "all": AclAction.ALL,
}
_PLACEHOLDER = re.compile("%[cu]")
_UNSAFE = re.compile("[+#/\x00]")


def _plain_levels(topic_filter: str) -> list[str]:
    validate_filter(topic_filter)
    shared = parse_shared(topic_filter)
    return (shared.filter if shared is not None else topic_filter).split(SEPARATOR)


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
    _mask: int = field(init=False, repr=False, compare=False)  # (an int: Flag '&' is slow)

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
        object.__setattr__(self, "_mask", self.action._value_)

    def __str__(self) -> str:
        """The rule in the file format."""
        if self.username is not None:
            subject = f"user {self.username}"
        elif self.client_id is not None:
            subject = f"client {self.client_id}"
        else:
            subject = "all"
        action = next(word for word, value in ACTION_WORDS.items() if value == self.action)
        return f"{self.permission.value} {subject} {action} {self.topic_filter}"

    def applies_to(self, client: ClientInfo, action: AclAction) -> bool:
        """True if the rule's subject is ``client`` and its action includes ``action``."""
        if not action._value_ & self._mask:
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
        """True if this rule decides ``action`` (PUBLISH, or SUBSCRIBE for receiving) on
        the split topic name ``levels``."""
        if not self.applies_to(client, action):
            return False
        mine = self.levels_for(client)
        if mine is None:  # an unsafe substitution: never allow, deny everything
            return self.permission is Permission.DENY
        return filter_matches_levels(mine, levels)

    def pattern_for(self, client: ClientInfo) -> Pattern | None:
        """The topics this rule decides for ``client`` (its action aside), for a search
        (:mod:`router.core.acl_search`); None if it decides none (an allow rule whose
        placeholders cannot be filled safely: a deny rule then takes every topic)."""
        mine = self.levels_for(client)
        if mine is not None:
            return Pattern.of(mine)
        return EVERY_TOPIC if self.permission is Permission.DENY else None


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
    action = ACTION_WORDS.get(tail[0])
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
        filter, possibly ``$share/g/f``). For a subscribe the deciding rule is the one
        that allows a topic of the filter or, when none is allowed, the first rule that
        denies some of them; None when the default decided (or the search gave up).
        Raises :class:`InvalidTopicError` for an invalid topic or filter and
        :class:`AclRuleError` for an action that is not exactly one.
        """
        return self._judge(client, action, topic)[0]

    def check(self, client: ClientInfo, action: AclAction, topic: str) -> Decision:
        """Allow or deny ``action`` on ``topic`` for ``client``, with the reason.

        Raises like :meth:`first_match`.
        """
        return self._judge(client, action, topic)[1]

    def check_publish(self, client: ClientInfo, topic: str) -> Decision:
        """:meth:`check` for a publish to the topic name ``topic``."""
        return self.check(client, AclAction.PUBLISH, topic)

    def check_subscribe(self, client: ClientInfo, topic_filter: str) -> Decision:
        """:meth:`check` for a subscribe to ``topic_filter`` (``$share/g/f``: on ``f``):
        allowed when at least one topic the filter matches may be received."""
        return self.check(client, AclAction.SUBSCRIBE, topic_filter)

    def check_receive(self, client: ClientInfo, topic: str) -> Decision:
        """May ``client`` receive a message on the topic name ``topic``: the first rule
        with action subscribe (or all) that matches it decides, else the default.
        Raises :class:`InvalidTopicError` for an invalid topic name."""
        levels = validate_topic(topic).split(SEPARATOR)
        rule = self._first(client, AclAction.SUBSCRIBE, levels)
        return self._default_decision if rule is None else _decision(rule)

    def may_receive(self, client: ClientInfo, topic: TopicName) -> bool:
        """:meth:`check_receive`'s answer alone, for a topic validated where it entered
        (no reason is built)."""
        return self.receiver(client)(topic)

    def receiver(self, client: ClientInfo) -> Callable[[str], bool]:
        """:meth:`may_receive` for one client: a function of a validated topic name, with
        the rules that apply to the client filled in and split once (the delivery path
        keeps one per session; make another when the client's user name changes)."""
        return self._decider(client, AclAction.SUBSCRIBE)

    def publisher(self, client: ClientInfo) -> Callable[[str], bool]:
        """:meth:`check_publish`'s answer alone for one client, as :meth:`receiver` gives
        it for receiving: a function of a validated topic name."""
        return self._decider(client, AclAction.PUBLISH)

    def _decider(self, client: ClientInfo, action: AclAction) -> Callable[[str], bool]:
        prepared: list[tuple[bool, list[str] | None]] = []  # (allows?, levels; None: all)
        for rule in self._rules:
            if rule.applies_to(client, action):
                levels = rule.levels_for(client)
                if levels is not None:
                    prepared.append((rule.permission is Permission.ALLOW, levels))
                elif rule.permission is Permission.DENY:
                    prepared.append((False, None))  # (fails closed: every later rule is moot)
                    break
        default = self._default is Permission.ALLOW

        def allows(topic: str) -> bool:
            topic_levels = topic.split(SEPARATOR)
            for allow, levels in prepared:
                if levels is None or filter_matches_levels(levels, topic_levels):
                    return allow
            return default

        return allows

    def _first(self, client: ClientInfo, action: AclAction, levels: list[str]) -> AclRule | None:
        for rule in self._rules:
            if rule.matches(client, action, levels):
                return rule
        return None

    def _judge(
        self, client: ClientInfo, action: AclAction, topic: str
    ) -> tuple[AclRule | None, Decision]:
        """The deciding rule (see :meth:`first_match`) and the decision."""
        if action is AclAction.PUBLISH:
            rule = self._first(client, action, validate_topic(topic).split(SEPARATOR))
        elif action is AclAction.SUBSCRIBE:
            levels = _plain_levels(topic)
            applying: list[AclRule] = []
            patterns: list[tuple[bool, Pattern]] = []
            for candidate in self._rules:
                if candidate.applies_to(client, action):
                    pattern = candidate.pattern_for(client)
                    if pattern is not None:
                        applying.append(candidate)
                        patterns.append((candidate.permission is Permission.ALLOW, pattern))
            verdict = search(Pattern.of(levels), patterns, self._default is Permission.ALLOW)
            if not verdict.exact:
                return None, _UNSEARCHED
            if verdict.decider is None:
                return None, self._default_decision
            rule = applying[verdict.decider]
            if verdict.by_default:  # (several deny its topics: the first rule, and the default)
                return rule, Decision(False, f"{_decision(rule).reason}; no rule matched the rest")
        else:
            raise AclRuleError(f"check one action at a time (PUBLISH or SUBSCRIBE), not {action!r}")
        return rule, self._default_decision if rule is None else _decision(rule)

    # -- as a hook -------------------------------------------------------------------

    def hook(self, client: ClientInfo, action: AclAction, topic: str, acc: Decision) -> HookResult:
        """The ``client.check_acl`` callback.

        A deciding rule (:meth:`first_match`) ends the chain with its decision (``Stop``);
        without one the chain goes on with the default's decision as the accumulator
        (``Ok``), so a later, lower-priority hook may still decide. Start the fold with a
        denying decision: if this callback raises (an invalid topic), the registry skips
        it and that stays.
        """
        rule, decision = self._judge(client, action, topic)
        return Ok(decision) if rule is None else Stop(decision)

    def register(self, registry: HookRegistry, priority: int = 0) -> None:
        """Register :meth:`hook` at ``client.check_acl`` of ``registry``.

        Raises :class:`DuplicateHookError` if this ACL is already registered there.
        """
        registry.register(HookPoint.CLIENT_CHECK_ACL, self.hook, priority)

    def unregister(self, registry: HookRegistry) -> bool:
        """Remove :meth:`hook` from ``registry``; True if it was there."""
        return registry.unregister(HookPoint.CLIENT_CHECK_ACL, self.hook)


_UNSEARCHED: Final = Decision.allow(
    "allowed: too many rules to search every topic of the filter (each delivery is checked)"
)


def _decision(rule: AclRule) -> Decision:
    verb = "allowed" if rule.permission is Permission.ALLOW else "denied"
    where = f" ({rule.source})" if rule.source else ""
    return Decision(rule.permission is Permission.ALLOW, f"{verb} by rule{where}: {rule}")
