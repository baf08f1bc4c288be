"""moe_experts.fuse_decode on the GPU (`pytest -m gpu`): a decode token's MoE FFN in three
launches (shaders/cuda/moe_dec.cu) against the NumPy reference and the op-by-op CUDA schedule,
on ragged shapes, every knob of the expert DMMV, mixed weight types (routed down Q6_K, shared
Q4_K), skewed routing, never-chosen experts poisoned with NaN, graph replay against eager
decode, and the planted unnormalised top-k rejected by validate and blamed on moe_experts."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.backends.plan import Moe
from engine.gguf_model import QTensor
from tests.engine.backends.cuda.test_cuda_ops import cfg
from tests.op_cases import check, qtensor

pytestmark = pytest.mark.gpu

PROMPT = [3, 17, 99, 5, 42, 7, 250, 11, 64, 2, 8, 1, 77, 31, 9, 120, 66, 4, 200, 13]
F32_PREFILL = {"prefill.gemm_min_t": 1 << 20}
KNOBS = [
    {},  # the default: route_vec, down_wsum
    {"moe_experts.route_vec": 0, "moe_experts.down_wsum": 0},  # the scalar route, moe_dec_down
    {"moe_experts.rows_per_block": 1, "moe_experts.threads_per_row": 128, "moe_experts.vec": 1},
    {"moe_experts.rows_per_block": 8, "moe_experts.threads_per_row": 16},
    {"moe_experts.rows_per_block": 2, "moe_experts.threads_per_row": 64, "moe_experts.vec": 1},
    {"moe_experts.rows_per_block": 1, "moe_experts.threads_per_row": 16},  # half a warp: NT 32
    # float4 router, short down rows
    {"moe_experts.route_vec": 1, "moe_experts.down_vec1": 1, "moe_experts.down_wsum": 0},
    {
        "moe_experts.route_vec": 1,
        "moe_experts.rows_per_block": 1,
        "moe_experts.threads_per_row": 128,
    },
    {"moe_experts.topk_regs": 0},  # the route's top-k from L2 each round (the default: regs)
    {"moe_experts.down_split": 1},  # a warp per expert slot, 4 outputs a block
    # 8 outputs a block (a partial last tile where C % 8), with the other route knobs
    {"moe_experts.down_split": 1, "moe_experts.rows_per_block": 8,
     "moe_experts.topk_regs": 1, "moe_experts.route_vec": 1},
    {"moe_experts.down_split": 1, "moe_experts.rows_per_block": 1,
     "moe_experts.threads_per_row": 64, "moe_experts.vec": 1},
    # a block per router row (moe_dec_route_r)
    {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1},
    {"moe_experts.route_block": 256, "moe_experts.down_split": 1,
     "moe_experts.threads_per_row": 64},
    # gate and up of an output sharing x's loads (moe_dec_gate_up_p)
    {"moe_experts.gate_up_pair": 1, "moe_experts.threads_per_row": 64},
]  # fmt: skip


def _f32w(a: np.ndarray, name: str = "w") -> QTensor:
    a = np.ascontiguousarray(a, np.float32)
    return QTensor(name, "F32", a.shape, a.view(np.uint8).reshape(-1, 4 * a.shape[-1]))


def _layer(rng, E, C, F, Fs, qe, qdown, qs, shared=True, skew=True, nan_experts=()):
    """Router (F32, skewed toward experts 0..3 when skew), routed experts, shared expert."""
    router = rng.standard_normal((E, C)).astype(np.float32) * 0.05
    if skew:
        router[:4] += 0.2  # most tokens pick the same few experts
    mats = []
    for shape, qt in (((E, F, C), qe), ((E, F, C), qe), ((E, C, F), qdown)):
        if nan_experts:  # float weights: a never-chosen expert of NaN poisons any read
            a = rng.standard_normal(shape).astype(np.float32) * 0.1
            a[list(nan_experts)] = np.nan
            mats.append(_f32w(a))
        else:
            mats.append(qtensor(rng, shape, qt, 0.1))
    sh = None
    if shared:
        sh = (
            _f32w(rng.standard_normal((1, C)).astype(np.float32) * 0.1),
            qtensor(rng, (Fs, C), qs, 0.1),
            qtensor(rng, (Fs, C), qs, 0.1),
            qtensor(rng, (C, Fs), qs, 0.1),
        )
    return _f32w(router), tuple(mats), sh


def _run(b, h, r, router, k, mats, sh):
    load = b.load_weight
    shared = None if sh is None else tuple(load(t) for t in sh)
    moe = Moe(load(router), k, tuple(load(m) for m in mats), shared)
    out = b._moe_ffn(b.upload(h), b.upload(r), moe)
    return b.download(out)


# (E, k, C, F, Fs, routed type, routed down type, shared type): ragged widths (F, Fs off every
# row tile), k up to the fold limit, the 35B-A3B's E / k, mixed down types (Q6_K routed down,
# Q4_K shared: not folded), a shared expert of another width.
SHAPES = [
    (8, 2, 512, 96, 96, "Q8_0", "Q8_0", "Q8_0"),
    (40, 8, 512, 256, 256, "Q4_K", "Q6_K", "Q4_K"),
    (256, 8, 512, 256, 256, "Q4_K", "Q4_K", "Q4_K"),
    (60, 11, 320, 160, 224, "Q4_0", "Q5_0", "Q4_1"),
    (16, 4, 256, 64, 64, "F16", "BF16", "F32"),
    # rows past 32 groups (F / 16 = 48, the shared Fs / 16 = 38: a lane walks two), odd k
    (20, 7, 256, 768, 608, "Q4_K", "Q4_K", "Q8_0"),
    # float experts, C = 100 (not a multiple of 8 outputs: a partial tile), E, k, F all odd
    (13, 3, 100, 40, 24, "F32", "F16", "BF16"),
]


@pytest.mark.parametrize("flat", KNOBS, ids=[f"knobs{i}" for i in range(len(KNOBS))])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"E{s[0]}k{s[1]}{s[5]}" for s in SHAPES])
@pytest.mark.parametrize("shared", [True, False])
def test_fused_moe_ffn_matches_numpy_and_the_op_by_op_schedule(be, shape, flat, shared):
    E, k, C, F, Fs, qe, qd, qs = shape
    rng = np.random.default_rng(E * 7 + k)
    router, mats, sh = _layer(rng, E, C, F, Fs, qe, qd, qs, shared)
    h, r = rng.standard_normal((2, 1, C)).astype(np.float32)
    ref = NumpyBackend()
    want = _run(ref, h, r, router, k, mats, sh)
    be.set_config(cfg(**flat))
    fused = _run(be, h, r, router, k, mats, sh)
    be.set_config(cfg(**flat, **{"moe_experts.fuse_decode": 0}))
    plain = _run(be, h, r, router, k, mats, sh)
    check(fused, want.astype(np.float64), 1e-10)
    # same rows, same reduction per row; only the router logits' and combine's order may differ
    assert np.allclose(fused, plain, rtol=1e-5, atol=1e-5)


def test_fused_moe_reads_only_the_chosen_experts(be):
    """Experts nobody chose hold NaN (the router's logits push them out of every top-k)."""
    rng = np.random.default_rng(3)
    E, k, C, F = 12, 3, 128, 64
    router, mats, sh = _layer(rng, E, C, F, F, "F32", "F32", "Q8_0", nan_experts=(5, 7, 11))
    rw = np.frombuffer(router.raw.tobytes(), np.float32).reshape(E, C).copy()
    rw[[5, 7, 11]] = 0.0
    h = np.abs(rng.standard_normal((1, C))).astype(np.float32)
    rw[[0, 1, 2, 3, 4, 6, 8, 9, 10]] += 0.05  # every other expert scores well above 0
    router = _f32w(rw)
    r = rng.standard_normal((1, C)).astype(np.float32)
    be.set_config(cfg())
    got = _run(be, h, r, router, k, mats, sh)
    want = _run(NumpyBackend(), h, r, router, k, mats, sh)
    check(got, want.astype(np.float64), 1e-10)


def _model(path, backend):
    from engine.gguf_model import open_model
    from engine.models import build_model

    return build_model(open_model(path), backend)


UNFUSED = {
    "moe_experts.fuse_decode": 0,
    "delta_net.fuse_decode": 0,
    "ssm_conv.fuse_step": 0,
    "rope_partial.fuse_qk": 0,
}


def _numpy_tokens_graph_equals_eager(be, mc, want, flat: dict, what: str) -> dict:  # noqa: ANN001
    """mc's 8-token decode of PROMPT under F32_PREFILL | flat, eager and replayed: NumPy's tokens
    (want), last logits at float32 noise, replay's step logits eager's to the bit. Returns the
    runs by use_graphs."""
    from engine.verify.validate import compare_logits

    be.set_config(cfg(**F32_PREFILL, **flat))
    runs = {}
    for graphs in (False, True):
        be.use_graphs = graphs
        runs[graphs] = mc.generate(PROMPT, 8, keep_logits=True)
    be.use_graphs = True
    for graphs, g in runs.items():
        assert g.tokens == want.tokens, (what, graphs)
        assert compare_logits(want.last_logits, g.last_logits)[2] < 1e-8, (what, graphs)
    for a, b in zip(runs[True].step_logits, runs[False].step_logits, strict=True):
        assert np.array_equal(a, b), f"graph replay differs from eager decode ({what})"
    return runs


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_fused_decode_model_matches_numpy_and_graph_equals_eager(be, tiny_model_factory, arch):
    # the default (fused MoE FFN, delta-net step, conv step, q/k prep) and the op-by-op
    # schedule: the tokens NumPy makes, logits at float32 noise, graph replay == eager decode
    path = tiny_model_factory(arch, "q4_k_m")
    mn, mc = _model(path, NumpyBackend()), _model(path, be)
    want = mn.generate(PROMPT, 8)
    runs = {
        fused: _numpy_tokens_graph_equals_eager(
            be, mc, want, {} if fused else UNFUSED, f"fused {fused}"
        )
        for fused in (True, False)
    }
    if arch == "qwen35":  # no MoE: the fused delta-net, conv and q/k steps are bit-identical
        for a, b in zip(runs[True][True].step_logits, runs[False][True].step_logits, strict=True):
            assert np.array_equal(a, b), "fused delta-net decode changed a bit"


def test_planted_unnormalised_route_is_rejected_and_blamed(be, tiny_model_factory):
    """The fused route's top-k weights never renormalised (MOE_DEC_UNNORMALISED, in
    moe_dec.cu only): validate rejects the default config and blames moe_experts' fusion."""
    from tests.mutants import Mutant, assert_validate_catches

    m = Mutant("MOE_DEC_UNNORMALISED", "cuda", "moe_experts",
               "the fused route's top-k weights are not renormalised", {})  # fmt: skip
    assert_validate_catches(m, tiny_model_factory("qwen35moe", "q4_k_m"))


def _tied_layer(rng, E, k, C, F):
    """Exact small-integer router rows (sums exact in any order) and h, so experts k - 1 and
    E - 2 tie exactly for the k-th place (the first k - 1 above, the rest below): ties go to
    the lower index, the NumPy reference's stable sort."""
    h = rng.integers(-2, 3, (1, C)).astype(np.float32)
    h[0, 0] = 4.0
    router = np.zeros((E, C), np.float32)
    router[:, 0] = 0.25 * (np.arange(E) % 3)  # the rest: logits 0, 1, 2 (each far below 8)
    router[: k - 1, 0] = 3.0 + 0.0625 * np.arange(k - 1)  # clear winners: logits 12 and up
    router[k - 1, 0] = router[E - 2, 0] = 2.75  # the tie: 11 = 11
    router[k - 1, 1:] = router[E - 2, 1:] = 0.0
    mats = tuple(qtensor(rng, s, "Q8_0", 0.1) for s in ((E, F, C), (E, F, C), (E, C, F)))
    return h, _f32w(router), mats


@pytest.mark.parametrize("E,k", [(40, 8), (256, 8), (300, 5)])
def test_topk_regs_breaks_ties_to_the_lower_index_like_numpy(be, E, k):
    rng = np.random.default_rng(E + k)
    C, F = 256, 64
    h, router, mats = _tied_layer(rng, E, k, C, F)
    r = rng.standard_normal((1, C)).astype(np.float32)
    want = _run(NumpyBackend(), h, r, router, k, mats, None)
    got = {}
    for regs in (0, 1):
        be.set_config(cfg(**{"moe_experts.topk_regs": regs}))
        got[regs] = _run(be, h, r, router, k, mats, None)
        check(got[regs], want.astype(np.float64), 1e-10)
    assert np.array_equal(got[0], got[1])  # same ids, same weights, same down kernel


def _with_mutant(be, name: str, flat: dict, body):
    """body(be) under config flat with only be's moe_dec module rebuilt with the planted <name>
    (these plants live in moe_dec.cu and the topk.cuh it includes): one module's build, where
    a planted backend rebuilds every module (minutes of a GPU suite for five tests)."""
    from engine.backends.cuda import kernels
    from tests.mutants import Mutant, planted

    be.set_config(cfg(**flat))
    fname, defines = kernels.modules_for(be.config)["moe_dec"]
    with planted(Mutant(name, "cuda", "moe_experts", name, {})):
        mod = kernels.module(be._cp, be._cc, fname, defines)
    be._k, be._fns, be._graph = {**be._k, "moe_dec": mod}, {}, None
    try:
        return body(be)
    finally:
        be.set_config(cfg())  # the production modules back (cached)


def _assert_caught(be, name: str, flat: dict, body, want: np.ndarray) -> None:  # noqa: ANN001
    """body(be) under the planted <name> (_with_mutant) is far from want."""
    bad = _with_mutant(be, name, flat, body)
    with pytest.raises(AssertionError):
        check(bad, want, 1e-10)


def _layer_case(shape: tuple, seed: int, skew: bool = True):  # noqa: ANN202
    """A random MoE layer of shape (SHAPES) and its input: (run(b) -> the layer on backend b,
    NumPy's result in float64)."""
    E, k, C, F, Fs, qe, qd, qs = shape
    rng = np.random.default_rng(seed)
    router, mats, sh = _layer(rng, E, C, F, Fs, qe, qd, qs, skew=skew)
    h, r = rng.standard_normal((2, 1, C)).astype(np.float32)

    def run(b):  # noqa: ANN001, ANN202
        return _run(b, h, r, router, k, mats, sh)

    return run, run(NumpyBackend()).astype(np.float64)


def test_planted_topk_regs_tie_to_the_higher_index_is_caught(be):
    """MOE_TOPK_REGS_TIE (topk.cuh, topk_row_regs only): the tie test's layer then
    differs from NumPy, while the scalar top-k (topk_regs 0) in the same build does not."""
    E, k, C, F = 40, 8, 256, 64
    rng = np.random.default_rng(E + k)
    h, router, mats = _tied_layer(rng, E, k, C, F)
    r = rng.standard_normal((1, C)).astype(np.float32)
    want = _run(NumpyBackend(), h, r, router, k, mats, None).astype(np.float64)
    _assert_caught(be, "MOE_TOPK_REGS_TIE", {"moe_experts.topk_regs": 1},
                   lambda b: _run(b, h, r, router, k, mats, None), want)  # fmt: skip
    ok = _with_mutant(be, "MOE_TOPK_REGS_TIE", {"moe_experts.topk_regs": 0},
                      lambda b: _run(b, h, r, router, k, mats, None))  # fmt: skip
    check(ok, want, 1e-10)


def test_planted_down_split_one_pass_is_caught_on_rows_past_32_groups(be):
    """MOE_DOWN_SPLIT_ONE_PASS (moe_dec_down_s: one group per lane, rows cut at 512):
    the F = 768 shape differs from NumPy; the 35B-A3B's F = 512 would not show it."""
    E, k = SHAPES[-2][:2]
    run, want = _layer_case(SHAPES[-2], E * 7 + k)
    _assert_caught(be, "MOE_DOWN_SPLIT_ONE_PASS", {"moe_experts.down_split": 1}, run, want)


DOWN_SPLIT = [
    {"moe_experts.down_split": 1, "moe_experts.topk_regs": 1, "moe_experts.route_vec": 1,
     "moe_experts.fuse_norm": 1},
    {"moe_experts.down_split": 1, "moe_experts.topk_regs": 1, "moe_experts.route_block": 128,
     "moe_experts.fuse_norm": 1, "moe_experts.rows_per_block": 8},
    {"moe_experts.down_split": 1, "moe_experts.topk_regs": 1, "moe_experts.route_block": 128,
     "moe_experts.fuse_pre_norm": 1},
]  # fmt: skip


@pytest.mark.parametrize("flat", DOWN_SPLIT, ids=["rv", "rb128", "rb128-pre"])
def test_down_split_model_matches_numpy_and_graph_equals_eager(be, tiny_model_factory, flat):
    # the whole tiny qwen35moe under the new knobs: NumPy's tokens, graph replay == eager
    path = tiny_model_factory("qwen35moe", "q4_k_m")
    want = _model(path, NumpyBackend()).generate(PROMPT, 8)
    _numpy_tokens_graph_equals_eager(be, _model(path, be), want, flat, "down_split")


def test_planted_route_block_half_row_is_caught(be):
    """MOE_ROUTE_BLOCK_HALF (moe_dec_route_r: a row's logit from its first warp only):
    other experts chosen, the layer differs from NumPy."""
    E, k = SHAPES[2][:2]  # 256 experts, top-8, C 512: 4 warps a row
    run, want = _layer_case(SHAPES[2], E * 7 + k, skew=False)
    flat = {"moe_experts.route_block": 128}
    _assert_caught(be, "MOE_ROUTE_BLOCK_HALF", flat, run, want)
    be.set_config(cfg(**flat))  # the production build of the same config passes
    check(run(be), want, 1e-10)


def _prenorm(b, x, pre, router, k, mats, sh, norm):
    ld = b.load_weight
    moe = Moe(ld(router), k, tuple(ld(m) for m in mats),
              None if sh is None else tuple(ld(t) for t in sh))  # fmt: skip
    out = b._moe_ffn_prenorm(b.upload(x), ld(pre), moe, None if norm is None else ld(norm), 1e-6)
    return tuple(b.download(o) for o in out) if norm is not None else (b.download(out),)


PRE_KNOBS = [
    {"moe_experts.route_block": 256},  # the rms_norm block's threads: to the bit
    {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1, "moe_experts.down_split": 1},
    {"moe_experts.route_block": 0, "moe_experts.fuse_norm": 0},  # 256 threads; norm apart
]


@pytest.mark.parametrize("knobs", PRE_KNOBS, ids=["rb256", "rb128-split", "rb0-nofn"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"E{s[0]}k{s[1]}{s[5]}" for s in SHAPES])
@pytest.mark.parametrize("scale", [1.0, 1e-4], ids=["x1", "tiny"])  # tiny: eps matters
def test_fuse_pre_norm_route_is_the_norm_then_the_moe_ffn(be, shape, knobs, scale):
    E, k, C, F, Fs, qe, qd, qs = shape
    rng = np.random.default_rng(E * 5 + k)
    router, mats, sh = _layer(rng, E, C, F, Fs, qe, qd, qs)
    pre, norm = (_f32w(rng.uniform(0.5, 1.5, C), nm) for nm in ("pre", "norm"))
    x = (rng.standard_normal((1, C)) * scale).astype(np.float32)
    ref = NumpyBackend()
    for nrm in (None, norm):
        want = _prenorm(ref, x, pre, router, k, mats, sh, nrm)
        be.set_config(cfg(**knobs, **{"moe_experts.fuse_pre_norm": 1}))
        got = _prenorm(be, x, pre, router, k, mats, sh, nrm)
        be.set_config(cfg(**knobs, **{"moe_experts.fuse_pre_norm": 0}))
        plain = _prenorm(be, x, pre, router, k, mats, sh, nrm)
        for g, p_, w_ in zip(got, plain, want, strict=True):
            check(g, np.asarray(w_, np.float64), 1e-10)
            if knobs["moe_experts.route_block"] == 256:  # rms_norm_row's sums, its threads
                assert np.array_equal(g, p_)
            else:
                assert np.allclose(g, p_, rtol=1e-5, atol=1e-5)


def test_planted_route_norm_without_eps_is_caught_on_a_tiny_row(be):
    """MOE_ROUTE_NORM_NO_EPS (moe_dec_route_rn: rsqrt(mean square) without eps): a row
    whose mean square is below eps differs from NumPy."""
    E, k, C, F, Fs, qe, qd, qs = SHAPES[1]
    rng = np.random.default_rng(11)
    router, mats, sh = _layer(rng, E, C, F, Fs, qe, qd, qs)
    pre = _f32w(np.ones(C), "pre")
    x = (rng.standard_normal((1, C)) * 1e-4).astype(np.float32)
    want = np.asarray(_prenorm(NumpyBackend(), x, pre, router, k, mats, sh, None)[0], np.float64)
    flat = {"moe_experts.fuse_pre_norm": 1, "moe_experts.route_block": 128}
    _assert_caught(be, "MOE_ROUTE_NORM_NO_EPS", flat,
                   lambda b: _prenorm(b, x, pre, router, k, mats, sh, None)[0], want)  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=[f"E{s[0]}k{s[1]}{s[5]}" for s in SHAPES])
