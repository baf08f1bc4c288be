"""The CUDA backend's hybrid ops without a GPU (tests/cuda_fake.py): every launch the hybrid
schedule makes, through every knob of the hybrid ops, matches its kernel's signature and the
grid the kernel expects; whole tiny qwen35 / qwen35moe / qwen3next models run end to end through
the real host code; bad shapes are refused with a message naming the op; the registry names
the ops and knobs as the Vulkan backend does. The kernels themselves run in
tests/engine/backends/cuda/test_cuda_hybrid.py (-m gpu)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Backend
from engine.backends.cuda import hybrid as cuda_hybrid
from engine.backends.cuda.backend import CudaBackend
from engine.gguf_model import QTensor
from engine.hybrid import HYBRID_OPS, MOE_OPS
from engine.tuning import REGISTRY, TuningConfig
from tests.cuda_fake import FakeCuda, signatures
from tests.op_cases import qtensor

HYBRIDS = ["qwen35", "qwen35moe", "qwen3next"]
PROMPT = list(range(5, 5 + 37))
NORM_KERNELS = ("rms_norm", "rms_norm_row")  # rms_norm.warp, rms_norm.block


def cfg(**flat) -> TuningConfig:
    return TuningConfig.from_flat("cuda", flat)


def _f32(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


MOE_SHAPE = (8, 256, 512, 3)  # experts, ff, width, used: the schedule tests' MoE layer


def _moe_layer(be, seed: int, gate_type: str, down_type: str) -> tuple:  # noqa: ANN001
    """(rng, (gate, up, down)): random experts of MOE_SHAPE loaded on be."""
    rng = np.random.default_rng(seed)
    E, F, C, _ = MOE_SHAPE
    gate, up = (be.load_weight(qtensor(rng, (E, F, C), gate_type, 0.1)) for _ in range(2))
    return rng, (gate, up, be.load_weight(qtensor(rng, (E, C, F), down_type, 0.1)))


def _moe_call(be, rng, T: int, gate, up, down) -> None:  # noqa: ANN001
    """moe_experts of T tokens on a random routing, be.launches holding only its launches."""
    E, _, C, k = MOE_SHAPE
    be.launches.clear()
    ids = rng.integers(0, E, (T, k)).astype(np.int32)
    out = be.ops.moe_experts(_f32(rng, T, C), ids, _f32(rng, T, k), gate, up, down)
    assert out.shape == (T, C)


def test_every_hybrid_op_is_a_cuda_op_and_registered():
    for op in HYBRID_OPS + MOE_OPS:
        assert getattr(CudaBackend, "_" + op) is not getattr(Backend, "_" + op), op
        if op != "rope_partial":  # Vulkan runs it as its rope op
            assert REGISTRY.op("vulkan", op).name == op
        assert REGISTRY.op("cuda", op).variants, op


def test_shared_knobs_mean_what_they_mean_on_vulkan():
    """One name, one meaning: the variant and knob names the two backends share, with the
    same choices where the knob is the same thing."""
    for op, variant in (("delta_net", "sequential"), ("moe_experts", "dmmv")):
        assert REGISTRY.op("cuda", op).variant(variant) and REGISTRY.op("vulkan", op).variant(
            variant
        )
    for variant in ("sequential", "chunked"):
        cu = REGISTRY.op("cuda", "delta_net").variant(variant)
        vk = REGISTRY.op("vulkan", "delta_net").variant(variant)
        for knob in ("state_transposed", "max_dk"):
            assert cu.param(knob).choices == vk.param(knob).choices, (variant, knob)
        assert cu.numeric == vk.numeric == "order_only"
    cu = REGISTRY.op("cuda", "delta_net").variant("chunked").param("chunk")
    for backend in ("vulkan", "numpy"):
        other = REGISTRY.op(backend, "delta_net").variant("chunked").param("chunk")
        assert (cu.choices, cu.default) == (other.choices, other.default), backend


def test_signatures_are_parsed_for_every_kernel():
    from engine.backends.cuda import kernels

    for fname in ("delta_net.cu", "delta_net_chunked.cu", "hybrid.cu", "moe.cu", "dmmv.cu",
                  "elementwise.cu", "moe_tc.cu"):  # fmt: skip
        names = kernels.kernel_names(kernels.source(fname))
        sigs = signatures(fname)
        assert set(names) <= set(sigs), (fname, set(names) - set(sigs))
    assert len(signatures("delta_net.cu")["delta_net_seq"]) == 14
    chunked = signatures("delta_net_chunked.cu")
    assert chunked["delta_net_seq"] == signatures("delta_net.cu")["delta_net_seq"]
    assert len(chunked["delta_net_chunk_prep"]) == 18 and len(chunked["delta_net_chunk_scan"]) == 12
    assert len(signatures("moe.cu")["moe_q4_k"]) == 10
    assert len(signatures("moe_tc.cu")["moe_tc_gu_q6_k"]) == 11
    assert len(signatures("moe_tc.cu")["moe_tc_down_q4_0"]) == 9


def test_the_fake_refuses_a_wrong_launch():
    from tests.cuda_fake import check_args

    sig = signatures("hybrid.cu")["sigmoid_mul"]  # (float*, float*, float*, long long, int)
    x = np.zeros(4, np.float32)
    check_args("sigmoid_mul", sig, (x, x, x, np.int64(4), np.int32(1)))
    for bad in [(x, x, x, np.int32(4), np.int32(1)), (x, x, x, np.int64(4)),
                (x, x.astype(np.int32), x, np.int64(4), np.int32(1))]:  # fmt: skip
        with pytest.raises(AssertionError):
            check_args("sigmoid_mul", sig, bad)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("warps", [1, 2, 4, 8])
@pytest.mark.parametrize("max_dk,prefetch", [(64, 1), (128, 4), (256, 8)])
def test_delta_net_launch(warps, max_dk, prefetch, transposed):
    be = FakeCuda(
        cfg(**{"delta_net.warps": warps, "delta_net.max_dk": max_dk,
               "delta_net.state_transposed": transposed, "delta_net.prefetch": prefetch})
    )  # fmt: skip
    rng = np.random.default_rng(0)
    T, Hk, Hv, dk, dv = 3, 2, 6, min(40, max_dk), 33
    q, k = _f32(rng, T, Hk, dk), _f32(rng, T, Hk, dk)
    v, g, beta = _f32(rng, T, Hv, dv), _f32(rng, T, Hv), _f32(rng, T, Hv)
    out = be.ops.delta_net(q, k, v, g, beta, np.zeros((Hv, dk, dv), np.float32), "tiled", 1e-6)
    assert out.shape == (T, Hv, dv)
    (launch,) = be.launches
    assert launch.kernel == "delta_net_seq" and launch.fname == "delta_net.cu"
    assert launch.grid == (-(-dv // warps), Hv, 1) and launch.block == (32 * warps, 1, 1)
    want = {
        "WARPS": warps,
        "MAX_DK": max_dk,
        "STATE_TRANSPOSED": int(transposed),
        "PREFETCH": prefetch,
    }
    assert launch.defines == want
    assert int(launch.args[-2]) == 0  # tiled


@pytest.mark.parametrize("chunk", [4, 8, 16, 32, 64])
@pytest.mark.parametrize("threads,warps,transposed", [(64, 1, False), (128, 4, True),
                                                      (256, 8, True)])  # fmt: skip
def test_delta_net_chunked_schedule(chunk, threads, warps, transposed):
    """Prefill: the prep pass per (chunk, head), ragged last chunk included, then the scan per
    (column block, head) on the same state; decode (T = 1): the sequential kernel of the same
    module, with the same layout."""
    flat = {"delta_net.variant": "chunked", "delta_net.chunk": chunk, "delta_net.warps": warps,
            "delta_net.threads": threads, "delta_net.state_transposed": transposed}  # fmt: skip
    be = FakeCuda(cfg(**flat))
    rng = np.random.default_rng(3)
    Hk, Hv, dk, dv = 2, 6, 40, 33
    state = np.zeros((Hv, dk, dv), np.float32)
    for T in (chunk - 1, chunk, chunk + 1, 3 * chunk + 5, 1):
        be.launches.clear()
        q, k = _f32(rng, T, Hk, dk), _f32(rng, T, Hk, dk)
        v, g, beta = _f32(rng, T, Hv, dv), _f32(rng, T, Hv), _f32(rng, T, Hv)
        out = be.ops.delta_net(q, k, v, g, beta, state, "grouped", 1e-6)
        assert out.shape == (T, Hv, dv)
        want_defines = {"WARPS": warps, "MAX_DK": 128, "STATE_TRANSPOSED": int(transposed),
                        "CHUNK": chunk, "PREFETCH": 1}  # fmt: skip
        assert all(la.fname == "delta_net_chunked.cu" for la in be.launches)
        assert all(la.defines == want_defines for la in be.launches)
        if T == 1:
            (seq,) = be.launches
            assert seq.kernel == "delta_net_seq" and seq.args[5] is state
            assert seq.grid == (-(-dv // warps), Hv, 1) and int(seq.args[-2]) == 1
            continue
        prep, scan = be.launches
        nc = -(-T // chunk)
        assert prep.kernel == "delta_net_chunk_prep" and scan.kernel == "delta_net_chunk_scan"
        assert prep.grid == (nc, Hv, 1) and prep.block == (threads, 1, 1)
        assert scan.grid == (-(-dv // warps), Hv, 1) and scan.block == (32 * warps, 1, 1)
        w, y, gq, gk, p, gl = prep.args[5:11]
        assert w.shape == (Hv, T, dv) and y.shape == gq.shape == gk.shape == (Hv, T, dk)
        assert p.shape == (Hv, T, chunk) and gl.shape == (Hv, nc)
        assert all(a is b for a, b in zip(scan.args[:6], prep.args[5:11], strict=True))
        assert scan.args[6] is state and scan.args[7] is out
        assert [int(a) for a in prep.args[11:17]] == [T, Hk, Hv, dk, dv, 1]
        assert [int(a) for a in scan.args[8:]] == [T, Hv, dk, dv]


def test_delta_net_refuses_what_the_kernel_cannot_hold():
    be = FakeCuda(cfg(**{"delta_net.max_dk": 64}))
    rng = np.random.default_rng(0)
    q = _f32(rng, 2, 1, 128)
    v, g = _f32(rng, 2, 2, 32), _f32(rng, 2, 2)
    state = np.zeros((2, 128, 32), np.float32)
    with pytest.raises(ValueError, match="max_dk 64"):
        be.ops.delta_net(q, q, v, g, g, state, "grouped", 1e-6)
    be.set_config(cfg())
    with pytest.raises(ValueError, match="v_order"):
        be.ops.delta_net(q, q, v, g, g, state, "sideways", 1e-6)
    with pytest.raises(ValueError, match="state"):
        be.ops.delta_net(q, q, v, g, g, state[:1], "grouped", 1e-6)
    assert not be.launches


def _f32_weight(a: np.ndarray) -> QTensor:
    a = np.ascontiguousarray(a, np.float32)
    return QTensor("w", "F32", a.shape, a.view(np.uint8).reshape(-1, 4 * a.shape[-1]))


@pytest.mark.parametrize("threads", [128, 1024])
def test_conv_gates_gate_rope_router_launches(threads):
    be = FakeCuda(cfg(**{"ssm_conv.threads": threads, "router_topk.rows_per_block": 2}))
    rng = np.random.default_rng(1)
    w = be.load_weight(_f32_weight(_f32(rng, 300, 4)))
    be.ops.ssm_conv(_f32(rng, 5, 300), np.zeros((3, 300), np.float32), w)
    conv, state = be.launches
    assert (conv.kernel, state.kernel) == ("ssm_conv", "ssm_conv_state")
    assert state.grid[0] * state.block[0] >= 300 and conv.block[0] == threads
    with pytest.raises(ValueError, match="F32"):
        be.ops.ssm_conv(_f32(rng, 5, 32), np.zeros((31, 32), np.float32),
                    be.load_weight(qtensor(rng, (32, 32), "Q8_0")))  # fmt: skip
    with pytest.raises(ValueError, match="state"):
        be.ops.ssm_conv(_f32(rng, 5, 300), np.zeros((2, 300), np.float32), w)
    dt, sa = be.load_weight(_f32_weight(_f32(rng, 6))), be.load_weight(_f32_weight(_f32(rng, 6)))
    g, beta = be.ops.ssm_gates(_f32(rng, 7, 6), _f32(rng, 7, 6), dt, sa)
    assert g.shape == beta.shape == (7, 6)
    assert be.ops.sigmoid_mul(_f32(rng, 5, 1), _f32(rng, 5, 64)).shape == (5, 64)
    assert int(be.launches[-1].args[-1]) == 64  # a gate per row of 64
    assert be.ops.rope_partial(_f32(rng, 3, 2, 256), 7, 1e7, 64).shape == (3, 2, 256)
    with pytest.raises(ValueError, match="rope_partial"):
        be.ops.rope_partial(_f32(rng, 3, 2, 32), 0, 1e7, 33)
    ids, wts = be.ops.router_topk(_f32(rng, 5, 256), 8)
    assert ids.dtype == np.int32 and ids.shape == wts.shape == (5, 8)
    assert be.launches[-1].grid[0] == 3 and be.launches[-1].block[0] == 64
    with pytest.raises(ValueError, match="router_topk"):
        be.ops.router_topk(_f32(rng, 5, 2048), 8)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16", "BF16", "F32"])
def test_moe_launches_read_only_chosen_experts_by_device_ids(qtype, monkeypatch):
    monkeypatch.setattr(cuda_hybrid, "MAX_PAIRS", 4)  # a launch per 4 pairs: exercise p0
    be = FakeCuda(cfg(**{"moe_experts.rows_per_block": 8, "moe_experts.threads_per_row": 16}))
    rng = np.random.default_rng(2)
    E, F, C, T, k = 8, 256, 512, 5, 3
    gate, up = (be.load_weight(qtensor(rng, (E, F, C), qtype, 0.1)) for _ in range(2))
    down = be.load_weight(qtensor(rng, (E, C, F), qtype, 0.1))
    ids = rng.integers(0, E, (T, k)).astype(np.int32)
    out = be.ops.moe_experts(_f32(rng, T, C), ids, _f32(rng, T, k), gate, up, down)
    assert out.shape == (T, C)
    moe = [launch for launch in be.launches if launch.kernel.startswith("moe_")]
    suffix = qtype.lower()
    assert {m.kernel for m in moe} == {f"moe_{suffix}", "moe_combine"}
    mats = [m for m in moe if m.kernel != "moe_combine"]
    assert len(mats) == 3 * 4  # gate, up, down: 15 pairs in launches of 4
    for m in mats:
        assert m.block == (8 * 16, 1, 1) and m.args[6] is ids or np.array_equal(m.args[6], ids)
    assert [int(m.args[8]) for m in mats[:4]] == [0, 4, 8, 12]  # p0
    assert sum(m.grid[2] for m in mats[:4]) == T * k
    assert [int(m.args[5]) for m in mats] == [k] * 8 + [1] * 4  # x_div: x[t] for gate and up


@pytest.mark.parametrize("tile", [4, 8, 16, 32])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "F16"])
def test_moe_grouped_schedule(tile, qtype):
    """Prefill: one sort launch, one gather, a grouped launch per projection over enough tiles
    for every routing (z), sorted rows through SwiGLU and down, a scatter back to pair order,
    then the combine; decode (T = 1): moe.cu's DMMV with the same knobs."""
    be = FakeCuda(
        cfg(
            **{
                "moe_experts.variant": "grouped",
                "moe_experts.tile_pairs": tile,
                "moe_experts.rows_per_block": 2,
                "moe_experts.threads_per_row": 64,
            }
        )
    )
    E, F, C, k = MOE_SHAPE
    rng, ws = _moe_layer(be, 5, qtype, qtype)
    for T in (1, 2, 37):
        _moe_call(be, rng, T, *ws)
        names = [la.kernel for la in be.launches]
        suffix = qtype.lower()
        if T == 1:
            assert names == [f"moe_{suffix}", f"moe_{suffix}", "swiglu", f"moe_{suffix}",
                             "moe_combine"], names  # fmt: skip
            assert be.launches[0].defines == {"ROWS_PER_BLOCK": 2, "THREADS_PER_ROW": 64, "VEC": 2}
            assert be.launches[0].fname == "moe.cu"
            continue
        g = f"moe_grouped_{suffix}"
        assert names == ["moe_sort", "moe_gather", g, g, "swiglu", g, "moe_scatter",
                         "moe_combine"], names  # fmt: skip
        P = T * k
        max_tiles = -(-P // tile) + min(E, P)
        sort, gather = be.launches[:2]
        assert sort.grid == (1, 1, 1) and sort.block == (1024, 1, 1)
        route = sort.args[-1]
        assert route.dtype == np.int32 and route.size == 1 + 3 * max_tiles + P
        assert [int(a) for a in sort.args[1:4]] == [P, E, max_tiles]
        assert gather.args[1] is route and [int(a) for a in gather.args[2:6]] == [
            max_tiles,
            k,
            P,
            C,
        ]
        assert gather.grid[0] * 256 >= min(P * C, 65535 * 8 * 256)
        mats = [la for la in be.launches if la.kernel == g]
        for m, n in zip(mats, (F, F, C), strict=True):
            assert m.grid == (-(-n // 2), 1, max_tiles) and m.block == (128, 1, 1)
            assert m.args[5] is route and m.args[-1].shape == (P, n)
            assert m.defines == {
                "ROWS_PER_BLOCK": 2,
                "THREADS_PER_ROW": 64,
                "VEC": 2,
                "TILE_PAIRS": tile,
            }
        assert mats[0].args[4] is mats[1].args[4] is gather.args[-1]  # gate and up: sorted x
        scatter = be.launches[6]
        assert scatter.args[0] is mats[2].args[-1] and scatter.args[1] is route
        assert be.launches[7].args[0] is scatter.args[-1]


@pytest.mark.parametrize(("tile", "rows"), [(16, 64), (32, 128), (64, 64)])
@pytest.mark.parametrize("gate_type", ["Q4_K", "Q8_0"])
def test_moe_tc_schedule(tile, rows, gate_type):
    """moe_experts.tc at prefill: the sort, gate + up + SwiGLU in one launch into fp16 sorted
    rows, down from them into pair order, then the combine, over enough tiles for any routing;
    down of another block type (Q4_K_M's Q6_K) takes its own kernel. Decode, chunks shorter than
    prefill.gemm_min_t, float experts and gate / up of different types: moe.cu's DMMV with the
    variant's dmmv knobs."""
    be = FakeCuda(
        cfg(
            **{
                "moe_experts.variant": "tc",
                "moe_experts.tile_pairs": tile,
                "moe_experts.block_rows": rows,
                "moe_experts.rows_per_block": 2,
                "prefill.gemm_min_t": 2,
            }
        )
    )
    E, F, C, k = MOE_SHAPE
    rng, (gate, up, down) = _moe_layer(be, 6, gate_type, "Q6_K")
    for T in (1, 2, 37):
        _moe_call(be, rng, T, gate, up, down)
        names = [la.kernel for la in be.launches]
        g = gate_type.lower()
        if T == 1:
            assert names == [f"moe_{g}", f"moe_{g}", "swiglu", "moe_q6_k", "moe_combine"], names
            assert be.launches[0].defines == {"ROWS_PER_BLOCK": 2, "THREADS_PER_ROW": 32, "VEC": 2}
            continue
        assert names == ["moe_sort", f"moe_tc_gu_{g}", "moe_tc_down_q6_k", "moe_combine"], names
        P = T * k
        max_tiles = -(-P // tile) + min(E, P)
        sort, gu, dn, comb = be.launches
        assert all(la.fname == "moe_tc.cu" for la in (sort, gu, dn))
        assert gu.defines == dn.defines == {
            "TILE_PAIRS": tile, "BLOCK_ROWS": rows, "Q4K_WINDOW": 0, "WIDE_LOADS": 1, "DIRECT": 1,
        }  # fmt: skip
        route = sort.args[-1]
        assert route.size == 1 + 3 * max_tiles + P
        assert [int(a) for a in sort.args[1:4]] == [P, E, max_tiles]
        assert gu.grid == (-(-F // rows), max_tiles, 1) and gu.block == (128, 1, 1)
        assert dn.grid == (-(-C // rows), max_tiles, 1) and dn.block == (128, 1, 1)
        assert [int(a) for a in gu.args[3:5]] == [F, C] and int(gu.args[6]) == k
        assert [int(a) for a in dn.args[2:4]] == [C, F]
        h = gu.args[-1]
        assert h.dtype == np.uint16 and h.shape == (P, F) and dn.args[4] is h
        assert gu.args[7] is dn.args[5] is route and int(gu.args[8]) == int(dn.args[6]) == max_tiles
        assert dn.args[-1].shape == (P, C) and comb.args[0] is dn.args[-1]
    mixed = be.load_weight(qtensor(rng, (E, F, C), "Q4_0", 0.1))  # gate and up of two types
    for g_, u_ in ((gate, mixed), (be.load_weight(qtensor(rng, (E, F, C), "F16", 0.1)),) * 2):
        be.launches.clear()
        be.ops.moe_experts(_f32(rng, 5, C), rng.integers(0, E, (5, k)).astype(np.int32),
                       _f32(rng, 5, k), g_, u_, down)  # fmt: skip
        assert not any(la.kernel.startswith("moe_tc_") for la in be.launches)
        assert be.launches[-1].kernel == "moe_combine"
    be.set_config(be.config.replace(**{"prefill.gemm_min_t": 64}))  # a 37-token chunk: DMMV
    be.launches.clear()
    be.ops.moe_experts(_f32(rng, 37, C), rng.integers(0, E, (37, k)).astype(np.int32),
                   _f32(rng, 37, k), gate, up, down)  # fmt: skip
    assert [la.kernel for la in be.launches][:2] == [f"moe_{gate_type.lower()}"] * 2


@pytest.mark.parametrize("arch", HYBRIDS)
@pytest.mark.parametrize(
    "flat",
    [
        {"prefill.gemm_min_t": 1 << 20},
        {"prefill.gemm_min_t": 2, "matmul_prefill.variant": "mmq", "prefill.chunk_tokens": 16},
        {"delta_net.state_transposed": False, "delta_net.warps": 1, "prefill.chunk_tokens": 8,
         "prefill.gemm_min_t": 1 << 20, "matmul_decode.variant": "mmvq"},
        {"delta_net.variant": "chunked", "delta_net.chunk": 16, "prefill.chunk_tokens": 24,
         "moe_experts.variant": "grouped", "moe_experts.tile_pairs": 4},
        {"matmul_decode.variant": "mmvw", "rope.fuse_kv": 1, "prefill.gemm_min_t": 2,
         "matmul_prefill.variant": "mmq8"},
        {"matmul_decode.variant": "mmvw", "moe_experts.variant": "mmvq",
         "moe_experts.threads_per_row": 32, "prefill.gemm_min_t": 1 << 20},
        {"moe_experts.variant": "tc", "moe_experts.tile_pairs": 16, "prefill.chunk_tokens": 24,
         "prefill.gemm_min_t": 2, "matmul_prefill.variant": "mmq"},  # (no cuBLAS here)
    ],
    ids=["dmmv", "mmq", "chunks-mmvq", "chunked-grouped", "mmvw-mmq8", "mmvw-moe-q8", "tc"],
)  # fmt: skip
def test_tiny_hybrid_runs_through_the_cuda_host_code(tiny_model_factory, arch, flat):
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(**flat))
    m = build_model(open_model(tiny_model_factory(arch, "q4_k_m")), be)
    for path in ("per_token", "batched"):
        gen = m.generate(PROMPT, 3, path=path)
        assert len(gen.tokens) == 3
    run = be.kernels_run()
    want = {"delta_net_seq", "ssm_conv", "ssm_conv_state", "ssm_gates", "sigmoid_mul",
            "rope_partial"}  # fmt: skip
    if int(cfg(**flat).op("delta_net")["fuse_conv"]):  # decode: the conv folded into the step
        want.add("delta_net_conv_step")
    else:  # decode: delta_net / ssm_conv fused steps
        want |= {"delta_net_step", "ssm_conv_step"}
    if flat.get("delta_net.variant") == "chunked":  # (a decode step is delta_net_step)
        want = (want - {"delta_net_seq"}) | {"delta_net_chunk_prep", "delta_net_chunk_scan"}
    if arch != "qwen35" and flat.get("moe_experts.variant") == "grouped":
        want |= {"moe_sort", "moe_gather", "moe_scatter"}
        assert any(k.startswith("moe_grouped_") for k in run), run
    if arch != "qwen35" and flat.get("moe_experts.variant") == "tc":
        want |= {"moe_sort"}
        assert any(k.startswith("moe_tc_gu_") for k in run), run
        assert any(k.startswith("moe_tc_down_") for k in run), run
    if arch != "qwen35" and flat.get("moe_experts.variant") == "mmvq":
        assert any(k.startswith("moe_q8_gu_") for k in run), run  # gate + up + SwiGLU
        assert any(k.startswith("moe_q8_") and "_gu_" not in k for k in run), run  # down
        assert "quantize_q8_1" in run  # the SwiGLU output (and prefill's x) as Q8_1
    if arch != "qwen35":
        want |= {"router_topk", "moe_combine"}
        assert any(k.startswith(("moe_q", "moe_f", "moe_grouped_", "moe_tc_")) for k in run), run
        if flat.get("moe_experts.variant") != "mmvq":  # decode: fuse_decode's three kernels
            want |= {"moe_dec_route", "moe_dec_gate_up"}
            assert any(k.startswith("moe_dec_down") for k in run), run
    assert want <= run, want - run


def test_mmvw_decode_step_groups_the_hybrid_projections(tiny_model_factory):
    # qwen35 tiny: 3 delta-net layers, 1 attention layer, dense FFN. Per decode token under
    # mmvw: delta-net in-projections qkv + gate + beta | alpha (2 launches), ssm_out with the
    # residual (1), FFN gate + up (1) and down with the residual (1); the attention layer's
    # q + k + v (1), output (1) and FFN (2); the LM head (1): 20, against 32 one per matmul.
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(**{"matmul_decode.variant": "mmvw", "prefill.gemm_min_t": 1 << 20}))
    m = build_model(open_model(tiny_model_factory("qwen35", "q4_k_m")), be)

    def mmvw_launches(n: int) -> int:
        be.launches.clear()
        m.generate(PROMPT, n)
        return sum(launch.kernel == "mmvw" for launch in be.launches)

    assert mmvw_launches(3) - mmvw_launches(2) == 20
    per_token = [launch for launch in be.launches if launch.kernel == "mmvw"]
    assert all(int(launch.args[3]) + int(launch.args[4]) > 0 for launch in per_token)


def test_conv_fuse_step_runs_one_kernel_for_a_decode_token():
    # ssm_conv.fuse_step: a one-token call is ssm_conv_step (a thread per channel, the state
    # updated in the same kernel); longer calls keep ssm_conv + ssm_conv_state.
    be = FakeCuda(cfg(**{"ssm_conv.fuse_step": 1, "ssm_conv.threads": 128}))
    rng = np.random.default_rng(2)
    w = be.load_weight(_f32_weight(_f32(rng, 300, 4)))
    state = np.zeros((3, 300), np.float32)
    be.ops.ssm_conv(_f32(rng, 1, 300), state, w)
    (step,) = be.launches
    assert step.kernel == "ssm_conv_step" and step.grid[0] * step.block[0] >= 300
    be.launches.clear()
    be.ops.ssm_conv(_f32(rng, 2, 300), state, w)
    assert [launch.kernel for launch in be.launches] == ["ssm_conv", "ssm_conv_state"]


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_moe_fuse_decode_runs_a_layers_moe_ffn_in_three_launches(tiny_model_factory, arch):
    # moe_experts.fuse_decode: per decode token and MoE layer, route + gate_up + down (moe_dec.cu)
    # instead of the op-by-op schedule's fifteen launches; the chosen experts' ids, weights and
    # the shared expert's gate logit stay on the device, passed from route to the other two.
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory(arch, "q4_k_m")
    per_token, last = {}, {}
    for fuse in (0, 1):
        # dmmv: the op-by-op schedule counted below (the default mmvf groups the shared
        # expert's gate and up into one launch: 14, not 15)
        be = FakeCuda(cfg(**{"moe_experts.fuse_decode": fuse, "prefill.gemm_min_t": 1 << 20,
                             "matmul_decode.variant": "dmmv", "moe_experts.fuse_norm": 0,
                             "moe_experts.down_wsum": 0}))  # fmt: skip
        m = build_model(open_model(path), be)
        per_token[fuse] = len(_decode_launches(be, m))  # be.launches: all three tokens'
        last[fuse] = [x for x in be.launches if x.kernel.startswith("moe_dec_")]
    assert not last[0]
    assert per_token[0] - per_token[1] == 12 * m.spec.n_layers  # every tiny layer is MoE
    route, gate_up, down = last[1][-3:]
    assert [route.kernel, gate_up.kernel, down.kernel] == [
        "moe_dec_route", "moe_dec_gate_up", "moe_dec_down"]  # fmt: skip
    ids, w, logits = route.args[10], route.args[11], route.args[8]
    assert gate_up.args[7] is ids and down.args[7] is ids and down.args[8] is w
    assert down.args[14] is logits and down.args[0] is gate_up.args[15]  # h
    assert not isinstance(route.args[4], np.uint64) and not isinstance(down.args[10], np.uint64)


def test_delta_net_fuse_decode_runs_a_layers_step_in_one_launch(tiny_model_factory):
    # delta_net.fuse_decode: per decode token and delta-net layer, delta_net_step (gates, scan
    # step, gated norm) instead of ssm_gates + delta_net_seq + rms_norm + swiglu; with the conv
    # step fused too (ssm_conv.fuse_step, default), four launches fewer than the op by op.
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory("qwen35", "q4_k_m")
    per_token, kernels = {}, {}
    for fuse in (0, 1):
        flat = {"delta_net.fuse_decode": fuse, "ssm_conv.fuse_step": fuse,
                "delta_net.fuse_conv": 0}  # fmt: skip
        be = FakeCuda(cfg(**flat, **{"prefill.gemm_min_t": 1 << 20}))
        m = build_model(open_model(path), be)
        per_token[fuse] = len(_decode_launches(be, m))  # be.launches: all three tokens'
        kernels[fuse] = be.kernels_run()
    n_dn = sum(m.spec.is_recurrent(i) for i in range(m.spec.n_layers))
    assert per_token[0] - per_token[1] == 4 * n_dn
    assert {"delta_net_step", "ssm_conv_step"} <= kernels[1]
    assert "delta_net_step" not in kernels[0] and "ssm_conv_step" not in kernels[0]


def test_blame_names_a_hybrid_fusion_only_once_it_ran(tiny_model_factory):
    # hook_bypassed_fusions: the fused decode ops of the hybrids are named (for validate's blame
    # when the hooked, unfused replay agrees) only after this backend ran them: never for a
    # dense model, whose schedule has none of them
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(**{"prefill.gemm_min_t": 1 << 20}))
    assert be.hook_bypassed_fusions(cfg()) == []
    m = build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), be)
    m.generate(PROMPT, 2)
    assert be.hook_bypassed_fusions(cfg()) == ["delta_net", "rope_partial", "moe_experts"]
    off = {"delta_net.fuse_decode": 0, "rope_partial.fuse_qk": 0, "moe_experts.fuse_decode": 0}
    assert be.hook_bypassed_fusions(cfg(**off)) == []
    assert be.hook_bypassed_fusions(cfg(**{"moe_experts.variant": "mmvq"})) == [
        "delta_net", "rope_partial"]  # fmt: skip


def _moe_model(tiny_model_factory, flat: dict) -> tuple[FakeCuda, object]:
    """The tiny qwen35moe on a FakeCuda under flat: (backend, model)."""
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(**flat))
    return be, build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), be)


