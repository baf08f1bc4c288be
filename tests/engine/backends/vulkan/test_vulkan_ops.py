"""Vulkan kernels beyond the shared differential suite (tests/engine/backends/test_backend_ops.py):
every
registered variant with a sample of parameter values (including MAX_COLS that do not divide T
and a required subgroup size), weights split into row ranges as the real LM head is, inputs
that are row views at an offset, and canaries after every output (pooled buffers are larger than
the tensors in them: a kernel writing past its end would clobber them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.gguf_model import QTensor
from engine.tuning import REGISTRY, TuningConfig
from tests.backend_contract import BackendContract
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    allowed_config,
    nmse,
    qtensor,
)
from tests.op_cases import attention_ref, dense, k_for

QUANTS = ["F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
CANARY = 0xFF  # bytes of a NaN pattern left in free buffers before each op


pytestmark = pytest.mark.usefixtures("clean_vb")


def poison_free_buffers(be, out_elems: int) -> None:  # noqa: ANN001
    """Make sure the pool holds free buffers of the output's size class, and fill every free
    buffer with the canary: the op's output lands in one of them."""
    spare = [be.alloc.new(4 * out_elems) for _ in range(4)]
    del spare
    for heap in be.alloc.free.values():
        for _, b in heap:
            if b.host is not None:
                b.host[:] = CANARY


def assert_canary_after(be, t) -> None:  # noqa: ANN001
    """Bytes of t's buffer after the tensor still hold the canary."""
    be.synchronize()
    b = t.buf
    if b.host is None:
        pytest.skip("canaries need host-visible (unified) memory")
    tail = b.host[4 * (t.offset + t.size) :]
    assert (tail == CANARY).all(), f"kernel wrote past its output ({(tail != CANARY).sum()} B)"


class TestVulkanContract(BackendContract):
    """The shared backend contract on Vulkan, with canaries in the pooled buffers each output
    lands in (where the memory is host-visible, as on lavapipe and unified-memory GPUs)."""

    backend = "vulkan"

    @pytest.fixture
    def be(self, vb):  # noqa: ANN201 - the module's backend (validation checked per test)
        return vb

    def poison(self, be, out_elems: int) -> None:  # noqa: ANN001
        poison_free_buffers(be, out_elems)

    def assert_canaries(self, be, out, args) -> None:  # noqa: ANN001
        if out.buf.host is not None:
            assert_canary_after(be, out)


def _sample(op: str, variant: str, label: str, **knobs: object) -> tuple[dict, str]:
    """(the flat config of op's variant with its knobs, label): one parameter sample."""
    return {f"{op}.variant": variant} | {f"{op}.{k}": v for k, v in knobs.items()}, label


def _dec(variant: str, label: str, **knobs: object) -> tuple[dict, str]:
    return _sample("matmul_decode", variant, label, **knobs)


def _pre(variant: str, label: str, **knobs: object) -> tuple[dict, str]:
    return _sample("matmul_prefill", variant, label, **knobs)