@pytest.mark.parametrize(
    "knobs", [{}, {"moe_experts.threads_per_row": 16, "moe_experts.rows_per_block": 8,
                   "moe_experts.vec": 1}], ids=["t32", "t16v1"]
)  # fmt: skip
def test_gate_up_pair_is_gate_up_to_the_bit(be, shape, knobs):
    E, k, C, F, Fs, qe, qd, qs = shape
    rng = np.random.default_rng(E * 3 + k)
    router, mats, sh = _layer(rng, E, C, F, Fs, qe, qd, qs)
    h, r = rng.standard_normal((2, 1, C)).astype(np.float32)
    got = {}
    for pair in (0, 1):
        be.set_config(cfg(**knobs, **{"moe_experts.gate_up_pair": pair}))
        got[pair] = _run(be, h, r, router, k, mats, sh)
    assert np.array_equal(got[0], got[1])
    check(got[1], _run(NumpyBackend(), h, r, router, k, mats, sh).astype(np.float64), 1e-10)


def test_planted_gate_up_pair_swapped_runs_are_caught(be):
    """MOE_GATE_UP_PAIR_SWAP (dot_pair: each group's two runs meet the other's x)."""
    E, k = SHAPES[1][:2]
    run, want = _layer_case(SHAPES[1], E * 3 + k)
    _assert_caught(be, "MOE_GATE_UP_PAIR_SWAP", {"moe_experts.gate_up_pair": 1}, run, want)


