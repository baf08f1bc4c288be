"""Issue 14's tensor-core prefill (matmul_prefill.resident, attention_prefill.gemm) on the CPU:
the backend's real host code with its kernels and cuBLAS calls emulated in NumPy
(tests/cuda_fake.py checks every launch against the kernel's signature). What this proves
without a GPU: the index arithmetic of the strided-batched GEMMs (operands, leading dims,
strides, the output written straight into [T, H, D]), the passes over query rows, the padded
key counts, the causal mask, and that fp16 forms and weight copies are made once and reused.
The kernels themselves run on the H200 in tests/engine/backends/cuda/test_cuda_ops.py (-k ptc)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from engine.backends.plan import AttnIn
from engine.tuning import TuningConfig
from tests.cuda_fake import FakeCuda
from tests.op_cases import attention_ref, check, dense, qtensor

F16 = np.float16


def _flat(a, off: int = 0, dtype=None) -> np.ndarray:  # noqa: ANN001
    f = np.asarray(a).reshape(-1)
    return (f.view(dtype) if dtype is not None else f)[off:]


def _h(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(F16).view(np.uint16)


def _pack_q(q, qh, T, H, D):  # noqa: ANN001, ANN202, N803
    qh.reshape(H, T, D)[:] = _h(np.asarray(q).reshape(T, H, D).transpose(1, 0, 2))


def _pack_kv(kc, vc, kh, vh, L, Lp, H, Hkv, D):  # noqa: ANN001, ANN202, N803
    G = H // Hkv
    for src, dst in ((kc, kh), (vc, vh)):
        d = dst.reshape(H, Lp, D)
        d[:] = 0
        for h in range(H):
            d[h, :L] = _h(np.asarray(src)[:L, h // G])


def _softmax(S, P, rows, tb, Lp, qpos0):  # noqa: ANN001, ANN202, N803
    s = np.asarray(S).reshape(rows, Lp).astype(np.float64)
    p = np.zeros((rows, Lp))
    for r in range(rows):
        n = int(qpos0) + r % int(tb) + 1
        e = np.exp(s[r, :n] - s[r, :n].max())
        p[r, :n] = e / e.sum()
    P.reshape(rows, Lp)[:] = _h(p)


def _dequant_f32(W, row_bytes, K, r0, n, out):  # noqa: ANN001, ANN202, N803
    rows = np.asarray(W).view(np.float32)[r0 : r0 + n]
    out.reshape(-1)[: n * K] = _h(rows).reshape(-1)


def _to_f16(x, xh, n):  # noqa: ANN001, ANN202
    _flat(xh)[:n] = _h(_flat(x)[:n])


def _rms(x, w, y, rows, D, eps):  # noqa: ANN001, ANN202, N803
    x2 = np.asarray(x).reshape(rows, D).astype(np.float32)
    scale = 1.0 / np.sqrt((x2 * x2).mean(-1, keepdims=True) + np.float32(eps))
    y.reshape(rows, D)[:] = x2 * scale.astype(np.float32) * np.asarray(w)
    return y.reshape(rows, D)


def _rms_row(x, w, y, xq, xds, D, eps):  # noqa: ANN001, ANN202, N803
    return _rms(x, w, y, np.asarray(x).size // int(D), D, eps)  # float rows only (xq null)


def _rms_f16(x, w, y, yh, rows, D, eps):  # noqa: ANN001, ANN202, N803
    yh.reshape(rows, D)[:] = _h(_rms(x, w, y, rows, D, eps))


def _swiglu(g, u, y, n):  # noqa: ANN001, ANN202
    g, u = _flat(g)[:n], _flat(u)[:n]
    _flat(y)[:n] = g / (1 + np.exp(-g)) * u


def _swiglu_f16(g, u, y, yh, n):  # noqa: ANN001, ANN202
    _swiglu(g, u, y, n)
    _flat(yh)[:n] = _h(_flat(y)[:n])


def _swiglu_pair(gu, y, yh, T, F):  # noqa: ANN001, ANN202, N803
    a = np.asarray(gu).reshape(T, 2 * F)
    g, u = a[:, :F], a[:, F:]
    y.reshape(T, F)[:] = g / (1 + np.exp(-g)) * u
    yh.reshape(T, F)[:] = _h(y.reshape(T, F))


def _add(a, b, y, n):  # noqa: ANN001, ANN202
    _flat(y)[:n] = _flat(a)[:n] + _flat(b)[:n]


def _rope_kv_rows(y, ld, bq, bk, bv, qo, kc, vc, T, H, Hkv, D, pos0, theta, neox):  # noqa: ANN001, ANN202, N803, PLR0913
    from engine.backends.numpy_ref import NumpyBackend

    T, H, Hkv, D, pos0, ld = (int(a) for a in (T, H, Hkv, D, pos0, ld))
    a = np.asarray(y).reshape(T, ld)
    parts = [a[:, : H * D], a[:, H * D : (H + Hkv) * D], a[:, (H + Hkv) * D :]]
    for i, b in enumerate((bq, bk, bv)):
        if isinstance(b, np.ndarray):
            parts[i] = parts[i] + b
    nb = NumpyBackend()
    qo.reshape(T, H, D)[:] = nb.ops.rope(parts[0].reshape(T, H, D), pos0, float(theta), bool(neox))
    k = nb.ops.rope(parts[1].reshape(T, Hkv, D), pos0, float(theta), bool(neox))
    kc.reshape(-1, Hkv * D)[pos0 : pos0 + T] = k.reshape(T, Hkv * D)
    vc.reshape(-1, Hkv * D)[pos0 : pos0 + T] = parts[2]


EMULATED = {
    "rope_kv_rows": _rope_kv_rows,
    "swiglu_pair_f16": _swiglu_pair,
    "add_same": _add,
    "attg_pack_q": _pack_q,
    "attg_pack_kv": _pack_kv,
    "attg_softmax": _softmax,
    "dequant_f16_f32": _dequant_f32,
    "f32_to_f16": _to_f16,
    "rms_norm": _rms,
    "rms_norm_row": _rms_row,  # rms_norm.block (norm_decode.cu)
    "rms_norm_f16": _rms_f16,
    "swiglu": _swiglu,
    "swiglu_f16": _swiglu_f16,
}


def _op(a, off: int, rows: int, cols: int, ld: int, trans: int, dtype) -> np.ndarray:  # noqa: ANN001
    """op(M) of a column-major matrix at element off of a (cuBLAS's view of memory)."""
    rs, cs = (cols, rows) if trans else (rows, cols)
    f = _flat(a, 0, dtype)
    assert off + (rs - 1) + (cs - 1) * ld < f.size, "cuBLAS operand reaches past its array"
    m = as_strided(f[off:], (rs, cs), (f.itemsize, ld * f.itemsize), writeable=False)
    return m.T if trans else m


class EmuCuda(FakeCuda):
    """FakeCuda whose kernels and cuBLAS calls compute (NumPy)."""

    def _launch(self, mod, name, grid, block, args, smem=0, pdl=False):  # noqa: ANN001, ANN202
        super()._launch(mod, name, grid, block, args, smem, pdl)
        assert name in EMULATED, f"no emulation of {name}"
        EMULATED[name](*args)

    def _gemm(self, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, c_off=0):  # noqa: ANN001, ANN202, E501, PLR0913
        super()._gemm(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, c, ldc, sc, batch, c_off)
        assert a.dtype == np.uint16 and b.dtype == np.uint16 and c.dtype == np.float32
        cf = _flat(c)
        for i in range(batch):
            A = _op(a, i * sa, m, k, lda, ta, F16).astype(np.float64)
            B = _op(b, i * sb, k, n, ldb, tb, F16).astype(np.float64)
            off = c_off + i * sc
            assert off + (m - 1) + (n - 1) * ldc < cf.size, "cuBLAS writes past its output"
            C = as_strided(cf[off:], (m, n), (4, 4 * ldc))
            C[:] = (alpha * A @ B).astype(np.float32)


def cfg(**flat) -> TuningConfig:  # noqa: ANN003
    return TuningConfig.from_flat("cuda", flat)


@pytest.mark.parametrize("block_q", [64, 256])
@pytest.mark.parametrize(
    "T,H,Hkv,D,pos0",
    [(2, 2, 1, 64, 0), (5, 4, 2, 64, 0), (70, 12, 2, 128, 0), (130, 7, 1, 64, 9),
     (67, 4, 4, 80, 200), (3, 2, 1, 256, 5), (9, 6, 3, 36, 1)],
)  # fmt: skip
def test_attention_gemm_matches_reference(block_q, T, H, Hkv, D, pos0):
    be = EmuCuda(cfg(**{"attention_prefill.variant": "gemm", "attention_prefill.block_q": block_q}))
    rng = np.random.default_rng(T * 7 + pos0)
    cache = be.new_kv_cache(1, pos0 + T + 3, Hkv, D)
    L = pos0 + T
    cache.k[0][:L] = rng.standard_normal((L, Hkv, D))
    cache.v[0][:L] = rng.standard_normal((L, Hkv, D))
    cache.k[0][L:] = np.nan  # slots past the keys must never be read
    cache.v[0][L:] = np.nan
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    out = be.ops.attention(be.upload(q), cache, 0, pos0)
    ref = attention_ref(q, cache.k[0][:L], cache.v[0][:L], pos0)
    check(np.asarray(out), ref, 5e-5)
    passes = -(-T // min(block_q, T))
    assert sum(k.kernel == "attg_softmax" for k in be.launches) == passes
    assert len(be.gemms) == 2 * passes
    for args, _kw in be.gemms:  # key counts a multiple of 8: cuBLAS tensor-op alignment
        assert args[2] % 8 == 0 or args[4] % 8 == 0


def test_attention_gemm_pass_shrinks_for_long_caches(monkeypatch):
    be = EmuCuda(cfg(**{"attention_prefill.variant": "gemm", "attention_prefill.block_q": 1024}))
    monkeypatch.setattr(EmuCuda, "ATTN_GEMM_SCORE_BYTES", 4 * 2 * 40 * 16)  # 16 query rows
    rng = np.random.default_rng(3)
    T, H, Hkv, D, pos0 = 37, 2, 1, 32, 3
    cache = be.new_kv_cache(1, 40, Hkv, D)
    cache.k[0][:] = rng.standard_normal(cache.k[0].shape)
    cache.v[0][:] = rng.standard_normal(cache.v[0].shape)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    out = be.ops.attention(be.upload(q), cache, 0, pos0)
    check(np.asarray(out), attention_ref(q, cache.k[0], cache.v[0], pos0), 5e-5)
    assert sum(k.kernel == "attg_softmax" for k in be.launches) == 3  # 16 + 16 + 5 rows


@pytest.mark.parametrize("fuse", [0, 1])
def test_resident_copy_once_and_fp16_forms_reused(fuse):
    be = EmuCuda(cfg(**{"matmul_prefill.variant": "resident", "matmul_prefill.fuse_f16": fuse}))
    rng = np.random.default_rng(fuse)
    T, K = 33, 96
    nw = be.load_weight(qtensor(rng, (K,), "F32"))
    qts = [qtensor(rng, (n, K), "F32", std=0.05) for n in (67, 5, 130)]
    ws = [be.load_weight(qt) for qt in qts]
    before = [w.nbytes for w in ws]
    h = be.ops.rms_norm(be.upload(rng.standard_normal((T, K)).astype(np.float32)), nw, 1e-6)
    for _ in range(2):  # q, k, v twice: one copy per weight, one fp16 form of h
        ys = [be.ops.matmul(h, w) for w in ws]
    for y, qt in zip(ys, qts, strict=True):
        check(np.asarray(y), np.asarray(h, np.float64) @ dense(qt).T, 1e-5)
    names = [k.kernel for k in be.launches]
    assert names.count("dequant_f16_f32") == 3
    assert names.count("f32_to_f16") == (0 if fuse else 1)
    plain = names.count("rms_norm") + names.count("rms_norm_row")  # rms_norm.warp / .block
    assert names.count("rms_norm_f16") == fuse and plain == 1 - fuse
    assert [w.nbytes - b for w, b in zip(ws, before, strict=True)] == [
        2 * n * K for n in (67, 5, 130)
    ]
    g = be.ops.swiglu(ys[0], ys[0])
    assert ("swiglu_f16" in {k.kernel for k in be.launches}) == bool(fuse)
    be.ops.matmul(g, be.load_weight(qtensor(rng, (3, 67), "F32")))
    assert [k.kernel for k in be.launches].count("f32_to_f16") == (0 if fuse else 2)


def test_fp16_form_dropped_when_memory_is_rewritten():
    be = EmuCuda(cfg(**{"matmul_prefill.variant": "resident"}))
    rng = np.random.default_rng(9)
    x = be.upload(rng.standard_normal((40, 64)).astype(np.float32))
    w = be.load_weight(qtensor(rng, (64, 64), "F32", std=0.1))
    be.ops.matmul(x, w)
    assert be._f16 and be._f16[-1][0].data.ptr == x.data.ptr
    be.matmul_into(be.upload(rng.standard_normal((40, 64)).astype(np.float32)), w, x)
    assert not any(e[0].data.ptr == x.data.ptr for e in be._f16), "a stale fp16 form"
    y = be.ops.matmul(x, w)
    wd = np.asarray(w.raw).view(np.float32).astype(np.float64)
    check(np.asarray(y), np.asarray(x, np.float64) @ wd.T, 1e-5)


def test_new_paths_are_opt_in():
    """The registry defaults stay staged GEMMs and flash attention; the new paths build their
    own modules only when chosen, and attention.cu (decode attention) is built either way."""
    from engine.backends.cuda import kernels

    d = TuningConfig.default("cuda")
    assert d.op("matmul_prefill").variant == "staged"
    assert d.op("attention_prefill").variant == "flash"
    mods = kernels.modules_for(d)
    assert "prefill_f16" not in mods and "attention_gemm" not in mods
    new = kernels.modules_for(
        cfg(**{"matmul_prefill.variant": "resident", "attention_prefill.variant": "gemm"})
    )
    assert new["attention"] == mods["attention"]
    assert new["attention_gemm"] == ("attention_gemm.cu", {})
    assert new["prefill_f16"] == ("prefill_f16.cu", {})


@pytest.mark.parametrize("bq,bk", [(32, 32), (64, 64), (128, 128)])
@pytest.mark.parametrize("D", [32, 64, 96, 128, 80, 256])
def test_flash_tc_launch_and_fallback(bq, bk, D):
    """flash_tc launches attn_tc_d<D> (grid, block, shared bytes as attention_tc.cu says) for
    its head dims and the gemm variant's kernels for the others."""
    be = FakeCuda(
        cfg(**{"attention_prefill.variant": "flash_tc", "attention_prefill.block_q": bq,
               "attention_prefill.block_k": bk})
    )  # fmt: skip
    T, H, Hkv, pos0 = 70, 6, 2, 5
    cache = be.new_kv_cache(1, pos0 + T, Hkv, D)
    be.ops.attention(be.upload(np.zeros((T, H, D), np.float32)), cache, 0, pos0)
    names = [k.kernel for k in be.launches]
    if D in (32, 64, 96, 128):
        assert names == [f"attn_tc_d{D}"]
        k = be.launches[0]
        assert k.grid[:2] == (-(-T // bq), H) and k.block[0] == bq // 16 * 32
        assert k.defines == {"BLOCK_Q": bq, "BLOCK_K": bk}
        assert float(k.args[-1]) == pytest.approx(1.4426950408889634 / np.sqrt(D), rel=1e-6)
        assert isinstance(k.args[4], np.uint64)  # no fp16 copy of out outside resident
    else:
        assert names[:2] == ["attg_pack_q", "attg_pack_kv"] and "attg_softmax" in names


def test_ffn_gate_up_in_one_gemm_and_views_shared():
    """Under resident + fuse_f16 a prefill chunk's ffn runs gate and up as one GEMM over one
    [2F, K] fp16 buffer; the unfused path afterwards reads the same copies (no new dequant)."""
    be = EmuCuda(cfg(**{"matmul_prefill.variant": "resident"}))
    rng = np.random.default_rng(4)
    T, C, F = 40, 64, 96
    qg, qu, qd = (qtensor(rng, s, "F32", std=0.1) for s in ((F, C), (F, C), (C, F)))
    gate, up, down = (be.load_weight(q) for q in (qg, qu, qd))
    h = rng.standard_normal((T, C)).astype(np.float32)
    r = rng.standard_normal((T, C)).astype(np.float32)
    out = np.asarray(be._ffn(be.upload(h), gate, up, down, be.upload(r)))
    g64, u64 = h.astype(np.float64) @ dense(qg).T, h.astype(np.float64) @ dense(qu).T
    ref = r + (g64 / (1 + np.exp(-g64)) * u64) @ dense(qd).T
    check(out, ref, 1e-5)
    assert [a[2] for a, _ in be.gemms[:1]] == [2 * F]  # m of the first GEMM: gate and up
    assert up.f16.data.ptr == gate.f16.data.ptr + F * C * 2
    n_deq = [k.kernel for k in be.launches].count("dequant_f16_f32")
    assert n_deq == 3
    be.ops.swiglu(
        be.ops.matmul(be.upload(h), gate), be.ops.matmul(be.upload(h), up)
    )  # the hooks' path
    assert [k.kernel for k in be.launches].count("dequant_f16_f32") == n_deq
    # copies made apart (that path first) are not paired: ffn then takes two GEMMs
    be2 = EmuCuda(cfg(**{"matmul_prefill.variant": "resident"}))
    g2, u2, d2 = (be2.load_weight(q) for q in (qg, qu, qd))
    be2.ops.matmul(be2.upload(h), g2)
    out2 = np.asarray(be2._ffn(be2.upload(h), g2, u2, d2, be2.upload(r)))
    check(out2, ref, 1e-5)
    assert all(a[2] != 2 * F for a, _ in be2.gemms)


def test_flash_tc_shared_memory_constraint():
    """block_q 128 with block_k 128 needs 104,448 bytes of shared memory: allowed on an H200
    (232,448 opt-in), refused on an sm_89 card (101,376), naming the rule."""
    from engine.backends.base import DeviceInfo

    big = cfg(**{"attention_prefill.variant": "flash_tc", "attention_prefill.block_q": 128,
                 "attention_prefill.block_k": 128})  # fmt: skip
    h200 = DeviceInfo(
        "cuda", "H200", "nvidia", "h200", extra={"cc": 90, "smem_per_block_optin": 232448}
    )
    ada = DeviceInfo("cuda", "L4", "nvidia", "l4", extra={"cc": 89, "smem_per_block_optin": 101376})
    assert big.problems(h200) == []
    assert any("shared tiles" in p for p in big.problems(ada))
    assert cfg(**{"attention_prefill.variant": "flash_tc"}).problems(ada) == []


def test_flash_tc_stores_the_o_projection_input_under_resident():
    be = FakeCuda(cfg(**{"attention_prefill.variant": "flash_tc",
                         "matmul_prefill.variant": "resident"}))  # fmt: skip
    T, H, D = 40, 4, 64
    cache = be.new_kv_cache(1, T, 2, D)
    out = be.ops.attention(be.upload(np.zeros((T, H, D), np.float32)), cache, 0, 0)
    outh = be.launches[-1].args[4]
    assert outh.dtype == np.uint16 and outh.shape == (T, H * D)
    assert be._to_f16(out.reshape(T, H * D)) is outh  # the o projection reuses it
    assert [k.kernel for k in be.launches] == ["attn_tc_d64"]


def test_kernels_are_looked_up_once_per_config():
    """CudaBackend._fn keeps each RawKernel: RawModule.get_function builds a new one per call."""
    from engine.backends.cuda.backend import CudaBackend

    class Module:
        calls = 0

        def get_function(self, name: str) -> tuple:
            Module.calls += 1
            return ("kernel", name)

    be = CudaBackend.__new__(CudaBackend)  # no GPU: only the lookup is exercised
    be._k, be._fns = {"m": Module()}, {}
    assert be._fn("m", "a") is be._fn("m", "a")
    be._fn("m", "b")
    assert Module.calls == 2


@pytest.mark.parametrize("bias", [True, False])
def test_attn_in_one_gemm_under_resident_and_fuse_kv(bias):
    """resident + fuse_f16 + rope.fuse_kv: a prefill chunk's q, k, v are one GEMM over one
    fp16 buffer and rope_kv_rows (strided rows of that GEMM); q and the cache equal the NumPy
    backend's unfused attn_in."""
    from engine.backends.numpy_ref import NumpyBackend

    be = EmuCuda(cfg(**{"matmul_prefill.variant": "resident", "rope.fuse_kv": 1}))
    rng = np.random.default_rng(int(bias))
    T, C, H, Hkv, D, pos0 = 40, 64, 4, 2, 16, 3
    qts = [qtensor(rng, (n * D, C), "F32", std=0.1) for n in (H, Hkv, Hkv)]
    bts = [qtensor(rng, (n * D,), "F32") for n in (H, Hkv, Hkv)] if bias else None
    h = rng.standard_normal((T, C)).astype(np.float32)
    ws = tuple(be.load_weight(q) for q in qts)
    bs = tuple(be.load_weight(b) for b in bts) if bias else None
    cache = be.new_kv_cache(1, pos0 + T + 2, Hkv, D)
    q = be._attn_in(AttnIn(be.upload(h), ws, bs, cache, 0, pos0, (H, Hkv, D), 1e4, True))
    nb = NumpyBackend()
    ncache = nb.new_kv_cache(1, pos0 + T + 2, Hkv, D)
    nws = tuple(nb.load_weight(x) for x in qts)
    nbs = tuple(nb.load_weight(x) for x in bts) if bias else None
    ref = nb._attn_in(AttnIn(h, nws, nbs, ncache, 0, pos0, (H, Hkv, D), 1e4, True))
    check(np.asarray(q), ref, 1e-5)
    check(np.asarray(cache.k[0]), ncache.k[0], 1e-5)
    check(np.asarray(cache.v[0]), ncache.v[0], 1e-5)
    assert [k.kernel for k in be.launches].count("rope_kv_rows") == 1
    assert len(be.gemms) == 1 and be.gemms[0][0][2] == (H + 2 * Hkv) * D
    assert ws[1].f16.data.ptr == ws[0].f16.data.ptr + H * D * C * 2  # row blocks of one copy
