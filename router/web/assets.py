"""The dashboard's JavaScript libraries, fetched by the build and never kept in the repository.

``python -m router.web.assets`` (``make web-assets``) downloads each pinned npm tarball from
the registry, checks it against the ``dist.integrity`` digest the registry published for that
version (written into :data:`PACKAGES` once, by hand), and extracts only the files the
dashboard loads, under flat names, into ``router/web/static/vendor/``::

    alpinejs 3.17.5  package/dist/cdn.min.js         -> vendor/alpine.min.js
    uplot    1.6.32  package/dist/uPlot.iife.min.js  -> vendor/uPlot.iife.min.js
                     package/dist/uPlot.min.css      -> vendor/uPlot.min.css

``vendor/manifest.json`` records, for each file, the package it came from and the SHA-256
of what was written: a second run finds every file as recorded and downloads nothing. A
new pin (another version) fetches that package again. Only the standard library is used,
so the module runs before anything else is installed; the proxy variables of urllib apply.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from router.errors import AssetFetchError

VENDOR: Final = Path(__file__).resolve().parent / "static" / "vendor"
REGISTRY: Final = "https://registry.npmjs.org"
MANIFEST_NAME: Final = "manifest.json"
TIMEOUT: Final = 30.0

Download = Callable[[str, float], bytes]


@dataclass(frozen=True)
class Package:
    """One pinned npm package: ``integrity`` is the registry's ``dist.integrity`` of that
    version (``sha512-`` and the base64 digest of the tarball), ``files`` maps a path inside
    the tarball to the flat name it gets in the vendor folder."""

    name: str
    version: str
    integrity: str
    files: Mapping[str, str]

    def __post_init__(self) -> None:
        algorithm, _, digest = self.integrity.partition("-")
        try:
            size = len(base64.b64decode(digest, validate=True))
        except binascii.Error:
            size = 0
        if algorithm != "sha512" or size != 64:
            raise AssetFetchError(
                f"{self.name}: integrity must be a sha512 digest, not {algorithm}"
            )
        if any("/" in flat or flat == MANIFEST_NAME for flat in self.files.values()):
            raise AssetFetchError(f"{self.name}: vendor names are flat and not {MANIFEST_NAME}")

    @property
    def pin(self) -> str:
        return f"{self.name}@{self.version}"

    def tarball(self, registry: str = REGISTRY) -> str:
        """The tarball's URL, as the registry names it (``<pkg>/-/<pkg>-<version>.tgz``)."""
        return f"{registry.rstrip('/')}/{self.name}/-/{self.name}-{self.version}.tgz"


PACKAGES: Final = (
    Package(
        "alpinejs",
        "3.17.5",
        "sha512-XewMqRC6zjy8iaUPn86dxjvooAsNai3hUtQbdn0A5H2w7Jt10xHGZ1SczN5+Dvp3UKkuSEt9moy/UaUWOwKdnQ==",
        {"package/dist/cdn.min.js": "alpine.min.js"},
    ),
    Package(
        "uplot",
        "1.6.32",
        "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==",
        {
            "package/dist/uPlot.iife.min.js": "uPlot.iife.min.js",
            "package/dist/uPlot.min.css": "uPlot.min.css",
        },
    ),
)


def vendor_names(packages: Sequence[Package] = PACKAGES) -> list[str]:
    """Every file the vendor folder should hold, in the order of the pins."""
    return [flat for package in packages for flat in package.files.values()]


def missing(vendor: Path = VENDOR, packages: Sequence[Package] = PACKAGES) -> list[str]:
    """The vendor files not there (absent or empty), e.g. ``["alpine.min.js"]``; ``[]`` when
    the dashboard has all it loads. Contents are not checked here (see :func:`fetch`)."""
    return [
        flat
        for flat in vendor_names(packages)
        if not (vendor / flat).is_file() or (vendor / flat).stat().st_size == 0
    ]


