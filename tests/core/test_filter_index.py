"""The compiled filter index against the pure one, and its edges: invalid input, deep and
wide tries, errors, references and memory."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from router.core._filter_index import FilterIndex as CompiledFilterIndex, Terminal
from router.core.filter_index import PureFilterIndex, PureTerminal, is_topic_name
from router.core.topics import validate_topic
from router.errors import InvalidTopicError
from tests.support.indexes import INDEXES

LEVELS = ["a", "b", "", "$x", "ü", "日本", "a b"]
level = st.sampled_from(LEVELS)
topics = st.lists(level, min_size=1, max_size=6).map("/".join).filter(bool)


@st.composite
def plain_filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.one_of(level, st.just("+")), min_size=0, max_size=5))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "+"


changes = st.lists(st.tuples(st.booleans(), plain_filters()), max_size=40)


def names(found: list[Any] | None) -> list[str] | None:
    return None if found is None else sorted(terminal.filter for terminal in found)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes, st.lists(topics, min_size=1, max_size=10))
def test_the_compiled_index_answers_as_the_pure_one(
    ops: list[tuple[bool, str]], probe: list[str]
) -> None:
    indexes = [CompiledFilterIndex(), PureFilterIndex(), PureFilterIndex(max_shapes=0)]
    for add, topic_filter in ops:
        for index in indexes:
            if add:
                terminal = PureTerminal(topic_filter)
                terminal.subs = {f"by {topic_filter}": None}  # type: ignore[dict-item]
                index.add(topic_filter, terminal)
            elif index.get(topic_filter) is not None:
                assert index.remove(topic_filter).filter == topic_filter
            else:
                with pytest.raises(KeyError):
                    index.remove(topic_filter)
        assert len({len(index) for index in indexes}) == 1
        assert len({index.node_count() for index in indexes}) == 1
    reference = indexes[1]
    for topic in probe + [f for _, f in ops if "+" not in f and "#" not in f]:
        expected = names(reference.terminals(topic))
        assert expected is not None
        for index in indexes:
            assert names(index.terminals(topic)) == expected, topic
            assert index.clients(topic) == {f"by {name}" for name in expected}
    expected_items = sorted((name, name) for name, _ in reference.items())
    for index in indexes:
        items = sorted((name, terminal.filter) for name, terminal in index.items())
        assert items == expected_items
        for name, _ in index.items():
            index.remove(name)
        assert index.node_count() == 0
        assert len(index) == 0


INVALID_TOPICS = ["", "a/+", "#", "a/#", "a\x00b", "\ud800", "x" * 65536, "é" * 32768, None]
INVALID_TOPICS += [b"a", 5]  # type: ignore[list-item]


@pytest.mark.parametrize("index", INDEXES)
@pytest.mark.parametrize("topic", INVALID_TOPICS, ids=range(len(INVALID_TOPICS)))
def test_an_invalid_topic_name_has_no_terminals(index: str, topic: Any) -> None:
    filter_index = INDEXES[index]()
    filter_index.add("#", PureTerminal("#"))
    assert not is_topic_name(topic)
    with pytest.raises(InvalidTopicError):
        validate_topic(topic)
    assert filter_index.terminals(topic) is None
    assert filter_index.clients(topic) is None


@pytest.mark.parametrize("index", INDEXES)
def test_the_longest_topic_names_are_valid(index: str) -> None:
    filter_index = INDEXES[index]()
    filter_index.add("#", PureTerminal("#"))
    for topic in ("x" * 65535, "é" * 32767 + "x"):
        assert is_topic_name(topic)
        assert names(filter_index.terminals(topic)) == ["#"]


@pytest.mark.parametrize("index", INDEXES)
def test_deep_topics_with_many_wildcards_match(index: str) -> None:
    filter_index = INDEXES[index]()
    depth = 200
    for at in range(depth):
        levels = ["l"] * depth
        levels[at] = "+"
        filter_index.add("/".join(levels), PureTerminal(str(at)))
    filter_index.add("/".join(["+"] * depth), PureTerminal("all plus"))
    filter_index.add("/".join(["l"] * 150 + ["#"]), PureTerminal("hash"))
    found = names(filter_index.terminals("/".join(["l"] * depth)))
    assert found is not None
    assert len(found) == depth + 2
    assert names(filter_index.terminals("/".join(["l"] * (depth + 1)))) == ["hash"]
    for name, _ in filter_index.items():
        filter_index.remove(name)
    assert filter_index.node_count() == 0


@pytest.mark.parametrize("index", INDEXES)
def test_the_deepest_filters_are_added_and_removed(index: str) -> None:
    filter_index = INDEXES[index]()
    deepest = "/".join(["+"] * 32767)  # 65,535 bytes: the longest filter there is
    filter_index.add(deepest, PureTerminal("deepest"))
    filter_index.add(deepest[:-2] + "/#", PureTerminal("hash"))
    assert filter_index.node_count() == 32768
    assert names(filter_index.terminals("/".join(["x"] * 32767))) == ["deepest", "hash"]
    filter_index.remove(deepest)
    assert filter_index.node_count() == 32767
    filter_index.remove(deepest[:-2] + "/#")
    assert filter_index.node_count() == 0
    filter_index.add(deepest, PureTerminal("deepest"))
    assert [name for name, _ in filter_index.items()] == [deepest]
    del filter_index  # frees 32,767 levels


def test_a_wide_level_grows_and_shrinks_its_table() -> None:
    filter_index = CompiledFilterIndex()
    count = 20_000
    for number in range(count):
        filter_index.add(f"w/{number}/+", PureTerminal(str(number)))
        filter_index.add(f"e/{number}", PureTerminal(f"e{number}"))
    assert filter_index.node_count() == 1 + 2 * count + count
    for number in range(0, count, 3):
        assert names(filter_index.terminals(f"w/{number}/x")) == [str(number)]
        assert names(filter_index.terminals(f"e/{number}")) == [f"e{number}"]
    for number in range(count):
        filter_index.remove(f"w/{number}/+")
        filter_index.remove(f"e/{number}")
        if number % 997 == 0:  # the tables still find every key left after shrinking
            left = number + 1
            if left < count:
                assert names(filter_index.terminals(f"w/{left}/y")) == [str(left)]
    assert filter_index.node_count() == 0


def test_bad_arguments_raise_and_change_nothing() -> None:
    filter_index = CompiledFilterIndex()
    filter_index.add("a/+", PureTerminal("a/+"))
    for bad in ("", "a/#/b", "a+", "a/b#", "#a"):
        with pytest.raises(ValueError):
            filter_index.add(bad, PureTerminal(bad))
    with pytest.raises(TypeError):
        filter_index.add(b"a", PureTerminal("a"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        filter_index.add("a")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        CompiledFilterIndex(1)  # type: ignore[call-arg]
    with pytest.raises(KeyError):
        filter_index.remove("a/b")
    with pytest.raises(KeyError):
        filter_index.remove("a/#")
    assert len(filter_index) == 1
    assert filter_index.node_count() == 2
    assert [name for name, _ in filter_index.items()] == ["a/+"]


@pytest.mark.parametrize("make_terminal", [Terminal, PureTerminal])
def test_clients_reads_subs_and_defers_groups(make_terminal: type[Any]) -> None:
    filter_index = CompiledFilterIndex()
    exact, wild = make_terminal("a/b"), make_terminal("a/+")
    exact.subs = {"c1": None, "c2": None}
    wild.subs = {f"w{i}": None for i in range(20)} | {"c1": None}
    filter_index.add("a/b", exact)
    filter_index.add("a/+", wild)
    assert filter_index.clients("a/b") == {"c1", "c2"} | {f"w{i}" for i in range(20)}
    assert filter_index.clients("a/c") == set(wild.subs)
    assert filter_index.clients("b") == set()
    wild.groups = {"$share/g/a/+": object()}
    assert filter_index.clients("a/b") is None  # the caller chooses group members
    wild.subs = ["not a dict"]
    with pytest.raises(TypeError):
        filter_index.clients("a/b")


def test_terminals_are_referenced_while_indexed_and_released_after() -> None:
    filter_index = CompiledFilterIndex()
    terminals = [Terminal("a/+"), Terminal("x"), PureTerminal("z/#")]
    before = [sys.getrefcount(t) for t in terminals]
    for position in range(len(terminals)):
        filter_index.add(terminals[position].filter, terminals[position])
    assert [sys.getrefcount(t) for t in terminals] == [count + 1 for count in before]
    replacement = Terminal("x")
    filter_index.add("x", replacement)  # replaces: the old terminal is released
    assert sys.getrefcount(terminals[1]) == before[1]
    for name in ("a/+", "x", "z/#"):
        filter_index.remove(name)
    assert [sys.getrefcount(t) for t in terminals] == before
    with pytest.raises(AttributeError):
        replacement.filter = "y"  # type: ignore[misc]


def test_adding_and_removing_everything_returns_the_memory() -> None:
    filters = [f"s/{i % 100}/d/{i}/m" for i in range(20_000)]
    filters += [f"s/{i % 100}/d/{i}/+" for i in range(10_000)]
    filters += [f"s/+/d/{i}/#" for i in range(10_000)]
    terminals = [Terminal(name) for name in filters]
    gc.collect()
    tracemalloc.start()
    try:
        filter_index = CompiledFilterIndex()
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            for name, terminal in zip(filters, terminals, strict=True):
                filter_index.add(name, terminal)
            assert tracemalloc.get_traced_memory()[0] - start > 40 * len(filters)
            for name in filters:
                filter_index.remove(name)
            assert filter_index.node_count() == 0
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - start < 4096
    finally:
        tracemalloc.stop()


# Run in a child interpreter: a stack overflow there kills the child, not pytest.
SMALL_STACK_SCRIPT = """
import threading

