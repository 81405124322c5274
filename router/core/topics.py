"""MQTT topic names and topic filters (MQTT 3.1.1 and 5.0, section 4.7).

Rules enforced here, with examples:

* Names and filters are UTF-8 text of 1..65535 bytes without U+0000. A Python ``str``
  holding a lone surrogate has no UTF-8 form and is refused.
* ``/`` separates levels; empty levels are real levels: ``a//b`` has three levels and
  ``/a`` starts with an empty one.
* ``+`` matches exactly one level (an empty one too): ``a/+`` matches ``a/b`` and ``a/``
  but not ``a`` or ``a/b/c``.
* ``#`` matches its parent level and every level below; it must be the last level:
  ``a/#`` matches ``a``, ``a/b`` and ``a/b/c``; ``a/#/b`` is invalid.
* Wildcards occupy a whole level: ``a+``, ``a/b#`` and ``+a/b`` are invalid filters.
  Topic names (what is published) contain no wildcard at all.
* A filter whose first level is ``+`` or ``#`` never matches a topic starting with ``$``:
  ``#`` does not match ``$SYS/x``, ``$SYS/#`` does.
* ``$share/{name}/{filter}`` is a shared subscription: the share name is non-empty and has
  no ``/``, ``+`` or ``#``; the filter part is a valid filter and matches what it would
  match on its own (``$share/g/$SYS/#`` matches ``$SYS/x``).
"""

from __future__ import annotations

from typing import Final, NamedTuple, NewType

from router.errors import InvalidTopicError

MAX_TOPIC_BYTES: Final = 65535
SEPARATOR: Final = "/"
SINGLE_LEVEL: Final = "+"
MULTI_LEVEL: Final = "#"
SHARE_PREFIX: Final = "$share/"
SYSTEM_PREFIX: Final = "$SYS/"
"""The broker's own topics: no client publishes under them (wills, retained and API
publishes included); only the node's own publisher does."""

# A str of this many characters or fewer cannot exceed MAX_TOPIC_BYTES (4 bytes a character).
_SAFE_CHARS: Final = MAX_TOPIC_BYTES // 4

TopicName = NewType("TopicName", str)
"""A topic name that passed :func:`validate_topic`.

A topic is validated once, where it enters (an API call, a CLI argument, an MQTT packet)
and travels as a ``TopicName`` from there: code that takes one (the trie's
:meth:`~router.core.trie.SubscriptionTrie.subscriptions_for`, the route mirror's
``match``) validates nothing again, and mypy proves every caller validated. At run time
it is a plain ``str``: the type costs nothing.
"""

TopicFilter = NewType("TopicFilter", str)
"""A topic filter (shared or not) that passed :func:`validate_filter`; see :data:`TopicName`."""


class SharedFilter(NamedTuple):
    """A parsed ``$share/{group}/{filter}``: the share name and the plain filter part."""

    group: str
    filter: str


def _check_text(text: object, what: str) -> str:
    """Apply the rules shared by names and filters; return ``text`` or raise."""
    if not isinstance(text, str):
        raise InvalidTopicError(repr(text), f"a {what} must be a str, not {type(text).__name__}")
    if not text:
        raise InvalidTopicError(text, f"a {what} must not be empty")
    if "\x00" in text:
        raise InvalidTopicError(text, f"a {what} must not contain U+0000")
    if not text.isascii():
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidTopicError(
                text, f"a {what} must be well-formed UTF-8 (it holds a lone surrogate)"
            ) from None
        if size > MAX_TOPIC_BYTES:
            raise InvalidTopicError(text, f"a {what} is at most {MAX_TOPIC_BYTES} UTF-8 bytes")
    elif len(text) > MAX_TOPIC_BYTES:
        raise InvalidTopicError(text, f"a {what} is at most {MAX_TOPIC_BYTES} UTF-8 bytes")
    return text


