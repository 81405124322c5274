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


# -- the pipeline layer: pyspark only inside router/pipeline, nothing below imports it ------

PIPELINE = ROUTER / "pipeline"
# Pipeline modules that the executors, the CLI or the plain-Python report import: no pyspark.
PIPELINE_WITHOUT_SPARK = ("errors", "model", "matching", "plain", "summary", "snapshot", "loader")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def outside_pipeline() -> list[Path]:
    sources = [*ROUTER.rglob("*.py"), *(ROUTER.parent / "cli").rglob("*.py")]
    return sorted(p for p in sources if PIPELINE not in p.parents)


def test_only_the_pipeline_imports_pyspark() -> None:
    for path in outside_pipeline():
        assert not imported_roots(path) & {"pyspark", "py4j"}, path


@pytest.mark.parametrize("module", PIPELINE_WITHOUT_SPARK)
def test_pipeline_helpers_need_no_pyspark(module: str) -> None:
    assert not imported_roots(PIPELINE / f"{module}.py") & {"pyspark", "py4j"}


def test_lower_layers_never_import_the_pipeline() -> None:
    for path in outside_pipeline():
        if path.parent.name in ("cli", "bench"):
            continue
        assert not any(m.startswith("router.pipeline") for m in imported_modules(path)), path
