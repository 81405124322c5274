"""The wheel carries router, router.cli and the Lua scripts, and installs a working CLI."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("router-*.whl")
    return built


def test_wheel_contains_cli_and_lua(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "router/cli/__init__.py" in names
    assert "router/py.typed" in names
    lua_in_repo = {f"router/{p.relative_to(ROOT)}" for p in (ROOT / "lua").rglob("*.lua")}
    assert "router/lua/lib/clocks.lua" in lua_in_repo  # the shared helpers ship too
    assert lua_in_repo <= names
    assert not any(name.startswith(("tests/", "cli/", "lua/")) for name in names)


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
    # The Lua scripts load from the installed package, not from this checkout.
    probe = "from router.state.scripts import script_source; import router; print(router.__file__)"
    located = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert str(env_dir) in located.stdout
