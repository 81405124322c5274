"""The house plan, enforced by reading the code (docs/architecture.md, Rooms).

Rooms by layer: a module imports only what its folder may import (read from its AST, so a
new module is checked the day it lands, with no list to keep). Names explain themselves:
every exception lives in ``router/errors.py`` and ends in ``Error``; no two modules have
names one letter apart, none is named after a standard-library module; no two public
classes share a name; no module is over 800 lines (600 is the guide: split by concept,
never pack code to fit). No cycle of imports inside a room, counting the imports under
``TYPE_CHECKING`` and inside functions (a small Protocol breaks one: what a module needs
of another, declared where it is needed). And importing the pure core loads none
of the runtime's dependencies.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
ROUTER = REPOSITORY / "router"
CLI = REPOSITORY / "cli"

# What each room may import from the package ("errors" is router.errors; "top" is the
# package itself and router.api). A room may always import its own modules.
LOWER = {
    "core": {"errors"},
    "state": {"errors", "core"},
    "cluster": {"errors", "core", "state"},
    "mqtt": {"errors", "core", "state", "cluster"},
    "top": {"errors", "core", "state", "cluster", "mqtt", "top"},
    "ops": {"errors", "core", "state", "cluster", "mqtt", "top"},
    "web": {"errors", "core", "state", "cluster", "mqtt", "top", "ops"},
    "pipeline": {"errors", "core", "state"},
    "integrations": {"errors", "core", "state", "cluster", "top"},
    "bench": {
        *("errors", "core", "state", "cluster", "mqtt", "top", "ops", "web", "pipeline"),
        "integrations",
    },
    "cli": {"errors", "core", "state", "cluster", "mqtt", "top", "ops", "web", "pipeline", "bench"},
}
# Third-party distributions each room may import (the standard library is always allowed,
# except in core, below).
# Only the state layer speaks to Redis for the router (it tells redis-py's errors as the
# router's: router/state/failures.py); ops starts Redis servers, the pipeline and the
# benchmarks talk to Redis directly by design.
THIRD_PARTY = {
    "core": set(),
    "state": {"redis", "msgpack", "hiredis"},  # (hiredis: state/turn_batch.py packs in C)
    # (PyJWT: cluster/jwt_auth.py; bcrypt: cluster/emqx_auth.py)
    "cluster": {"msgpack", "jwt", "cryptography", "bcrypt"},
    "mqtt": {"websockets"},
    "top": set(),
    "ops": {"redis", "fakeredis", "prometheus_client"},
    "web": {"aiohttp", "prometheus_client"},
    "pipeline": {"redis", "pyspark", "py4j", "matplotlib"},
    # each module imports its framework, an optional extra (router/integrations/__init__.py);
    # msgpack: the Django Channels layer serializes as channels_redis does
    "integrations": {"channels", "django", "socketio", "broadcaster", "msgpack"},
    # the peers of `router bench backends` are the frameworks' own Redis backends
    "bench": {"redis", "paho", "channels", "channels_redis", "socketio"},
    "cli": {"click", "rich"},
}
# The core is pure: no I/O machinery of the standard library either.
CORE_FORBIDDEN_STDLIB = {"asyncio", "socket", "ssl", "selectors", "subprocess"}
# The deciders: pure objects that decide and leave all I/O to a driver (STYLE.md, as
# router/mqtt/exchange.py decides for a connection). Beyond their room's rule: from the
# package only router.errors and the core; from the standard library no clock, no log,
# no randomness, no environment, no threads.
DECIDERS = ("core/session_machine.py",)
DECIDER_FORBIDDEN_STDLIB = CORE_FORBIDDEN_STDLIB | {
    *("logging", "time", "datetime", "random", "secrets", "os", "threading", "contextvars"),
}
# Modules of the pipeline that the executors, the CLI or the plain-Python report import.
PIPELINE_WITHOUT_SPARK = ("model", "matching", "plain", "summary", "snapshot", "loader")


def sources() -> list[Path]:
    return sorted([*ROUTER.rglob("*.py"), *CLI.rglob("*.py")])


def room_of(path: Path) -> str:
    if path.is_relative_to(CLI):
        return "cli"
    parts = path.relative_to(ROUTER).parts
    if len(parts) == 1:
        return "errors" if parts[0] == "errors.py" else "top"
    return parts[0]


def room_of_module(dotted: str) -> str:
    """The room of an imported ``router...`` module."""
    parts = dotted.split(".")
    if len(parts) == 1 or parts[1] == "api":
        return "top"
    return "cli" if parts[1] in ("cli", "lua") else parts[1]


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted module) of every import in the file."""
    if path.is_relative_to(CLI):
        package = "router.cli"
    else:
        package = ".".join(("router", *path.relative_to(ROUTER).parts[:-1]))
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield node.lineno, f"{base}.{node.module}" if node.module else base
            elif node.module:
                yield node.lineno, node.module


