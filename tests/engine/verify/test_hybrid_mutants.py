"""The verifier sees the hybrid family: engine.verify.validate passes the honest NumPy path, rejects
each planted bug of tests/hybrid_mutants.py in the batched prefill and blames the op it lives
in; the same bugs in every path (where validate's two paths agree) are rejected by the
transformers reference."""

from __future__ import annotations

import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import GGUFModel, open_model
from engine.model import Model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.validate import compare_logits, validate
from tests.hybrid_mutants import MUTANTS, everywhere

PROMPTS = [list(range(3, 3 + n)) for n in (1, 5, 37)]
CANDIDATE = {"prefill.chunk_tokens": 8}


def _validate(path, backend_cls):
    m = build_model(open_model(path), backend_cls())
    flat = CANDIDATE | getattr(backend_cls, "candidate", {})
    return validate(m, TuningConfig.from_flat("numpy", flat), PROMPTS, steps=4)


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35"])
def test_honest_hybrid_passes(tiny_model_factory, arch):
    rep = _validate(tiny_model_factory(arch, "q4_k_m"), NumpyBackend)
    assert rep.passed, rep.to_dict()


def test_honest_chunked_scan_passes(tiny_model_factory):
    """The candidate the chunked mutant runs under, without the bug."""
    honest = type("Honest", (NumpyBackend,), {"candidate": MUTANTS[CHUNKED].candidate})
    rep = _validate(tiny_model_factory("qwen3next", "q4_k_m"), honest)
    assert rep.passed, rep.to_dict()


CHUNKED = "delta_net_chunked_no_intra_mask"


# (op, output) each bug is blamed on: a recurrent state is part of its op's output
BLAMED = {
    "delta_net_Sk_not_STk": ("delta_net", "ssm_scan"),
    "state_not_carried_to_decode": ("delta_net", "ssm_state"),
    "conv_state_off_by_one": ("ssm_conv", "conv_state"),
    "router_topk_unnormalised": ("router_topk", "router_weights"),
    "delta_net_chunked_no_intra_mask": ("delta_net", "ssm_scan"),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_validate_rejects_prefill_mutant_and_blames_its_op(tiny_model_factory, name):
    rep = _validate(tiny_model_factory("qwen3next", "q4_k_m"), MUTANTS[name])
    assert not rep.passed, name
    assert any(p.reasons for p in rep.prompts)
    # op-level replay rejects it on the reference's own inputs and names op and output
    assert rep.replay is not None and not rep.replay.passed, rep.replay
    assert rep.blame is not None and (rep.blame.op, rep.blame.label) == BLAMED[name], rep.blame


@pytest.mark.parametrize("name", ["delta_net_Sk_not_STk", "router_topk_unnormalised"])
def test_reference_rejects_mutant_in_every_path(tmp_path, name):
    torch = pytest.importorskip("torch", reason="the dev extra installs torch==2.13.0")
    pytest.importorskip("transformers")
    from tests.hf_hybrid import export_gguf, make_hf

    hf = make_hf("qwen3next")
    path = export_gguf(hf, "qwen3next", tmp_path / "ref.gguf")
    prompt = [5, 17, 99, 3, 42, 7, 250, 11, 64]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0, -1].double().numpy()
    bad = build_model(GGUFModel(path), everywhere(MUTANTS[name])())
    assert _validate_silent(bad, prompt)  # validate alone cannot see it ...
    _, _, nmse, _, _ = compare_logits(ref, bad.generate(prompt, 0).last_logits)
    assert nmse > 1e-3, nmse  # ... the reference can (honest: ~1e-12)


def _validate_silent(model: Model, prompt: list[int]) -> bool:
    return validate(model, TuningConfig.from_flat("numpy", CANDIDATE), [prompt], steps=4).passed


# --- Vulkan: bugs planted in the chunked scan's shader (tests/planted) -------------------------
VULKAN_CHUNKED = {"delta_net.variant": "chunked", "delta_net.chunk": 4, "prefill.chunk_tokens": 8}
VULKAN_MUTANTS = {
    "DN_CHUNK_NO_MASK": "delta_net",  # each token reads the later tokens of its chunk
    "DN_CHUNK_STATE_NOT_STORED": "delta_net",  # prefill's state never reaches decode
}


@pytest.mark.parametrize("name", [None, *VULKAN_MUTANTS])
def test_vulkan_chunked_scan_mutants_are_rejected_and_blamed(tiny_model_factory, name):
    """validate on Vulkan (per-token reference: the sequential kernel; batched candidate: the
    chunked one) passes the shipped shader and rejects each planted bug, blaming delta_net."""
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend
    from tests.mutants import Mutant, planted

    path = tiny_model_factory("qwen3next", "q4_k_m")
    with planted(Mutant(name or "", "vulkan" if name else "numpy", "delta_net", "")):
        be = make_backend()
        try:
            cand = TuningConfig.default("vulkan").replace(**VULKAN_CHUNKED)
            rep = validate(build_model(open_model(path), be), cand, PROMPTS, steps=4)
        finally:
            be.close()
    if name is None:
        assert rep.passed, rep.to_dict()
        return
    assert not rep.passed, name
    assert rep.blame is not None and rep.blame.op == VULKAN_MUTANTS[name], str(rep.blame)
    assert rep.replay is not None and not rep.replay.passed, rep.replay