def validate_topic(name: str) -> TopicName:
    """Return ``name`` if it is a valid topic name (what a client publishes to).

    Raises :class:`InvalidTopicError` if it is empty, too long, holds U+0000, is not
    well-formed UTF-8, or contains a wildcard.
    """
    # The fast path: short ASCII names are checked without encoding them.
    if (
        type(name) is str
        and name
        and len(name) <= _SAFE_CHARS
        and name.isascii()
        and "+" not in name
        and "#" not in name
        and "\x00" not in name
    ):
        return TopicName(name)
    _check_text(name, "topic name")
    if SINGLE_LEVEL in name or MULTI_LEVEL in name:
        raise InvalidTopicError(name, "a topic name must not contain the wildcards '+' or '#'")
    return TopicName(name)


def _check_filter_levels(text: str, whole: str) -> None:
    levels = text.split(SEPARATOR)
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if level in (SINGLE_LEVEL, MULTI_LEVEL):
            if level == MULTI_LEVEL and index != last:
                raise InvalidTopicError(whole, "'#' must be the last level of a filter")
            continue
        if SINGLE_LEVEL in level or MULTI_LEVEL in level:
            raise InvalidTopicError(
                whole, f"a wildcard must occupy a whole level (level {index} is {level!r})"
            )


def parse_shared(topic_filter: str) -> SharedFilter | None:
    """Split a ``$share/{group}/{filter}`` filter; return None for a plain filter.

    The parts are not validated here: call :func:`validate_filter` first.
    """
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    group, _, rest = topic_filter[len(SHARE_PREFIX) :].partition(SEPARATOR)
    return SharedFilter(group, rest)


def validate_filter(topic_filter: str) -> TopicFilter:
    """Return ``topic_filter`` if it is a valid topic filter, shared or not.

    Raises :class:`InvalidTopicError` naming the broken rule otherwise.
    """
    _check_text(topic_filter, "topic filter")
    if not topic_filter.startswith(SHARE_PREFIX):
        _check_filter_levels(topic_filter, topic_filter)
        return TopicFilter(topic_filter)
    body = topic_filter[len(SHARE_PREFIX) :]
    if SEPARATOR not in body:
        raise InvalidTopicError(
            topic_filter, "a shared subscription needs '$share/{name}/{filter}'"
        )
    group, _, inner = body.partition(SEPARATOR)
    if not group:
        raise InvalidTopicError(topic_filter, "the share name must not be empty")
    if SINGLE_LEVEL in group or MULTI_LEVEL in group:
        raise InvalidTopicError(topic_filter, "the share name must not contain '+' or '#'")
    if not inner:
        raise InvalidTopicError(topic_filter, "the filter of a shared subscription is empty")
    _check_filter_levels(inner, topic_filter)
    return TopicFilter(topic_filter)


def filter_matches_levels(filter_levels: list[str], topic_levels: list[str]) -> bool:
    """Match already split, already valid, non-shared filter and topic levels."""
    if topic_levels[0].startswith("$") and filter_levels[0] in (SINGLE_LEVEL, MULTI_LEVEL):
        return False
    count = len(topic_levels)
    for index, level in enumerate(filter_levels):
        if level == MULTI_LEVEL:
            return True
        if index >= count or (level != SINGLE_LEVEL and level != topic_levels[index]):
            return False
    return len(filter_levels) == count


def matches(topic_filter: str, topic: str) -> bool:
    """Tell whether ``topic_filter`` matches the topic name ``topic``.

    Both are validated first (:class:`InvalidTopicError` if either is invalid). A shared
    filter ``$share/g/f`` matches exactly what ``f`` matches.
    """
    validate_filter(topic_filter)
    validate_topic(topic)
    shared = parse_shared(topic_filter)
    plain = shared.filter if shared else topic_filter
    return filter_matches_levels(plain.split(SEPARATOR), topic.split(SEPARATOR))


def has_wildcard(plain_filter: str) -> bool:
    """True if a valid, non-shared filter holds ``+`` or ``#`` (so it can match many topics)."""
    return SINGLE_LEVEL in plain_filter or MULTI_LEVEL in plain_filter
