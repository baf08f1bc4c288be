"""validate's op-level replay (engine.verify.op_replay): every hooked op of the candidate judged on
the reference's own inputs under its own variant's numeric class. On the tiny qwen35, NumPy with
exactly the Q8_1 rounding of CUDA's int8 paths (tests/int8_decode.py) -- a correct variant that
the end-to-end int8 bound rejected -- now passes, while the seed's S^T k scan, which a widened
end-to-end bound alone would pass, is rejected by replay with delta_net named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import open_model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.budgets import NUMERIC_BUDGETS, RECURRENT_END_TO_END, end_to_end
from engine.verify.op_replay import merge, replay, segments
from engine.verify.validate import validate
from tests.hybrid_mutants import SkNotStk
from tests.int8_decode import INT8_CANDIDATE, Int8Candidate

# the GPU test's prompt (tests/engine/backends/cuda/test_cuda_hybrid.py), one token, and a longer
# one
PROMPT = [3, 17, 99, 5, 42, 7, 250, 11, 64, 2, 8, 1, 77, 31, 9, 120, 66, 4, 200, 13, 5, 6, 7,
          8, 90, 91, 92, 93, 14, 15, 16, 18, 19, 20, 21, 22, 23]  # fmt: skip
PROMPTS = [PROMPT, PROMPT[:1], list(range(40, 110))]
INT8 = NUMERIC_BUDGETS["int8_activations"]


def _int8(path, backend_cls=Int8Candidate, chunk: int = 512, prefill: bool = True):
    be = backend_cls()
    be.prefill = prefill
    m = build_model(open_model(path), be)
    cand = TuningConfig.default("numpy").replace(
        **{"prefill.chunk_tokens": chunk, **INT8_CANDIDATE}
    )
    return validate(m, cand, PROMPTS, steps=6, edges=False)


def test_int8_emulation_of_the_tiny_qwen35_passes_with_replay(tiny_model_factory):
    # int8 prefill rows (mmq8) and int8 decode rows: the configs the H200 rejected at KLD
    # 0.023-0.029 (tests/engine/backends/cuda/test_cuda_hybrid.py); NumPy with exactly that
    # rounding, no kernel.
    rep = _int8(tiny_model_factory("qwen35", "q4_k_m"))
    assert rep.passed, rep.reasons
    # end to end it is past the dense int8 bound, inside the measured recurrent one
    assert INT8.kld_max < rep.kld_max < RECURRENT_END_TO_END["int8_activations"]["kld_max"] / 2
    assert rep.tolerances["kld_max"] == RECURRENT_END_TO_END["int8_activations"]["kld_max"]
    ops = {s.op: s for s in rep.replay.ops}
    for op in ("matmul_decode", "matmul_prefill"):  # judged by int8's per-op bound: visible
        assert ops[op].numeric == "int8_activations" and 1e-6 < ops[op].nmse < INT8.op_nmse
    # everything else sees the reference's inputs: float noise, under order_only's 1e-8
    assert ops["delta_net"].numeric == "order_only" and ops["delta_net"].nmse < 1e-12
    assert ops["ssm_conv"].nmse < 1e-12 and ops["rms_norm"].nmse < 1e-12
    assert rep.replay.worst.op in ("matmul_decode", "matmul_prefill")
    d = json.loads(json.dumps(rep.to_dict()))  # the JSON of `engine validate --json`
    assert d["replay"]["passed"] and d["replay"]["worst"]["bound"] == INT8.op_nmse
    assert {o["op"] for o in d["replay"]["ops"]} >= {"delta_net", "matmul_decode"}
    from worker.evaluator import validate_summary
    from worker.records import ValidateSummary

    rec = ValidateSummary.from_dict(json.loads(json.dumps(validate_summary(rep).to_dict())))
    assert rec.replay["worst"]["op"] == rep.replay.worst.op  # what a trial record keeps


SkInt8 = type("SkInt8", (SkNotStk, Int8Candidate), {})  # the seed's bug beside int8 rounding


def test_sk_scan_under_int8_passes_end_to_end_but_fails_replay(tiny_model_factory):
    """The seed's S^T k bug (prefill calls of the scan) in a candidate that also rounds its
    matmuls to int8: the widened recurrent end-to-end bound alone would pass it; replay judges
    the scan on the reference's inputs under delta_net's own class (order_only) and names it."""
    rep = _int8(tiny_model_factory("qwen35", "q4_k_m"), SkInt8)
    assert all(p.passed for p in rep.prompts), [p.reasons for p in rep.prompts]  # end to end
    assert not rep.passed
    first = rep.replay.first
    assert (first.op, first.label, first.layer) == ("delta_net", "ssm_scan", 0), first
    assert rep.blame == first  # the blame is replay's: the op itself, not where drift grew
    scan = next(s for s in rep.replay.ops if s.op == "delta_net")
    assert scan.numeric == "order_only" and scan.bound == NUMERIC_BUDGETS["order_only"].op_nmse
    assert scan.nmse > 1e-3 and scan.nmse > 1e4 * scan.bound  # nowhere near float noise
    assert any("op-level replay" in r for r in rep.reasons)


def test_replayed_ops_see_the_reference_inputs_so_error_does_not_compound(tiny_model_path):
    """A candidate whose batched matmuls are off by a relative 3e-4: end to end that error
    spreads into every later op; in replay only the matmul shows it, the ops after it are
    given the reference's values and agree to float noise. (At 1e-4 the NMSE, 1.0e-8, sat on
    order_only's bound itself; a fresh install of today (numpy 2.4.6) put one use of 70 just
    under it.)"""

    class Noisy(NumpyBackend):
        def _matmul(self, x, w):  # noqa: ANN001, ANN202
            out = super()._matmul(x, w)
            return out * np.float32(1 + 3e-4) if x.shape[0] > 1 else out

    m = build_model(open_model(tiny_model_path), Noisy())
    ref = TuningConfig.default("numpy")
    cand = ref.replace(**{"prefill.chunk_tokens": 8})
    tokens = m.forced_run(PROMPT, 4, "per_token").tokens
    r = replay(m, ref, cand, PROMPT, tokens, 4)
    ops = {s.op: s for s in r.ops}
    assert 5e-8 < ops["matmul_prefill"].nmse < 2e-7  # (3e-4)^2, in every use
    assert ops["matmul_prefill"].failed == ops["matmul_prefill"].uses  # 9x order_only's 1e-8
    for op in ("rms_norm", "attention", "swiglu", "add", "rope"):
        assert ops[op].nmse < 1e-12, (op, ops[op].nmse)
    assert not r.passed and r.first.op == "matmul_prefill" and r.first.layer == 0
    assert m.hook is None and m.state_hook is None and m.config == cand


def test_segments_group_whole_chunks():
    assert segments(10, 4, 128) == [[0, 4, 8]]
    assert segments(300, 64, 128) == [[0, 64], [128, 192], [256]]
    assert segments(300, 512, 128) == [[0]]
    assert [s for seg in segments(1000, 24, 128) for s in seg] == list(range(0, 1000, 24))


def test_long_prompt_replays_in_segments_like_one(tiny_model_factory, monkeypatch):
    """Replay records the reference one segment at a time (memory), switching configs between
    segments; the verdict is the same as with the whole prompt in one segment."""
    import engine.verify.op_replay as R

    m = build_model(open_model(tiny_model_factory("qwen35", "q4_k_m")), NumpyBackend())
    ref = TuningConfig.default("numpy")
    cand = ref.replace(**{"prefill.chunk_tokens": 8})
    prompt = list(range(5, 45))
    tokens = m.forced_run(prompt, 3, "per_token").tokens
    whole = R.replay(m, ref, cand, prompt, tokens, 3)
    monkeypatch.setattr(R, "SEGMENT_TOKENS", 16)
    split = R.replay(m, ref, cand, prompt, tokens, 3)
    assert whole.passed and split.passed and not split.unmatched
    assert {s.op: s.uses for s in whole.ops} == {s.op: s.uses for s in split.ops}


def test_end_to_end_widening_keeps_an_experiments_tightened_bound():
    table = end_to_end(None, recurrent=True)
    assert table["int8_activations"].kld_max == RECURRENT_END_TO_END["int8_activations"]["kld_max"]
    assert table["int8_activations"].op_nmse == INT8.op_nmse  # per-op never widened
    assert end_to_end(None, recurrent=False)["int8_activations"] == INT8
    tight = {**NUMERIC_BUDGETS, "int8_activations": INT8.tightened(kld_max=1e-3)}
    assert end_to_end(tight, recurrent=True)["int8_activations"].kld_max == 1e-3
    assert end_to_end(tight, recurrent=True)["int8_activations"].nmse > INT8.nmse


def test_merge_keeps_the_worst_per_op(tiny_model_path):
    m = build_model(open_model(tiny_model_path), NumpyBackend())
    ref = TuningConfig.default("numpy")
    cand = ref.replace(**{"prefill.chunk_tokens": 4})
    runs = []
    for p in (PROMPT[:5], PROMPT):
        runs.append(replay(m, ref, cand, p, m.forced_run(p, 2, "per_token").tokens, 2))
    both = merge(runs)
    for s in both.ops:
        assert s.nmse == max(o.nmse for r in runs for o in r.ops if o.op == s.op)
        assert s.uses == sum(o.uses for r in runs for o in r.ops if o.op == s.op)


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_int8_emulation_passes_on_the_other_tiny_hybrids(tiny_model_factory, arch):
    rep = _int8(tiny_model_factory(arch, "q4_k_m"), chunk=8)
    assert rep.passed, rep.reasons
    assert rep.replay.passed and rep.replay.worst.numeric == "int8_activations"


def test_int8_experts_pass_with_the_recurrent_route_tie(tiny_model_factory):
    """int8 experts too (moe_experts.mmvq's rounding), chunk 24, edge prompts: under int8's
    dense route_tie (8e-2) the drift swapped an expert at a reference gap of 0.082 (layer 2,
    position 23 of the 70-token prompt: KLD 0.066); the recurrent route_tie borrows it."""
    be = Int8Candidate()
    be.experts = True
    m = build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), be)
    cand = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 24, **INT8_CANDIDATE})
    rep = validate(m, cand, PROMPTS, steps=6)
    assert rep.passed, rep.reasons
    assert rep.tolerances["route_tie"] == RECURRENT_END_TO_END["int8_activations"]["route_tie"]
    ops = {s.op: s for s in rep.replay.ops}
    assert ops["moe_experts"].numeric == "int8_activations" and ops["moe_experts"].nmse > 1e-5
    assert ops["router_topk"].nmse == 0.0  # the reference's logits: the same experts, exactly


@pytest.mark.parametrize("transposed", [False, True])
def test_vulkan_replay_compares_states_across_layouts(tiny_model_factory, transposed):
    """The reference keeps S (Vulkan's default), a state_transposed candidate S^T in its cache:
    replay compares both as S and hands the candidate the reference's state in its own layout,
    so a correct candidate passes in either layout; a state put back in the wrong layout would
    not (the decode steps after it would read S^T as S)."""
    import engine.verify.op_replay as R
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend

    be = make_backend()
    try:
        m = build_model(open_model(tiny_model_factory("qwen35", "q4_k_m")), be)
        ref = TuningConfig.default("vulkan")
        flat = {"delta_net.state_transposed": transposed, "prefill.chunk_tokens": 8}
        cand = ref.replace(**flat)
        tokens = m.forced_run(PROMPT[:13], 4, "per_token").tokens
        r = R.replay(m, ref, cand, PROMPT[:13], tokens, 4)
        ops = {s.op: s for s in r.ops}
        assert r.passed and not r.unmatched, r.lines()
        assert ops["delta_net"].nmse < 1e-10 and ops["delta_net"].uses > 0
    finally:
        be.close()


def test_cached_reference_recordings_keep_the_verdicts(tiny_model_factory, monkeypatch):
    """validate's ref_cache keeps the replay's reference recordings (per prompt and candidate
    chunk): a later candidate replays against them with no reference pass, and a bug
    validated after an honest candidate is still rejected by replay."""
    import engine.verify.op_replay as R

    path = tiny_model_factory("qwen35", "q4_k_m")
    honest = build_model(open_model(path), NumpyBackend())
    cand = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 8})
    cache: dict = {}
    kw = {"steps": 4, "edges": False, "ref_cache": cache}

    def kept() -> list:
        return [k for k in cache if k[0] == "replay" and len(k) == 5]

    # the first prompt's recording measures the bytes per position; the later ones are kept
    assert validate(honest, cand, PROMPTS, **kw).passed and len(kept()) == len(PROMPTS) - 1
    assert validate(honest, cand, PROMPTS, **kw).passed and len(kept()) == len(PROMPTS)
    assert cache[R._USED] == sum(cache[k].nbytes for k in kept())

    def no_reference_pass(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("a cached recording was recorded again")

    monkeypatch.setattr(R._Reference, "__init__", no_reference_pass)
    bad = build_model(open_model(path), SkNotStk())
    rep = validate(bad, cand, PROMPTS, **kw | {"blame_failures": False})
    assert not rep.passed and rep.replay.first.op == "delta_net"
    assert all(cache[k].rows for k in kept())  # read, not consumed
    monkeypatch.undo()
    small = R.replay(honest, TuningConfig.default("numpy"), cand, PROMPT, [1] * 4, 4,
                     cache={R._BPP: 1e9}, cache_bytes=1)  # fmt: skip
    assert small.passed  # over the byte budget: streamed in segments, not kept


def test_an_int8_reference_loosens_the_float_ops_judged_against_it(tiny_model_path):
    """validate --reference mmvq (tests/engine/backends/cuda/test_cuda_ops.py's int8 paths): the
    reference records
    every row through its int8 decode matmul, so the candidate's float batched matmul differs
    from those rows by the reference's own int8 error. It is judged by the looser of its class
    and the reference's (int8_activations), not by order_only's 1e-8 (red on the H200); a float
    reference keeps order_only's bound, and a real bug stays over the loosened one."""
    be = Int8Candidate()  # int8 decode rows only under INT8_CANDIDATE, float prefill rows
    m = build_model(open_model(tiny_model_path), be)
    ref = TuningConfig.default("numpy").replace(**INT8_CANDIDATE)
    cand = ref.replace(**{"prefill.chunk_tokens": 8})
    m.set_config(ref)
    tokens = m.forced_run(PROMPT, 4, "per_token").tokens
    r = replay(m, ref, cand, PROMPT, tokens, 4)
    ops = {s.op: s for s in r.ops}
    mp = ops["matmul_prefill"]
    assert mp.numeric == "order_only" and mp.bound == INT8.op_nmse
    assert NUMERIC_BUDGETS["order_only"].op_nmse < mp.nmse < INT8.op_nmse  # the int8 error
    assert r.passed, r.reasons()
    float_ref = replay(m, TuningConfig.default("numpy"), cand, PROMPT, tokens, 4)
    assert {s.op: s for s in float_ref.ops}["matmul_prefill"].bound == (
        NUMERIC_BUDGETS["order_only"].op_nmse
    )

    class Off(Int8Candidate):  # batched matmuls off by 10%: far outside int8's rounding
        def _matmul(self, x, w):  # noqa: ANN001, ANN202
            out = super()._matmul(x, w)
            return out * np.float32(1.1) if x.shape[0] > 1 else out

    bad = build_model(open_model(tiny_model_path), Off())
    bad.set_config(ref)
    r = replay(bad, ref, cand, PROMPT, tokens, 4)
    assert not r.passed and r.first.op == "matmul_prefill"


def test_recording_budget_is_a_quarter_of_memory_at_least_4_gib(monkeypatch):
    """A GPU node (128 GiB) keeps 32 GiB of reference recordings: a 9B-like study's whole prompt
    set (~6 GB) is recorded once, not again for every candidate; a small machine keeps 4 GiB."""
    import engine.verify.op_replay as R

    pages = {"SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(R.os, "sysconf", lambda name: pages.get(name, (128 << 30) // 4096))
    assert R.cache_bytes() == 32 << 30
    monkeypatch.setattr(R.os, "sysconf", lambda name: pages.get(name, (8 << 30) // 4096))
    assert R.cache_bytes() == 4 << 30

    def missing(name):  # noqa: ANN001, ANN202
        raise ValueError(name)

    monkeypatch.setattr(R.os, "sysconf", missing)
    assert R.cache_bytes() == R.CACHE_FLOOR


def test_cuda_row_stats_match_the_hosts_and_come_back_in_one_transfer() -> None:
    """CudaBackend.row_stats (on the device, no wait) gives the base backend's host numbers
    per row (a NaN row included) and stats_host splits one download back into each use's."""
    from engine.backends.base import Backend
    from tests.cuda_fake import FakeCuda

    be = FakeCuda()
    rng = np.random.default_rng(3)
    cases = [rng.standard_normal((n, w)).astype(np.float32) for n, w in ((1, 64), (5, 33))]
    cases[1][2, 7] = np.nan
    cases.append(rng.standard_normal((3, 20)).astype(np.float16))  # row_stats_f16
    refs = [(c + rng.standard_normal(c.shape) * 1e-3).astype(np.float32) for c in cases]
    pend = [be.row_stats(be.upload(c), be.upload(r), r) for c, r in zip(cases, refs, strict=True)]
    downloads = []
    be.download = lambda t: downloads.append(t.shape) or np.array(t)  # type: ignore[method-assign]
    got = be.stats_host(pend)
    assert len(downloads) == 1
    for c, r, g in zip(cases, refs, got, strict=True):
        want = Backend.row_stats(be, c, r, r)
        assert g.shape == (4, c.shape[0])
        np.testing.assert_array_equal(g, want)
    assert np.isnan(got[1][0, 2]) and got[1][3, 2] == 7  # NaN's row: its column found


def test_vulkan_row_stats_are_read_after_the_op_that_follows_overwrites() -> None:
    """Vulkan's row_stats copies the output in the stream's order and reads it at stats_host:
    the host's numbers even when the tensor is overwritten in between (the next op's write)."""
    from engine.backends.base import Backend
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend

    be = make_backend()
    try:
        rng = np.random.default_rng(5)
        c = rng.standard_normal((3, 40)).astype(np.float32)
        r = c + rng.standard_normal(c.shape).astype(np.float32) * 1e-2
        t = be.upload(c)
        pending = be.row_stats(t, be.upload(r), r)
        z = be.upload(np.zeros_like(c))
        be.stream.copy(z.buf, 4 * z.offset, t.buf, 4 * t.offset, c.nbytes)
        (got,) = be.stats_host([pending])
        np.testing.assert_array_equal(got, Backend.row_stats(be, c, r, r))
        assert not np.any(be.download(t))  # it was overwritten after the copy
    finally:
        be.close()