# moe_experts.dec_wide (qwide.cuh: Q4_K / Q6_K groups from 16-byte loads), dec_fcvt (bytes to
# floats without I2F), l2_prefetch (gate_up prefetching the down matrices into L2) and
# split_occupancy (moe_dec_down_s9, moe_dec_down_s9r8) under
# each kernel they reach: the thread-row route / gate_up / down, the pair gate_up, the per-lane
# weighted-sum down, the split down (k + shared up to 12 warps: down_s9 only where <= 9)
WIDE_BASE = [
    {"moe_experts.route_vec": 0, "moe_experts.down_wsum": 0},  # moe_dec_down (rows folded)
    {},  # moe_dec_down_w
    {"moe_experts.route_block": 128, "moe_experts.down_split": 1, "moe_experts.gate_up_pair": 1},
    {"moe_experts.down_split": 1, "moe_experts.rows_per_block": 8, "moe_experts.vec": 1},
    {"moe_experts.down_vec1": 1, "moe_experts.down_wsum": 0, "moe_experts.threads_per_row": 64,
     "moe_experts.rows_per_block": 2},
]  # fmt: skip


@pytest.mark.parametrize("base", WIDE_BASE, ids=[f"base{i}" for i in range(len(WIDE_BASE))])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"E{s[0]}k{s[1]}{s[5]}" for s in SHAPES])
def test_dec_wide_and_l2_prefetch_are_bit_identical_and_match_numpy(be, shape, base):
    run, want = _layer_case(shape, shape[0] * 11 + shape[1])
    # (dec_wide, l2_prefetch, split_occupancy, dec_fcvt)
    got = {}
    keys = [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (1, 1, 0, 0), (0, 0, 0, 1), (2, 1, 0, 1),
            (1, 1, 0, 1)]  # fmt: skip
    if base.get("moe_experts.down_split"):  # moe_dec_down_s9 / _s9r8 (split_occupancy 3 / 2)
        keys += [(0, 0, 3, 0), (1, 1, 3, 0), (1, 1, 2, 0), (2, 1, 2, 1)]
    for wide, pf, occ, fcvt in keys:
        be.set_config(cfg(**base, **{"moe_experts.dec_wide": wide, "moe_experts.l2_prefetch": pf,
                                     "moe_experts.split_occupancy": occ,
                                     "moe_experts.dec_fcvt": fcvt}))  # fmt: skip
        got[wide, pf, occ, fcvt] = run(be)
    for key in keys:
        if key[2] == 2 and base.get("moe_experts.rows_per_block") != 8:
            check(got[key], want, 1e-10)  # 8 outputs a block: another split of the rows
            continue
        if key != keys[0]:
            assert np.array_equal(got[key], got[keys[0]]), key
    check(got[keys[0]], want, 1e-10)