def violations(path: Path) -> list[str]:
    room = room_of(path)
    if room == "errors":
        allowed_rooms: set[str] = set()
        allowed_third: set[str] = set()
    else:
        allowed_rooms = LOWER[room] | {room}
        allowed_third = THIRD_PARTY[room]
    found = []
    for line, module in imports(path):
        root = module.split(".")[0]
        if root == "router":
            target = room_of_module(module)
            if target not in allowed_rooms:
                found.append(f"{path.relative_to(REPOSITORY)}:{line} imports {module} ({target})")
        elif root == "__future__":
            continue
        elif root in sys.stdlib_module_names:
            if room in ("core", "errors") and root in CORE_FORBIDDEN_STDLIB:
                found.append(f"{path.relative_to(REPOSITORY)}:{line} imports {module} (I/O)")
        elif root not in allowed_third:
            found.append(f"{path.relative_to(REPOSITORY)}:{line} imports {module} (third party)")
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPOSITORY)))
def test_each_module_imports_only_the_layers_below(path: Path) -> None:
    assert violations(path) == []


def decider_violations(path: Path) -> list[str]:
    found = []
    for line, module in imports(path):
        root = module.split(".")[0]
        if root == "router":
            allowed = module == "router.errors" or module.startswith("router.core.")
        else:
            allowed = root == "__future__" or (
                root in sys.stdlib_module_names and root not in DECIDER_FORBIDDEN_STDLIB
            )
        if not allowed:
            found.append(f"{path.relative_to(REPOSITORY)}:{line} imports {module}")
    return found


def fake_core_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> Path:
    """``router/core/bad.py`` holding ``source`` in a repository of its own, which the
    checks of this module then read."""
    fake_router = tmp_path / "router"
    (fake_router / "core").mkdir(parents=True)
    bad = fake_router / "core" / "bad.py"
    bad.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "ROUTER", fake_router)
    monkeypatch.setattr(sys.modules[__name__], "REPOSITORY", tmp_path)
    return bad


@pytest.mark.parametrize("decider", DECIDERS)
def test_a_decider_imports_nothing_but_errors_the_core_and_pure_stdlib(decider: str) -> None:
    assert decider_violations(ROUTER / decider) == []


def test_the_decider_check_catches_a_clock_a_log_and_a_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = fake_core_module(
        tmp_path,
        monkeypatch,
        "import time\nimport logging\nfrom enum import Enum\nfrom router.errors import E\n"
        "from router.core.topics import T\nfrom router.cluster.sessions import states\n",
    )
    found = [v.split(" imports ")[1] for v in decider_violations(bad)]
    assert found == ["time", "logging", "router.cluster.sessions"]


