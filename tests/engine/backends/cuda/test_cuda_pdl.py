"""Programmatic dependent launch (engine/backends/cuda/pdl.py, knob matmul_decode.pdl): the ctypes
structures match cuda.h, arguments are marshalled with CuPy's widths, the knob needs sm_90; on a
GPU (`-m gpu`, its own process under tools/gpu_suite.py: a wrong launch can crash it) the
decode with PDL equals the decode without, eager and replayed."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.backends.base import DeviceInfo
from engine.backends.cuda.pdl import _Attr, _Config, kernel_params
from engine.tuning import TuningConfig

CUDA_H = Path("/usr/local/cuda/include/cuda.h")
LAYOUT_C = r"""
#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
int main(void) {
    printf("%zu %zu %zu %zu %zu %zu %d\n", sizeof(CUlaunchAttribute),
           offsetof(CUlaunchAttribute, value), sizeof(CUlaunchConfig),
           offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),
           offsetof(CUlaunchConfig, numAttrs),
           (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
"""


@pytest.mark.skipif(
    shutil.which("gcc") is None or not CUDA_H.exists(), reason="gcc or cuda.h not here"
)
def test_structures_match_cuda_h(tmp_path):
    src = tmp_path / "layout.c"
    src.write_text(LAYOUT_C)
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{CUDA_H.parent}", str(src), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]  # fmt: skip
    want = [
        ctypes.sizeof(_Attr), _Attr.value.offset, ctypes.sizeof(_Config), _Config.stream.offset,
        _Config.attrs.offset, _Config.nattrs.offset, 6,
    ]  # fmt: skip
    assert got == want


def test_kernel_params_use_each_arguments_width():
    class Mem:
        ptr = 0xABCDEF0

    class Arr:
        data = Mem()

    args = (Arr(), np.int32(-5), np.int64(1 << 40), np.float32(1.5), np.uint64(0), np.uint32(7))
    ptrs, keep = kernel_params(args)
    sizes = [ctypes.sizeof(v) for v in keep]
    assert sizes == [8, 4, 8, 4, 8, 4]
    assert ctypes.cast(ptrs[0], ctypes.POINTER(ctypes.c_void_p))[0] == 0xABCDEF0
    assert ctypes.cast(ptrs[1], ctypes.POINTER(ctypes.c_int32))[0] == -5
    assert ctypes.cast(ptrs[2], ctypes.POINTER(ctypes.c_int64))[0] == 1 << 40
    assert ctypes.cast(ptrs[3], ctypes.POINTER(ctypes.c_float))[0] == 1.5
    with pytest.raises(TypeError, match="argument of type int"):
        kernel_params((3,))
    with pytest.raises(TypeError):
        kernel_params((np.float64(1.0),))  # CuPy would pass 8 bytes: no kernel here takes one


@pytest.mark.parametrize("dec", ["mmvw", "mmvf"])
def test_pdl_needs_sm90(dec):
    cfg = TuningConfig.from_flat("cuda", {"matmul_decode.variant": dec, "matmul_decode.pdl": 1})
    a100 = DeviceInfo("cuda", "NVIDIA A100", "nvidia", "a100", extra={"cc": 80})
    h200 = DeviceInfo("cuda", "NVIDIA H200", "nvidia", "h200", extra={"cc": 90})
    assert any("9.0" in p for p in cfg.problems(a100))
    assert cfg.problems(h200) == []


# --- on a GPU ---------------------------------------------------------------------------------
PDL = {
    "matmul_decode.variant": "mmvw",
    "rope.fuse_kv": 1,
    "attention_decode.variant": "split_kw",
    "argmax.variant": "multi",
}


@pytest.fixture(scope="module")
def be():
    pytest.importorskip("cupy", reason="CuPy is not installed")
    from engine import backends
    from engine.errors import BackendUnavailable

    try:
        b = backends.create("cuda")
    except BackendUnavailable as e:
        pytest.skip(f"cuda backend not usable here: {e}")
    if b.device_info().extra["cc"] < 90:
        pytest.skip("programmatic dependent launch needs sm_90")
    return b


def assert_pdl_changes_no_bit(be, m, flat: dict, prompt: list[int], n: int) -> dict:  # noqa: ANN001
    """m's greedy decode of n tokens under flat with matmul_decode.pdl 0 and 1, each eager and
    replayed: the tokens and every step's logits to the bit. Returns the runs, keyed
    (pdl, graphs)."""
    runs = {}
    for pdl in (0, 1):
        be.set_config(TuningConfig.from_flat("cuda", flat | {"matmul_decode.pdl": pdl}))
        assert (be._pdl is not None) == bool(pdl)
        for graphs in (False, True):
            be.use_graphs = graphs
            runs[pdl, graphs] = m.generate(prompt, n, keep_logits=True)
    be.use_graphs = True
    base = runs[0, True]
    for key, g in runs.items():
        assert g.tokens == base.tokens, key
        for a, b in zip(g.step_logits, base.step_logits, strict=True):
            assert np.array_equal(a, b), f"{key}: PDL changed a result"
    return runs


# mmvw's fused epilogues with the weights' L2 prefetch before each kernel's wait (issue 14)
FUSED = {
    f"matmul_decode.{k}": 1 for k in ("fuse_swiglu", "fuse_norm", "fuse_rope", "prefetch", "stage")
}


GQA = {"attention_decode.variant": "gqa"}  # its first tile's cache rows read before the wait


@pytest.mark.gpu
@pytest.mark.parametrize("extra", [{}, FUSED, GQA], ids=["mmvw_all", "fused_prefetch", "gqa"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_pdl_decode_equals_plain_launches(be, tiny_model_factory, arch, extra):
    from tests.engine.backends.cuda.test_cuda_ops import PROMPT, _model

    m = _model(tiny_model_factory(arch, "q4_k_m"), be)
    runs = assert_pdl_changes_no_bit(be, m, PDL | extra, PROMPT, 10)
    for key, g in runs.items():
        assert np.array_equal(g.last_logits, runs[0, True].last_logits), key
    be.set_config(TuningConfig.default("cuda"))


@pytest.mark.gpu
def test_pdl_validate_passes(be, tiny_model_path):
    from engine.verify.validate import Tolerances, validate
    from tests.engine.backends.cuda.test_cuda_ops import PROMPT, _model

    be.set_config(TuningConfig.default("cuda"))
    m = _model(tiny_model_path, be)
    cand = TuningConfig.from_flat("cuda", PDL | {"matmul_decode.pdl": 1})
    ref = TuningConfig.from_flat("cuda", {"matmul_decode.variant": "mmvq"})
    rep = validate(m, cand, [PROMPT, PROMPT[:1]], steps=6,
                   tol=Tolerances(max_abs_diff=0.2, nmse=1e-3), reference=ref)  # fmt: skip
    assert rep.passed, [p.reasons for p in rep.prompts]
    be.set_config(TuningConfig.default("cuda"))


# the float decode (matmul_decode.mmvf) with its PDL-launched neighbours (dec15): rms_norm.block,
# rope_kv, attention_decode.gqa (its first tile read before the wait), swiglu, argmax.multi
FLOAT_PDL = {
    "rms_norm.variant": "block",
    "rope.fuse_kv": 1,
    "attention_decode.variant": "gqa",
    "argmax.variant": "multi",
}


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_float_pdl_decode_equals_plain_launches(be, tiny_model_factory, arch):
    from tests.engine.backends.cuda.test_cuda_ops import PROMPT, _model

    m = _model(tiny_model_factory(arch, "q4_k_m"), be)
    assert_pdl_changes_no_bit(be, m, FLOAT_PDL, PROMPT, 10)
    be.set_config(TuningConfig.default("cuda"))
