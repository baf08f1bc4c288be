"""Hybrid models (qwen35 / qwen35moe / qwen3next) on the NumPy reference: the synthetic files
carry gguf-py's tensor names and metadata, and every prefill path (per token, batched in chunks,
the chunked delta-net scan) leaves the same recurrent state and generates the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

from engine.backends.numpy_hybrid import delta_chunked, delta_sequential, k_head_of_v
from engine.backends.numpy_ref import NumpyBackend
from engine.errors import ConfigError
from engine.gguf_model import open_model
from engine.model import Model
from engine.models import build_model
from engine.synth import write_synthetic
from engine.tuning import TuningConfig

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
PROMPT = [3, 17, 99, 5, 42, 7, 250, 11, 64, 2, 8, 300, 41]  # 13: ragged chunks


def _model(path, **flat) -> Model:
    return build_model(open_model(path), NumpyBackend(TuningConfig.from_flat("numpy", flat)))


@pytest.mark.parametrize("arch", ARCHS)
def test_synthetic_file_uses_gguf_py_names(tiny_model_factory, arch):
    g = open_model(tiny_model_factory(arch, "q4_k_m"))
    by_name = {v: k for k, v in MODEL_ARCH_NAMES.items()}
    known = {TENSOR_NAMES[t] for t in MODEL_TENSORS[by_name[arch]]}
    for name in g.tensor_names:
        base = ".".join(p if not p.isdigit() else "{bid}" for p in name.split("."))
        assert base.rsplit(".", 1)[0] in known or base in known, name
    s = g.spec
    assert s.hybrid and s.recurrent == (True, True, True, False)
    assert s.ssm.v_order == ("grouped" if arch == "qwen3next" else "tiled")
    assert (s.moe is not None) == (arch != "qwen35")
    assert s.rope_dim == 8 and s.head_dim == 32
    assert g.tensor("blk.0.ssm_a").dequantize().max() < 0  # -exp(A_log)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_paths_leave_the_same_state(tiny_model_factory, arch):
    path = tiny_model_factory(arch, "q4_k_m")
    ref = _model(path)
    c_ref = ref.new_cache(64)
    lr = ref.backend.download(ref.prefill(PROMPT, c_ref, "per_token"))
    for flat in (
        {"prefill.chunk_tokens": 4},
        {"prefill.chunk_tokens": 32},
        {"prefill.chunk_tokens": 8, "delta_net.variant": "chunked", "delta_net.chunk": 4},
        {"prefill.chunk_tokens": 32, "delta_net.variant": "chunked", "delta_net.chunk": 8},
    ):
        m = _model(path, **flat)
        c = m.new_cache(64)
        lb = m.backend.download(m.prefill(PROMPT, c, "batched"))
        assert np.allclose(lr, lb, atol=1e-4), flat
        for i in range(m.spec.n_layers):
            if m.spec.is_recurrent(i):
                assert np.allclose(c_ref.conv[i], c.conv[i], atol=1e-4), (flat, i)
                assert np.allclose(c_ref.ssm[i], c.ssm[i], atol=1e-4), (flat, i)
            else:
                assert np.allclose(c_ref.k[i][: len(PROMPT)], c.k[i][: len(PROMPT)], atol=1e-4)
        assert m.generate(PROMPT, 6).tokens == ref.generate(PROMPT, 6, path="per_token").tokens


def test_decode_continues_from_the_prefill_state(tiny_model_factory):
    """Prompt + first token run as one prompt give the logits that decode gives after it."""
    m = _model(tiny_model_factory("qwen35", "q4_k_m"))
    g = m.generate(PROMPT, 2, keep_logits=True)
    whole = m.generate([*PROMPT, g.tokens[0]], 1)
    assert np.allclose(g.step_logits[0], whole.last_logits, atol=1e-4)


def test_chunked_scan_equals_sequential():
    rng = np.random.default_rng(1)
    T, Hv, dk, dv = 23, 3, 8, 6
    q = rng.standard_normal((T, Hv, dk))
    k = rng.standard_normal((T, Hv, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, Hv, dv))
    g = -rng.uniform(0.01, 2.0, (T, Hv))
    beta = rng.uniform(0, 1, (T, Hv))
    S0 = rng.standard_normal((Hv, dk, dv))
    o1, s1 = delta_sequential(q, k, v, g, beta, S0)
    for chunk in (1, 4, 7, 64):
        o2, s2 = delta_chunked(q, k, v, g, beta, S0, chunk)
        assert np.allclose(o1, o2, atol=1e-9) and np.allclose(s1, s2, atol=1e-9), chunk


def test_delta_rule_by_hand():
    """One head, dk = dv = 2, two tokens, against arithmetic done by hand (S^T k, not S k)."""
    S = np.array([[[1.0, 2.0], [0.0, 0.0]]])  # S[0] rows are k dims
    k = np.array([[[0.0, 1.0]], [[1.0, 0.0]]])
    q = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    v = np.array([[[1.0, 1.0]], [[0.0, 0.0]]])
    g = np.log(np.array([[0.5], [1.0]]))
    beta = np.array([[1.0], [0.5]])
    o, s = delta_sequential(q, k, v, g, beta, S)
    # t0: S = [[.5, 1], [0, 0]]; S^T k = [0, 0]; u = [1, 1]; S = [[.5, 1], [1, 1]]; o = [.5, 1]
    # t1: S^T k = [.5, 1]; u = .5 [-.5, -1]; S = [[.25, .5], [1, 1]]; o = S^T [0, 1] = [1, 1]
    assert np.allclose(o[:, 0], [[0.5, 1.0], [1.0, 1.0]])
    assert np.allclose(s[0], [[0.25, 0.5], [1.0, 1.0]])


def test_v_head_orders():
    assert k_head_of_v(2, 6, "grouped").tolist() == [0, 0, 0, 1, 1, 1]
    assert k_head_of_v(2, 6, "tiled").tolist() == [0, 1, 0, 1, 0, 1]


def test_router_topk_is_normalised():
    b = NumpyBackend()
    logits = np.array([[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 4.0]], np.float32)
    ids, w = b.ops.router_topk(logits, 2)
    assert ids.tolist() == [[3, 2], [0, 3]]
    assert np.allclose(w.sum(axis=1), 1.0)
    assert np.isclose(w[0, 0], 1 / (1 + np.exp(-1.0)))  # e^3 / (e^3 + e^2)


def test_conv_state_carries_across_calls(tiny_model_factory):
    m = _model(tiny_model_factory("qwen35", "q4_k_m"))
    w = m.weights["blk.0.ssm_conv1d.weight"]
    x = np.random.default_rng(0).standard_normal((9, w.qt.shape[0])).astype(np.float32)
    s_all = np.zeros((3, x.shape[1]), np.float32)
    whole = m.backend.ops.ssm_conv(x, s_all, w)
    s_parts = np.zeros_like(s_all)
    parts = [m.backend.ops.ssm_conv(x[a:b], s_parts, w) for a, b in ((0, 1), (1, 5), (5, 9))]
    assert np.allclose(whole, np.concatenate(parts), atol=1e-6)
    assert np.array_equal(s_all, x[-3:]) and np.array_equal(s_parts, x[-3:])


def test_synth_rejects_a_dense_preset_for_a_hybrid(tmp_path):
    with pytest.raises(ConfigError, match="preset for qwen35"):
        write_synthetic(tmp_path / "x.gguf", arch="qwen35", preset="1.5b", progress=False)
    assert not list(tmp_path.iterdir())


def test_backend_without_hybrid_ops_fails_at_load(tiny_model_factory):
    from engine.backends.base import Backend
    from engine.errors import UnsupportedError

    class DenseOnly(NumpyBackend):  # two hybrid ops back to the base contract's "unsupported"
        _ssm_conv = Backend._ssm_conv
        _router_topk = Backend._router_topk

    with pytest.raises(UnsupportedError, match="ssm_conv, router_topk"):
        build_model(open_model(tiny_model_factory("qwen3next", "q4_k_m")), DenseOnly())


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
def test_fused_trunk_is_the_hooked_trunk_on_numpy(tiny_model_factory, arch):
    # With no hook the trunk goes through matmuls / matmul_add / ffn, whose base defaults are
    # the hooked trunk's op calls: the same logits to the bit on a backend that does not fuse.
    m = build_model(open_model(tiny_model_factory(arch, "q4_k_m")), NumpyBackend())
    fused = m.generate([5, 17, 99, 3, 42, 7], 3)
    seen: list[str] = []
    m.hook = lambda op, label, *rest: seen.append(label)
    hooked = m.generate([5, 17, 99, 3, 42, 7], 3)
    assert {"attn_residual", "ffn_residual", "ssm_out", "attn_qkv", "ssm_gated"} <= set(seen)
    assert fused.tokens == hooked.tokens
    assert np.array_equal(fused.last_logits, hooked.last_logits)


def test_phase_profile_charges_every_phase(tiny_model_factory, capsys):
    # tools/profile_hybrid.py on NumPy (wall clock per op): every phase of a MoE hybrid shows,
    # the wrappers come off afterwards, and the CLI prints the table and refuses a dense file.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "profile_hybrid.py"
    spec = importlib.util.spec_from_file_location("profile_hybrid", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    gguf = tiny_model_factory("qwen35moe", "q4_k_m")
    m = build_model(open_model(gguf), NumpyBackend())
    rep = mod.phase_profile(m, 24, 3)
    want = {"dn.proj", "dn.conv", "dn.scan", "dn.norm+out", "attn.proj", "attn.core",
            "attn.out", "moe.router", "moe.experts", "moe.shared", "other"}  # fmt: skip
    for what in ("prefill_ms", "decode_ms_per_token"):
        assert set(rep[what]) == want, what
        assert all(v > 0 for v in rep[what].values()), rep[what]
    assert "_delta_net" not in m.__dict__ and "matmul" not in m.backend.__dict__
    args = ["--model", str(gguf), "--backend", "numpy", "--prompt", "8", "--gen", "2"]
    assert mod.main(args) == 0
    assert "dn.scan" in capsys.readouterr().out
    dense = tiny_model_factory("qwen2", "q4_k_m")
    assert mod.main(["--model", str(dense), "--backend", "numpy"]) == 2


def test_int8_decode_emulation_passes_validate_under_the_int8_budget(tiny_model_factory):
    # tests/int8_decode.py rounds every decode row's block-type matmul input to Q8_1 (CUDA's
    # mmvq / mmvw): on the tiny qwen35moe (the worst of the three tiny hybrids) the rounding is
    # visible (NMSE > 1e-5) and validate, against the float per-token reference, passes it under
    # the int8_activations class it declares for those matmuls (op-level replay included);
    # CUDA's int8 decode must match this emulation (tests/engine/backends/cuda/test_cuda_hybrid.py:
    # test_int8_decode_matches_its_numpy_emulation).
    from engine.verify.budgets import NUMERIC_BUDGETS
    from engine.verify.validate import validate
    from tests.int8_decode import INT8_CANDIDATE, Int8Candidate

    m = build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), Int8Candidate())
    flat = {"prefill.chunk_tokens": 512}
    cand = TuningConfig.default("numpy").replace(**flat)
    prompts = [list(range(5, 42)), [5], list(range(40, 110))]
    assert validate(m, cand, prompts, steps=6, edges=False).nmse < 1e-10  # float: the reference
    rep = validate(m, cand.replace(**INT8_CANDIDATE), prompts, steps=6, edges=False)
    assert rep.passed, rep.reasons
    assert 1e-5 < rep.nmse < NUMERIC_BUDGETS["int8_activations"].nmse / 2


def test_int8_rounding_through_the_recurrence_exceeds_the_dense_int8_bound_on_the_tiny_qwen35(
    tiny_model_factory,
):
    # Why the H200 rejected int8 prefill (mmq8) + int8 decode on the tiny qwen35 before op-level
    # replay (tests/engine/backends/cuda/test_cuda_hybrid.py): NumPy with exactly that Q8_1
    # rounding and no kernel at
    # all lands at KLD ~0.023, the H200's figure; the recurrent state carries the prefill rows'
    # rounding into every later token. Decode rows alone stay inside (KLD 3e-4) on this tiny
    # model; the 9B-like shape's int8 decode measured KLD 0.010-0.011 on the H200. Validate now
    # passes it: replay judges each op on the reference's inputs (the int8 matmuls under int8's
    # op_nmse, the rest float-exact) and the end-to-end bound of a recurrent hybrid is the
    # measured RECURRENT_END_TO_END (tests/engine/verify/test_op_replay.py).
    from engine.verify.budgets import NUMERIC_BUDGETS, RECURRENT_END_TO_END
    from engine.verify.validate import validate
    from tests.int8_decode import INT8_CANDIDATE, Int8Candidate

    be = Int8Candidate()
    m = build_model(open_model(tiny_model_factory("qwen35", "q4_k_m")), be)
    cand = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 512, **INT8_CANDIDATE})
    prompt = [3, 17, 99, 5, 42, 7, 250, 11, 64, 2, 8, 1, 77, 31, 9, 120, 66, 4, 200, 13, 5, 6, 7,
              8, 90, 91, 92, 93, 14, 15, 16, 18, 19, 20, 21, 22, 23]  # the GPU test's  # fmt: skip
    prompts = [prompt, prompt[:1], list(range(40, 110))]
    refs: dict = {}
    decode_only = validate(m, cand, prompts, steps=6, ref_cache=refs, edges=False)
    assert decode_only.passed and decode_only.kld_max < 2e-3
    be.prefill = True
    rep = validate(m, cand, prompts, steps=6, ref_cache=refs, edges=False)
    assert rep.passed and rep.replay.passed, rep.reasons
    dense, recurrent = NUMERIC_BUDGETS["int8_activations"], RECURRENT_END_TO_END["int8_activations"]
    assert dense.kld_max < 1.5e-2 < rep.kld_max < 4e-2 < recurrent["kld_max"], rep.kld_max
    # the recurrence's inputs carry most of it: those projections float (matmul_decode.
    # float_ssm_in), every other matmul still int8 at prefill and decode: KLD 0.023 -> 0.008
    # (NMSE 0.016 still just past 0.013; ssm_out float too would make it 0.004)
    be.float_ssm_in = True
    mixed = validate(m, cand, prompts, steps=6, ref_cache=refs, edges=False)
    assert mixed.kld_max < rep.kld_max / 2, (mixed.kld_max, rep.kld_max)
    assert mixed.nmse > 1e-4  # still int8 elsewhere: not the float reference
