"""The verifier's blind spots of issue 30, each on the tiny model (whose rows all fill their
blocks) with the NumPy backend: a partial row block (the ragged check), a bug past the first
chunk of 256 (the crossing prompt), an unwritten argmax slice (poisoned scratch) and a bug in
a kernel both validate paths share (blame from the cross-check)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench import bench_prompt
from engine.gguf_model import open_model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.cross_check import apply_cross_check, cross_check_numpy
from engine.verify.validate import _validate, crossing_length, validate
from tests import mutants

STEPS = 3


def _model(path, plant):  # noqa: ANN001, ANN202
    return build_model(open_model(path), plant())


def _prompts(vocab: int = 512) -> list[list[int]]:
    return [bench_prompt(n, vocab, seed=3) for n in (5, 37)]


def _cand(**flat) -> TuningConfig:  # noqa: ANN003
    return TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 16, **flat})


def test_partial_row_block_caught_by_the_ragged_check(tiny_model_path):
    """A decode matmul that skips rows past the last multiple of 32 passes on the tiny model
    (every row count a multiple of 32); the ragged model's 688 and 509 rows catch it."""
    model = _model(tiny_model_path, mutants.DecodeTailRows)
    cand = _cand(**{"matmul_decode.variant": "ondemand"})
    alone = validate(model, cand, _prompts(), STEPS, ragged=False)
    assert alone.passed, "the tiny model itself has no ragged rows: the ragged check is needed"
    rep = validate(model, cand, _prompts(), STEPS)
    assert not rep.passed and rep.ragged is not None and not rep.ragged["passed"]
    assert rep.blame is not None and rep.blame.op == "matmul_decode", rep.blame
    assert any(r.startswith("ragged model: ") for r in rep.reasons)
    assert rep.to_dict()["ragged"]["blame"]["op"] == "matmul_decode"


def test_correct_candidate_passes_the_ragged_check(tiny_model_path):
    from engine.backends.numpy_ref import NumpyBackend

    model = _model(tiny_model_path, NumpyBackend)
    rep = validate(model, _cand(**{"matmul_decode.variant": "ondemand"}), _prompts(), STEPS)
    assert rep.passed, rep.reasons
    assert rep.ragged is not None and rep.ragged["passed"] and rep.seconds["ragged"] > 0


def test_crossing_length_follows_the_candidates_knobs():
    chunk256 = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 256})
    # the tiny model's longest fixed prompt is 247 tokens: inside one chunk of 256
    assert crossing_length(chunk256, longest=247, limit=4088) == 256 + 17
    assert crossing_length(chunk256, longest=258, limit=4088) is None  # crossed already
    assert crossing_length(chunk256, longest=247, limit=260) == 260  # the context caps it
    assert crossing_length(chunk256, longest=247, limit=257) is None  # T == 1 past it: no use
    vk = TuningConfig.from_flat("vulkan", {"prefill.chunk_tokens": 64})
    assert crossing_length(vk, longest=10, limit=4000) == 64 + 17  # tile_n 64, chunk 64


def test_rope_bug_past_the_first_chunk_of_256(tiny_model_path):
    """RoPE positions restarting in the second chunk: with chunk_tokens 256 no fixed or edge
    prompt reached it; the crossing prompt does."""
    model = _model(tiny_model_path, mutants.RopeChunkPositions)
    cand = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 256})
    rep = validate(model, cand, _prompts(), STEPS, ragged=False)
    assert not rep.passed and max(p.prompt_tokens for p in rep.prompts) == 256 + 17
    assert rep.blame is not None and rep.blame.op == "rope", rep.blame


class _ZeroedScratch(mutants.ArgmaxSliceUnwritten):
    """Unwritten memory that happens to hold zeros (fresh pages): the unwritten partial loses
    to every positive maximum, so without poison the bug shows only where the row's maximum
    lies in the unwritten slice."""

    def scratch(self, shape, dtype=np.float32):  # noqa: ANN001, ANN201
        return super().scratch(shape, dtype) if self.poison else np.zeros(shape, dtype)


def test_poison_catches_an_unwritten_argmax_slice_every_time(tiny_model_path):
    model = _model(tiny_model_path, _ZeroedScratch)
    prompts = [bench_prompt(n, 512, seed=3) for n in range(2, 8)]
    kw = {"replay_ops": False, "blame_failures": False, "edges": False}
    unpoisoned = _validate(model, _cand(), prompts, 1, **kw)
    missed = [p.prompt_tokens for p in unpoisoned.prompts if p.passed]
    assert missed, "some rows' maxima lie outside the unwritten slice: stale memory hides it"
    assert not model.backend.poison  # _validate leaves it off; validate sets and restores it
    rep = validate(model, _cand(), prompts, 1, ragged=False, **kw)
    assert not model.backend.poison
    assert not any(p.passed for p in rep.prompts), "poison: every prompt's argmax is caught"
    rep = validate(model, _cand(), prompts[:1], STEPS, replay_ops=False, ragged=False)
    assert rep.blame is not None and rep.blame.op == "argmax", rep.blame


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_poisoned_scratch_is_nan_or_minus_one(dtype):
    from engine.backends.numpy_ref import NumpyBackend

    be = NumpyBackend()
    be.poison = True
    a = be.scratch((3, 5), dtype)
    assert np.isnan(a).all() if dtype is np.float32 else (a == -1).all()


def test_blame_names_the_shared_kernel_when_the_reference_is_off(tiny_model_path):
    """A bug in the default decode matmul, which the per-token reference runs too: validate
    alone blames the candidate's batched matmul; with the cross-check folded in, the blame is
    the shared kernel, the first op off against NumPy."""
    model = _model(tiny_model_path, mutants.DefaultDecodeMatmulOff)
    rep = validate(model, _cand(), _prompts(), STEPS, ragged=False)
    assert not rep.passed and rep.blame is not None and rep.blame.op != "matmul_decode"
    cross = cross_check_numpy(model, _prompts()[:1], steps=STEPS)
    assert not cross["passed"]
    apply_cross_check(rep, cross)
    assert not rep.passed and rep.blame.op == "matmul_decode", rep.blame
    assert rep.to_dict()["blame"]["op"] == "matmul_decode"
