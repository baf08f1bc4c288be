"""The planted shader bugs (tests/planted) and the overlay they are planted through
(FLEETTUNE_KERNEL_SOURCES, engine/backends/kernel_sources.py): every patch still applies to the
shipped shaders exactly once (a shader edit that breaks one fails here, in the fast tier, not in
a lavapipe or GPU suite); every mutant a test names has one and every patch is named by a test;
both source loaders read the overlay first and their caches key on what they read; the patched
Vulkan and CUDA sources compile (glslc, nvcc: no device needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.backends import kernel_sources
from engine.backends.cuda import kernels
from engine.backends.vulkan import spirv
from engine.tuning import TuningConfig
from tests import planted
from tests.mutants import MUTANTS

TESTS = Path(__file__).resolve().parents[2]
PATCHES = planted.patches()
CUDA_NAMES = sorted(n for n, ps in PATCHES.items() if any(p.path.startswith("cuda/") for p in ps))
VULKAN_NAMES = sorted(n for n, ps in PATCHES.items() if any(p.path[:7] == "vulkan/" for p in ps))


def test_every_patch_applies_exactly_once():
    """Each patch's correct text occurs exactly once in its shader (after the mutant's earlier
    patches of the same file), and the patched file is not the shipped one."""
    assert len(planted.patches()) >= 60
    for name, patches in planted.patches().items():
        for p in patches:
            assert (kernel_sources.SHADERS / p.path).is_file(), (name, p.path)
            assert p.correct != p.buggy and p.correct.endswith("\n"), (name, p.path)
        for path, text in planted.files(name).items():  # apply() raises unless once
            assert text != (kernel_sources.SHADERS / path).read_text(), (name, path)


def test_a_broken_patch_is_named():
    """A shader edit that removes a patch's correct text (or doubles it) fails with the
    mutant's name and a pointer to the patch files."""
    p = planted.patches()["KV_OFF_BY_ONE"][0]
    with pytest.raises(ValueError, match=r"KV_OFF_BY_ONE.*occurs 0 times.*tests/planted"):
        planted.apply(p, "void main() {}\n")
    with pytest.raises(ValueError, match="occurs 2 times"):
        planted.apply(p, p.correct * 2)
    with pytest.raises(ValueError, match="no '@@@ end'"):
        planted.parse("@@@ X vulkan/a.comp\nx\n@@@ becomes\ny\n")


def test_every_planted_name_has_a_patch_and_every_patch_a_test():
    shader_mutants = {m.name for m in MUTANTS if m.backend != "numpy"}
    assert shader_mutants <= set(planted.patches())
    text = "\n".join(p.read_text() for p in TESTS.rglob("*.py"))
    unused = [n for n in planted.patches() if f'"{n}"' not in text]
    assert not unused, f"patches no test plants: {unused}"


def test_the_overlay_is_read_first_and_keys_every_cache(tmp_path, monkeypatch):
    """Without the variable, the shipped sources and their keys; with an overlay, its files
    (an include too) in the CUDA source, the SPIR-V key and the reference-logits identity."""
    shipped_key = spirv.build_key("embedding", ("QTYPE_Q6_K",))
    shipped_cu = kernels.source("moe_dec.cu")
    assert kernel_sources.digest() == ""
    root = planted.write_overlay("Q6K_SCALE", tmp_path / "a")  # vulkan/dequant.glsl
    planted.write_overlay("MOE_DEC_WIDE_Q6_SCALE", root)  # cuda/qwide.cuh, moe_dec.cu's include
    monkeypatch.setenv(kernel_sources.ENV, str(root))
    assert kernel_sources.path("vulkan/dequant.glsl") == root / "vulkan" / "dequant.glsl"
    assert kernel_sources.path("vulkan/rope.comp") == kernel_sources.SHADERS / "vulkan/rope.comp"
    assert spirv.build_key("embedding", ("QTYPE_Q6_K",)) != shipped_key
    (bug,) = planted.patches()["MOE_DEC_WIDE_Q6_SCALE"]
    src = kernels.source("moe_dec.cu")
    assert bug.buggy in src and bug.buggy not in shipped_cu and src != shipped_cu
    digest = kernel_sources.digest()
    assert len(digest) == 24
    (root / "cuda" / "qwide.cuh").write_text("// edited\n")
    assert kernel_sources.digest() != digest
    monkeypatch.setenv(kernel_sources.ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="FLEETTUNE_KERNEL_SOURCES"):
        kernel_sources.path("vulkan/rope.comp")
    monkeypatch.delenv(kernel_sources.ENV)
    assert spirv.build_key("embedding", ("QTYPE_Q6_K",)) == shipped_key
    assert kernels.source("moe_dec.cu") == shipped_cu


