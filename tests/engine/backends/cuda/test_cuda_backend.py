"""CUDA backend pieces that need no GPU: registry declarations, device naming, kernel sources
(headers, kernel names, and an nvcc compile where nvcc exists), and the clear error when CuPy or
a GPU is missing. The GPU tests are tests/engine/backends/cuda/test_cuda_ops.py (`pytest -m
gpu`)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from engine.backends.cuda import kernels
from engine.backends.cuda.device import device_class
from engine.tuning import REGISTRY, TuningConfig
from engine.tuning.variants.cuda import ALL_TYPES

CU_FILES = [
    "dmmv.cu", "dequant.cu", "elementwise.cu", "attention.cu", "mmq.cu", "mmvw.cu",
    "decode_fused.cu",
]  # fmt: skip


@pytest.mark.parametrize(
    "name,slug",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 5090", "rtx5090"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
        ("NVIDIA L40S", "l40s"),
    ],
)
def test_device_class(name, slug):
    assert device_class(name) == slug


def test_registry_declares_exact_quant_types():
    assert ALL_TYPES == {"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
    for op in ("matmul_decode", "matmul_batched", "matmul_prefill", "embedding"):
        for q in ALL_TYPES:
            assert REGISTRY.supports("cuda", op, q), (op, q)
        for q in ("Q5_1", "Q5_K"):
            assert not REGISTRY.supports("cuda", op, q), (op, q)


def test_every_variant_default_config_is_allowed():
    """Each variant with its defaults builds a config that passes its constraints on an sm_90."""
    from engine.backends.base import DeviceInfo

    dev = DeviceInfo("cuda", "NVIDIA H200", "nvidia", "h200", extra={"cc": 90, "sms": 132})
    for op in REGISTRY.ops("cuda"):
        for v in op.variants:
            c = TuningConfig.from_flat("cuda", {f"{op.name}.variant": v.name})
            assert c.problems(dev) == [], (op.name, v.name)
            for p in v.params:
                assert p.default in p.choices


def test_mmq_needs_ampere():
    from engine.backends.base import DeviceInfo

    old = DeviceInfo("cuda", "Tesla T4", "nvidia", "t4", extra={"cc": 75})
    c = TuningConfig.from_flat("cuda", {"matmul_prefill.variant": "mmq"})
    assert any("compute capability" in p for p in c.problems(old))


@pytest.mark.parametrize(
    ("variant", "knob", "value"), [("mmvf", "pdl", 1), ("mmvw", "pdl", 1), ("mmvw", "stream", 3)]
)
def test_decode_launch_features_need_hopper(variant, knob, value):
    """PDL and mmvw_stream's bulk copies are sm_90 features: refused on an A100, allowed on an
    H200, and the knob left at 0 asks nothing of the device."""
    from engine.backends.base import DeviceInfo

    a100 = DeviceInfo("cuda", "A100", "nvidia", "a100", extra={"cc": 80})
    h200 = DeviceInfo("cuda", "H200", "nvidia", "h200", extra={"cc": 90})
    flat = {"matmul_decode.variant": variant}
    on = TuningConfig.from_flat("cuda", flat | {f"matmul_decode.{knob}": value})
    assert any(f"matmul_decode.{knob} != 0 needs compute capability >= 9.0" in p
               for p in on.problems(a100))  # fmt: skip
    assert on.problems(h200) == []
    assert TuningConfig.from_flat("cuda", flat).problems(a100) == []


def test_registry_module_imports_no_cupy():
    code = (
        "import sys; import engine.tuning.variants.cuda, engine.backends.cuda; "
        "print('cupy' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("fname", CU_FILES)
def test_sources_have_headers_and_registered_kernels(fname):
    src = kernels.source(fname)
    head = (kernels.SHADERS / fname).read_text().splitlines()[0]
    assert head.startswith(f"// {fname}:"), "each .cu starts with a header naming itself"
    text = (kernels.SHADERS / fname).read_text()
    assert "Variants" in text and "Tunables" in text
    assert kernels.kernel_names(src), "no kernels found"
    assert '#include "' not in src, "includes are inlined"
    used = {v.source for op in REGISTRY.ops("cuda") for v in op.variants}
    assert f"cuda/{fname}" in used


def _builds() -> list:
    """(module key, file, defines) of the default config and of each matmul variant: what the
    backend compiles (kernels.modules_for), so tunables come from the registry."""
    seen, out = set(), []
    for flat in (
        {},
        {"matmul_decode.variant": "mmvq", "matmul_prefill.variant": "mmq8"},
        {"matmul_batched.variant": "dmmv_serial", "matmul_prefill.variant": "mmq"},
    ):
        for key, (fname, defines) in kernels.modules_for(
            TuningConfig.from_flat("cuda", flat)
        ).items():
            ident = (fname, tuple(sorted(defines.items())))
            if ident not in seen:
                seen.add(ident)
                out.append(pytest.param(fname, defines, id=f"{key}-{fname}"))
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed here")
@pytest.mark.parametrize("fname,defines", _builds())
def test_sources_compile_for_sm80_and_sm90(tmp_path, fname, defines):
    src = tmp_path / fname
    src.write_text(kernels.source(fname))
    for arch in ("sm_80", "sm_90"):
        r = subprocess.run(
            [
                "nvcc",
                f"-arch={arch}",
                "-std=c++17",
                *(f"-D{k}={v}" for k, v in defines.items()),
                "-cubin",
                "-o",
                str(tmp_path / "k.cubin"),
                str(src),
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed")
def test_missing_cupy_is_backend_unavailable():
    from engine import backends
    from engine.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="CuPy is not installed"):
        backends.create("cuda")
