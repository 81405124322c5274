"""The frameworks' own test suites, fetched from the package registry at test time.

Their source distributions carry their tests; we never copy them into the repository. Each
suite is pinned by version and by the SHA-256 of its source distribution (the same release
is installed by the ``test`` extra, so the suite tests the code it was written for), and is
unpacked once into ``.cache/framework-suites/`` (gitignored) beside the repository.

``suite_root(name)`` returns the unpacked release's root (``.../channels_redis-4.3.0``); a
test then runs pytest there, in a subprocess, with our backend swapped in.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPOSITORY: Final = Path(__file__).resolve().parents[2]
CACHE: Final = REPOSITORY / ".cache" / "framework-suites"
DOWNLOAD_TIMEOUT: Final = 120.0


@dataclass(frozen=True)
class Suite:
    """One pinned source distribution: what pip calls it, its version and digest."""

    distribution: str
    version: str
    sha256: str

    @property
    def archive_name(self) -> str:
        return f"{self.distribution.replace('-', '_')}-{self.version}.tar.gz"

    @property
    def root_name(self) -> str:
        return self.archive_name.removesuffix(".tar.gz")


SUITES: Final = {
    "channels_redis": Suite(
        "channels-redis",
        "4.3.0",
        "740ee7b54f0e28cf2264a940a24453d3f00526a96931f911fcb69228ef245dd2",
    ),
    "python_socketio": Suite(
        "python-socketio",
        "5.18.1",
        "07ab0e7c94a52833a67af1dc05958ad6fb0de69adc87de9198a61b22588c40d4",
    ),
}


class SuiteFetchError(RuntimeError):
    """The registry could not be reached, or served an archive with another digest."""


def suite_root(name: str) -> Path:
    """The unpacked source distribution of suite ``name``, fetched when not yet cached.

    Raises :class:`SuiteFetchError` when pip cannot download it or its digest differs from
    the pinned one (a tampered or re-uploaded release is never run).
    """
    suite = SUITES[name]
    root = CACHE / suite.root_name
    if (root / "PKG-INFO").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / suite.archive_name
    if not archive.exists():
        _download(suite)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != suite.sha256:
        archive.unlink()
        raise SuiteFetchError(f"{suite.archive_name}: sha256 {digest}, expected {suite.sha256}")
    with tarfile.open(archive) as packed:
        packed.extractall(CACHE, filter="data")
    return root


def _download(suite: Suite) -> None:
    command = [
        sys.executable,
        *("-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"),
        *("--dest", str(CACHE), f"{suite.distribution}=={suite.version}"),
    ]
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=DOWNLOAD_TIMEOUT)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as failure:
        detail = getattr(failure, "stderr", b"") or b""
        raise SuiteFetchError(
            f"pip download {suite.distribution}=={suite.version}: {detail.decode()[-500:]}"
        ) from failure


def run_suite(
    root: Path, plugin: str, arguments: Sequence[str], env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run pytest on ``arguments`` in the unpacked suite ``root`` with our ``plugin`` (a
    module that swaps our class in), this process's environment plus ``env``; its output
    is captured, and its exit status left to the caller (the expected failures make it 1)."""
    command = [
        *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", plugin),
        *arguments,
    ]
    return subprocess.run(
        command,
        cwd=root,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