def _preprocessed(shader: str, defines: tuple[str, ...]) -> str:
    """glslc -E of a build as the loader reads it (the overlay's files, includes too)."""
    with kernel_sources.directory("vulkan") as d:
        cmd = ["glslc", "-E", "-fshader-stage=compute", f"-I{d}", *(f"-D{x}" for x in defines)]
        r = subprocess.run([*cmd, str(d / f"{shader}.comp")], capture_output=True, text=True)
    return r.stdout.replace(str(d), "")


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc not installed")
@pytest.mark.parametrize("name", VULKAN_NAMES)
def test_planted_vulkan_sources_compile(name, tmp_path, monkeypatch):
    """A build the mutant changes (its key moves under the overlay and the planted code is
    compiled in: the preprocessed text moves too; its suite's candidate config's builds and the
    builds of fewest defines tried first) compiles from the overlay, an include included, to
    other SPIR-V than the shipped build, which the same cache keeps apart."""
    from engine.backends.vulkan.kernels import all_builds
    from engine.precompile import vulkan_builds
    from engine.tuning.variants.vulkan import QUANT_TYPES

    monkeypatch.setenv("FLEETTUNE_SPIRV_CACHE", str(tmp_path / "cache"))
    keys = {b: spirv.build_key(*b) for b in all_builds()}
    flat = next((m.candidate for m in MUTANTS if m.name == name and m.backend == "vulkan"), {})
    first = set(vulkan_builds(TuningConfig.default("vulkan").replace(**flat), QUANT_TYPES))
    src = str(planted.write_overlay(name, tmp_path / "src"))
    monkeypatch.setenv(kernel_sources.ENV, src)
    moved = [b for b in keys if spirv.build_key(*b) != keys[b]]
    moved.sort(key=lambda b: (b not in first, len(b[1]), b))
    assert moved, f"{name} changes no build"
    for build in moved:  # a build may hold the planted code under a define it lacks
        monkeypatch.setenv(kernel_sources.ENV, src)
        text = _preprocessed(*build)
        monkeypatch.delenv(kernel_sources.ENV)
        if text != _preprocessed(*build):
            break
    else:
        pytest.fail(f"{name}: no build compiles the planted code in")
    monkeypatch.setenv(kernel_sources.ENV, src)
    bad = spirv.compile_spirv(*build)
    monkeypatch.delenv(kernel_sources.ENV)
    assert not spirv.cached(*build)
    assert spirv.compile_spirv(*build) != bad


NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)


def _cuda_builds(name: str) -> list[tuple[str, dict[str, int]]]:
    """(file, defines) of each module the mutant changes: its suite's candidate config where it
    has one (the planted code is then compiled in), else the default config's build, else the
    first registered build of the file (tests/engine/backends/cuda/test_cuda_compile.py)."""
    from tests.engine.backends.cuda.test_cuda_compile import builds

    shipped = {p.name: kernels.source(p.name) for p in kernels.SHADERS.glob("*.cu")}
    with planted.planted(name):
        changed = sorted(f for f in shipped if kernels.source(f) != shipped[f])
    flat = next((m.candidate for m in MUTANTS if m.name == name and m.backend == "cuda"), {})
    chosen = {}
    for cfg in (TuningConfig.default("cuda").replace(**flat), TuningConfig.default("cuda")):
        for fname, defines in kernels.modules_for(cfg).values():
            chosen.setdefault(fname, dict(defines))
    every = builds()
    return [(f, chosen[f] if f in chosen else dict(sorted(every[f])[0][1])) for f in changed]


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed here")
@pytest.mark.parametrize("name", CUDA_NAMES)
def test_planted_cuda_sources_compile(name, tmp_path):
    """The mutant's patched modules compile with nvcc (-cubin: ptxas too), as NVRTC would get
    them (kernels.source under the overlay)."""
    from tests.engine.backends.cuda.test_cuda_compile import compile_one

    todo = _cuda_builds(name)
    assert todo, f"{name} changes no CUDA module"
    errors = []
    with planted.planted(name):
        for fname, defines in todo:
            src = tmp_path / fname
            src.write_text(kernels.source(fname))
            errors.append(compile_one((fname, tuple(sorted(defines.items()))), src))
    assert not any(errors), "\n\n".join(e for e in errors if e)


def test_planted_sets_and_restores_the_variable(monkeypatch):
    """planted() points the variable at the mutant's overlay for its body, then restores it."""
    rel = "vulkan/matmul_tiled.comp"
    monkeypatch.setenv(kernel_sources.ENV, "/previous")
    with planted.planted("TILED_NO_BARRIER") as root:
        assert os.environ[kernel_sources.ENV] == str(root)
        assert kernel_sources.read_text(rel) == planted.files("TILED_NO_BARRIER")[rel]
        assert kernel_sources.read_text(rel) != (kernel_sources.SHADERS / rel).read_text()
    assert os.environ[kernel_sources.ENV] == "/previous"
