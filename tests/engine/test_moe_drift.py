"""Issue 15's diagnosis of moe_experts.tc on the 35b-a3b (scripts/moe_drift.py, in git history): the
NumPy emulations of its arithmetic (tests/fp16_prefill.py) and the proposed drift-explained routing
of validate (engine.hybrid's route_ref): a routing the candidate's in-class router drift flips is
borrowed from the reference; a router fault (logits moved past op_nmse, or a wrong top-k on right
logits) is not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import open_model
from engine.models import build_model
from engine.runtime import load
from engine.tuning import TuningConfig
from engine.verify.validate import tokenize_prompts, validate
from tests.engine.verify.test_validate_routing import WrongKth
from tests.fp16_prefill import (
    Fp16Experts,
    Fp16ExpertsF32H,
    Fp16Prefill,
    candidate,
    fp16_budgets,
    validate_borrowing,
)
from tests.hybrid_mutants import MUTANTS as HYBRID_MUTANTS


@pytest.fixture(scope="module")
def moe_path(tiny_model_factory):
    return tiny_model_factory("qwen35moe", "q4_k_m")


def _long_prompt(path):
    return [tokenize_prompts(load(path, "numpy", use_promoted=False).tokenizer())[1]]


def _no_route_tie() -> dict:
    return {c: dataclasses.replace(b, route_tie=0.0) for c, b in fp16_budgets().items()}


def test_drift_routes_borrow_only_an_in_class_differing_top_k(moe_path):
    model = build_model(open_model(moe_path), NumpyBackend())
    zr = np.array([0.3, 1.0, 0.29, -2.0, 0.0, 0.1, -1.0, 0.5])  # k = 2: {1, 7}
    model.route_ref = {(2, 10): zr, (2, 11): zr, (2, 12): zr}
    model.route_nmse = 5e-4
    z = np.stack([
        zr + [0, 0, 0, 0, 0, 0, 0, -0.6],  # 7 below 0: {1, 0}, row NMSE 0.056: a fault
        zr + [0.01, 0, 0, 0, 0, 0, 0, -0.01],  # still {1, 7}: nothing to borrow
        zr + [0.0, 0, 0, 0, 0, 0, 0, -0.21],  # {1, 0}, NMSE 6.9e-3: a fault too
    ]).astype(np.float32)  # fmt: skip
    forced = model._drift_routes(z, 2, 10, [(t, None) for t in range(3)])
    assert [ids for _, ids in forced] == [None, None, None]
    zr2 = zr + [0, 0, 0, 0, 0, 0, 0, -0.19]  # reference {1, 7} by 0.01 over expert 0
    model.route_ref = {(2, 10): zr2}
    zc = (zr2 + [0.015, 0, 0, 0, 0, 0, 0, -0.015]).astype(np.float32)[None]  # NMSE 7e-5
    ((t, ids),) = model._drift_routes(zc, 2, 10, [(0, None)])
    assert ids.tolist() == [1, 7]
    assert model.routes_borrowed == [(2, 10, pytest.approx(0.01))]
    got = model.backend.ops.router_topk(model._forced_routes(zc, 2, 10), 2)[0]
    assert sorted(got[0].tolist()) == [1, 7]


def test_drift_explained_routing_borrows_an_fp16_flip(moe_path):
    """Without route_tie the fp16 GEMM's flip fails validate unless validate borrows the
    drift-explained routing (its default); with it the candidate passes, far under the budget."""
    model = build_model(open_model(moe_path), Fp16Prefill())
    prompts = _long_prompt(moe_path)
    rep = validate(model, candidate(), prompts, steps=4, budgets=_no_route_tie(), edges=False,
                   drift_routes=False)  # fmt: skip
    assert not rep.passed and not rep.routes_borrowed
    got = validate_borrowing(model, candidate(), prompts, budgets=_no_route_tie(), edges=False)
    assert got["passed"], got["reasons"]
    assert got["borrowed"] > 0 and got["nmse"] < 1e-4


class NoisyRouter(Fp16Prefill):
    """The router's matmul off by NMSE ~1e-2 (20x the fp16 op_nmse): flips it must not excuse."""

    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        y = super()._matmul(x, w)
        if w.qt.name.endswith("ffn_gate_inp.weight") and x.shape[0] > 1:
            rng = np.random.default_rng(x.shape[0])
            y = y + 0.1 * np.sqrt(np.mean(y * y)) * rng.standard_normal(y.shape)
        return y.astype(np.float32)


@pytest.mark.parametrize(
    "backend,budgets",
    [(WrongKth, fp16_budgets), (NoisyRouter, _no_route_tie)],
    ids=["wrong_top_k", "noisy_router"],
)
def test_drift_explained_routing_does_not_hide_a_routing_bug(moe_path, backend, budgets):
    model = build_model(open_model(moe_path), backend())
    got = validate_borrowing(
        model, candidate(), _long_prompt(moe_path), budgets=budgets(), edges=False
    )
    assert not got["passed"] and got["borrowed"] == 0


def test_fp16_experts_emulation_records_magnitudes_and_h_rounding(moe_path):
    """Fp16Experts keeps per call the magnitudes fp16 holds; Fp16ExpertsF32H differs from it
    only by H's rounding (an NMSE of fp16's ~1e-8 scale, not 0)."""
    gguf = open_model(moe_path)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, gguf.spec.n_embd)).astype(np.float32)
    ids = rng.integers(0, 8, (40, 2)).astype(np.int32)
    ids[:, 1] = (ids[:, 0] + 1) % 8
    w = np.full((40, 2), 0.5, np.float32)
    outs = []
    for cls in (Fp16Experts, Fp16ExpertsF32H):
        m = build_model(gguf, cls())
        exps = [m.weights[f"blk.0.ffn_{t}_exps.weight"] for t in ("gate", "up", "down")]
        outs.append(m.backend.ops.moe_experts(x, ids, w, *exps).astype(np.float64))
        (st,) = m.backend.stats
        assert st["x"] == pytest.approx(np.abs(x).max())
        assert 0 < st["h"] < 65504 and 0 < st["h_round_nmse"] < 1e-6
    err = np.sum((outs[0] - outs[1]) ** 2) / np.sum(outs[1] ** 2)
    assert 0 < err < 1e-6


@pytest.mark.parametrize("name", sorted(HYBRID_MUTANTS))
def test_drift_explained_routing_still_rejects_the_hybrid_mutants(tiny_model_factory, name):
    """Each planted hybrid bug (tests/hybrid_mutants.py) on the MoE qwen3next, judged under the
    fp16 class with route_tie off and drift-explained routing on: still rejected."""
    cls = HYBRID_MUTANTS[name]
    model = build_model(open_model(tiny_model_factory("qwen3next", "q4_k_m")), cls())
    flat = {"prefill.chunk_tokens": 8} | getattr(cls, "candidate", {})
    got = validate_borrowing(
        model, TuningConfig.from_flat("numpy", flat), [list(range(3, 3 + n)) for n in (5, 37)],
        budgets=_no_route_tie(), edges=False,
    )  # fmt: skip
    assert not got["passed"], name
