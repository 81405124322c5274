"""The pure core imports neither Redis nor asyncio (ARCHITECTURE.md, STYLE.md 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROUTER = Path(__file__).resolve().parent.parent / "router"
CORE = [
    "topics",
    "trie",
    "shapes",
    "aliases",
    "sharing",
    "options",
    "errors",
    "mirror",
    "guid",
    "hooks",
    "acl",
    "cache",
]
FORBIDDEN = {"redis", "asyncio", "msgpack", "fakeredis", "pyspark", "click", "rich"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", CORE)
def test_core_module_is_pure(module: str) -> None:
    assert not imported_roots(ROUTER / f"{module}.py") & FORBIDDEN


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_only_core(module: str) -> None:
    tree = ast.parse((ROUTER / f"{module}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("router."):
            assert node.module.removeprefix("router.") in CORE, node.module
