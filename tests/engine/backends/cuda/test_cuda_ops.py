"""The CUDA backend against the NumPy reference, op by op and variant by variant (`pytest -m gpu`).

Every registered variant of every op runs on random shapes that include sizes that are not
multiples of any tile, column tile or block, and size-1 dims; per-op NMSE limits (5e-4 for matmul,
the fp16 GEMM paths), no NaN/Inf, canaries around outputs, inputs unchanged. Then whole synthetic
models: graph replay equals eager decode, validate passes for every variant, a compile failure
and a kernel fault are reported as such. On a machine without CuPy or a GPU the whole module is
skipped with the reason (and `pytest` without -m gpu deselects it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine.tuning import TuningConfig
from tests.backend_contract import BackendContract
from tests.op_cases import (
    assert_graph_equals_eager,
    check,
    check_dot,
    dense,
    qtensor,
    seed_of,
    write_cache_and_attend,
)

pytestmark = pytest.mark.gpu

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
MATMUL_NMSE = 5e-4
# Q8_1 activations (mmvq, mmq8): ~3e-5 expected on average; a single output (N = 1) whose
# terms cancel reaches a few 1e-3 (measured on the H200, 2026-11-29). A wrong scale or slot
# gives 1e-2 and up.
INT8_NMSE = 5e-3
SENTINEL = 1234.5


PAD = 1024  # bytes of sentinel after every allocation made during a contract op


class TestCudaContract(BackendContract):
    """The shared backend contract on CUDA. Canaries: while an op runs, every allocation gets
    PAD bytes of SENTINEL after it (a CuPy allocator); after the op, the output's must be
    intact."""

    backend = "cuda"

    @pytest.fixture
    def be(self, cuda_be):  # noqa: ANN201
        cuda_be.set_config(TuningConfig.default("cuda"))
        return cuda_be

    def poison(self, be, out_elems: int) -> None:  # noqa: ANN001
        cp = be._cp
        self._pads: dict[int, tuple[object, int]] = {}

        def padded(size: int):  # noqa: ANN202 - cupy.cuda.MemoryPointer
            size4 = -(-size // 4) * 4
            mem = cp.cuda.Memory(size4 + PAD)
            ptr = cp.cuda.MemoryPointer(mem, 0)
            cp.ndarray((PAD // 4,), np.float32, ptr + size4).fill(SENTINEL)
            self._pads[ptr.ptr] = (mem, size4)
            return ptr

        cp.cuda.set_allocator(padded)

    def assert_canaries(self, be, out, args) -> None:  # noqa: ANN001
        cp = be._cp
        cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
        got = self._pads.get(out.data.mem.ptr)
        assert got is not None, "the output was not allocated during the op"
        mem, size4 = got
        pad = cp.ndarray((PAD // 4,), np.float32, cp.cuda.MemoryPointer(mem, size4))
        be.synchronize()
        assert (pad.get() == SENTINEL).all(), "kernel wrote past its output"


def cfg(**flat) -> TuningConfig:
    return TuningConfig.from_flat("cuda", flat)


def guarded(cp, shape, pad=257):
    """An output view with sentinel canaries on both sides: (view, check_canaries)."""
    n = int(np.prod(shape))
    buf = cp.full(n + 2 * pad, SENTINEL, np.float32)
    view = buf[pad : pad + n].reshape(shape)

    def intact() -> None:
        host = buf.get()
        assert (host[:pad] == SENTINEL).all(), "write before the output"
        assert (host[pad + n :] == SENTINEL).all(), "write after the output"

    return view, intact


def k_for(qtype: str, blocks: int) -> int:
    return 256 * blocks if qtype.endswith("_K") else 32 * blocks if qtype[0] == "Q" else 37 * blocks


def assert_ragged_matmul_into(cp, be, rng, qtype: str, sizes: list, err: float) -> None:  # noqa: ANN001
    """matmul_into of a decode row [1, K] into a guarded output, per (rows, K blocks) in sizes:
    the dot products to err (check_dot), nothing written outside the output, x untouched."""
    for N, kb in sizes:
        K = k_for(qtype, kb)
        w = qtensor(rng, (N, K), qtype, std=0.05)
        x = rng.standard_normal((1, K)).astype(np.float32)
        xd = be.upload(x)
        y, intact = guarded(cp, (1, N))
        be.matmul_into(xd, be.load_weight(w), y)
        check_dot(y.get(), x, dense(w), err)
        intact()
        assert np.array_equal(be.download(xd), x), "input changed"


def _mmq_cases(variant: str) -> list[tuple[str, dict, list[int]]]:
    """The mmq family's tile shapes (tile_m x tile_n, warps_m x warps_n) under variant, as
    MATMUL_CONFIGS rows: the default 128 x 128, and 64 x 32 / 64 x 64 with their T lists."""
    tiles = [
        ("128x128", {}, [2, 33, 130]),
        ("64x32-2x2", {"tile_m": 64, "tile_n": 32, "warps_m": 2, "warps_n": 2}, [5, 70]),
        ("64x64-4x1", {"tile_m": 64, "tile_n": 64, "warps_m": 4, "warps_n": 1}, [65]),
    ]
    base = {"prefill.gemm_min_t": 2, "matmul_prefill.variant": variant}
    return [
        (f"{variant}-{name}", base | {f"matmul_prefill.{k}": v for k, v in knobs.items()}, Ts)
        for name, knobs, Ts in tiles
    ]


# --- matmul: every path, variant and parameter family -----------------------------------------
MATMUL_CONFIGS = [
    # (id, flat config, T values)
    ("decode-default", {}, [1]),
    ("mmvq", {"matmul_decode.variant": "mmvq"}, [1]),  # Q8_1 activations, dp4a
    ("mmvq-w1-r1", {"matmul_decode.variant": "mmvq", "matmul_decode.warps": 1,
                    "matmul_decode.rows_per_block": 1}, [1]),
    ("mmvq-w8-r4", {"matmul_decode.variant": "mmvq", "matmul_decode.warps": 8,
                    "matmul_decode.rows_per_block": 4}, [1]),
    ("mmvq-w2-r8", {"matmul_decode.variant": "mmvq", "matmul_decode.warps": 2,
                    "matmul_decode.rows_per_block": 8}, [1]),
    ("decode-r1-t8-v1", {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_block": 1,
                         "matmul_decode.threads_per_row": 8, "matmul_decode.vec": 1}, [1]),
    ("decode-r16-t64-v4", {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_block": 16,
                           "matmul_decode.threads_per_row": 64, "matmul_decode.vec": 4}, [1]),
    ("decode-r2-t128", {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_block": 2,
                        "matmul_decode.threads_per_row": 128}, [1]),
    ("decode-rpt1", {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_thread": 1}, [1]),
    ("decode-rpt4-t16", {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_thread": 4,
                         "matmul_decode.threads_per_row": 16}, [1]),
    ("kpar-c2", {"prefill.gemm_min_t": 1 << 20, "matmul_batched.max_cols": 2}, [2, 7]),
    ("kpar-c16", {"prefill.gemm_min_t": 1 << 20}, [2, 17, 33]),
    ("kpar-c40-t64", {"prefill.gemm_min_t": 1 << 20, "matmul_batched.max_cols": 40,
                      "matmul_batched.threads_per_row": 64, "matmul_batched.rows_per_block": 1},
     [41, 40]),
    ("serial-c16", {"prefill.gemm_min_t": 1 << 20, "matmul_batched.variant": "dmmv_serial"},
     [3, 17]),
    ("staged", {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "staged"}, [2, 33, 130]),
    *_mmq_cases("mmq"),
    *_mmq_cases("mmq8"),
    # ptc: issue 14's tensor-core prefill (resident fp16 weights, fp16 activations at source)
    ("ptc-resident", {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "resident"},
     [2, 33, 130]),
    ("ptc-resident-nofuse", {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "resident",
                             "matmul_prefill.fuse_f16": 0}, [5, 70]),
]  # fmt: skip


@pytest.mark.parametrize("cid,flat,Ts", MATMUL_CONFIGS, ids=[c[0] for c in MATMUL_CONFIGS])
@pytest.mark.parametrize("qtype", QTYPES)
def test_matmul(cp, be, cid, flat, Ts, qtype):
    be.set_config(cfg(**flat))
    rng = np.random.default_rng(seed_of(cid, qtype))
    for T in Ts:
        for N, kb in [(1, 1), (67, 3), (130, 2), (257, 1)]:
            K = k_for(qtype, kb)
            w = qtensor(rng, (N, K), qtype, std=0.05)
            x = rng.standard_normal((T, K)).astype(np.float32)
            xd = be.upload(x)
            y, intact = guarded(cp, (T, N))
            be.matmul_into(xd, be.load_weight(w), y)
            if "mmvq" in cid or "mmq8" in cid:  # int8 activations
                check_dot(y.get(), x, dense(w), INT8_NMSE)
            else:
                check(y.get(), x.astype(np.float64) @ dense(w).T, MATMUL_NMSE)
            intact()
            assert np.array_equal(be.download(xd), x), "input changed"


def test_staged_chunks_rows(cp, be):
    """The staged path dequantizes in row chunks when the scratch is smaller than the weight."""
    be.set_config(cfg())
    rng = np.random.default_rng(5)
    w = qtensor(rng, (300, 512), "Q4_K", std=0.05)
    x = rng.standard_normal((9, 512)).astype(np.float32)
    y, intact = guarded(cp, (9, 300))
    be._staged(be.upload(x), be.load_weight(w), y, scratch_bytes=2 * 512 * 7)  # 7-row chunks
    check(y.get(), x.astype(np.float64) @ dense(w).T, MATMUL_NMSE)
    intact()


def test_load_weight_rejects_unsupported_type(be):
    from engine.errors import UnsupportedError

    rng = np.random.default_rng(0)
    w = qtensor(rng, (4, 32), "Q5_1")
    with pytest.raises(UnsupportedError, match=r"'w'.*Q5_1"):
        be.load_weight(w)


# --- small ops ------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T", [1, 5])
def test_embedding(cp, be, qtype, T):
    be.set_config(cfg())
    rng = np.random.default_rng(T)
    K = k_for(qtype, 2) if qtype[0] == "Q" else 96
    table = qtensor(rng, (37, K), qtype)
    ids = np.array([0, 36, 5, 5, 17][:T], np.int32)
    out = be.download(be.ops.embedding(be.load_weight(table), be.upload(ids)))
    check(out, dense(table)[ids], 1e-12)


@pytest.mark.parametrize("rpb", [1, 4, 8])
@pytest.mark.parametrize("shape", [(1, 7), (3, 896), (5, 4, 64), (1, 2, 128), (33, 257)])
def test_rms_norm(be, shape, rpb):
    be.set_config(cfg(**{"rms_norm.variant": "warp", "rms_norm.rows_per_block": rpb}))
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = qtensor(rng, (shape[-1],), "F32")
    out = be.download(be.ops.rms_norm(be.upload(x), be.load_weight(w), 1e-6))
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * dense(w)
    check(out, ref, 1e-10)


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (7, 130), (3, 4099)])
def test_add_swiglu(be, shape):
    be.set_config(cfg(**{"add.threads": 128, "swiglu.threads": 1024}))
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(shape).astype(np.float32) * 4 for _ in range(2))
    bias = qtensor(rng, (shape[-1],), "F32")
    check(be.download(be.ops.add(be.upload(a), be.upload(b))), a.astype(np.float64) + b, 1e-13)
    check(be.download(be.ops.add(be.upload(a), be.load_weight(bias))), a + dense(bias), 1e-13)
    g64 = a.astype(np.float64)
    out = be.download(be.ops.swiglu(be.upload(a), be.upload(b)))
    check(out, g64 / (1 + np.exp(-g64)) * b, 1e-10)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(
    "T,H,D,pos0", [(1, 1, 64, 0), (3, 2, 64, 17), (9, 3, 128, 1000), (2, 5, 80, 32767)]
)
def test_rope(be, neox, T, H, D, pos0):
    from engine.backends.numpy_ref import NumpyBackend

    be.set_config(cfg())
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    theta = 1e6 if neox else 1e4
    ref = NumpyBackend().ops.rope(x, pos0, theta, neox)
    check(be.download(be.ops.rope(be.upload(x), pos0, theta, neox)), ref, 1e-10)


@pytest.mark.parametrize("threads", [256, 1024])
@pytest.mark.parametrize("T,V", [(1, 1), (1, 151936), (3, 1000), (2, 33)])
def test_argmax_first_maximum(be, threads, T, V):
    be.set_config(cfg(**{"argmax.threads": threads}))
    rng = np.random.default_rng(V)
    logits = rng.standard_normal((T, V)).astype(np.float32)
    if V > 10:
        logits[0, [7, V - 3]] = 50.0  # a tie: the first index wins
        logits[-1, [V - 1, 3]] = 60.0
    out = be.download(be.ops.argmax(be.upload(logits)))
    assert out.tolist() == np.argmax(logits, axis=-1).tolist()


ATTN_CONFIGS = [
    ("decode-s8-w4", {}),
    ("decode-s1-w1", {"attention_decode.splits": 1, "attention_decode.warps": 1}),
    ("decode-s32-w8", {"attention_decode.splits": 32, "attention_decode.warps": 8}),
    ("flash-16-4", {}),
    ("flash-8-1", {"attention_prefill.block_q": 8, "attention_prefill.rows_per_warp": 1}),
    ("flash-64-2", {"attention_prefill.block_q": 64, "attention_prefill.rows_per_warp": 2}),
    ("split-4-2", {"attention_prefill.variant": "split", "attention_prefill.splits": 4,
                   "attention_prefill.warps": 2}),
    ("ptc-gemm-256-4", {"attention_prefill.variant": "gemm"}),
    ("ptc-gemm-64-1", {"attention_prefill.variant": "gemm", "attention_prefill.block_q": 64,
                       "attention_prefill.softmax_warps": 1}),
    ("ptc-gemm-1024-8", {"attention_prefill.variant": "gemm", "attention_prefill.block_q": 1024,
                         "attention_prefill.softmax_warps": 8}),
    # one-kernel mma.sync attention; D = 80 and 256 take its gemm fallback
    ("ptc-flashtc-64-64", {"attention_prefill.variant": "flash_tc"}),
    ("ptc-flashtc-32-32", {"attention_prefill.variant": "flash_tc",
                           "attention_prefill.block_q": 32, "attention_prefill.block_k": 32}),
    ("ptc-flashtc-128-128", {"attention_prefill.variant": "flash_tc",
                             "attention_prefill.block_q": 128, "attention_prefill.block_k": 128}),
]  # fmt: skip
# fp16 Q, K, V and P into fp32 accumulators (the fp16 numeric class): ~1e-7 measured-size
# rounding; a missing mask or a wrong head is 1e-2 and up.
ATTN_F16_NMSE = 5e-5


ATTN_SHAPES = [
    (1, 2, 1, 64, 0), (1, 4, 2, 64, 37), (1, 28, 4, 128, 600), (5, 4, 2, 64, 0),
    (7, 6, 2, 128, 11), (33, 2, 2, 64, 3), (70, 12, 2, 128, 0), (3, 2, 1, 256, 5),
    (1, 1, 1, 32, 0), (130, 7, 1, 64, 9), (67, 4, 4, 80, 200),
]  # fmt: skip
# Decode configs only see T == 1 and prefill configs T > 1, as the backend dispatches them.
ATTN_CASES = [
    pytest.param(cid, flat, *shape, id=f"{cid}-T{shape[0]}-H{shape[1]}-D{shape[3]}-p{shape[4]}")
    for cid, flat in ATTN_CONFIGS
    for shape in ATTN_SHAPES
    if cid.startswith("decode") == (shape[0] == 1)
]


@pytest.mark.parametrize("cid,flat,T,H,Hkv,D,pos0", ATTN_CASES)
def test_kv_write_and_attention(cp, be, cid, flat, T, H, Hkv, D, pos0):
    be.set_config(cfg(**flat))
    rng = np.random.default_rng(T + pos0 + D)
    cap = pos0 + T + 5
    q, k, v, cache, kc, vc, out = write_cache_and_attend(be, rng, T, H, Hkv, D, pos0)
    from engine.backends.numpy_ref import NumpyBackend

    nb = NumpyBackend()
    ncache = nb.new_kv_cache(1, cap, Hkv, D)
    ncache.k[0][:], ncache.v[0][:] = kc, vc
    check(
        out, nb.ops.attention(q, ncache, 0, pos0), ATTN_F16_NMSE if cid.startswith("ptc") else 1e-9
    )
    with pytest.raises(ValueError, match="KV cache full"):
        be.ops.kv_write(cache, 0, be.upload(k), be.upload(v), cap - T + 1)


def test_registry_matches_device(be):
    info = be.device_info()
    for key in ("cc", "sms", "smem_per_block", "smem_per_block_optin"):
        assert info.extra[key] > 0
    assert info.vendor == "nvidia" and info.device_class and info.memory_bytes > 0
    TuningConfig.default("cuda").check(info)


# --- Q8_1 activations and the fused producers (q8.cu) -----------------------------------------
def _check_q8(x: np.ndarray, xq, xds) -> None:
    """Blocks of 32: d = max|x| / 127, q = round(x / d), second value d * sum(q)."""
    q = xq.get().astype(np.float64).reshape(x.shape[0], -1, 32)
    ds = xds.get().astype(np.float64).reshape(x.shape[0], -1, 2)
    xb = x.astype(np.float64).reshape(q.shape)
    amax = np.abs(xb).max(axis=-1)
    assert np.allclose(ds[..., 0], amax / 127, rtol=1e-6, atol=0)
    assert np.abs(q).max() <= 127
    assert np.all(np.abs(q * ds[..., :1] - xb) <= ds[..., :1] * 0.5 * (1 + 1e-4) + 1e-30)
    assert np.allclose(ds[..., 1], ds[..., 0] * q.sum(axis=-1), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("T,K", [(1, 32), (3, 96), (1, 3584), (5, 18944)])
@pytest.mark.parametrize("threads", [128, 1024])
def test_quantize_q8_1(be, T, K, threads):
    be.set_config(cfg(**{"quantize_act.threads": threads}))
    rng = np.random.default_rng(T * K + threads)
    x = (rng.standard_normal((T, K)) * rng.uniform(0.1, 10, (T, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: d = 0, q = 0
    xq, xds = be.quantize_q8(be.upload(x))
    _check_q8(x, xq, xds)


@pytest.mark.parametrize("D", [32, 96, 1536, 3584])
@pytest.mark.parametrize("threads", [128, 512])
def test_rms_norm_q8_fused(be, D, threads):
    """One decode row under mmvq: the fused kernel's float output equals rms_norm's, and the
    Q8_1 form it leaves is what matmul then uses (no second quantization)."""
    be.set_config(cfg(**{"matmul_decode.variant": "mmvq", "quantize_act.threads": threads,
                         "rms_norm.variant": "warp"}))  # fmt: skip
    rng = np.random.default_rng(D + threads)
    x = rng.standard_normal((1, D)).astype(np.float32)
    w = qtensor(rng, (D,), "F32")
    out = be.ops.rms_norm(be.upload(x), be.load_weight(w), 1e-6)
    xf = x.astype(np.float64)
    ref = xf / np.sqrt((xf**2).mean(-1, keepdims=True) + 1e-6) * dense(w)
    check(be.download(out), ref, 1e-12)
    hit = be._q8_lookup(out)
    assert hit is not None, "fused rms_norm left no Q8_1 form"
    _check_q8(be.download(out), *hit)
    wq = qtensor(rng, (67, D), "Q8_0", std=0.05)
    y = be.download(be.ops.matmul(out, be.load_weight(wq)))
    check(y, be.download(out).astype(np.float64) @ dense(wq).T, INT8_NMSE)


@pytest.mark.parametrize("n", [32, 160, 18944])
def test_swiglu_q8_fused(be, n):
    be.set_config(cfg(**{"matmul_decode.variant": "mmvq"}))
    rng = np.random.default_rng(n)
    g = rng.standard_normal((1, n)).astype(np.float32)
    u = rng.standard_normal((1, n)).astype(np.float32)
    out = be.ops.swiglu(be.upload(g), be.upload(u))
    gf = g.astype(np.float64)
    check(be.download(out), gf / (1 + np.exp(-gf)) * u, 1e-12)
    hit = be._q8_lookup(out)
    assert hit is not None, "fused swiglu left no Q8_1 form"
    _check_q8(be.download(out), *hit)


def test_q8_form_dropped_when_memory_is_rewritten(cp, be):
    be.set_config(cfg(**{"matmul_decode.variant": "mmvq"}))
    rng = np.random.default_rng(5)
    x = be.upload(rng.standard_normal((1, 64)).astype(np.float32))
    be.quantize_q8(x)
    w = qtensor(rng, (64, 64), "Q8_0", std=0.05)
    be.matmul_into(be.upload(rng.standard_normal((1, 64)).astype(np.float32)), be.load_weight(w), x)
    assert be._q8_lookup(x) is None
    y = be.download(be.ops.matmul(x, be.load_weight(w)))
    check(y, be.download(x).astype(np.float64) @ dense(w).T, INT8_NMSE)


# --- whole models -----------------------------------------------------------------------------
def _model(path, backend):
    from engine.gguf_model import open_model
    from engine.models import build_model

    return build_model(open_model(path), backend)


PROMPT = [3, 17, 99, 5, 42, 7, 250, 11, 64, 2, 8, 1, 77, 31, 9, 120, 66, 4, 200, 13, 5, 6, 7,
          8, 90, 91, 92, 93, 14, 15, 16, 18, 19, 20, 21, 22, 23]  # 37 tokens  # fmt: skip


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_model_matches_numpy_and_graph_equals_eager(be, tiny_model_factory, arch):
    from engine.backends.numpy_ref import NumpyBackend

    path = tiny_model_factory(arch, "q4_k_m")
    be.set_config(cfg())
    ref = _model(path, NumpyBackend()).generate(PROMPT, 12, path="per_token", keep_logits=True)
    m = _model(path, be)
    be.use_graphs = False
    eager = m.generate(PROMPT, 12, keep_logits=True)
    be.use_graphs = True
    graph = m.generate(PROMPT, 12, keep_logits=True)
    graph2 = m.generate(PROMPT[:5], 12, keep_logits=True)  # a new cache: a new capture
    assert graph.tokens == eager.tokens == ref.tokens
    for a, b in zip(graph.step_logits, eager.step_logits, strict=True):
        assert np.array_equal(a, b), "graph replay differs from eager decode"
    scale = max(1.0, float(np.abs(ref.last_logits).max()))
    assert np.abs(graph.last_logits - ref.last_logits).max() < 2e-2 * scale
    ref5 = _model(path, NumpyBackend()).generate(PROMPT[:5], 12, path="per_token")
    assert graph2.tokens == ref5.tokens


VALIDATE_CONFIGS = [
    {},
    {"prefill.chunk_tokens": 16},
    {
        "prefill.chunk_tokens": 8,
        "prefill.gemm_min_t": 1 << 20,
        "matmul_batched.variant": "dmmv_serial",
    },
    {"prefill.gemm_min_t": 1 << 20, "matmul_batched.max_cols": 40},
    {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "staged"},
    {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "mmq"},
    {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "mmq", "matmul_prefill.tile_m": 64,
     "matmul_prefill.tile_n": 32, "matmul_prefill.warps_m": 4, "matmul_prefill.warps_n": 2},
    {"attention_prefill.variant": "split", "attention_decode.splits": 1},
    {"attention_prefill.block_q": 32, "attention_prefill.rows_per_warp": 8},
]  # fmt: skip


@pytest.mark.parametrize(
    "flat", VALIDATE_CONFIGS, ids=[str(i) for i in range(len(VALIDATE_CONFIGS))]
)
def test_validate_passes_for_variant(be, tiny_model_path, flat):
    from engine.verify.validate import validate

    be.set_config(cfg())
    m = _model(tiny_model_path, be)
    prompts = [PROMPT, PROMPT[:1], list(range(40, 40 + 70))]
    rep = validate(m, cfg(**flat), prompts, steps=6)
    assert rep.passed, [p.reasons for p in rep.prompts]


PTC = {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "resident",
       "attention_prefill.variant": "gemm"}  # fmt: skip
PTC_VALIDATE_CONFIGS = [
    PTC,
    PTC | {"prefill.chunk_tokens": 16, "attention_prefill.block_q": 64},  # chunks with pos0 > 0
    PTC | {"matmul_prefill.fuse_f16": 0, "attention_prefill.softmax_warps": 1},
    {"attention_prefill.variant": "gemm", "prefill.chunk_tokens": 32},  # with staged GEMMs
    PTC | {"attention_prefill.variant": "flash_tc"},
    PTC
    | {
        "attention_prefill.variant": "flash_tc",
        "prefill.chunk_tokens": 16,
        "attention_prefill.block_q": 32,
        "attention_prefill.block_k": 128,
    },
    # q, k, v in one GEMM and rope_kv_rows (prefill_f16.cu)
    PTC | {"attention_prefill.variant": "flash_tc", "rope.fuse_kv": 1, "prefill.chunk_tokens": 16},
]


@pytest.mark.parametrize(
    "flat",
    PTC_VALIDATE_CONFIGS,
    ids=[
        f"ptc{i}-{f.get('attention_prefill.variant', 'flash')}"
        for i, f in enumerate(PTC_VALIDATE_CONFIGS)
    ],
)
def test_validate_passes_for_ptc_variant(be, tiny_model_path, flat):
    """The tensor-core prefill variants against the per-token reference under their declared
    numeric class (fp16)."""
    from engine.verify.validate import validate

    be.set_config(cfg())
    m = _model(tiny_model_path, be)
    prompts = [PROMPT, PROMPT[:1], list(range(40, 40 + 70))]
    rep = validate(m, cfg(**flat), prompts, steps=6)
    assert rep.passed, [p.reasons for p in rep.prompts]
    assert "fp16" in rep.numeric_classes


def test_ptc_f16_producers_and_resident_copy(cp, be):
    """Under resident + fuse_f16: rms_norm and swiglu of a prefill chunk store the fp16 form
    the GEMM reads (bit-equal to a conversion of their float32 output), the GEMM reuses it, the
    weight's fp16 copy is made once and counted in the weight's bytes."""
    be.set_config(cfg(**PTC))
    rng = np.random.default_rng(11)
    x = rng.standard_normal((33, 256)).astype(np.float32)
    nw = be.load_weight(qtensor(rng, (256,), "F32"))
    h = be.ops.rms_norm(be.upload(x), nw, 1e-6)
    g = be.ops.swiglu(be.upload(x), be.upload(x[::-1].copy()))
    for out in (h, g):
        form = [e[1] for e in be._f16 if e[0] is out]
        assert form, "no fp16 form stored by the producer"
        assert np.array_equal(form[0].get(), out.get().astype(np.float16).view(np.uint16))
    qt = qtensor(rng, (67, 256), "Q4_K", std=0.05)
    w = be.load_weight(qt)
    raw_bytes = w.nbytes
    y1 = be.download(be.ops.matmul(h, w))
    copy = w.f16
    assert copy is not None and w.nbytes == raw_bytes + 67 * 256 * 2
    y2 = be.download(be.ops.matmul(h, w))
    assert w.f16 is copy, "the fp16 copy was made again"
    ref = be.download(h).astype(np.float64) @ dense(qt).T
    check(y1, ref, MATMUL_NMSE)
    assert np.array_equal(y1, y2)


def test_ptc_flash_tc_stores_o_projection_input(cp, be):
    """Under resident + fuse_f16, flash_tc also writes its output's fp16 rounding (bit-equal to
    converting the float32 output), which the o projection's GEMM then reads."""
    be.set_config(cfg(**PTC | {"attention_prefill.variant": "flash_tc"}))
    rng = np.random.default_rng(2)
    T, H, Hkv, D, pos0 = 45, 4, 2, 128, 7
    cache = be.new_kv_cache(1, pos0 + T, Hkv, D)
    kv = rng.standard_normal((2, pos0 + T, Hkv, D)).astype(np.float32)
    be.ops.kv_write(cache, 0, be.upload(kv[0]), be.upload(kv[1]), 0)
    q = be.upload(rng.standard_normal((T, H, D)).astype(np.float32))
    out = be.ops.attention(q, cache, 0, pos0)
    made = be._f16[-1][1]  # the kernel's fp16 output, remembered as the o projection's input
    form = be._to_f16(out.reshape(T, H * D))
    assert form is made
    want = out.get().reshape(T, H * D).astype(np.float16).view(np.uint16)
    assert np.array_equal(form.get(), want)