# Parameter samples per variant: (flat config, label). Values chosen to hit one row per
# workgroup, more rows than subgroups, threads_per_row of 1 and of the whole workgroup, a
# required subgroup size, and MAX_COLS that do not divide the column counts below.
DECODE = [
    _dec("block", "block-default"),
    _dec("block", "block-wg32-r1", wg_size=32, rows_per_wg=1, rows_per_thread=1),
    _dec(
        "block",
        "block-r16-tpr4-rpt4-sg8",
        wg_size=128,
        rows_per_wg=16,
        threads_per_row=4,
        rows_per_thread=4,
        subgroup_size=8,
    ),
    _dec("subgroup", "subgroup-default"),
    _dec("subgroup", "subgroup-wg32-r1", wg_size=32, rows_per_wg=1),
    _dec("subgroup", "subgroup-r16-sg8", wg_size=128, rows_per_wg=16, subgroup_size=8),
    _dec("shmem", "shmem-tpr1", threads_per_row=1, wg_size=32, rows_per_wg=4),
    _dec("shmem", "shmem-tpr64", threads_per_row=64, wg_size=64, rows_per_wg=2),
    _dec("shmem", "shmem-wg256-r16", threads_per_row=8, wg_size=256, rows_per_wg=16),
]
# Every weight type runs both prefill variants at a small MAX_COLS; the larger MAX_COLS samples
# (whose unrolled accumulator loops take lavapipe's LLVM seconds per pipeline) run on a block
# type and on a float type with a ragged row tail.
PREFILL = [
    _pre("kpar", "kpar-mc8", max_cols=8),
    _pre("serial", "serial-mc4-wg32", max_cols=4, wg_size=32),
    _pre("tiled", "tiled-m32-n16", tile_m=32, tile_n=16),
]
PREFILL_SAMPLES = [
    _pre("kpar", "kpar-default"),
    _pre("kpar", "kpar-mc40-r1", max_cols=40, wg_size=32, rows_per_wg=1),
    _pre("kpar", "kpar-mc1", max_cols=1),
    _pre("kpar", "kpar-mc24-sg8", max_cols=24, wg_size=128, rows_per_wg=16, subgroup_size=8),
    _pre("serial", "serial-default"),
    _pre("serial", "serial-mc64", max_cols=64, wg_size=32),
    _pre("serial", "serial-mc8-wg256", max_cols=8, wg_size=256),
    _pre("tiled", "tiled-default"),
    _pre("tiled", "tiled-vec4", vec4=True),
    _pre("tiled", "tiled-vec4-m128", vec4=True, tile_m=128),
    _pre("tiled", "tiled-m128-n32", tile_m=128, tile_n=32),
    _pre("tiled", "tiled-m32-n128", tile_m=32, tile_n=128),
]


def _check_matmuls(vb, rng: np.random.Generator, qtype: str, shapes: tuple) -> None:  # noqa: ANN001
    """Per (T, N, K in blocks): x [T, K] times a random qtype weight [N, K] against float64
    (NMSE 5e-4) with the freed buffers poisoned first, nothing written past the output."""
    for T, n, blocks in shapes:
        w = qtensor(rng, (n, k_for(qtype, blocks)), qtype)
        x = rng.standard_normal((T, w.shape[1])).astype(np.float32)
        xt, wv = vb.upload(x), vb.load_weight(w)
        poison_free_buffers(vb, x.shape[0] * n)
        y = vb.ops.matmul(xt, wv)
        out = vb.download(y)
        assert np.isfinite(out).all()
        assert nmse(x.astype(np.float64) @ dense(w).T, out) < 5e-4
        assert_canary_after(vb, y)


@pytest.mark.parametrize("flat", [p[0] for p in DECODE], ids=[p[1] for p in DECODE])
@pytest.mark.parametrize("qtype", QUANTS)
def test_matmul_decode_variants(vb, flat, qtype):
    vb.set_config(allowed_config(vb, flat))
    rng = np.random.default_rng(len(qtype))
    _check_matmuls(vb, rng, qtype, ((1, 1, 1), (1, 67, 3)))


@pytest.mark.parametrize(
    "flat,qtype",
    [pytest.param(f, q, id=f"{q}-{label}") for f, label in PREFILL for q in QUANTS]
    + [
        pytest.param(f, q, id=f"{q}-{label}")
        for f, label in PREFILL_SAMPLES
        for q in ("Q4_K", "F16")
    ],
)
def test_matmul_prefill_variants(vb, flat, qtype):
    vb.set_config(allowed_config(vb, flat))
    rng = np.random.default_rng(len(qtype) + 7)
    _check_matmuls(vb, rng, qtype, ((2, 33, 1), (41, 19, 2)))  # 41 columns: several MAX_COLS


@pytest.mark.parametrize("prefill", ["kpar", "tiled"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "F16", "Q6_K"])
def test_weights_split_into_row_ranges(vb, qtype, prefill):
    """A weight over maxStorageBufferRange is stored and dispatched in row ranges (the real
    Qwen LM head is 145 MB against lavapipe's 128 MiB): lower the limit to a few rows."""
    vb.set_config(allowed_config(vb, {"matmul_prefill.variant": prefill}))
    rng = np.random.default_rng(3)
    w = qtensor(rng, (50, k_for(qtype, 1)), qtype)
    old = vb.max_weight_bytes
    vb.max_weight_bytes = w.raw.shape[1] * 16 + 5  # 16 rows per range: 16 + 16 + 16 + 2
    try:
        wv = vb.load_weight(w)
    finally:
        vb.max_weight_bytes = old
    assert [p[2] for p in wv.parts] == [16, 16, 16, 2]
    ref = dense(w)
    for T in (1, 5):
        x = rng.standard_normal((T, w.shape[1])).astype(np.float32)
        out = vb.download(vb.ops.matmul(vb.upload(x), wv))
        assert nmse(x.astype(np.float64) @ ref.T, out) < 5e-4
    ids = np.array([0, 49, 15, 16, 33, 48], np.int32)  # both sides of every range boundary
    emb = vb.download(vb.ops.embedding(wv, vb.upload(ids)))
    assert nmse(ref[ids], emb) < 1e-10


