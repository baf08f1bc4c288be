"""Where kernel sources are read from: shaders/, or an overlay directory on top of it.

``FLEETTUNE_KERNEL_SOURCES=<dir>`` names a directory laid out like shaders/ (``<dir>/vulkan/
rms_norm.comp``, ``<dir>/cuda/mmvw.cu``, ...). A file present there is read instead of the
shipped one; every other file comes from shaders/. It is a kernel developer's way to try an
edited shader without touching the checkout or reinstalling, and how the tests plant their bugs
(tests/planted). Both source loaders read through here (the Vulkan one, engine.backends.vulkan.
spirv, and the CUDA one, engine.backends.cuda.kernels), and so does engine.precompile through
them. Their compile caches key on the content of what was read, so a build from an overlay never
meets a cache entry of the shipped sources, nor the other way round. A child process (a Ray worker,
a precompile pool) inherits the variable and reads the same sources.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "FLEETTUNE_KERNEL_SOURCES"
SHADERS = Path(__file__).resolve().parents[2] / "shaders"


def overlay() -> Path | None:
    """The overlay directory, or None when the variable is unset or empty."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    root = Path(value)
    if not root.is_dir():
        raise FileNotFoundError(f"{ENV}={value}: not a directory")
    return root


def path(rel: str) -> Path:
    """The file a loader reads for shaders/<rel>: the overlay's when it has one."""
    root = overlay()
    if root is not None and (root / rel).is_file():
        return root / rel
    return SHADERS / rel


def read_text(rel: str) -> str:
    return path(rel).read_text()


def read_bytes(rel: str) -> bytes:
    return path(rel).read_bytes()


def names(sub: str, pattern: str) -> list[str]:
    """File names matching pattern in shaders/<sub> and the overlay's <sub>, sorted, once each."""
    found = {p.name for p in (SHADERS / sub).glob(pattern)}
    root = overlay()
    if root is not None:
        found |= {p.name for p in (root / sub).glob(pattern) if p.is_file()}
    return sorted(found)


def overlaid(sub: str) -> list[str]:
    """Names of the overlay's files in <sub> (none without an overlay)."""
    root = overlay()
    if root is None or not (root / sub).is_dir():
        return []
    return sorted(p.name for p in (root / sub).iterdir() if p.is_file())


@contextmanager
def directory(sub: str) -> Iterator[Path]:
    """A directory holding what <sub> reads as: shaders/<sub> itself when the overlay holds
    nothing there, else a temporary merge of the two (for a compiler that resolves #include
    next to the including file, like glslc)."""
    mine = overlaid(sub)
    if not mine:
        yield SHADERS / sub
        return
    root = overlay()
    assert root is not None
    with tempfile.TemporaryDirectory(prefix="fleettune-src-") as tmp:
        merged = Path(tmp)
        for p in (SHADERS / sub).iterdir():
            if p.is_file():
                shutil.copyfile(p, merged / p.name)
        for name in mine:
            shutil.copyfile(root / sub / name, merged / name)
        yield merged


def digest() -> str:
    """A hash of the overlay's files (names and content), "" without an overlay: part of any
    identity that outlives a process (a reference-logits cache) where a compile key does not
    reach."""
    root = overlay()
    if root is None:
        return ""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:24]
