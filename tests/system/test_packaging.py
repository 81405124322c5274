"""The wheel carries router, router.cli, the Lua scripts and the compiled filter index,
installs a working CLI, and builds without a compiler too (the pure core)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE_CORE = (
    "from router.core.filter_index import COMPILED; from router import SubscriptionTrie;"
    "t = SubscriptionTrie(); t.subscribe('c', 'a/+'); t.subscribe('d', 'a/b');"
    "print(COMPILED, sorted(t.match('a/b')))"
)


def build_wheel(out: Path, source: Path, env: dict[str, str] | None = None) -> Path:
    """Build a wheel of a clean copy of the sources (what git tracks or would track: no
    extension built in place by ``make``) into ``out``."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), "."],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    [built] = out.glob("router-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("src"))


def test_wheel_contains_cli_and_lua(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "router/cli/__init__.py" in names
    assert "router/py.typed" in names
    lua_in_repo = {f"router/{p.relative_to(ROOT)}" for p in (ROOT / "lua").rglob("*.lua")}
    assert "router/lua/lib/clocks.lua" in lua_in_repo  # the shared helpers ship too
    assert lua_in_repo <= names
    assert not any(name.startswith(("tests/", "cli/", "lua/")) for name in names)
    compiled = [name for name in names if name.startswith("router/core/_filter_index.")]
    assert sorted(name.rsplit(".", 1)[1] for name in compiled) == ["pyi", "so"]


@pytest.mark.slow
def test_a_wheel_built_without_a_compiler_runs_the_pure_core(tmp_path: Path) -> None:
    built = build_wheel(tmp_path / "dist", tmp_path / "src", env={"CC": "false"})
    names = zipfile.ZipFile(built).namelist()
    assert not [name for name in names if name.endswith(".so")]
    zipfile.ZipFile(built).extractall(tmp_path / "site")
    result = subprocess.run(
        [sys.executable, "-c", PROBE_CORE],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert result.stdout.split("\n")[0] == "False ['c', 'd']"


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    pip = env_dir / "bin" / "pip"
    subprocess.run(
        [str(pip), "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    result = subprocess.run(
        [str(env_dir / "bin" / "router"), "--help"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert "publish/subscribe router" in result.stdout
    # The Lua scripts load from the installed package, not from this checkout; the
    # compiled filter index came with it.
    probe = "from router.state.scripts import script_source; import router; print(router.__file__)"
    for code, expected in ((probe, str(env_dir)), (PROBE_CORE, "True ['c', 'd']")):
        printed = subprocess.run(
            [str(env_dir / "bin" / "python"), "-c", code],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert expected in printed.stdout