def test_the_check_catches_an_import_from_above(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = fake_core_module(
        tmp_path,
        monkeypatch,
        "import asyncio\nimport redis\nfrom router.cluster.node import RouterNode\n",
    )
    assert [v.split(" (")[1] for v in violations(bad)] == ["I/O)", "third party)", "cluster)"]


def test_only_the_pipeline_imports_pyspark() -> None:
    for path in sources():
        if room_of(path) in ("pipeline", "bench", "cli"):
            continue
        assert not any(m.split(".")[0] in ("pyspark", "py4j") for _, m in imports(path)), path


@pytest.mark.parametrize("module", PIPELINE_WITHOUT_SPARK)
def test_pipeline_helpers_need_no_pyspark(module: str) -> None:
    path = ROUTER / "pipeline" / f"{module}.py"
    assert not any(m.split(".")[0] in ("pyspark", "py4j") for _, m in imports(path))


def test_importing_the_core_loads_no_runtime_dependency() -> None:
    probe = (
        "import sys, router.core.trie, router.core.route_mirror, router.core.hot_topics, "
        "router.core.acl, router.core.hooks, router.core.messages, router.core.aliases\n"
        "import router\n"
        "router.SubscriptionTrie, router.validate_topic, router.Acl\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('redis', 'msgpack', 'asyncio', 'router') and not m.startswith(('router.core', "
        "'router.errors')) and m != 'router'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert loaded == "[]"


def test_the_lazy_names_and_the_typed_imports_agree() -> None:
    tree = ast.parse((ROUTER / "__init__.py").read_text(encoding="utf-8"))
    typed = {
        (node.module, alias.name)
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    import router

    assert typed == {(module, name) for name, module in router._EXPORTS.items()}


def test_public_names_resolve_lazily() -> None:
    import router

    for name in router.__all__:
        assert getattr(router, name) is not None, name
    with pytest.raises(AttributeError):
        router.NoSuchName  # noqa: B018


# -- names ---------------------------------------------------------------------------------


def classes(path: Path) -> Iterator[ast.ClassDef]:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            yield node


def is_exception(node: ast.ClassDef, known: set[str]) -> bool:
    bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    return bool(bases & known) or any(b.endswith(("Error", "Exception")) for b in bases)


def test_every_exception_lives_in_errors_and_ends_in_error() -> None:
    declared = {node.name for node in classes(ROUTER / "errors.py")}
    assert declared and all(name.endswith("Error") for name in declared), declared
    known = declared | {"Exception", "ValueError", "LookupError", "TypeError"}
    elsewhere = [
        f"{path.relative_to(REPOSITORY)}: {node.name}"
        for path in sources()
        if path != ROUTER / "errors.py"
        for node in classes(path)
        if is_exception(node, known)
    ]
    assert elsewhere == []


def one_edit_apart(a: str, b: str) -> bool:
    """True if ``a`` becomes ``b`` by changing, adding or removing one character."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def module_names() -> list[Path]:
    return [p for p in sources() if p.name != "__init__.py"]


def test_module_names_are_not_one_letter_apart() -> None:
    paths = module_names()
    close = [
        (str(a.relative_to(REPOSITORY)), str(b.relative_to(REPOSITORY)))
        for a, b in combinations(paths, 2)
        if one_edit_apart(a.stem, b.stem)
    ]
    assert close == []
    assert one_edit_apart("node", "nodes") and one_edit_apart("retained", "retainer")


def test_module_names_are_unique_in_the_library() -> None:
    stems = [p.stem for p in module_names() if not p.is_relative_to(CLI)]
    assert sorted({s for s in stems if stems.count(s) > 1}) == []


def test_no_module_is_named_after_the_standard_library() -> None:
    shadowing = [str(p) for p in module_names() if p.stem in sys.stdlib_module_names]
    assert shadowing == []


def test_no_two_public_classes_share_a_name() -> None:
    seen: dict[str, str] = {}
    clashes = []
    for path in sources():
        for node in classes(path):
            if node.name.startswith("_"):
                continue
            where = str(path.relative_to(REPOSITORY))
            if node.name in seen:
                clashes.append((node.name, seen[node.name], where))
            seen[node.name] = where
    assert clashes == []


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPOSITORY)))
def test_modules_stay_under_800_lines(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 800


def test_no_code_is_laid_out_by_hand() -> None:
    """The formatter lays out every line: a module is split by concept, never packed to fit."""
    tests = sorted((REPOSITORY / "tests").rglob("*.py"))
    markers = ("# fmt: " + "skip", "# fmt: " + "off")  # (in two parts: this line is no hit)
    packed = [
        f"{path.relative_to(REPOSITORY)}:{number}"
        for path in [*sources(), *tests]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert packed == []


def test_at_most_eight_modules_sit_directly_in_the_package() -> None:
    assert len(list(ROUTER.glob("*.py"))) <= 8


# -- cycles ------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    if path.is_relative_to(CLI):
        return ".".join(("router", "cli", *path.relative_to(CLI).with_suffix("").parts))
    return ".".join(("router", *path.relative_to(ROUTER).with_suffix("").parts))


def room_graph(paths: list[Path]) -> dict[str, set[str]]:
    """module -> the modules of its own room it imports (anywhere in its code)."""
    modules = {module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for _, imported in imports(path):
            target = imported
            while target and target not in modules:  # (``from package.module import name``)
                target = target.rpartition(".")[0]
            if target and target != name and room_of(modules[target]) == room_of(path):
                found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_room_has_an_import_cycle() -> None:
    assert cycles(room_graph(sources())) == []


def test_the_cycle_check_sees_type_checking_and_function_imports(tmp_path: Path) -> None:
    room = tmp_path / "router" / "mqtt"
    room.mkdir(parents=True)
    guarded = "if TYPE_CHECKING:\n    from router.mqtt.second import B\n"
    (room / "first.py").write_text("from typing import TYPE_CHECKING\n" + guarded)
    (room / "second.py").write_text("def f():\n    from router.mqtt.third import C\n")
    (room / "third.py").write_text("import router.mqtt.first\n")
    (room / "fourth.py").write_text("from router.mqtt import third\n")
    paths = sorted(room.glob("*.py"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys.modules[__name__], "ROUTER", tmp_path / "router")
        patch.setattr(sys.modules[__name__], "REPOSITORY", tmp_path)
        assert cycles(room_graph(paths)) == [
            ["router.mqtt.first", "router.mqtt.second", "router.mqtt.third"]
        ]