def check_integrity(data: bytes, integrity: str, what: str) -> None:
    """Return if ``data`` has the sha512 digest ``integrity``; ``ValueError`` naming ``what``
    otherwise (a tampered or truncated download: nothing of it is written)."""
    expected = integrity.partition("-")[2]
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")
    if actual != expected:
        raise AssetFetchError(
            f"{what}: integrity mismatch (expected sha512-{expected}, got {actual})"
        )


def extract(data: bytes, package: Package) -> dict[str, bytes]:
    """The named files of a verified tarball, by flat name; ``ValueError`` if one is absent
    or is not a regular file (nothing else of the tarball is read)."""
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for inner, flat in package.files.items():
            try:
                member = archive.getmember(inner)
            except KeyError:
                raise AssetFetchError(f"{package.pin}: no {inner} in the tarball") from None
            stream = archive.extractfile(member) if member.isfile() else None
            if stream is None:
                raise AssetFetchError(f"{package.pin}: {inner} is not a regular file")
            found[flat] = stream.read()
    return found


def download(url: str, timeout: float) -> bytes:
    """The body at ``url``; ``OSError`` (``urllib.error.URLError`` included) on failure."""
    request = urllib.request.Request(url, headers={"User-Agent": "router-web-assets"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        body: bytes = answer.read()
        return body


def read_manifest(vendor: Path) -> dict[str, dict[str, str]]:
    """``{flat name: {"package": pin, "sha256": hex}}``; empty when absent or unreadable."""
    try:
        recorded = json.loads((vendor / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def is_current(vendor: Path, package: Package, manifest: Mapping[str, Mapping[str, str]]) -> bool:
    """True if every file of ``package`` is on disk as the manifest recorded it for this pin."""
    for flat in package.files.values():
        entry = manifest.get(flat, {})
        path = vendor / flat
        if entry.get("package") != package.pin or not path.is_file():
            return False
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry.get("sha256"):
            return False
    return True


def _write(path: Path, data: bytes) -> None:
    """Write through a temporary file and a rename, so a reader never sees half a file."""
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    os.replace(partial, path)


def fetch(
    vendor: Path = VENDOR,
    packages: Sequence[Package] = PACKAGES,
    *,
    registry: str = REGISTRY,
    get: Download = download,
    timeout: float = TIMEOUT,
) -> list[str]:
    """Bring the vendor folder up to the pins; return the pins downloaded (``[]`` when all
    were current). Raises ``OSError`` when the registry cannot be reached or a file cannot be
    written, ``ValueError`` when a tarball fails its integrity check or lacks a file; the
    packages fetched before the failure stay written and recorded."""
    vendor.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(vendor)
    fetched = []
    for package in packages:
        if is_current(vendor, package, manifest):
            continue
        url = package.tarball(registry)
        data = get(url, timeout)
        check_integrity(data, package.integrity, url)
        for flat, content in extract(data, package).items():
            _write(vendor / flat, content)
            manifest[flat] = {"package": package.pin, "sha256": hashlib.sha256(content).hexdigest()}
        _write(vendor / MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())
        fetched.append(package.pin)
    return fetched


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 when the vendor folder is complete, 1 with one line on stderr when not."""
    parser = argparse.ArgumentParser(
        prog="python -m router.web.assets",
        description="Fetch the dashboard's pinned JavaScript libraries into static/vendor/.",
    )
    parser.add_argument("--registry", default=REGISTRY, help="npm registry (default: %(default)s)")
    parser.add_argument("--vendor", type=Path, default=VENDOR, help="target folder")
    args = parser.parse_args(argv)
    try:
        fetched = fetch(args.vendor, registry=args.registry)
    except urllib.error.HTTPError as error:
        print(f"web assets: {error.url}: HTTP {error.code} {error.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, TimeoutError) as error:
        reason = getattr(error, "reason", None) or error
        print(f"web assets: cannot reach {args.registry}: {reason}", file=sys.stderr)
        return 1
    except (OSError, ValueError, tarfile.TarError) as error:
        print(f"web assets: {error}", file=sys.stderr)
        return 1
    if fetched:
        print(f"web assets: fetched {', '.join(fetched)} into {args.vendor}")
    else:
        print(f"web assets: {args.vendor} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
