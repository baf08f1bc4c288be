"""The decode fusions of matmul_decode.mmvw without a GPU (tests/cuda_fake.py): fuse_swiglu and
fuse_norm reach the host schedule (mmvw_glu and mmvw_norm launched with their kernels'
signatures and grids, swiglu_q8 and all but the first and last rms_norm_q8 gone), their
defaults keep today's launches, and the knobs that are -D defines build mmvw.cu with them.
The kernels themselves run in tests/engine/backends/cuda/test_cuda_decode_fused.py (-m gpu)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.backends.cuda import kernels
from engine.tuning import TuningConfig
from tests.cuda_fake import FakeCuda

PROMPT = list(range(5, 5 + 12))
BASE = {"matmul_decode.variant": "mmvw", "rope.fuse_kv": 1}


def cfg(**flat) -> TuningConfig:
    return TuningConfig.from_flat("cuda", flat)


def _decode_launches(tiny_model_factory, flat: dict, steps: int = 3) -> tuple[FakeCuda, list]:
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(**flat))
    m = build_model(open_model(tiny_model_factory("qwen2", "q4_k_m")), be)
    cache = m.new_cache(len(PROMPT) + steps + 1)
    m.prefill(PROMPT, cache)
    be.launches.clear()
    tok = be.upload(np.array([1], np.int32))
    m.forward(tok, 1, len(PROMPT), cache)
    return be, list(be.launches), m


@pytest.mark.parametrize(
    "knobs",
    [{}, {"matmul_decode.fuse_swiglu": 1}, {"matmul_decode.fuse_norm": 1},
     {"matmul_decode.fuse_rope": 1, "rope.fuse_kv": 0},
     {"matmul_decode.fuse_swiglu": 1, "matmul_decode.fuse_norm": 1,
      "matmul_decode.fuse_rope": 1, "matmul_decode.threads_per_row": 8,
      "matmul_decode.rows_per_thread": 4, "matmul_decode.glu_threads_per_row": 16}],
    ids=["off", "swiglu", "norm", "rope", "all"],
)  # fmt: skip
def test_fused_decode_launches(tiny_model_factory, knobs):
    be, launches, m = _decode_launches(tiny_model_factory, BASE | knobs)
    n = m.spec.n_layers
    count = Counter(launch.kernel for launch in launches)
    glu = knobs.get("matmul_decode.fuse_swiglu", 0) == 1
    norm = knobs.get("matmul_decode.fuse_norm", 0) == 1
    assert count["mmvw_glu"] == (n if glu else 0)
    assert count["swiglu_q8"] == (0 if glu else n)
    assert count["mmvw_norm"] == (2 * n - 1 if norm else 0)  # o and down; the last down not
    # the first layer's input norm and the output norm stay; the rest end mmvw_norm launches
    assert count["rms_norm_q8"] + count["rms_norm_row"] == (2 if norm else 2 * n + 1)
    rope = knobs.get("matmul_decode.fuse_rope", 0) == 1
    assert count["mmvw_qkv"] == (n if rope else 0)
    assert count["rope_kv"] == (0 if rope else n)
    # per layer: q/k/v (+ rope_kv), attention (the default variant's: split + combine, or
    # tile's one launch), o (+ rms_norm_q8), gate/up (+ swiglu_q8), down; the next layer's norm
    # after all but the last down; outside the layers: embedding, the first norm, the output
    # norm, the LM head
    att = 1 if be.config.op("attention_decode").variant == "tile" else 2
    assert sum(v for k, v in count.items() if k.startswith("attn_")) == att * n
    layer = (1 if rope else 2) + att + (1 if norm else 2) + (1 if glu else 2) + 1
    assert len(launches) == 2 + n * layer + (n - 1) * (0 if norm else 1) + 2, count
    c = be.config.op("matmul_decode")
    rpb = int(c["warps"]) * 32 // int(c["threads_per_row"]) * int(c["rows_per_thread"])
    for launch in launches:
        if launch.kernel in ("mmvw", "mmvw_norm"):
            assert launch.block == (int(c["warps"]) * 32, 1, 1)
        if launch.kernel == "mmvw_glu":
            assert launch.grid[0] == -(-m.spec.n_ff // 32), launch.grid  # a block per 32 rows
            assert launch.block == (64 * int(c["glu_threads_per_row"]), 1, 1)
        if launch.kernel == "mmvw_qkv":
            H, Hkv, D = m.spec.n_head, m.spec.n_head_kv, m.spec.head_dim
            nbs = [-(-r // rpb) for r in (H * D, Hkv * D, Hkv * D)]
            assert launch.grid[0] == sum(nbs) and int(launch.args[3]) == nbs[0]
            assert launch.args[-1] is be._rope_tickets
        if launch.kernel == "mmvw_norm":
            N = int(launch.args[5])
            assert launch.grid[0] == -(-N // rpb)
            assert launch.args[-1] is be._norm_ticket


def test_fusions_fall_back_off_decode(tiny_model_factory):
    """A prompt (T > 1) under the fused knobs runs the unfused schedule: no fused launch."""
    from engine.gguf_model import open_model
    from engine.models import build_model

    flat = BASE | {"matmul_decode.fuse_swiglu": 1, "matmul_decode.fuse_norm": 1}
    be = FakeCuda(cfg(**flat))
    m = build_model(open_model(tiny_model_factory("qwen2", "q4_k_m")), be)
    gen = m.generate(PROMPT, 2, path="batched")
    assert len(gen.tokens) == 2
    prefill_kernels = be.kernels_run()
    assert {"mmvw_glu", "mmvw_norm"} <= prefill_kernels  # the two decode steps
    be.launches.clear()
    cache = m.new_cache(len(PROMPT) + 1)
    m.prefill(PROMPT, cache)
    assert not {"mmvw_glu", "mmvw_norm"} & be.kernels_run()


@pytest.mark.parametrize(
    "knob,macro",
    [("wload", "WLOAD"), ("min_blocks", "MIN_BLOCKS"), ("unroll", "UNROLL"),
     ("glu_threads_per_row", "GLU_THREADS_PER_ROW"), ("glu_unroll", "GLU_UNROLL"),
     ("q4k_wide", "Q4K_WIDE"),
     ("q6k_wide", "Q6K_WIDE"), ("split_k", "SPLIT_K"), ("q4k_lean", "Q4K_LEAN"),
     ("q4k_min_blocks", "Q4K_MIN_BLOCKS")],
)  # fmt: skip
def test_define_knobs_build_mmvw_with_them(knob, macro):
    d = cfg(**BASE)
    assert kernels.modules_for(d)["mmvw"][1][macro] == d.op("matmul_decode")[knob]
    values = {"wload": (1, 2), "glu_threads_per_row": (2, 16), "min_blocks": (4, 16),
              "q4k_wide": (1,), "q6k_wide": (1,), "split_k": (2, 4), "q4k_lean": (1,),
              "q4k_min_blocks": (12, 16)}  # fmt: skip
    for value in values.get(knob, (2, 8)):
        mods = kernels.modules_for(cfg(**BASE, **{f"matmul_decode.{knob}": value}))
        assert mods["mmvw"] == ("mmvw.cu", {**mods["mmvw"][1], macro: value})
        assert mods["mmvw"][1][macro] == value


def test_blame_names_the_fused_op_the_hooked_replay_bypasses():
    """A fault only in mmvw_glu / mmvw_norm / rope_kv is invisible to blame's hooked (unfused)
    replay; validate then names the op whose fusion is on."""
    from types import SimpleNamespace

    from engine.verify.validate import _fusion_blame

    be = FakeCuda(cfg())
    assert be.hook_bypassed_fusions(cfg(**BASE)) == ["rope"]
    on = cfg(**BASE, **{"matmul_decode.fuse_norm": 1})
    assert be.hook_bypassed_fusions(on) == ["matmul_decode", "rope"]
    assert be.hook_bypassed_fusions(cfg(**{"matmul_decode.variant": "mmvw"})) == []
    rope = cfg(**{"matmul_decode.variant": "mmvw", "matmul_decode.fuse_rope": 1})
    assert be.hook_bypassed_fusions(rope) == ["matmul_decode"]
    b = _fusion_blame(SimpleNamespace(backend=be), on)
    assert b.op == "matmul_decode" and b.params["fuse_norm"] == 1 and "fused" in b.label
    assert _fusion_blame(SimpleNamespace(backend=be), cfg()) is None


def test_ragged_ffn_glu_writes_no_q8_form(tiny_model_factory):
    """F = 688 (no multiple of 32; ffn_down F16): mmvw_glu still runs, with a null Q8_1 output,
    and the down projection (float weights) goes through dmmv; o still ends in mmvw_norm."""
    from engine.gguf_model import open_model
    from engine.models import build_model

    flat = BASE | {f"matmul_decode.{k}": 1 for k in ("fuse_swiglu", "fuse_norm", "fuse_rope")}
    be = FakeCuda(cfg(**flat))
    m = build_model(open_model(tiny_model_factory("qwen2", "q4_k_m", preset="ragged")), be)
    assert m.spec.n_ff % 32
    m.generate(PROMPT, 2, path="batched")
    glu = [launch for launch in be.launches if launch.kernel == "mmvw_glu"]
    assert glu and all(isinstance(g.args[11], np.uint64) and g.args[11] == 0 for g in glu)
    assert all(g.grid[0] == -(-m.spec.n_ff // 32) for g in glu)
    run = be.kernels_run()
    assert {"mmvw_norm", "mmvw_qkv", "dmmv_f16"} <= run and "swiglu_q8" not in run, sorted(run)


def test_stage_smem_is_a_blocks_rows_of_the_widest_matrix():
    from engine.backends.cuda.backend import CudaWeight

    def w(row_bytes: int) -> CudaWeight:
        return CudaWeight("w", "Q4_K", (8, 256), raw=np.zeros((8, row_bytes), np.uint8))

    be = FakeCuda(cfg(**BASE))
    assert be._stage_smem((w(144),)) == 0  # stage off: no dynamic shared memory
    be.set_config(cfg(**BASE, **{"matmul_decode.stage": 1, "matmul_decode.rows_per_thread": 2}))
    rpb = be._mmvw_rows_per_block()
    assert rpb == 8 and be._stage_smem((w(144), w(224), w(144))) == 8 * 224
    assert be._stage_smem((w(232448 // 8),)) == 0  # past the opt-in limit: global reads


@pytest.mark.parametrize("fuse_norm,min_k", [(0, 256), (1, 256), (1, 2048)])
def test_split_k_grids_follow_the_kernels_rows_per_block(tiny_model_factory, fuse_norm, min_k):
    """matmul_decode.split_k (dec8): an mmvw / mmvw_norm launch on rows of K >= split_min_k
    has split_k times fewer rows per block (mmvw.cu's mmvw_rpb), shorter rows keep them all
    (tiny: K 256 and 640); mmvw_qkv never splits; the stage's shared memory follows the rows."""
    knobs = {"matmul_decode.split_k": 2, "matmul_decode.split_min_k": min_k,
             "matmul_decode.fuse_norm": fuse_norm, "matmul_decode.fuse_rope": 1,
             "matmul_decode.stage": 1, "matmul_decode.rows_per_thread": 2}  # fmt: skip
    be, launches, m = _decode_launches(tiny_model_factory, BASE | knobs)
    rpb = be._mmvw_rows_per_block()
    assert rpb == 8 and be._mmvw_rows_per_block(min_k - 1) == 8
    assert be._mmvw_rows_per_block(min_k) == 4
    seen = Counter()
    for launch in launches:
        if launch.kernel == "mmvw":
            K, ns = int(launch.args[2]), [int(launch.args[i]) for i in (7, 13, 19)]
            r = rpb // 2 if K >= min_k else rpb
            assert launch.grid[0] == sum(-(-n // r) for n in ns), (K, ns, launch.grid)
            assert int(launch.args[3]) == -(-ns[0] // r)
            rbs = [int(launch.args[i]) for i in (6, 12, 18)]
            assert launch.smem == r * max(rbs)
            seen[K >= min_k] += 1
        if launch.kernel == "mmvw_norm":
            K, N = int(launch.args[2]), int(launch.args[5])
            r = rpb // 2 if K >= min_k else rpb
            assert launch.grid[0] == -(-N // r) and launch.smem == r * int(launch.args[4])
            seen[K >= min_k] += 1
        if launch.kernel == "mmvw_qkv":
            H, Hkv, D = m.spec.n_head, m.spec.n_head_kv, m.spec.head_dim
            assert launch.grid[0] == sum(-(-n // rpb) for n in (H * D, Hkv * D, Hkv * D))
            assert launch.smem == rpb * max(int(launch.args[i]) for i in (6, 10, 14))
    assert seen[min_k <= 640] >= 2 * m.spec.n_layers and not seen[min_k > 640], seen


def test_cuda_precompile_lists_each_distinct_module_once(tmp_path):
    """tools/cuda_precompile.py: the union of the configs' modules, each (file, defines) once;
    a bad list is one line and exit 2."""
    from tools.cuda_precompile import main, module_list

    base = {"matmul_decode.variant": "mmvw"}
    one = module_list([base])
    two = module_list([base, base | {"matmul_decode.pdl": 1}, base | {"matmul_decode.split_k": 2}])
    mmvw = [d for f, d in two if f == "mmvw.cu"]
    assert len(two) == len(one) + 1 and len(mmvw) == 2  # pdl is a host knob: no new build
    assert {dict(d)["SPLIT_K"] for d in mmvw} == {1, 2}
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert main([str(bad)]) == 2


@pytest.mark.parametrize("ke", [0, 1])
def test_split_kw_kv_early_reaches_the_kernel(tiny_model_factory, ke):
    """attention_decode.kv_early (dec8) is attn_split_kw's last argument (the fake checks the
    launch against the kernel's signature)."""
    flat = BASE | {"attention_decode.variant": "split_kw", "attention_decode.kv_early": ke}
    _, launches, m = _decode_launches(tiny_model_factory, flat)
    kw = [launch for launch in launches if launch.kernel == "attn_split_kw"]
    assert len(kw) == m.spec.n_layers and all(int(k.args[-1]) == ke for k in kw)


def test_fusion_blame_bisects_several_fused_ops(monkeypatch):
    """With several fused ops on, blame names the one whose fusions turned off let the failing
    prompt pass (the planted QK_PREP_ROPE_AHEAD was blamed on delta_net, the first one)."""
    from types import SimpleNamespace

    import engine.verify.validate as V

    be = FakeCuda(cfg())
    on = cfg(**BASE, **{"matmul_decode.fuse_norm": 1})  # matmul_decode and rope fused
    assert be.hook_bypassed_fusions(on) == ["matmul_decode", "rope"]
    tried = []

    def fake_validate(model, cand, prompts, steps, **kw):  # noqa: ANN001, ANN003, ANN202
        tried.append(cand.flat())
        return SimpleNamespace(passed=cand.op("rope")["fuse_kv"] == 0)  # the fault is rope_kv

    monkeypatch.setattr(V, "validate", fake_validate)
    model = SimpleNamespace(backend=be, set_config=lambda c: None)
    b = V._fusion_blame(model, on, [1, 2, 3], 4)
    assert b.op == "rope" and "rope's fusions off" in b.label
    assert tried[0]["matmul_decode.fuse_norm"] == 0 and tried[0]["rope.fuse_kv"] == 1
    assert tried[1]["rope.fuse_kv"] == 0 and tried[1]["matmul_decode.fuse_norm"] == 1


@pytest.mark.parametrize("split", [1, 2])
def test_stream_plan_and_launches(tiny_model_factory, split):
    """matmul_decode.stream: the decode step's Q4_K / Q6_K mmvw launches become mmvw_stream
    (its signature checked by the fake), the grid at most the row sets and SMs x blocks per SM,
    the ring within a block's shared memory; other types, or the knob off, keep mmvw."""
    from engine.backends.cuda.backend import CudaWeight

    flat = BASE | {"matmul_decode.stream": 4, "matmul_decode.split_k": split}
    be, launches, _ = _decode_launches(tiny_model_factory, flat)
    streamed = [launch for launch in launches if launch.kernel == "mmvw_stream"]
    assert streamed, Counter(launch.kernel for launch in launches)
    for launch in streamed:
        nsets, stages, stage_bytes, x4, x6 = (int(a) for a in launch.args[5:10])
        assert 1 <= launch.grid[0] <= nsets and 2 <= stages <= 4
        assert launch.smem == stages * stage_bytes and stage_bytes % 16 == 0
        assert x4 == x6 == -1  # stream_x off

    def plan(qtype: str, n: int, k: int, **knobs: int) -> tuple | None:
        be.set_config(cfg(**BASE, **{f"matmul_decode.{a}": v for a, v in knobs.items()}))
        rb = k // 256 * {"Q4_K": 144, "Q6_K": 224, "Q8_0": 272}[qtype]
        w = CudaWeight("w", qtype, (n, k), raw=be.upload(np.zeros((n, rb), np.uint8)))
        rpb = be._mmvw_rows_per_block(k)
        return be._stream_plan((w,), rpb, -(-n // rpb))

    # 7B gate: 4 rows of 2016 bytes a set, 4 stages (32 KB): 6 blocks an SM by shared memory
    assert plan("Q4_K", 18944, 3584, stream=4) == (132 * 6, 4, 8064, -1, -1, 4 * 8064)
    assert plan("Q4_K", 18944, 3584, stream=4, stream_blocks=2)[0] == 264
    # 7B down: 4 rows of 10656 bytes; 8 stages do not fit a block: 5 (213 KB), one block an SM
    assert plan("Q4_K", 3584, 18944, stream=8) == (132, 5, 42624, -1, -1, 5 * 42624)
    assert plan("Q6_K", 7, 512, stream=2) == (2, 2, 1792, -1, -1, 3584)  # fewer sets than SMs
    # stream_x: the planes (56 bytes a slot of 32) after the ring, counted in the fit
    xs = 56 * 18944 // 32
    assert plan("Q4_K", 3584, 18944, stream=8, stream_x=1) == (132, 4, 42624, 4 * 42624, -1,
                                                               4 * 42624 + xs)  # fmt: skip
    assert plan("Q6_K", 64, 512, stream=2, stream_x=1)[3:5] == (-1, 2 * 1792)
    assert plan("Q4_K", 64, 512, stream=2, stream_x=1, q4k_wide=1)[3:] == (-1, -1, 2 * 1152)
    assert plan("Q4_K", 3584, 18944, stream=0) is None
    assert plan("Q8_0", 64, 512, stream=4) is None
    be.set_config(
        cfg(
            **BASE,
            **{
                "matmul_decode.stream": 2,
                "matmul_decode.rows_per_thread": 4,
                "matmul_decode.threads_per_row": 8,
                "matmul_decode.warps": 8,
            },
        )
    )
    w = CudaWeight("w", "Q6_K", (8, 1 << 16), raw=be.upload(np.zeros((8, 256 * 224), np.uint8)))
    assert be._stream_plan((w,), 128, 1) is None  # two stages of 128 such rows cannot fit


def test_q4k_kernel_takes_the_all_q4k_launches(tiny_model_factory):
    """matmul_decode.q4k_kernel: an mmvw launch of Q4_K matrices only runs mmvw_q4k (same
    signature, checked by the fake); a launch with another type keeps mmvw."""
    from engine.backends.cuda.decode_matmul import _QT

    be, launches, _ = _decode_launches(tiny_model_factory, BASE | {"matmul_decode.q4k_kernel": 1})
    kinds = Counter(launch.kernel for launch in launches)
    assert kinds["mmvw_q4k"] > 0, kinds
    for launch in launches:
        if launch.kernel not in ("mmvw", "mmvw_q4k"):
            continue
        # (N, qt) of the three matrices; N = 0: no matrix
        mats = [(int(launch.args[7 + 6 * i]), int(launch.args[8 + 6 * i])) for i in range(3)]
        all_q4k = all(qt == _QT["Q4_K"] for n, qt in mats if n > 0)
        assert (launch.kernel == "mmvw_q4k") == all_q4k, (launch.kernel, mats)
    _, off, _ = _decode_launches(tiny_model_factory, BASE)
    assert not any(launch.kernel == "mmvw_q4k" for launch in off)


def test_stage_min_rows_stages_only_the_large_launches(tiny_model_factory):
    """matmul_decode.stage_min_rows: under stage = 1, launches of fewer rows get no shared
    memory (mmvw_stage_start then reads global memory); the LM head (vocab rows) keeps it."""
    flat = BASE | {"matmul_decode.stage": 1}
    _, staged, m = _decode_launches(tiny_model_factory, flat)
    vocab = m.spec.n_vocab
    _, big, _ = _decode_launches(tiny_model_factory, flat | {"matmul_decode.stage_min_rows": 32768})
    mm = [launch for launch in staged if launch.kernel == "mmvw"]
    assert mm and all(launch.smem > 0 for launch in mm)
    for launch in (launch for launch in big if launch.kernel == "mmvw"):
        rows = sum(int(launch.args[7 + 6 * i]) for i in range(3))
        assert (launch.smem > 0) == (rows >= 32768), (rows, launch.smem, vocab)


@pytest.mark.parametrize(
    "knobs,kernel",
    [({}, "mmvw"), ({"q4k_kernel": 1}, "mmvw_q4k"), ({"stream": 2, "stream_x": 1}, "mmvw_stream")],
)
def test_gpu_matmul_helpers_launch_what_their_tests_name(knobs, kernel):
    """tests/cuda_decode_cases.py's run_matmul and run_three (the GPU tests of mmvw_q4k and
    mmvw_stream) on the fake: the knobs reach the kernel they test, run_three is one launch of
    its three matrices with the bias and the residual, the canaries and inputs intact."""
    from tests.cuda_decode_cases import mmvw_knobs, run_matmul, run_three
    from tests.op_cases import qtensor

    be = FakeCuda(cfg(**BASE))
    cp = be._cp
    rng = np.random.default_rng(0)
    w = qtensor(rng, (67, 512), "Q4_K", std=0.05)
    x = rng.standard_normal((1, 512)).astype(np.float32)

    def matmuls() -> list:  # after the activations' quantize_q8_1
        return [launch for launch in be.launches if launch.kernel.startswith("mmvw")]

    assert run_matmul(cp, be, mmvw_knobs(**knobs), w, x).shape == (1, 67)
    assert [launch.kernel for launch in matmuls()] == [kernel]
    ws = [qtensor(rng, (n, 512), "Q4_K", std=0.05) for n in (131, 1, 66)]
    bias = qtensor(rng, (131,), "F32")
    res = rng.standard_normal((1, 66)).astype(np.float32)
    be.launches.clear()
    outs = run_three(cp, be, mmvw_knobs(**knobs), ws, x, bias, res)
    assert [y.shape for y in outs] == [(1, 131), (1, 1), (1, 66)]
    (launch,) = matmuls()
    assert launch.kernel == kernel
    if kernel != "mmvw_stream":  # (its arguments are laid out otherwise)
        assert [int(launch.args[7 + 6 * i]) for i in range(3)] == [131, 1, 66]