def _decode_launches(be, m, n: int = 3) -> list:
    """The launches of the n-th generated token (n - 1 tokens' launches subtracted)."""
    be.launches.clear()
    m.generate(PROMPT, n - 1)
    before = len(be.launches)
    be.launches.clear()
    m.generate(PROMPT, n)
    return be.launches[before:]


@pytest.mark.parametrize("v_order_arch", ["qwen35", "qwen3next"])
def test_delta_net_fuse_conv_runs_conv_and_step_in_one_launch(tiny_model_factory, v_order_arch):
    # delta_net.fuse_conv: per decode token and delta-net layer, delta_net_conv_step reads the
    # raw q/k/v projection (an mmvf output) and the layer's conv state itself: no ssm_conv_step
    # (nor the three column copies, which the fake does not count) and no delta_net_step.
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory(v_order_arch, "q4_k_m")
    per_token = {}
    for fuse in (0, 1):
        be = FakeCuda(cfg(**{"delta_net.fuse_conv": fuse, "prefill.gemm_min_t": 1 << 20}))
        m = build_model(open_model(path), be)
        step = _decode_launches(be, m)
        per_token[fuse] = len(step)
        names = [x.kernel for x in step]
        n_dn = sum(m.spec.is_recurrent(i) for i in range(m.spec.n_layers))
        if fuse:
            fused = [x for x in step if x.kernel == "delta_net_conv_step"]
            assert len(fused) == n_dn and "ssm_conv_step" not in names
            assert "delta_net_step" not in names
            ssm = m.spec.ssm
            Cc = 2 * ssm.key_dim + ssm.value_dim
            for x in fused:  # qkv: the raw projection row, the conv state [K-1, Cc]
                assert x.args[0].shape == (1, Cc) and x.args[1].shape == (ssm.d_conv - 1, Cc)
                assert x.grid[:2] == (ssm.head_v_dim // 4, ssm.n_v_heads)  # warps 4
                assert int(x.args[-3]) == (ssm.v_order == "grouped")
        else:
            assert names.count("ssm_conv_step") == names.count("delta_net_step") == n_dn
    assert per_token[0] - per_token[1] == n_dn


def test_delta_net_fuse_conv_leaves_prefill_and_hooked_runs_as_they_were(tiny_model_factory):
    # a prefill chunk (T > 1) and the hooked replay take the op-by-op schedule under the knob
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(**{"delta_net.fuse_conv": 1, "prefill.gemm_min_t": 1 << 20}))
    m = build_model(open_model(tiny_model_factory("qwen35", "q4_k_m")), be)
    be.launches.clear()
    m.prefill(PROMPT[:9], m.new_cache(16))
    names = {x.kernel for x in be.launches}
    assert "delta_net_conv_step" not in names and {"ssm_conv", "delta_net_seq"} <= names


