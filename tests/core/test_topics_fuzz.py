"""The topic parser under hostile text (hypothesis), against a model written from the
rules of MQTT 5.0 section 4.7: NUL, lone surrogates, levels of every
size up to past 65535 bytes, ``+`` and ``#`` anywhere, ``$share/`` in every shape.

For any text: each validator returns it or raises InvalidTopicError (nothing else), as the
model says; the validators agree with each other (a valid name is a valid filter that
matches exactly itself; a shared filter is valid exactly when its parts are, and matches
what its filter matches); :func:`matches` agrees with the model matcher.
"""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st

from router.core.topics import (
    MAX_TOPIC_BYTES,
    filter_matches_levels,
    has_wildcard,
    matches,
    parse_shared,
    validate_filter,
    validate_topic,
)
from router.errors import InvalidTopicError

# -- the model --------------------------------------------------------------------------


def text_ok(text: str) -> bool:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 1 <= size <= MAX_TOPIC_BYTES and "\x00" not in text


def model_topic(text: str) -> bool:
    return text_ok(text) and "+" not in text and "#" not in text


def model_levels(plain: str) -> bool:
    levels = plain.split("/")
    for index, level in enumerate(levels):
        if level == "#" and index != len(levels) - 1:
            return False
        if level not in ("+", "#") and ("+" in level or "#" in level):
            return False
    return True


def model_filter(text: str) -> bool:
    if not text_ok(text):
        return False
    if not text.startswith("$share/"):
        return model_levels(text)
    group, slash, inner = text[len("$share/") :].partition("/")
    return (
        bool(slash and group and inner)
        and "+" not in group
        and "#" not in group
        and (model_levels(inner))
    )


def model_match(plain: str, topic: str) -> bool:
    """Level by level, the way the specification words it."""
    f, t = plain.split("/"), topic.split("/")
    if t[0].startswith("$") and f[0] in ("+", "#"):
        return False
    for index, level in enumerate(f):
        if level == "#":
            return True
        if index >= len(t) or level not in ("+", t[index]):
            return False
    return len(f) == len(t)


# -- hostile text -------------------------------------------------------------------------

LEVELS = [
    "",
    "a",
    "b",
    "+",
    "#",
    "a+",
    "+a",
    "#b",
    "b#",
    "++",
    "##",
    "+#",
    "$",
    "$SYS",
    "$share",
    "share",
    "g",
    "\x00",
    "\ud800",
    "\udfff",
    "é",
    "𝄞",
    " ",
    "%",
    "{",
    "}",
]
HUGE = [
    "a" * 65535,
    "a" * 65536,
    "é" * 32767,
    "é" * 32768,
    "𝄞" * 16383,
    "𝄞" * 16384,
    "a/" * 32767 + "a",
    "+/" * 32767 + "#",
    "$share/g/" + "a" * 65526,
    "$share/g/" + "a" * 65527,
    "a" * 16383 + "𝄞",
    "a" * 16384 + "\ud800",
]

levels_text = st.lists(st.sampled_from(LEVELS) | st.text(max_size=3), min_size=1, max_size=6).map(
    "/".join
)
topicish = st.one_of(
    levels_text,
    levels_text.map(lambda rest: "$share/" + rest),
    st.text(alphabet=st.sampled_from("ab/+#$\x00é𝄞\ud800"), max_size=12),
    st.text(max_size=20),
    st.sampled_from(HUGE),
)


def outcome(validate: object, text: str) -> bool:
    """True if ``validate(text)`` returns ``text``, False if it raises InvalidTopicError."""
    try:
        result = validate(text)  # type: ignore[operator]
    except InvalidTopicError as error:
        assert error.topic == text
        return False
    assert result == text
    return True


SETTINGS = settings(max_examples=1500, deadline=None)


@SETTINGS
@given(topicish)
@example("$share/g/+")
@example("$share/+/a")
@example("$share//a")
@example("$share/g")
@example("$share")
@example("+/#")
@example("#/")
def test_the_validators_follow_the_model(text: str) -> None:
    is_topic, is_filter = outcome(validate_topic, text), outcome(validate_filter, text)
    assert (is_topic, is_filter) == (model_topic(text), model_filter(text))
    shared = parse_shared(text)
    if is_topic:
        assert not has_wildcard(text)
        # A name is a filter without wildcards, but a name under '$share/' is a filter
        # only when it has the form of a shared subscription ('$share/g' is not).
        assert is_filter or shared is not None
    if is_filter and shared is not None:
        # A shared filter is valid exactly when its parts are: its filter part is a plain
        # filter ('$share/g/$share/h' shares the plain filter '$share/h').
        assert shared.group and "+" not in shared.group and "#" not in shared.group
        assert shared.filter and model_levels(shared.filter)


@SETTINGS
@given(topic_filter=topicish, topic=topicish)
@example(topic_filter="$share/g/#", topic="$SYS/x")
@example(topic_filter="$share/g/$SYS/#", topic="$SYS")
@example(topic_filter="+/+", topic="/")
def test_matches_follows_the_model(topic_filter: str, topic: str) -> None:
    valid = model_filter(topic_filter) and model_topic(topic)
    try:
        result = matches(topic_filter, topic)
    except InvalidTopicError:
        assert not valid
        return
    assert valid
    shared = parse_shared(topic_filter)
    plain = shared.filter if shared else topic_filter
    assert result == model_match(plain, topic)
    assert result == filter_matches_levels(plain.split("/"), topic.split("/"))


@SETTINGS
@given(topicish)
def test_a_valid_name_matches_itself_as_a_filter(topic: str) -> None:
    # A name that starts with '$share/' is, as a filter, a shared subscription instead.
    if model_topic(topic) and parse_shared(topic) is None:
        assert matches(topic, topic)
