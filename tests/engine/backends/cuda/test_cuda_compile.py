"""Every CUDA module compiles, without a GPU: each file in shaders/cuda with the defines of every
registered variant at its defaults and at each numeric knob's extremes (the other knobs moved
as little as the registry's constraints need), built as kernels.modules_for builds them, the
includes expanded by kernels.source. nvcc -cubin runs ptxas too, so inline-PTX and resource
errors fail here, not on the device. Compiles run in parallel (about a second each)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine.backends.base import DeviceInfo
from engine.backends.cuda import kernels
from engine.tuning import REGISTRY, TuningConfig
from engine.tuning.registry import DEFINE

NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
)
H200 = DeviceInfo(
    "cuda",
    "NVIDIA H200",
    "nvidia",
    "h200",
    extra={
        "cc": 90,
        "sms": 132,
        "smem_per_block": 49152,
        "smem_per_block_optin": 232448,
        "smem_per_sm": 233472,
        "l2_bytes": 62914560,
    },
)
Build = tuple[str, tuple[tuple[str, int], ...]]


def _fit(op: str, variant, knob, value) -> dict | None:  # noqa: ANN001 - registry types
    """A flat config with op's variant, knob at value and the registry's constraints met: the
    other define-bound knobs at their defaults, else the first allowed combination."""
    base = {f"{op}.variant": variant.name, f"{op}.{knob.name}": value}
    others = [p for p in variant.bound(DEFINE) if p.name != knob.name]
    combos = itertools.chain(
        [tuple(p.default for p in others)], itertools.product(*(p.choices for p in others))
    )
    for combo in combos:
        flat = {**base, **{f"{op}.{p.name}": v for p, v in zip(others, combo, strict=True)}}
        if not TuningConfig.from_flat("cuda", flat).problems(H200):
            return flat
    return None


def configs() -> list[dict]:
    """Flat configs: the defaults; each variant at its defaults; each numeric define-bound knob
    at its smallest and largest value."""
    out: list[dict] = [{}]
    for op in REGISTRY.ops("cuda"):
        for v in op.variants:
            out.append({f"{op.name}.variant": v.name})
            for p in v.bound(DEFINE):
                values = (min(p.choices), max(p.choices)) if p.is_numeric else p.choices
                for value in values:
                    flat = _fit(op.name, v, p, value)
                    if flat is not None:
                        out.append(flat)
    # dn_clu.cu's defines come from host knobs (delta_net.step_cluster, step_lanes) and the
    # scan's max_dk / state_transposed: every value, the extremes of max_dk
    for n, lanes in itertools.product((1, 2, 4), (8, 16, 32)):
        out.append({"delta_net.step_cluster": n, "delta_net.step_lanes": lanes})
    for mdk, t in itertools.product((64, 256), (False, True)):
        out.append({"delta_net.step_cluster": 4, "delta_net.max_dk": mdk,
                    "delta_net.state_transposed": t})  # fmt: skip
    return out


def builds() -> dict[str, list[Build]]:
    """.cu file -> the distinct define sets the backend can build it with; every file in
    shaders/cuda appears (one no variant names is built with no defines)."""
    out: dict[str, set[Build]] = {p.name: set() for p in kernels.SHADERS.glob("*.cu")}
    for flat in configs():
        cfg = TuningConfig.from_flat("cuda", flat)
        for fname, defines in kernels.modules_for(cfg).values():
            out.setdefault(fname, set()).add((fname, tuple(sorted(defines.items()))))
    for fname, seen in out.items():
        if not seen:
            seen.add((fname, ()))
    return {f: sorted(b) for f, b in sorted(out.items())}


def compile_one(build: Build, src: Path, arch: str = "sm_90") -> str | None:
    """nvcc's error text for one build, None when it compiles."""
    fname, defines = build
    cmd = [NVCC, f"-arch={arch}", "-std=c++17", "-cubin", "-o", os.devnull]
    cmd += [f"-D{k}={v}" for k, v in defines] + [str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return f"{fname} {dict(defines)}:\n{r.stderr.strip()[-3000:]}"


def test_builds_cover_every_file_and_knob_extreme():
    b = builds()
    assert set(b) >= {p.name for p in kernels.SHADERS.glob("*.cu")}
    for op in REGISTRY.ops("cuda"):
        for v in op.variants:
            for p in v.bound(DEFINE):
                for build in (f for f in v.builds() if v.reaches(p, f)):  # every file it shapes
                    fname, macro = Path(build).name, str(p.binding.target)
                    got = {dict(d).get(macro) for _, d in b[fname]}
                    want = {int(min(p.choices)), int(max(p.choices))} if p.is_numeric else set()
                    if kernels._BUILT_WHEN.get(fname) == macro:
                        want.discard(0)  # 0: the file is not built
                    assert want <= got, (op.name, v.name, p.name, fname, want, got)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed here")
@pytest.mark.parametrize("fname", sorted(p.name for p in kernels.SHADERS.glob("*.cu")))
def test_module_compiles_with_every_registered_build(fname):
    todo = builds()[fname]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / fname
        src.write_text(kernels.source(fname))
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            errors = [e for e in pool.map(lambda b: compile_one(b, src), todo) if e]
    assert not errors, f"{len(errors)} of {len(todo)} builds failed:\n" + "\n\n".join(errors)
