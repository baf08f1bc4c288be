"""attention.flash: prefill flash attention on cooperative matrices, 64 queries a workgroup
(shaders/vulkan/attention_flash.comp), the split kernel at decode.

Host tests (no device): the pass builds with the pinned glslang and spirv-val accepts it; the
registry admits the variant only with cooperative matrices and 44 KiB of shared memory; on
lavapipe (CI) set_config refuses it and the backend stays usable. GPU tests (marked gpu; the
H200 through NVIDIA's Vulkan) check the op against float64 NumPy on ragged shapes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.backends.vulkan import spirv
from engine.backends.vulkan.kernels import all_builds, programs
from engine.errors import ConfigError
from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_coopmat import h200_like
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    allowed_config,
    coopmat_fixture,
    make_backend,
    nmse,
    require_vulkan,
)
from tests.op_cases import attention_ref

FLASH = {"attention.variant": "flash"}


def test_flash_pass_builds_with_glslang_and_validates(tmp_path):
    builds = [b for b in all_builds() if b[0] == "attention_flash"]
    assert sorted(d for _, d in builds) == [
        (), ("KEY_SPLIT",), ("MATRIX_SCALE",), ("MATRIX_SCALE", "KEY_SPLIT")
    ]  # fmt: skip
    # matrix_scale reaches the flash pass only (the split passes keep their builds)
    cfg = TuningConfig.default("vulkan").replace(**FLASH, **{"attention.matrix_scale": True})
    progs = programs("attention", cfg.op("attention"))
    assert [p.defines for p in progs if p.shader == "attention_flash"] == [
        ("MATRIX_SCALE",), ("MATRIX_SCALE", "KEY_SPLIT")
    ]  # fmt: skip
    assert all("MATRIX_SCALE" not in p.defines for p in progs if p.shader != "attention_flash")
    assert spirv.compiler_for("attention_flash")[0] == "glslangValidator"
    tools = Path(sys.executable).parent
    for _, defines in builds:
        code = spirv.compile_spirv("attention_flash", defines, tmp_path)
        path = tmp_path / "flash.spv"
        path.write_bytes(code)
        subprocess.run([tools / "spirv-val", "--target-env", "vulkan1.3", path], check=True)
        dis = subprocess.run([tools / "spirv-dis", path], capture_output=True, text=True).stdout
        # a multiply whose result is a cooperative matrix: only with MATRIX_SCALE
        mats = set(re.findall(r"(%\w+) = OpTypeCooperativeMatrixKHR", dis))
        muls = {m for m in re.findall(r"= OpFMul (%\w+) ", dis) if m in mats}
        assert bool(muls) == ("MATRIX_SCALE" in defines), defines


def test_registry_allows_flash_only_with_coopmat_and_shared_memory():
    cfg = TuningConfig.default("vulkan").replace(**FLASH)
    assert cfg.problems(h200_like()) == []
    assert cfg.problems(h200_like(min_subgroup_size=32, max_subgroup_size=64)) == []  # RDNA
    for dev in (
        h200_like(cooperative_matrix=False, coopmat_shapes=[]),
        h200_like(max_shared_memory=32768),
        h200_like(min_subgroup_size=32, max_subgroup_size=128),
        h200_like(min_subgroup_size=8),
    ):
        (p,) = cfg.problems(dev)
        assert p.startswith("attention.flash:")


def test_lavapipe_refuses_flash_through_the_constraint():
    require_vulkan()
    be = make_backend()
    try:
        if be.device_info().extra.get("cooperative_matrix"):
            pytest.skip("this device has cooperative matrices (the GPU tests cover it)")
        with pytest.raises(ConfigError, match="attention.flash: the device reports"):
            be.set_config(TuningConfig.default("vulkan").replace(**FLASH))
        assert be.config.op("attention").variant == "split"
    finally:
        be.close()


cb = coopmat_fixture("cb")


@pytest.mark.gpu
@pytest.mark.parametrize("matrix_scale", [False, True])
@pytest.mark.parametrize(
    "T,H,Hkv,D,pos0",
    [
        (37, 4, 2, 64, 0),  # one ragged query tile, GQA
        (130, 14, 2, 128, 549),  # three tiles, the last of 2 queries, a long earlier context
        (64, 7, 1, 128, 0),  # exactly one tile, GQA 7 (the 7B's ratio)
        (65, 2, 1, 16, 3),  # one output fragment, a one-query last tile
        (33, 4, 4, 128, 31),  # no GQA, keys ragged against the 32-key block
        (200, 2, 2, 96, 0),  # D 96: six output fragments of eight
        (6, 7, 1, 80, 45),  # D not a multiple of 16: the split kernel
        (1, 14, 2, 128, 549),  # decode: the split kernel
    ],
)
def test_flash_attention(cb, T, H, Hkv, D, pos0, matrix_scale):
    """Against float64 NumPy. The cache rows past the last visible key hold NaN, which the pass
    must never multiply into its output, and q is a row view at an offset."""
    out, ref, _, (q, cache) = _flash_run(cb, T, H, Hkv, D, pos0, 0, matrix_scale, profile=False)
    assert out.shape == (T, H, D) and np.isfinite(out).all()
    limit = 1e-9 if (T == 1 or D % 16) else 2e-5  # split: float32; flash: fp16 tiles
    assert nmse(ref, out) < limit
    # the same as the coopmat variant's pass (16 queries a workgroup) within fp16 rounding
    if T > 1 and D % 16 == 0:
        cb.set_config(TuningConfig.default("vulkan").replace(**{"attention.variant": "coopmat"}))
        old = cb.download(cb.ops.attention(cb.ops.rows(cb.upload(q), 1, T + 1), cache, 0, pos0))
        assert nmse(old, out) < 2e-5


SPLIT_CASES = [
    (37, 4, 2, 64, 0),  # one tile: ranges of 32 keys (chunk 64 -> 1 range: the plain pass)
    (130, 14, 2, 128, 549),  # three tiles, a long earlier context: ranges sized from pos0 + T
    (200, 2, 2, 96, 0),  # four tiles, the last of 8 queries
    (512, 2, 1, 128, 0),  # the 1.5B's pp512 tiles (8), GQA 2
    (257, 7, 1, 16, 31),  # one output fragment, ragged keys against the 32-key block
]


def _flash_run(cb, T, H, Hkv, D, pos0, chunk, scale=False, profile=True):  # noqa: ANN001, ANN202
    """(out, reference, kernels, (q, cache)) of attention.flash with key_chunk = chunk: a cache
    whose rows past the last visible key hold NaN, q a row view at an offset; kernels (the
    profile's pipeline names) empty without profile."""
    cb.set_config(
        allowed_config(cb, FLASH | {"attention.key_chunk": chunk, "attention.matrix_scale": scale})
    )
    rng = np.random.default_rng(T * 1000 + pos0 + D)
    L = pos0 + T
    kc = rng.standard_normal((L + 40, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((L + 40, Hkv, D)).astype(np.float32)
    kc[L:], vc[L:] = np.nan, np.nan
    q = 2.0 * rng.standard_normal((T + 2, H, D)).astype(np.float32)
    cache = cb.new_kv_cache(1, L + 40, Hkv, D)
    cb.ops.kv_write(cache, 0, cb.upload(kc), cb.upload(vc), 0)
    cb.set_profiling(profile)
    out = cb.download(cb.ops.attention(cb.ops.rows(cb.upload(q), 1, T + 1), cache, 0, pos0))
    kernels = set(cb.profile().kernels) if profile else set()
    cb.set_profiling(False)
    return out, attention_ref(q[1 : T + 1], kc[:L], vc[:L], pos0), kernels, (q, cache)


def _accepts(out: np.ndarray, ref: np.ndarray) -> bool:
    return bool(np.isfinite(out).all()) and nmse(ref, out) < 2e-5


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [32, 64, 128, 256])
@pytest.mark.parametrize("T,H,Hkv,D,pos0", SPLIT_CASES)
def test_flash_key_split(cb, T, H, Hkv, D, pos0, chunk):
    """attention.key_chunk: the flash pass over ceil(T / chunk) key ranges and the split
    kernel's merge, against float64 NumPy (NaN past the last key, q at an offset); one range
    is the plain pass."""
    out, ref, kernels, _ = _flash_run(cb, T, H, Hkv, D, pos0, chunk, scale=chunk == 128)
    assert out.shape == (T, H, D) and _accepts(out, ref)
    split = -(-T // chunk) > 1
    # pipeline names: attention.flash.flash_split, attention.split.merge (the H200's profile)
    assert any(".flash_split" in k for k in kernels) == split, kernels
    assert any(k.endswith(".merge") for k in kernels) == split, kernels


@pytest.mark.gpu
def test_planted_dropped_key_range_is_rejected(cb, monkeypatch):
    """The check above rejects a merge told one key range fewer (the last range's keys lost)."""
    from engine.backends.vulkan.backend import VulkanBackend

    real = VulkanBackend._flash_split

    def short(self, q, bufs, offs, out, dims, pos0):  # noqa: ANN001, ANN202
        dispatch = self.stream.dispatch

        def fewer(p, b, w, push, grid):  # noqa: ANN001, ANN202
            if p is self._pipe("attention.merge")[0]:
                push = (push[0], push[1], push[2] - 1, *push[3:])
            return dispatch(p, b, w, push, grid)

        self.stream.dispatch = fewer
        try:
            return real(self, q, bufs, offs, out, dims, pos0)
        finally:
            del self.stream.dispatch

    monkeypatch.setattr(VulkanBackend, "_flash_split", short)
    out, ref, _, _ = _flash_run(cb, 512, 2, 1, 128, 0, 128)
    assert not _accepts(out, ref)
