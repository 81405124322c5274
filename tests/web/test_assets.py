"""router.web.assets: the pinned npm tarballs checked against their integrity, only the
named files extracted, nothing fetched twice, one line when the registry is unreachable."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from router.errors import AssetFetchError
from router.web import assets
from router.web.assets import Package


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


DATA = tarball({"package/dist/a.js": b"alpha", "package/dist/b.css": b"beta", "package/x": b"x"})
PACKAGE = Package(
    "demo", "1.2.3", integrity(DATA), {"package/dist/a.js": "a.js", "package/dist/b.css": "b.css"}
)


class Registry:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked: list[str] = []

    def __call__(self, url: str, timeout: float) -> bytes:
        self.asked.append(url)
        return self.data


def test_the_named_files_are_extracted_once(tmp_path: Path) -> None:
    registry = Registry(DATA)
    assert assets.fetch(tmp_path, [PACKAGE], get=registry) == ["demo@1.2.3"]
    assert registry.asked == ["https://registry.npmjs.org/demo/-/demo-1.2.3.tgz"]
    assert (tmp_path / "a.js").read_bytes() == b"alpha"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.js", "b.css", "manifest.json"]
    assert json.loads((tmp_path / "manifest.json").read_text())["a.js"]["package"] == "demo@1.2.3"
    assert assets.fetch(tmp_path, [PACKAGE], get=registry) == []
    assert len(registry.asked) == 1
    assert assets.missing(tmp_path, [PACKAGE]) == []


def test_a_changed_file_or_a_new_pin_is_fetched_again(tmp_path: Path) -> None:
    registry = Registry(DATA)
    assets.fetch(tmp_path, [PACKAGE], get=registry)
    (tmp_path / "a.js").write_bytes(b"tampered")
    assert assets.fetch(tmp_path, [PACKAGE], get=registry) == ["demo@1.2.3"]
    assert (tmp_path / "a.js").read_bytes() == b"alpha"


def test_a_tarball_failing_its_integrity_writes_nothing(tmp_path: Path) -> None:
    bad = Registry(tarball({"package/dist/a.js": b"evil", "package/dist/b.css": b"beta"}))
    with pytest.raises(AssetFetchError, match="integrity mismatch"):
        assets.fetch(tmp_path, [PACKAGE], get=bad)
    assert assets.missing(tmp_path, [PACKAGE]) == ["a.js", "b.css"]


def test_a_file_missing_from_the_tarball_is_an_error(tmp_path: Path) -> None:
    data = tarball({"package/dist/a.js": b"alpha"})
    package = Package("demo", "1.2.3", integrity(data), PACKAGE.files)
    with pytest.raises(AssetFetchError, match=r"no package/dist/b\.css"):
        assets.fetch(tmp_path, [package], get=Registry(data))


@pytest.mark.parametrize("bad", ["sha1-AAAA", "sha512-notbase64!", "sha512-" + "A" * 20])
def test_a_pin_checks_its_integrity_string(bad: str) -> None:
    with pytest.raises(AssetFetchError):
        Package("demo", "1", bad, {"package/a.js": "a.js"})


def test_the_pins_are_sha512_and_flat() -> None:
    assert [p.pin for p in assets.PACKAGES] == ["alpinejs@3.17.5", "uplot@1.6.32"]
    assert assets.vendor_names() == ["alpine.min.js", "uPlot.iife.min.js", "uPlot.min.css"]


def test_an_unreachable_registry_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = assets.main(["--registry", "http://127.0.0.1:9", "--vendor", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 1
    assert err.startswith("web assets: cannot reach http://127.0.0.1:9: ")
    assert err.count("\n") == 1