from router.core._filter_index import FilterIndex, Terminal

def build_and_drop() -> None:
    deep = "/".join(["+"] * 30_000)
    index = FilterIndex()
    for name in (deep, deep + "/#", "a/+/b", "a/#", "x/y"):
        index.add(name, Terminal(name))
    index.remove(deep)
    index.add(deep, Terminal(deep))
    listed = sorted(name for name, _ in index.items())  # (walks 30,001 levels)
    assert listed == sorted([deep, deep + "/#", "a/+/b", "a/#", "x/y"]), listed[:3]
    del index  # frees 30,001 levels on a 256 KiB stack

old = threading.stack_size(256 * 1024)
try:
    thread = threading.Thread(target=build_and_drop)
    thread.start()
    thread.join()
finally:
    threading.stack_size(old)
"""


def test_a_deep_trie_is_listed_and_freed_on_a_small_thread_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SMALL_STACK_SCRIPT], check=False, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def test_dropping_an_index_releases_every_terminal_and_node() -> None:
    shapes = ["+/+/#", "+/a/+", "a/+/b/#", "a/b/+", "#", "+", "a/+", "a/+/+/c"]
    filters = [f"{i}/+/{shape}" for shape in shapes for i in range(50)] + shapes + ["a/b"]
    terminals = [Terminal(name) for name in filters]
    before = [sys.getrefcount(terminal) for terminal in terminals]
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        filter_index = CompiledFilterIndex()
        for position, name in enumerate(filters):
            filter_index.add(name, terminals[position])
        assert filter_index.node_count() > len(filters)
        del filter_index
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - start < 4096
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(terminal) for terminal in terminals] == before