@pytest.mark.parametrize("attn,fkv", [("gemm", 0), ("flash_tc", 0), ("flash_tc", 1)])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_ptc_model_matches_numpy(be, tiny_model_factory, arch, attn, fkv):
    from engine.backends.numpy_ref import NumpyBackend

    path = tiny_model_factory(arch, "q4_k_m")
    ref = _model(path, NumpyBackend()).generate(PROMPT, 8, path="per_token", keep_logits=True)
    be.set_config(cfg(**PTC | {"attention_prefill.variant": attn, "rope.fuse_kv": fkv}))
    got = _model(path, be).generate(PROMPT, 8, keep_logits=True)
    assert got.tokens == ref.tokens
    scale = max(1.0, float(np.abs(ref.last_logits).max()))
    assert np.abs(got.last_logits - ref.last_logits).max() < 5e-2 * scale


INT8_MMVQ = {"matmul_decode.variant": "mmvq"}
INT8_VALIDATE_CONFIGS = [
    INT8_MMVQ,
    INT8_MMVQ | {"matmul_decode.warps": 8, "matmul_decode.rows_per_block": 2},
    INT8_MMVQ | {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "mmq8"},
    INT8_MMVQ | {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "mmq8",
                 "matmul_prefill.tile_m": 64, "matmul_prefill.tile_n": 32,
                 "matmul_prefill.warps_m": 2, "matmul_prefill.warps_n": 2},
]  # fmt: skip