def test_delta_net_fuse_ba_stacks_beta_and_alpha_into_one_mmvf_launch(tiny_model_factory):
    # delta_net.fuse_ba: a qwen35 decode row's four input projections in one mmvf launch, the
    # third matrix the [beta; alpha] stack (made once per layer, reused every token)
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory("qwen35", "q4_k_m")
    mmvf = {}
    for fuse in (0, 1):
        be = FakeCuda(cfg(**{"delta_net.fuse_ba": fuse, "prefill.gemm_min_t": 1 << 20}))
        m = build_model(open_model(path), be)
        step = _decode_launches(be, m)
        mmvf[fuse] = [x for x in step if x.kernel.startswith("mmvf")]
        if fuse:
            stacks = be._ba_stacks
            n_dn = sum(m.spec.is_recurrent(i) for i in range(m.spec.n_layers))
            assert len(stacks) == n_dn  # once per layer, not per token
            Hv, C = m.spec.ssm.n_v_heads, m.spec.n_embd
            for cat, beta, alpha in ((c, b(), a()) for c, b, a in stacks.values()):
                assert cat.shape == (2 * Hv, C) and cat.raw.shape[0] == 2 * Hv
                np.testing.assert_array_equal(cat.raw[:Hv], beta.raw)
                np.testing.assert_array_equal(cat.raw[Hv:], alpha.raw)
    n_dn = sum(m.spec.is_recurrent(i) for i in range(m.spec.n_layers))
    assert len(mmvf[0]) - len(mmvf[1]) == n_dn


