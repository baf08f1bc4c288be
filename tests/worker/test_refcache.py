"""worker.refcache: a reference run read back from disk holds its logits once."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from engine.model import ForcedRun
from worker.refcache import RefLogits


def test_a_run_read_from_disk_holds_its_logits_once(tmp_path: Path) -> None:
    # One row per position of a fresh read of the whole [P, V] array held P copies of it: on
    # the 1.5B (V = 151936) validate's 529-token prompt alone came to 175 GB (H200 OOM).
    P, V, steps, layers = 64, 512, 8, 2
    rng = np.random.default_rng(0)
    pos = range(P + steps - 1)
    run = ForcedRun(
        list(range(P)),
        list(range(steps)),
        {p: rng.standard_normal(V).astype(np.float32) for p in pos},
        {p: p % V for p in pos},
        {(ly, p): rng.standard_normal(8) for ly in range(layers) for p in pos},
    )
    key = ((("matmul.variant", "mmvf"),), tuple(range(P)), steps)
    RefLogits({"model": "m"}, tmp_path)[key] = run  # written to disk
    data = sum(a.nbytes for a in run.logits.values()) + sum(a.nbytes for a in run.router.values())

    fresh = RefLogits({"model": "m"}, tmp_path)
    tracemalloc.start()
    try:
        got = fresh.get(key)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert fresh.hits == 1 and got is not None
    assert held < 2 * data, f"{held} bytes held for {data} bytes of logits and router rows"
    assert got.logits.keys() == run.logits.keys()
    assert all(np.array_equal(got.logits[p], run.logits[p]) for p in pos)
    assert all(np.array_equal(got.router[k], v) for k, v in run.router.items())
    assert got.device_argmax == run.device_argmax and got.tokens == run.tokens