def _assert_caught_under_knob(  # noqa: ANN001
    be, mutant: str, shape: tuple, seed: int, flat: dict, knob: str
) -> None:
    """The layer of shape (seeded) with mutant planted differs from NumPy under flat with knob
    1, and is right with knob 0 (the same build)."""
    run, want = _layer_case(shape, seed)
    _assert_caught(be, mutant, flat | {knob: 1}, run, want)
    ok = _with_mutant(be, mutant, flat | {knob: 0}, run)
    check(ok, want, 1e-10)


def test_planted_dec_wide_q6k_scale_is_caught(be):
    """MOE_DEC_WIDE_Q6_SCALE (qwide.cuh: an odd Q6_K group takes its pair's scale): the
    layer with a Q6_K routed down differs from NumPy under dec_wide, not under the narrow
    decode of the same build."""
    E, k = SHAPES[1][:2]
    flat = {"moe_experts.down_split": 1, "moe_experts.route_block": 128}
    mutant, knob = "MOE_DEC_WIDE_Q6_SCALE", "moe_experts.dec_wide"
    _assert_caught_under_knob(be, mutant, SHAPES[1], E * 13 + k, flat, knob)


def test_planted_dec_fcvt_unsigned_is_caught(be):
    """MOE_DEC_FCVT_UNSIGNED (qwide.cuh run_dot_x: every quant byte read 128 too high)
    under dec_fcvt; the I2F conversion (dec_fcvt 0) of the same build is right."""
    E, k = SHAPES[2][:2]
    flat = {"moe_experts.down_split": 1, "moe_experts.dec_wide": 2}
    mutant, knob = "MOE_DEC_FCVT_UNSIGNED", "moe_experts.dec_fcvt"
    _assert_caught_under_knob(be, mutant, SHAPES[2], E * 17 + k, flat, knob)


WIDE_MODEL = {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
              "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1,
              "moe_experts.dec_wide": 2, "moe_experts.l2_prefetch": 1,
              "moe_experts.dec_fcvt": 1}  # fmt: skip


def test_dec_wide_prefetch_model_matches_numpy_and_graph_equals_eager(be, tiny_model_factory):
    # the whole tiny qwen35moe (Q4_K_M: Q4_K experts, Q6_K downs in some layers) under the
    # new knobs: NumPy's tokens, graph replay == eager decode
    path = tiny_model_factory("qwen35moe", "q4_k_m")
    want = _model(path, NumpyBackend()).generate(PROMPT, 8)
    _numpy_tokens_graph_equals_eager(be, _model(path, be), want, WIDE_MODEL, "dec_wide")