def test_delta_net_fuse_ba_keeps_beta_and_alpha_apart_in_its_output():
    # the stacked product's halves come back as beta then alpha, each [1, Hv]
    be = FakeCuda(cfg(**{"delta_net.fuse_ba": 1}))
    rng = np.random.default_rng(5)
    C, Hv = 256, 6
    ws = tuple(be.load_weight(qtensor(rng, (n, C), "Q8_0")) for n in (40, 24, Hv, Hv))
    outs = be.ops.ssm_in(_f32(rng, 1, C), ws)
    assert [tuple(o.shape) for o in outs] == [(1, 40), (1, 24), (1, Hv), (1, Hv)]
    (launch,) = be.launches
    assert launch.kernel.startswith("mmvf")
    assert outs[2].base is outs[3].base is not None  # views of one [1, 2 Hv] product


def test_delta_net_fuse_ba_makes_no_stack_while_a_graph_is_captured():
    # a copy made during a capture would be a graph node (not done until a replay): the stack
    # waits for a call outside the capture, the captured call takes two launches
    be = FakeCuda(cfg(**{"delta_net.fuse_ba": 1}))
    rng = np.random.default_rng(6)
    ws = tuple(be.load_weight(qtensor(rng, (n, 256), "Q4_0")) for n in (40, 24, 5, 5))
    x = _f32(rng, 1, 256)
    be._capturing = True
    be.ops.ssm_in(x, ws)
    assert len(be.launches) == 2 and not be._ba_stacks
    be._capturing = False
    be.launches.clear()
    be.ops.ssm_in(x, ws)
    assert len(be.launches) == 1 and len(be._ba_stacks) == 1
    ws = None  # the weights gone: their stack with them
    import gc

    gc.collect()
    assert not be._ba_stacks


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_moe_fuse_norm_ends_each_moe_layer_with_the_next_layers_norm(tiny_model_factory, arch):
    # moe_experts.fuse_norm: every MoE layer but the last ends in moe_dec_down_norm, whose
    # normalised row is what the next layer's first projection reads; rms_norm launches go
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory(arch, "q4_k_m")
    per_token = {}
    for fuse in (0, 1):
        be = FakeCuda(cfg(**{"moe_experts.fuse_norm": fuse, "prefill.gemm_min_t": 1 << 20,
                             "moe_experts.down_wsum": 0}))  # fmt: skip
        m = build_model(open_model(path), be)
        step = _decode_launches(be, m)
        per_token[fuse] = len(step)
        downs = [i for i, x in enumerate(step) if x.kernel.startswith("moe_dec_down")]
        assert len(downs) == m.spec.n_layers
        names = [step[i].kernel for i in downs]
        if fuse:
            assert names == ["moe_dec_down_norm"] * (m.spec.n_layers - 1) + ["moe_dec_down"]
            for i in downs[:-1]:
                hn = step[i].args[-2]
                reads = [a for a in step[i + 1].args if isinstance(a, np.ndarray)]
                assert step[i + 1].kernel not in NORM_KERNELS
                assert any(np.shares_memory(a, hn) for a in reads)
        else:
            assert all(step[i + 1].kernel in NORM_KERNELS for i in downs[:-1])
    assert per_token[0] - per_token[1] == m.spec.n_layers - 1


