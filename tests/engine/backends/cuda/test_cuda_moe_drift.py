"""moe_experts.tc under validate's proposed drift-explained routing (`pytest -m gpu`; issue 15, the
diagnosis of scripts/moe_drift.py, in git history): with route_tie off, the CUDA tc candidate on the
tiny qwen35moe passes once routings its in-class router drift flips are borrowed, and borrows none
where its router logits match the reference's top-k; the planted unsorted-output bug still fails."""

from __future__ import annotations

import dataclasses

import pytest

from engine.gguf_model import open_model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.budgets import NUMERIC_BUDGETS
from tests.fp16_prefill import validate_borrowing

pytestmark = pytest.mark.gpu

PROMPT = list(range(40, 110))  # 70 tokens: above gemm_min_t, so tc runs
TC = {"moe_experts.variant": "tc", "prefill.chunk_tokens": 512}


def _no_route_tie() -> dict:
    return {c: dataclasses.replace(NUMERIC_BUDGETS["fp16"], route_tie=0.0) for c in NUMERIC_BUDGETS}


@pytest.mark.parametrize("direct", [0, 1])
def test_moe_tc_passes_with_drift_explained_routing(be, tiny_model_factory, direct):
    be.set_config(TuningConfig.default("cuda"))
    m = build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), be)
    flat = {**TC, "moe_experts.wide_loads": direct, "moe_experts.direct": direct}
    got = validate_borrowing(
        m, TuningConfig.from_flat("cuda", flat), [PROMPT], budgets=_no_route_tie(), edges=False
    )
    assert got["passed"], got["reasons"]
    assert got["nmse"] < 1e-4
    assert m.route_ref == {}  # left off for the caller


def test_planted_moe_tc_unsorted_still_fails_with_drift_explained_routing(be, tiny_model_factory):
    """The planted unsorted-output bug (moe_tc.cu: outputs on the sorted rows) moves no router
    logit of its own layer: borrowing routings cannot hide it."""
    from tests.backend_params import open_backend
    from tests.mutants import Mutant, planted

    m = Mutant("MOE_TC_UNSORTED", "cuda", "moe_experts", "expert outputs land on the sorted "
               "rows", {"moe_experts.variant": "tc", "prefill.gemm_min_t": 2})  # fmt: skip
    with planted(m):
        be = open_backend("cuda")
        try:
            model = build_model(open_model(tiny_model_factory("qwen35moe", "q4_k_m")), be)
            cand = TuningConfig.default("cuda").replace(**m.candidate)
            got = validate_borrowing(model, cand, [PROMPT], budgets=_no_route_tie(), edges=False)
        finally:
            getattr(be, "close", lambda: None)()
    assert not got["passed"]
