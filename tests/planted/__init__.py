"""Planted shader bugs, owned by the tests: each is a patch of a shipped shader (its correct text,
found exactly once, and the buggy text that replaces it), in vulkan.patches and cuda.patches
beside this file. The product knows nothing of them: a test plants one by writing the patched
files into an overlay directory and pointing ``FLEETTUNE_KERNEL_SOURCES`` at it
(engine.backends.kernel_sources), which every compile path reads and every child process
inherits.

A patch file is a list of blocks::

    @@@ NAME vulkan/matmul_tiled.comp: what the bug does
    <the correct lines, as in shaders/>
    @@@ becomes
    <the buggy lines>
    @@@ end

A mutant NAME may hold several blocks, in several files (the same bug in a Vulkan and a CUDA
shader); they are applied in the order written. Lines outside blocks are ignored.
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.backends import kernel_sources

HERE = Path(__file__).resolve().parent
PATCH_FILES = ("vulkan.patches", "cuda.patches")
ENV = kernel_sources.ENV


@dataclass(frozen=True)
class Patch:
    name: str  # the mutant: DMMV_TAIL_ROWS
    path: str  # relative to shaders/: vulkan/matmul_decode.comp
    what: str
    correct: str  # whole lines, each ending in a newline
    buggy: str


def parse(text: str, origin: str = "") -> list[Patch]:
    """The blocks of one patch file (module doc)."""
    out: list[Patch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        head = lines[i]
        i += 1
        if not head.startswith("@@@ "):
            continue
        name, _, rest = head[4:].strip().partition(" ")
        path, _, what = rest.partition(":")
        parts: list[list[str]] = [[], []]
        for part, stop in ((0, "@@@ becomes\n"), (1, "@@@ end\n")):
            while i < len(lines) and lines[i] != stop:
                if lines[i].startswith("@@@ "):
                    raise ValueError(f"{origin}: {head.strip()}: no {stop.strip()!r}")
                parts[part].append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{origin}: {head.strip()}: no {stop.strip()!r}")
            i += 1
        out.append(Patch(name, path.strip(), what.strip(), "".join(parts[0]), "".join(parts[1])))
    return out


@functools.cache
def patches() -> dict[str, tuple[Patch, ...]]:
    """Every mutant's patches, by name."""
    by_name: dict[str, list[Patch]] = {}
    for fname in PATCH_FILES:
        for p in parse((HERE / fname).read_text(), fname):
            by_name.setdefault(p.name, []).append(p)
    return {k: tuple(v) for k, v in by_name.items()}


def apply(patch: Patch, text: str) -> str:
    """text with the patch applied; ValueError unless its correct text occurs exactly once."""
    n = text.count(patch.correct)
    if n != 1:
        raise ValueError(
            f"planted {patch.name}: its correct text occurs {n} times in {patch.path} (once "
            f"wanted): the shader changed; update tests/planted/*.patches\n{patch.correct}"
        )
    return text.replace(patch.correct, patch.buggy, 1)


def files(name: str) -> dict[str, str]:
    """The shipped shaders the mutant changes (path relative to shaders/), patched."""
    if name not in patches():
        raise KeyError(f"no planted mutant {name!r} in tests/planted/*.patches")
    out: dict[str, str] = {}
    for p in patches()[name]:
        text = out.get(p.path)
        if text is None:
            text = (kernel_sources.SHADERS / p.path).read_text()
        out[p.path] = apply(p, text)
    return out


def text(name: str, path: str) -> str:
    """shaders/<path> with the mutant's patches of it applied (unchanged where it has none)."""
    return files(name).get(path) or (kernel_sources.SHADERS / path).read_text()


def write_overlay(name: str, root: Path) -> Path:
    """The mutant's patched files under root, laid out as shaders/ (an overlay directory)."""
    for path, body in files(name).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(body)
    return root


@contextmanager
def planted(name: str) -> Iterator[Path]:
    """FLEETTUNE_KERNEL_SOURCES pointed at an overlay holding the mutant, for the body (this
    process and the processes it starts); the variable's old value restored after."""
    old = os.environ.get(ENV)
    with tempfile.TemporaryDirectory(prefix=f"planted-{name}-") as tmp:
        os.environ[ENV] = str(write_overlay(name, Path(tmp)))
        try:
            yield Path(tmp)
        finally:
            if old is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old