# Block-variant samples for the ragged cases below: the default (a whole subgroup per row, two
# rows per lane), and clusters of 4 and 8 lanes with rows_per_wg not a multiple of the rows a
# workgroup covers per pass.
BLOCK = [
    _dec("block", "default"),
    _dec("block", "tpr4-rpt4-r8", threads_per_row=4, rows_per_thread=4, rows_per_wg=8),
    _dec(
        "block", "wg32-tpr8-r16", wg_size=32, threads_per_row=8, rows_per_thread=2, rows_per_wg=16
    ),
]


def _block_shapes(qtype: str) -> list[tuple[int, int]]:
    """(N, K): float rows 16-byte aligned (uvec4 loads), 4-byte aligned, odd-length (funnel
    shifts, ragged tail) and shorter than one group; block rows of 1-3 blocks (Q6_K rows of
    one 210-byte block start 2 bytes off a word every other row)."""
    if not qtype.startswith("Q"):
        return [(37, 128), (9, 100), (23, 37), (3, 5)]
    blk = 256 if qtype.endswith("_K") else 32
    return [(37, blk), (11, 2 * blk), (5, 3 * blk)]


@pytest.mark.parametrize("flat", [p[0] for p in BLOCK], ids=[p[1] for p in BLOCK])
@pytest.mark.parametrize("qtype", QUANTS)
def test_matmul_decode_block_ragged(vb, flat, qtype):
    """What the block variant's wide loads could get wrong: x at every offset mod 4 (a view
    into a larger buffer: vec4 loads only when aligned), float rows of any K, N not a multiple
    of the rows per workgroup or per lane, and weights in row ranges (7 rows each: the ranges'
    y offsets and a short last range)."""
    vb.set_config(allowed_config(vb, flat))
    rng = np.random.default_rng(len(qtype) * 31)
    for n, k in _block_shapes(qtype):
        w = qtensor(rng, (n, k), qtype)
        old = vb.max_weight_bytes
        vb.max_weight_bytes = w.raw.shape[1] * 7 + 3
        try:
            wv = vb.load_weight(w)
        finally:
            vb.max_weight_bytes = old
        assert [p[2] for p in wv.parts] == [7] * (n // 7) + ([n % 7] if n % 7 else [])
        ref_w = dense(w)
        for off in (0, 1, 2, 3):
            x = rng.standard_normal(k).astype(np.float32)
            buf = vb.upload(np.concatenate([[np.nan] * off, x, [np.nan] * 5]))  # NaN: no reads
            xt = vb.ops.reshape(vb.ops.rows(buf, off, off + k), (1, k))
            poison_free_buffers(vb, n)
            y = vb.ops.matmul(xt, wv)
            out = vb.download(y)
            assert np.isfinite(out).all(), f"N={n} K={k} x offset {off}"
            assert nmse(x[None].astype(np.float64) @ ref_w.T, out) < 5e-4, f"N={n} K={k} +{off}"
            assert_canary_after(vb, y)


def test_ops_on_row_views(vb):
    """Inputs that start inside a buffer (rows of a chunk) are read at their offset."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 256)).astype(np.float32)
    xt = vb.upload(x)
    w = qtensor(rng, (40, 256), "Q4_K")
    wv = vb.load_weight(w)
    out = vb.download(vb.ops.matmul(vb.ops.rows(xt, 5, 6), wv))  # T == 1 from the last row
    assert nmse(x[5:6].astype(np.float64) @ dense(w).T, out) < 5e-4
    out = vb.download(vb.ops.matmul(vb.ops.rows(xt, 2, 5), wv))
    assert nmse(x[2:5].astype(np.float64) @ dense(w).T, out) < 5e-4
    nw = vb.load_weight(qtensor(rng, (256,), "F32", std=1.0))
    normed = vb.download(vb.ops.rms_norm(vb.ops.rows(xt, 3, 4), nw, 1e-6))
    x64 = x[3:4].astype(np.float64)
    ref = (
        x64
        / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)
        * dense(
            QTensor(
                "n", "F32", (256,), np.asarray(nw.f32 and vb.download(nw.f32)).view(np.uint8)[None]
            )
        )
    )
    assert nmse(ref, normed) < 1e-10
    s = vb.download(vb.ops.add(vb.ops.rows(xt, 1, 3), vb.ops.rows(xt, 4, 6)))
    assert np.allclose(s, x[1:3] + x[4:6])
    ids = vb.upload(np.array([7, 3, 9, 1], np.int32))
    table = qtensor(rng, (10, 64), "Q8_0")
    emb = vb.download(vb.ops.embedding(vb.load_weight(table), vb.ops.rows(ids, 1, 3)))
    assert nmse(dense(table)[[3, 9]], emb) < 1e-12


@pytest.mark.parametrize(
    "op", ["rms_norm", "add", "swiglu", "rope", "attention", "argmax", "embedding", "kv_write"]
)
@pytest.mark.parametrize("wg", [32, 512])
def test_small_ops_at_workgroup_extremes(vb, op, wg):
    """The small ops at the smallest and largest registered workgroup size."""
    vb.set_config(allowed_config(vb, {f"{op}.wg_size": wg}))
    rng = np.random.default_rng(wg)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    if op == "rms_norm":
        nw = vb.load_weight(qtensor(rng, (64,), "F32", std=1.0))
        nwd = vb.download(nw.f32).astype(np.float64)
        out = vb.download(vb.ops.rms_norm(vb.upload(x), nw, 1e-5))
        x64 = x.astype(np.float64)
        ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-5) * nwd
    elif op == "add":
        out = vb.download(vb.ops.add(vb.upload(x), vb.upload(x * 2)))
        ref = x * 3.0
    elif op == "swiglu":
        out = vb.download(vb.ops.swiglu(vb.upload(x), vb.upload(x)))
        g = x.astype(np.float64)
        ref = g / (1 + np.exp(-g)) * g
    elif op == "rope":
        from engine.backends.numpy_ref import NumpyBackend

        out = vb.download(vb.ops.rope(vb.upload(x), 300, 1e4, False))
        ref = NumpyBackend().ops.rope(x, 300, 1e4, False)
    elif op == "argmax":
        lg = rng.standard_normal((3, 1000)).astype(np.float32)
        out = vb.download(vb.ops.argmax(vb.upload(lg)))
        assert out.tolist() == np.argmax(lg, -1).tolist()
        return
    elif op == "embedding":
        table = qtensor(rng, (9, 64), "Q4_0")
        ids = np.array([8, 0, 8], np.int32)
        out = vb.download(vb.ops.embedding(vb.load_weight(table), vb.upload(ids)))
        ref = dense(table)[ids]
    else:  # kv_write and attention
        from engine.backends.numpy_ref import NumpyBackend

        nb = NumpyBackend()
        q = rng.standard_normal((3, 4, 64)).astype(np.float32)
        kv = rng.standard_normal((3, 2, 64)).astype(np.float32)
        cv, cn = vb.new_kv_cache(1, 9, 2, 64), nb.new_kv_cache(1, 9, 2, 64)
        vb.ops.kv_write(cv, 0, vb.upload(kv), vb.upload(kv * 0.5), 2)
        nb.ops.kv_write(cn, 0, kv, kv * 0.5, 2)
        assert np.array_equal(vb.download(cv.v[0]), cn.v[0])
        out = vb.download(vb.ops.attention(vb.upload(q), cv, 0, 2))
        ref = nb.ops.attention(q, cn, 0, 2)
        # positions 0, 1 are zeros in both caches: they take part in the softmax identically
    assert nmse(ref, out) < 1e-9


# attention: split-KV with one range (written directly), ranges of one key (key_threads = wg_size),
# more ranges than keys (empty ones), threads beyond D idle in the value pass, several ranges for
# T > 1; and the online kernel.
ATTENTION = [
    ({}, "split-default"),
    ({"attention.splits": 1}, "split-s1-direct"),
    ({"attention.splits": 2, "attention.key_threads": 1, "attention.wg_size": 32}, "split-s2-kt1"),
    (
        {
            "attention.splits": 64,
            "attention.splits_prefill": 8,
            "attention.key_threads": 32,
            "attention.wg_size": 32,
        },
        "split-s64-kt32-wg32",
    ),
    (
        {"attention.splits": 8, "attention.key_threads": 16, "attention.wg_size": 512},
        "split-s8-wg512",
    ),
    ({"attention.splits_prefill": 4, "attention.key_threads": 2}, "split-prefill4"),
    ({"attention.variant": "online"}, "online-default"),
    ({"attention.variant": "online", "attention.wg_size": 32}, "online-wg32"),
]


@pytest.mark.parametrize("flat", [p[0] for p in ATTENTION], ids=[p[1] for p in ATTENTION])
@pytest.mark.parametrize(
    "T,H,Hkv,D,pos0",
    [
        (1, 7, 1, 80, 300),
        (1, 4, 4, 64, 4),
        (1, 14, 2, 128, 549),
        (6, 7, 1, 80, 45),
        (3, 2, 1, 256, 9),
    ],
)
def test_attention_variants(vb, flat, T, H, Hkv, D, pos0):
    """Each sample against NumPy, q read as a row view at an offset, and nothing written past
    the output (the split kernel's partials and merge must stay inside their buffers)."""
    cfg = allowed_config(vb, flat)
    if D > 8 * int(cfg.op("attention")["wg_size"]):
        pytest.skip(f"D {D} > 8 * wg_size: rejected by the op (UnsupportedError)")
    vb.set_config(cfg)
    rng = np.random.default_rng(T * 1000 + pos0)
    L = pos0 + T
    kc = rng.standard_normal((L + 2, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((L + 2, Hkv, D)).astype(np.float32)
    q = rng.standard_normal((T + 2, H, D)).astype(np.float32)
    cache = vb.new_kv_cache(1, L + 2, Hkv, D)
    vb.ops.kv_write(cache, 0, vb.upload(kc), vb.upload(vc), 0)  # keys beyond L must stay unseen
    vb.synchronize()  # the uploads are free buffers now: poisoning them must come after
    qt = vb.ops.rows(vb.upload(q), 1, T + 1)
    poison_free_buffers(vb, T * H * D)
    y = vb.ops.attention(qt, cache, 0, pos0)
    out = vb.download(y)
    assert np.isfinite(out).all()
    assert nmse(attention_ref(q[1 : T + 1], kc, vc, pos0), out) < 1e-9
    assert_canary_after(vb, y)


ARGMAX = [
    ({}, "two_stage-default"),
    ({"argmax.slices": 1}, "two_stage-s1"),
    ({"argmax.slices": 1024, "argmax.wg_size": 32}, "two_stage-s1024-wg32"),
    ({"argmax.slices": 8, "argmax.wg_size": 512}, "two_stage-s8-wg512"),
    ({"argmax.variant": "default"}, "default"),
]


@pytest.mark.parametrize("flat", [p[0] for p in ARGMAX], ids=[p[1] for p in ARGMAX])
def test_argmax_nan_inf_and_ties(vb, flat):
    """np.argmax's rule at every sample: the first maximum, the first NaN over any number, an
    all -inf row gives 0; ties straddling slices; a row read at an offset."""
    vb.set_config(allowed_config(vb, flat))
    lg = np.zeros((7, 1001), np.float32)
    lg[1, [5, 200]] = 3.0
    lg[2, 17] = np.nan
    lg[2, 3] = 9.0
    lg[2, 999] = np.nan
    lg[3] = -np.inf
    lg[4, [1000, 998]] = [np.inf, np.inf]
    lg[5] = -np.inf
    lg[5, [640, 1000]] = -1e30
    lg[6, 1000] = 1.0  # the last element of the last slice
    out = vb.download(vb.ops.argmax(vb.upload(lg)))
    assert out.tolist() == np.argmax(lg, -1).tolist() == [0, 5, 17, 0, 998, 640, 1000]
    rows = vb.ops.rows(vb.upload(lg), 4, 7)
    poison_free_buffers(vb, 3)
    y = vb.ops.argmax(rows)
    assert vb.download(y).tolist() == [998, 640, 1000]
    assert_canary_after(vb, y)


def test_required_subgroup_size_the_device_lacks_is_a_constraint(vb):
    dev = vb.device_info()
    bad = next(
        s
        for s in (8, 16, 32, 64, 128)
        if not dev.extra["min_subgroup_size"] <= s <= dev.extra["max_subgroup_size"]
    )
    cfg = TuningConfig.default("vulkan").replace(**{"matmul_decode.subgroup_size": bad})
    assert cfg.problems(dev), "registry must reject a subgroup size the device cannot require"
    with pytest.raises(ConfigError):
        vb.set_config(cfg)
    # still usable, still on the previous config
    w = qtensor(np.random.default_rng(0), (8, 32), "Q8_0")
    x = np.ones((1, 32), np.float32)
    assert nmse(x @ dense(w).T, vb.download(vb.ops.matmul(vb.upload(x), vb.load_weight(w)))) < 1e-6


def test_block_variant_constraints(vb):
    """The default decode variant is allowed here; a row's lanes must fit one subgroup, a lane's
    rows one workgroup's, and the device must have subgroup shuffles (the butterfly)."""
    dev = vb.device_info()
    base = TuningConfig.default("vulkan")
    assert base.op("matmul_decode").variant == "block" and not base.problems(dev)
    # Twice the subgroup (a registered value only where the subgroup is small: lavapipe's 8).
    too_wide = 2 * dev.subgroup_size
    if (
        too_wide
        in REGISTRY.op("vulkan", "matmul_decode").variant("block").param("threads_per_row").choices
    ):
        assert base.replace(**{"matmul_decode.threads_per_row": too_wide}).problems(dev)
    assert base.replace(**{"matmul_decode.rows_per_wg": 1}).problems(dev)  # rows_per_thread 2
    ops = dev.extra["subgroup_operations"] & ~0x10
    no_shuffle = dataclasses.replace(dev, extra={**dev.extra, "subgroup_operations": ops})
    assert base.problems(no_shuffle)
    assert not base.replace(**{"matmul_decode.variant": "subgroup"}).problems(no_shuffle)


def test_registry_tells_the_truth_about_quant_types(vb):
    from engine.tuning.variants.vulkan import QUANT_TYPES

    for op in ("matmul_decode", "matmul_prefill", "embedding"):
        for q in QUANTS:
            assert REGISTRY.supports("vulkan", op, q) == (q in QUANT_TYPES)
        assert not REGISTRY.supports("vulkan", op, "Q5_K")
    # and what it declares loads and runs
    rng = np.random.default_rng(9)
    for q in sorted(QUANT_TYPES):
        w = qtensor(rng, (3, k_for(q, 1)), q)
        x = rng.standard_normal((1, w.shape[1])).astype(np.float32)
        assert (
            nmse(x @ dense(w).T, vb.download(vb.ops.matmul(vb.upload(x), vb.load_weight(w)))) < 5e-4
        )


def test_tiled_vec4_needs_tiles_of_64(vb):
    base = TuningConfig.default("vulkan").replace(**{"matmul_prefill.vec4": True})
    dev = vb.device_info()
    assert not base.problems(dev)
    assert base.replace(**{"matmul_prefill.tile_m": 32}).problems(dev)
    assert base.replace(**{"matmul_prefill.tile_n": 16}).problems(dev)


def test_tiled_needs_256_threads(vb):
    dev = vb.device_info()
    small = dataclasses.replace(dev, extra={**dev.extra, "max_workgroup_invocations": 128})
    tiled = TuningConfig.default("vulkan")
    assert tiled.op("matmul_prefill").variant == "tiled" and not tiled.problems(dev)
    assert any(p.startswith("matmul_prefill.tiled: 256 threads") for p in tiled.problems(small))
    serial = tiled.replace(**{"matmul_prefill.variant": "serial"})
    assert not [p for p in serial.problems(small) if p.startswith("matmul_prefill")]