@pytest.mark.parametrize(
    "flat", INT8_VALIDATE_CONFIGS, ids=[str(i) for i in range(len(INT8_VALIDATE_CONFIGS))]
)
def test_validate_int8_paths_against_int8_reference(be, tiny_model_path, flat):
    """The Q8_1 paths against per-token mmvq decode: every greedy token equal, logits within
    int8-activation tolerances (the tiny model measured max |diff| 0.055, NMSE 1.4e-4 on the
    H200 against the float reference; the default 0.05 / 2e-5 are fp16-sized)."""
    from engine.verify.validate import Tolerances, validate

    be.set_config(cfg())
    m = _model(tiny_model_path, be)
    prompts = [PROMPT, PROMPT[:1], list(range(40, 40 + 70))]
    rep = validate(m, cfg(**flat), prompts, steps=6, tol=Tolerances(max_abs_diff=0.2, nmse=1e-3),
                   reference=cfg(**INT8_MMVQ))  # fmt: skip
    assert rep.passed, [p.reasons for p in rep.prompts]


def test_mmvq_graph_equals_eager(be, tiny_model_factory):
    """Under mmvq (quantized forms reused across ops) graph replay is bit-equal to eager."""
    path = tiny_model_factory("qwen2", "q4_k_m")
    be.set_config(cfg(**INT8_MMVQ))
    m = _model(path, be)
    assert_graph_equals_eager(be, m, PROMPT, 12)
    be.set_config(cfg())


