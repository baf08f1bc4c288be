"""MoE routing near-ties in validate: an fp16 prefill GEMM (CUDA's default, emulated on NumPy by
tests/fp16_prefill.py) moves a router logit across a near-tie and swaps a whole expert; validate
borrows the reference's choice below the budget's route_tie, and still rejects a router bug."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import open_model
from engine.models import build_model
from engine.runtime import load
from engine.verify.validate import near_tie_routes, tokenize_prompts, validate
from tests.fp16_prefill import Fp16Experts, Fp16Prefill, candidate, fp16_budgets


def test_near_tie_routes_take_the_reference_top_k_below_the_bound():
    router = {
        (0, 5): np.array([0.3, 1.0, 0.2999, -2.0]),  # k=2: 2nd 0.3 vs 3rd 0.2999, gap 1e-4
        (1, 5): np.array([0.3, 1.0, 0.1, -2.0]),  # gap 0.2
        (2, 7): np.array([0.5, 0.5, 0.5, 0.0]),  # exact tie: the lower ids, like router_topk
    }
    routes = near_tie_routes(router, 2, 1e-2)
    assert sorted(routes) == [(0, 5), (2, 7)]
    assert routes[(0, 5)].tolist() == [1, 0]
    assert routes[(2, 7)].tolist() == [0, 1]
    assert near_tie_routes(router, 2, 0.0) == {}


@pytest.fixture(scope="module")
def moe_path(tiny_model_factory):
    return tiny_model_factory("qwen35moe", "q4_k_m")


def test_forced_routes_choose_the_reference_experts_with_own_weights(moe_path):
    model = build_model(open_model(moe_path), NumpyBackend())
    k = model.spec.moe.n_expert_used
    assert k == 2 and model.spec.moe.n_expert == 8  # the tiny preset
    logits = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    want = np.array([7, 2])
    model.routes = {(1, 11): want}  # row 1 of a chunk at pos0 10, layer 1
    ids, w = model.backend.ops.router_topk(model._forced_routes(logits, 1, 10), k)
    free_ids, free_w = model.backend.ops.router_topk(logits, k)
    assert sorted(ids[1].tolist()) == sorted(want.tolist())
    z = logits[1, ids[1]].astype(np.float64)
    np.testing.assert_allclose(w[1], np.exp(z) / np.exp(z).sum(), rtol=1e-6)
    np.testing.assert_array_equal(ids[[0, 2]], free_ids[[0, 2]])  # other rows untouched
    np.testing.assert_array_equal(w[[0, 2]], free_w[[0, 2]])
    assert model._forced_routes(logits, 0, 10) is logits  # no forced row in layer 0


def _long_prompt(path):
    return [tokenize_prompts(load(path, "numpy", use_promoted=False).tokenizer())[1]]


def test_fp16_prefill_routing_flip_is_a_near_tie_not_a_kernel_bug(moe_path):
    """The H200 failure (blame moe_experts layer 0 token 28) reproduced on the CPU: without
    route_tie one near-tie flip fails the fp16 candidate; with the registry's it passes."""
    model = build_model(open_model(moe_path), Fp16Prefill())
    prompts = _long_prompt(moe_path)
    off = {c: dataclasses.replace(b, route_tie=0.0) for c, b in fp16_budgets().items()}
    rep = validate(
        model, candidate(), prompts, steps=4, budgets=off, edges=False, drift_routes=False
    )
    assert not rep.passed and rep.nmse > 0.1, rep.reasons
    assert (rep.blame.op, rep.blame.layer, rep.blame.token) == ("moe_experts", 0, 28)
    rep = validate(model, candidate(), prompts, steps=4, budgets=fp16_budgets(), edges=False)
    assert rep.passed, rep.reasons
    assert rep.prompts[0].routes_forced > 0 and rep.nmse < 1e-4


def test_fp16_experts_pass_validate_under_the_fp16_budget(moe_path):
    """moe_experts.tc's arithmetic (fp16 x, expert rows and SwiGLU output; tests/fp16_prefill.py)
    on top of the fp16 GEMM: a correct candidate validate must pass in the fp16 class."""
    model = build_model(open_model(moe_path), Fp16Experts())
    rep = validate(
        model, candidate(), _long_prompt(moe_path), steps=4, budgets=fp16_budgets(), edges=False
    )
    assert rep.passed, rep.reasons
    assert rep.nmse < 1e-4, rep.nmse


class WrongKth(Fp16Prefill):
    """Batched top-k off by one: the (k+1)-th expert instead of the k-th."""

    def _router_topk(self, logits, k):  # noqa: ANN001, ANN201
        if logits.shape[0] == 1:
            return super()._router_topk(logits, k)
        ids, _ = super()._router_topk(logits, k + 1)
        z = np.take_along_axis(logits.astype(np.float64), ids, axis=-1)
        keep = [*range(k - 1), k]
        w = np.exp(z[:, keep] - z[:, keep].max(axis=-1, keepdims=True))
        return ids[:, keep], (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)


def test_route_tie_does_not_hide_a_router_bug(moe_path):
    model = build_model(open_model(moe_path), WrongKth())
    rep = validate(
        model, candidate(), _long_prompt(moe_path), steps=4, budgets=fp16_budgets(), edges=False
    )
    assert not rep.passed
    assert rep.blame is not None and rep.blame.op == "router_topk", rep.blame
