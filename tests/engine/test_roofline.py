"""engine.roofline: the bytes a decode token reads and the FLOPs a prefill token computes, from a
model's tensors, and where a bench figure sits against a device's ceilings."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from engine.gguf_model import open_model
from engine.quantize import row_bytes
from engine.roofline import (
    CEILINGS,
    Tensor,
    decode_position,
    gguf_tensors,
    model_work,
    prefill_position,
)


def test_every_weight_is_read_once_per_decode_token(tiny_model_path):
    g = open_model(tiny_model_path)
    ts = gguf_tensors(g)
    w = model_work(g.spec, ts)
    emb = next(t for t in ts if t.name == "token_embd.weight")
    total = sum(t.nbytes for t in ts)
    assert total == sum(g.tensor(t.name).nbytes for t in ts)  # sizes as stored in the file
    # the embedding is gathered (one row) unless it is also the LM head
    gathered = 0 if g.spec.tied_embeddings else emb.nbytes - emb.nbytes // emb.shape[0]
    assert w.weight_bytes == total - gathered
    # prefill: 2 FLOPs per weight element of the layers (no embedding, no LM head)
    gemm = [t for t in ts if len(t.shape) == 2 and t.name.startswith("blk.")]
    assert w.matmul_flops == 2 * sum(t.elements for t in gemm)
    s = g.spec
    assert w.kv_bytes_per_pos == 2 * 4 * s.n_head_kv * s.head_dim * s.n_layers
    assert w.state_bytes == 0


def test_moe_experts_count_the_used_fraction(tiny_model_path):
    spec = open_model(tiny_model_path).spec
    from engine.gguf_model import MoESpec

    moe = replace(spec, moe=MoESpec(n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff_shexp=0))
    exps = Tensor("blk.0.ffn_up_exps.weight", "Q8_0", (8, 64, 256))
    dense = Tensor("blk.0.ffn_up.weight", "Q8_0", (64, 256))
    w = model_work(moe, [exps, dense])
    assert w.weight_bytes == exps.nbytes // 4 + dense.nbytes
    assert w.matmul_flops == 2 * (8 * 64 * 256 // 4 + 64 * 256)
    assert exps.nbytes == 8 * 64 * row_bytes("Q8_0", 256)


def test_positions_against_the_h200_ceilings(tiny_model_path):
    g = open_model(tiny_model_path)
    w = model_work(g.spec, gguf_tensors(g))
    c = CEILINGS["h200"]
    d = decode_position(w, 512, 128, 100.0, c)
    per = w.weight_bytes + w.kv_bytes_per_pos * 576
    assert d.per_token == per and d.achieved == pytest.approx(per * 100 / 1e9)
    assert d.fraction == pytest.approx(d.achieved / c.copy_gb_s)
    assert d.ceiling_tok_s == pytest.approx(100.0 / d.fraction)
    p = prefill_position(w, 512, 1000.0, None)  # a device class without measured ceilings
    assert p.fraction is None and p.achieved == pytest.approx(p.per_token * 1000 / 1e12)


def test_bench_reports_the_roofline(tiny_model_path):
    out = subprocess.run(
        [sys.executable, "-m", "engine", "bench", "--model", str(tiny_model_path),
         "--backend", "numpy", "--prompt-tokens", "7", "--gen-tokens", "3", "--repeats", "1",
         "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    (r,) = doc["roofline"]
    assert r["prompt_tokens"] == 7 and r["decode"]["achieved"] > 0 and r["prefill"]["achieved"] > 0
    assert r["decode"]["fraction"] is None  # the CPU class has no measured ceilings
