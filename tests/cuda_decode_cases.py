"""Helpers shared by the CUDA decode GPU tests (test_cuda_mmvw_q4k.py, test_cuda_mmvw_stream.py,
test_cuda_attn_decode.py, test_cuda_norm_decode.py): one decode matmul or one launch of three
matrices with canaries around the outputs, and whole tiny models that must decode alike or pass
validate. The backend and ``cp`` are arguments: tests/engine/backends/cuda/test_cuda_decode_host.py
runs the matmul
helpers on tests/cuda_fake.py's FakeCuda (NumPy standing in for CuPy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf_model import QTensor
from tests.engine.backends.cuda.test_cuda_ops import PROMPT, _model, cfg, guarded
from tests.op_cases import assert_same_decode, dense, qtensor

MMVW = {"matmul_decode.variant": "mmvw"}


def mmvw_knobs(**k: Any) -> dict:
    """matmul_decode.mmvw with the given matmul_decode knobs, as a flat config."""
    return MMVW | {f"matmul_decode.{n}": v for n, v in k.items()}


def mmvw_model(**k: Any) -> dict:
    """mmvw_knobs(**k) for a whole model's int8 decode: the KV write in rope_kv, split_kw
    attention, the multi-block argmax."""
    extras = {"rope.fuse_kv": 1, "attention_decode.variant": "split_kw", "argmax.variant": "multi"}
    return mmvw_knobs(**k) | extras


def run_matmul(cp: Any, be: Any, flat: dict, w: QTensor, x: np.ndarray) -> np.ndarray:
    """x @ w.T by be.matmul_into under flat, canaries around the output, x left unchanged."""
    be.set_config(cfg(**flat))
    y, intact = guarded(cp, (1, w.shape[0]))
    xd = be.upload(x)
    be.matmul_into(xd, be.load_weight(w), y)
    intact()
    assert np.array_equal(be.download(xd), x), "input changed"
    return y.get()


def run_three(
    cp: Any, be: Any, flat: dict, ws: list[QTensor], x: np.ndarray, bias: QTensor, res: np.ndarray
) -> list[np.ndarray]:
    """One be._mmvw launch under flat of three matrices: the first with bias added, the second
    alone, the third with the residual res; canaries around each output."""
    be.set_config(cfg(**flat))
    adds = [be.load_weight(bias).f32, None, be.upload(res)]
    mats, ys = [], []
    for w, a in zip(ws, adds, strict=True):
        y, intact = guarded(cp, (1, w.shape[0]))
        mats.append((be.load_weight(w), y, a))
        ys.append((y, intact))
    be._mmvw(be.upload(x), mats)
    outs = [y.get() for y, _ in ys]
    for _, intact in ys:
        intact()
    return outs


def matrices_with_adds(cp: Any, be: Any, rng: np.random.Generator, K: int, qtypes: tuple) -> tuple:
    """x [1, K] and up to three matrices of qtypes (131 rows with a bias, 1 row with no add, 66
    rows with a residual row) for one several-matrix launch: (x, the launch's (weight, output
    between canaries, add) per matrix, the checks' (output, dense weight, add in float64,
    canary check) per matrix)."""
    specs = list(zip(qtypes, ((131, "bias"), (1, None), (66, "residual")), strict=False))
    x = rng.standard_normal((1, K)).astype(np.float32)
    mats, checks = [], []
    for qtype, (N, add) in specs:
        w = qtensor(rng, (N, K), qtype, std=0.05)
        a, add_ref = None, np.zeros((1, N))
        if add == "bias":
            b = qtensor(rng, (N,), "F32")
            a, add_ref = be.load_weight(b).f32, dense(b)[None]
        elif add == "residual":
            r = rng.standard_normal((1, N)).astype(np.float32)
            a, add_ref = be.upload(r), r.astype(np.float64)
        y, intact = guarded(cp, (1, N))
        mats.append((be.load_weight(w), y, a))
        checks.append((y, dense(w), add_ref, intact))
    return x, mats, checks


def three_refs(ws: list[QTensor], x: np.ndarray, bias: QTensor, res: np.ndarray) -> list:
    """run_three's results in float64."""
    refs = [x.astype(np.float64) @ dense(w).T for w in ws]
    refs[0] = refs[0] + dense(bias)
    refs[2] = refs[2] + res
    return refs


def assert_model_runs_and_validates(
    be: Any, path: Path, flat: dict, kernel: str, monkeypatch: Any
) -> None:
    """The tiny model at path under flat launches kernel, its graph replay equals its eager
    decode to the bit, and validate passes it against mmvq within the int8 budget."""
    from engine.verify.validate import Tolerances, validate

    be.set_config(cfg(**flat))
    m = _model(path, be)
    names: list[str] = []
    launch = be._launch
    monkeypatch.setattr(
        be, "_launch", lambda mod, name, *a, **k: (names.append(name), launch(mod, name, *a, **k))
    )
    be.use_graphs = False
    eager = m.generate(PROMPT, 8, keep_logits=True)
    assert kernel in names, sorted(set(names))
    monkeypatch.setattr(be, "_launch", launch)
    be.use_graphs = True
    graph = m.generate(PROMPT, 8, keep_logits=True)
    assert_same_decode(graph, eager, "graph replay differs from eager decode")
    be.set_config(cfg())
    m = _model(path, be)
    tol = Tolerances(max_abs_diff=0.2, nmse=1e-3)
    ref = cfg(**{"matmul_decode.variant": "mmvq"})
    rep = validate(m, cfg(**flat), [PROMPT, PROMPT[:1]], steps=6, tol=tol, reference=ref)
    assert rep.passed, [p.reasons for p in rep.prompts]


def assert_config_graph_equals_eager(be: Any, path: Path, flat: dict) -> None:
    """The tiny model at path (built under the default config) decodes under flat with graph
    replay equal to eager, to the bit."""
    from tests.op_cases import assert_graph_equals_eager

    m = _model(path, be)
    be.set_config(cfg(**flat))
    assert_graph_equals_eager(be, m, PROMPT)
    be.set_config(cfg())


def assert_validates(be: Any, path: Path, flat: dict) -> None:
    """validate passes flat against the default reference with the registry's budget."""
    from engine.verify.validate import validate

    be.set_config(cfg())
    m = _model(path, be)
    rep = validate(m, cfg(**flat), [PROMPT, PROMPT[:1], list(range(40, 110))], steps=6)
    assert rep.passed, [p.reasons for p in rep.prompts]
    be.set_config(cfg())


def assert_decode_alike(be: Any, m: Any, flats: tuple, prompt: list[int], what: str) -> None:
    """m decodes prompt to the same tokens and logits, to the bit, under every flat config,
    eager and replayed; what names the difference when it does not."""
    runs = []
    for flat in flats:
        be.set_config(cfg(**flat))
        for graphs in (False, True):
            be.use_graphs = graphs
            runs.append(m.generate(prompt, 10, keep_logits=True))
    be.use_graphs = True
    for r in runs[1:]:
        assert_same_decode(r, runs[0], what)
    be.set_config(cfg())