@pytest.mark.parametrize("fuse_norm", [0, 1])
def test_moe_down_wsum_launches_one_down_kernel_with_or_without_the_norm(
    tiny_model_factory, fuse_norm
):
    # moe_experts.down_wsum: moe_dec_down_w serves both; its norm arguments null without
    flat = {"moe_experts.down_wsum": 1, "moe_experts.fuse_norm": fuse_norm,
            "prefill.gemm_min_t": 1 << 20}  # fmt: skip
    be, m = _moe_model(tiny_model_factory, flat)
    step = _decode_launches(be, m)
    downs = [x for x in step if x.kernel.startswith("moe_dec_down")]
    assert [x.kernel for x in downs] == ["moe_dec_down_w"] * m.spec.n_layers
    normed = [not isinstance(x.args[-4], np.uint64) for x in downs]
    assert normed == [bool(fuse_norm)] * (m.spec.n_layers - 1) + [False]


@pytest.mark.parametrize("fuse_norm", [0, 1])
@pytest.mark.parametrize("rows", [1, 4, 8])
def test_moe_down_split_launches_a_warp_per_expert_slot(tiny_model_factory, fuse_norm, rows):
    # moe_experts.down_split: moe_dec_down_s, a block of k (+ 1 shared) warps per rows_per_block
    # outputs, over down_wsum when both are on; topk_regs is the route's last argument
    flat = {"moe_experts.down_split": 1, "moe_experts.down_wsum": 1,
            "moe_experts.fuse_norm": fuse_norm, "moe_experts.rows_per_block": rows,
            "moe_experts.topk_regs": 1, "prefill.gemm_min_t": 1 << 20}  # fmt: skip
    be, m = _moe_model(tiny_model_factory, flat)
    step = _decode_launches(be, m)
    downs = [x for x in step if x.kernel.startswith("moe_dec_down")]
    assert [x.kernel for x in downs] == ["moe_dec_down_s"] * m.spec.n_layers
    k = int(downs[0].args[9])
    shared = not isinstance(downs[0].args[10], np.uint64)
    C = int(downs[0].args[18])
    for x in downs:
        assert x.block[0] == 32 * (k + int(shared)) and tuple(x.grid[:2]) == (-(-C // rows), 1)
    normed = [not isinstance(x.args[-4], np.uint64) for x in downs]
    assert normed == [bool(fuse_norm)] * (m.spec.n_layers - 1) + [False]
    routes = [x for x in step if x.kernel == "moe_dec_route"]
    assert routes and all(int(x.args[-1]) == 1 for x in routes)


def test_moe_gate_up_pair_launches_its_kernel_on_the_same_grid(tiny_model_factory):
    launches = {}
    for pair in (0, 1):
        flat = {"moe_experts.gate_up_pair": pair, "prefill.gemm_min_t": 1 << 20}
        be, m = _moe_model(tiny_model_factory, flat)
        launches[pair] = [x for x in _decode_launches(be, m) if "gate_up" in x.kernel]
    assert [x.kernel for x in launches[1]] == ["moe_dec_gate_up_p"] * m.spec.n_layers
    assert [(x.grid, x.block) for x in launches[1]] == [(x.grid, x.block) for x in launches[0]]


@pytest.mark.parametrize("threads", [128, 256])
def test_moe_route_block_launches_a_block_per_router_row(tiny_model_factory, threads):
    # moe_experts.route_block: moe_dec_route_r, E (+ 1: the shared expert's gate) blocks of
    # route_block threads, its ids / weights / logits the ones gate_up and down read
    flat = {"moe_experts.route_block": threads, "moe_experts.topk_regs": 1,
            "prefill.gemm_min_t": 1 << 20}  # fmt: skip
    be, m = _moe_model(tiny_model_factory, flat)
    step = _decode_launches(be, m)
    routes = [x for x in step if x.kernel.startswith("moe_dec_route")]
    assert [x.kernel for x in routes] == ["moe_dec_route_r"] * m.spec.n_layers
    for x in routes:
        E, shared = int(x.args[4]), not isinstance(x.args[3], np.uint64)
        assert x.block[0] == threads and tuple(x.grid[:2]) == (E + int(shared), 1)
        assert int(x.args[-1]) == 1  # topk_regs
    i = step.index(routes[0])
    gate_up, down = step[i + 1], step[i + 2]
    ids, w, logits = routes[0].args[8], routes[0].args[9], routes[0].args[6]
    assert gate_up.args[7] is ids and down.args[7] is ids and down.args[8] is w
    assert down.args[14] is logits


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
@pytest.mark.parametrize("threads", [0, 128])
def test_moe_fuse_pre_norm_folds_the_post_attention_norm_into_the_route(
    tiny_model_factory, arch, threads
):
    # moe_experts.fuse_pre_norm: the mixer's output projection is a plain matmul_add, the route
    # (moe_dec_route_rn, route_block threads or 256) reads the residual row and the
    # post-attention norm's weights and writes the normed row gate_up reads: one launch per
    # MoE layer fewer, no rms_norm between the projection and the route
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory(arch, "q4_k_m")
    per_token = {}
    for fuse in (0, 1):
        flat = {"moe_experts.fuse_pre_norm": fuse, "moe_experts.route_block": threads,
                "prefill.gemm_min_t": 1 << 20}  # fmt: skip
        be = FakeCuda(cfg(**flat))
        m = build_model(open_model(path), be)
        step = _decode_launches(be, m)
        per_token[fuse] = len(step)
        routes = [j for j, x in enumerate(step) if x.kernel.startswith("moe_dec_route")]
        assert len(routes) == m.spec.n_layers
        for j in routes:
            if fuse:
                assert step[j].kernel == "moe_dec_route_rn"
                assert step[j].block[0] == (threads or 256)
                assert step[j - 1].kernel.startswith("mmvf")  # the output projection
                hn = step[j].args[3]
                assert step[j + 1].kernel == "moe_dec_gate_up" and step[j + 1].args[0] is hn
                w = m.weights[f"blk.{routes.index(j)}.post_attention_norm.weight"]
                assert step[j].args[1] is w.f32
            else:
                assert step[j - 1].kernel in NORM_KERNELS
    assert per_token[0] - per_token[1] == m.spec.n_layers


def test_phase_profile_charges_the_fused_decode_kernels_to_their_phases(tiny_model_factory):
    # tools/profile_hybrid.py's phase at each CUDA launch of a decode step under the hdec
    # knobs: the conv-folded delta-net step to dn.scan, the stacked projections to dn.proj, the
    # MoE kernels (with the norm tail) to moe.fused
    import importlib.util
    from pathlib import Path

    from engine.gguf_model import open_model
    from engine.models import build_model

    path = Path(__file__).resolve().parents[4] / "tools" / "profile_hybrid.py"
    spec = importlib.util.spec_from_file_location("profile_hybrid", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    flat = {"delta_net.fuse_conv": 1, "delta_net.fuse_ba": 1, "moe_experts.fuse_norm": 1,
            "moe_experts.down_wsum": 0, "prefill.gemm_min_t": 1 << 20}  # fmt: skip
    be = FakeCuda(cfg(**flat))
    m = build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), be)
    m.generate(PROMPT, 2)  # (beta / alpha stacked by the prefill)
    tracker = mod.PhaseTracker(m)
    seen: dict[str, set] = {}
    launch = FakeCuda._launch

    def spy(self, mod_, name, *a, **kw):
        seen.setdefault(name, set()).add(tracker.phase)
        return launch(self, mod_, name, *a, **kw)

    try:
        FakeCuda._launch = spy
        m.forward(be.upload(np.array([3], np.int32)), 1, len(PROMPT) + 2, m.new_cache(64))
    finally:
        FakeCuda._launch = launch
        tracker.restore()
    assert seen["delta_net_conv_step"] == {"dn.scan"}
    assert {"moe_dec_route", "moe_dec_gate_up", "moe_dec_down_norm"} <= set(seen)
    for k in ("moe_dec_route", "moe_dec_gate_up", "moe_dec_down_norm", "moe_dec_down"):
        assert seen[k] == {"moe.fused"}, (k, seen[k])
    assert "dn.proj" in {p for k, ps in seen.items() if k.startswith("mmvf") for p in ps}


@pytest.mark.parametrize("pair", [0, 1])
def test_moe_l2_prefetch_hands_gate_up_the_down_matrices_its_slots_read(tiny_model_factory, pair):
    # moe_experts.l2_prefetch: gate_up (either kernel) gets the routed down stack and the
    # shared expert's down (the very arrays the down kernel reads), null pointers when off
    launches = {}
    for pf in (0, 1):
        flat = {"moe_experts.l2_prefetch": pf, "moe_experts.gate_up_pair": pair,
                "moe_experts.down_split": 1, "prefill.gemm_min_t": 1 << 20}  # fmt: skip
        be, m = _moe_model(tiny_model_factory, flat)
        launches[pf] = [x for x in _decode_launches(be, m) if x.kernel.startswith("moe_dec_")]
    off = [x for x in launches[0] if "gate_up" in x.kernel]
    assert off and all(isinstance(x.args[17], np.uint64) for x in off)
    assert all(isinstance(x.args[19], np.uint64) for x in off)
    step = launches[1]
    for i, x in enumerate(step):
        if "gate_up" not in x.kernel:
            continue
        down = step[i + 1]
        assert down.kernel == "moe_dec_down_s"
        assert x.args[17] is down.args[2] and int(x.args[18]) == int(down.args[3])  # D
        assert x.args[19] is down.args[10] and int(x.args[20]) == int(down.args[11])  # SD
    on = [x for x in step if "gate_up" in x.kernel]
    assert [(a.kernel, a.grid, a.block) for a in on] == [(a.kernel, a.grid, a.block) for a in off]


def test_moe_dec_wide_is_a_define_of_moe_dec_alone(tiny_model_factory):
    # moe_experts.dec_wide: DEC_WIDE in the moe_dec.cu build (qwide.cuh), moe.cu's defines
    # (the op-by-op DMMV's) untouched, so a trial of it does not rebuild moe.cu
    from engine.backends.cuda import kernels

    # (and dec_fcvt: DEC_FCVT, the same way)
    for variant in ("dmmv", "grouped", "tc"):
        mods = {}
        for wide, fcvt in ((0, 0), (1, 1), (2, 0)):
            flat = {"moe_experts.variant": variant, "moe_experts.dec_wide": wide,
                    "moe_experts.dec_fcvt": fcvt}  # fmt: skip
            mods[wide] = kernels.modules_for(cfg(**flat))
            assert mods[wide]["moe_dec"][1]["DEC_WIDE"] == wide
            assert mods[wide]["moe_dec"][1]["DEC_FCVT"] == fcvt
        assert mods[0]["moe"] == mods[1]["moe"] == mods[2]["moe"]
        assert not {"DEC_WIDE", "DEC_FCVT"} & set(mods[1]["moe"][1])
    flat = {"moe_experts.dec_wide": 2, "moe_experts.dec_fcvt": 1, "prefill.gemm_min_t": 1 << 20}
    be, m = _moe_model(tiny_model_factory, flat)
    decs = [x for x in _decode_launches(be, m) if x.kernel.startswith("moe_dec_")]
    assert decs and all(x.defines["DEC_WIDE"] == 2 and x.defines["DEC_FCVT"] == 1 for x in decs)


def test_moe_split_occupancy_launches_the_bounded_split_kernel(tiny_model_factory):
    # moe_experts.split_occupancy 3: moe_dec_down_s9 (k + shared <= 9 warps) on down_s's grid,
    # block and arguments
    # and 2: moe_dec_down_s9r8 on ceil(C / 8) blocks whatever rows_per_block
    launches = {}
    for occ in (0, 2, 3):
        flat = {"moe_experts.down_split": 1, "moe_experts.split_occupancy": occ,
                "prefill.gemm_min_t": 1 << 20}  # fmt: skip
        be, m = _moe_model(tiny_model_factory, flat)
        launches[occ] = [x for x in _decode_launches(be, m) if "down" in x.kernel]
    assert launches[0] and {x.kernel for x in launches[0]} == {"moe_dec_down_s"}
    assert {x.kernel for x in launches[3]} == {"moe_dec_down_s9"}
    assert {x.kernel for x in launches[2]} == {"moe_dec_down_s9r8"}
    assert all(x.block[0] <= 32 * 9 for x in launches[3] + launches[2])
    assert [(x.grid, x.block, len(x.args)) for x in launches[3]] == [
        (x.grid, x.block, len(x.args)) for x in launches[0]]  # fmt: skip
    C = int(launches[2][0].args[18])
    assert [x.grid[:2] for x in launches[2]] == [(-(-C // 8), 1)] * len(launches[2])
    assert [x.block for x in launches[2]] == [x.block for x in launches[0]]


@pytest.mark.parametrize("v_order_arch", ["qwen35", "qwen3next"])
@pytest.mark.parametrize("n,lanes", [(1, 8), (2, 16), (4, 8)])
def test_delta_net_step_cluster_launches_a_cluster_per_k_head(
    tiny_model_factory, v_order_arch, n, lanes
):
    # delta_net.step_cluster: per decode token and delta-net layer one dn_clu_r<rv> launch
    # (dn_clu.cu) in place of delta_net_conv_step, grid (n, Hv), dv / n columns of `lanes`
    # threads each in whole warps; prefill keeps the op-by-op schedule
    from engine.gguf_model import open_model
    from engine.models import build_model

    path = tiny_model_factory(v_order_arch, "q4_k_m")
    be = FakeCuda(cfg(**{"delta_net.step_cluster": n, "delta_net.step_lanes": lanes,
                         "prefill.gemm_min_t": 1 << 20}))  # fmt: skip
    m = build_model(open_model(path), be)
    step = _decode_launches(be, m)
    names = [x.kernel for x in step]
    ssm = m.spec.ssm
    rv = ssm.n_v_heads // ssm.n_k_heads
    n_dn = sum(m.spec.is_recurrent(i) for i in range(m.spec.n_layers))
    clu = [x for x in step if x.kernel == f"dn_clu_r{rv}"]
    assert len(clu) == n_dn and "delta_net_conv_step" not in names
    Cc = 2 * ssm.key_dim + ssm.value_dim
    for x in clu:
        assert x.args[0].shape == (1, Cc) and x.args[1].shape == (ssm.d_conv - 1, Cc)
        assert x.grid[:2] == (n, ssm.n_v_heads)
        assert x.block[0] == -(-(-(-ssm.head_v_dim // n) * lanes) // 32) * 32
        assert int(x.args[-2]) == (ssm.v_order == "grouped")
    be.launches.clear()
    m.prefill(PROMPT[:9], m.new_cache(16))
    assert not any(x.kernel.startswith("dn_clu") for x in be.launches)


def test_delta_net_step_cluster_falls_back_where_no_cluster_fits():
    # a cluster past 8 blocks (4 V heads per K head x 4), a block past 512 threads, below sm_90:
    # delta_net_conv_step's launch; otherwise the cluster kernel of that rv
    be = FakeCuda(cfg())
    c = cfg(**{"delta_net.step_cluster": 4, "delta_net.step_lanes": 32}).knobs("delta_net")
    assert be._dn_clu_launch(c, 4, 8, 128, 128) is None  # 32 columns x 32 lanes
    assert be._dn_clu_launch(c, 2, 8, 64, 64) is None  # rv 4 x 4 blocks
    assert be._dn_clu_launch(c, 4, 8, 64, 64) == ("dn_clu_r2", (4, 8), (512,))
    assert be._dn_clu_launch(c, 4, 12, 64, 64) is None  # rv 3
    be._cc = 89
    assert be._dn_clu_launch(c, 4, 8, 64, 64) is None


def test_delta_net_step_cluster_needs_sm_90():
    from engine.backends.base import DeviceInfo
    from engine.errors import ConfigError

    dev = {cc: DeviceInfo("cuda", "gpu", "nvidia", "gpu", extra={"cc": cc}) for cc in (80, 90)}
    c = cfg(**{"delta_net.step_cluster": 2})
    c.check(dev[90])
    cfg().check(dev[80])
    with pytest.raises(ConfigError, match="step_cluster"):
        c.check(dev[80])
