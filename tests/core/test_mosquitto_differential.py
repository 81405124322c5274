"""The router's topic rules beside libmosquitto's, a C implementation nobody here wrote.

libmosquitto1 is a Debian package that `make test` installs; the test fails (never skips)
without it. Thousands of seeded (filter, topic) pairs must get identical answers from
``router.matches`` and ``mosquitto_topic_matches_sub``, and both libraries must agree on
which filters and topic names are valid.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import random

import pytest

from router import InvalidTopicError, SubscriptionTrie, matches, validate_filter, validate_topic

MOSQ_ERR_SUCCESS = 0
LEVELS = ["a", "b", "ab", "", "$SYS", "$x", "+", "#", "a+", "#b", "ü", "x y"]


@pytest.fixture(scope="module")
def libmosquitto() -> ctypes.CDLL:
    name = ctypes.util.find_library("mosquitto") or "libmosquitto.so.1"
    library = ctypes.CDLL(name)  # raises OSError when missing: install libmosquitto1
    library.mosquitto_topic_matches_sub.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_bool),
    ]
    library.mosquitto_topic_matches_sub.restype = ctypes.c_int
    library.mosquitto_sub_topic_check.argtypes = [ctypes.c_char_p]
    library.mosquitto_pub_topic_check.argtypes = [ctypes.c_char_p]
    return library


def mosquitto_matches(library: ctypes.CDLL, topic_filter: str, topic: str) -> bool:
    result = ctypes.c_bool(False)
    status = library.mosquitto_topic_matches_sub(
        topic_filter.encode(), topic.encode(), ctypes.byref(result)
    )
    assert status == MOSQ_ERR_SUCCESS, (topic_filter, topic, status)
    return bool(result.value)


def random_text(rng: random.Random, max_levels: int) -> str:
    return "/".join(rng.choice(LEVELS) for _ in range(rng.randint(1, max_levels)))


def is_valid(check: object, text: str) -> bool:
    try:
        check(text)  # type: ignore[operator]
    except InvalidTopicError:
        return False
    return True


def test_validity_agrees(libmosquitto: ctypes.CDLL) -> None:
    rng = random.Random(2024)
    for _ in range(5000):
        text = random_text(rng, 6)
        if text.startswith("$share/") or not text:
            # libmosquitto treats $share as a plain level and leaves the emptiness rule
            # (MQTT-4.7.3-1) to its packet reader; both rules have table tests of their own.
            continue
        sub_ok = libmosquitto.mosquitto_sub_topic_check(text.encode()) == MOSQ_ERR_SUCCESS
        pub_ok = libmosquitto.mosquitto_pub_topic_check(text.encode()) == MOSQ_ERR_SUCCESS
        assert is_valid(validate_filter, text) == sub_ok, text
        assert is_valid(validate_topic, text) == pub_ok, text


def test_matching_agrees_on_thousands_of_pairs(libmosquitto: ctypes.CDLL) -> None:
    rng = random.Random(7)
    compared = matched = 0
    trie = SubscriptionTrie()
    pairs = []
    while compared < 20_000:
        topic_filter, topic = random_text(rng, 5), random_text(rng, 5)
        if not (is_valid(validate_filter, topic_filter) and is_valid(validate_topic, topic)):
            continue
        if topic_filter.startswith("$share/"):
            continue
        expected = mosquitto_matches(libmosquitto, topic_filter, topic)
        assert matches(topic_filter, topic) == expected, (topic_filter, topic)
        compared += 1
        matched += expected
        pairs.append((topic_filter, topic, expected))
    # Both answers are common, so the comparison says something either way.
    assert 1000 < matched < compared - 1000
    # The trie, holding every filter at once, gives the same answers as the C library.
    for index, (topic_filter, _, _) in enumerate(pairs[:3000]):
        trie.subscribe(f"c{index}", topic_filter)
    for index, (topic_filter, topic, expected) in enumerate(pairs[:3000]):
        assert (f"c{index}" in trie.match(topic)) == expected, (topic_filter, topic)