def test_compile_failure_is_reported_and_backend_stays_usable(be, monkeypatch):
    from engine.backends.cuda import kernels
    from engine.errors import KernelCompileError

    be.set_config(cfg())
    before = be.config
    real = kernels.source

    def broken(name: str) -> str:
        return real(name) + ("\nthis is not C++;\n" if name == "mmq.cu" else "")

    monkeypatch.setattr(kernels, "source", broken)
    with pytest.raises(KernelCompileError, match="mmq.cu"):
        be.set_config(cfg(**{"matmul_prefill.variant": "mmq", "matmul_prefill.tile_m": 64}))
    assert be.config is before
    monkeypatch.setattr(kernels, "source", real)
    x = np.ones((1, 64), np.float32)
    w = qtensor(np.random.default_rng(0), (3, 64), "Q8_0")
    out = be.download(be.ops.matmul(be.upload(x), be.load_weight(w)))
    check(out, x @ dense(w).T, MATMUL_NMSE)


def test_kernel_fault_is_an_engine_error(be):  # be: skips where CUDA is not usable
    """An out-of-bounds kernel kills the CUDA context, so it runs in a child process."""
    code = textwrap.dedent(
        """
        import numpy as np
        from engine import backends
        from engine.errors import EngineError
        be = backends.create("cuda")
        y = be._empty((1, 64))
        x = be.upload(np.ones((1, 256), np.float32))
        be._launch("decode", "dmmv_q4_k", (64, 1), (128,),
                   (np.uint64(1 << 40), np.int32(144), np.int32(64), np.int32(256), x,
                    np.int32(1), np.uint64(16)))  # weights and output far outside any allocation
        try:
            be.download(y)
        except EngineError as e:
            print("REPORTED:", e)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "REPORTED: CUDA kernel fault" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_stats_kernel_matches_the_host(be, dtype) -> None:  # noqa: ANN001
    """elementwise.cu's row_stats (op-level replay's comparison, one launch a use) against the
    host's float64 numbers: ragged widths, a NaN (it wins the max, first column), an inf, a tie
    (the first column), a row equal to its reference."""
    from engine.backends.base import host_row_stats

    rng = np.random.default_rng(11)
    for n, w in ((1, 1), (1, 1536), (5, 257), (37, 8960)):
        c = rng.standard_normal((n, w)).astype(dtype)
        r = c.astype(np.float32) + rng.standard_normal((n, w)).astype(np.float32) * 1e-2
        if n >= 5:
            c[1, 3], c[1, 200] = np.nan, np.nan
            c[2, 17] = np.inf
            r[3] = c[3].astype(np.float32)
            r[4, :] = c[4].astype(np.float32)
            r[4, 5], r[4, 9] = r[4, 5] + 2, r[4, 9] - 2  # |diff| 2 exactly, a tie: 5 wins
        got = be.stats_host([be.row_stats(be.upload(c), be.upload(r), r)])[0]
        want = host_row_stats(c, r)
        assert got.shape == (4, n)
        np.testing.assert_allclose(got[:3], want[:3], rtol=1e-12, equal_nan=True)
        np.testing.assert_array_equal(got[3], want[3])
        if n >= 5:
            assert np.isnan(got[2, 1]) and got[3, 1] == 3 and got[2, 2] == np.inf
            assert got[0, 3] == 0 and got[3, 4] == 5
