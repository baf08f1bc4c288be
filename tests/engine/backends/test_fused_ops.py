"""The backend contract's fused ops (attn_in, matmul_add, ffn, matmul_add_norm, ffn_norm) default
to the unfused op sequence, call for call: Model's fused trunk (no hook) and its hooked trunk
make the same op calls with the same arguments on a backend that does not fuse, so their outputs
are identical. No GPU."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.backends.plan import AttnIn
from engine.gguf_model import open_model
from engine.models import build_model

PRIMITIVES = ("embedding", "rms_norm", "matmul", "add", "rope", "kv_write", "attention", "swiglu")


class Recording(NumpyBackend):
    """NumPy with a log of every primitive op call: (op, shapes of its array arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, tuple]] = []

    def __getattribute__(self, name: str):  # noqa: ANN204
        attr = super().__getattribute__(name)
        if name[1:] not in PRIMITIVES or name[0] != "_":  # an op's implementation: _matmul, ...
            return attr
        log = super().__getattribute__("log")

        def call(*args, **kw):  # noqa: ANN002, ANN003, ANN202
            log.append((name[1:], tuple(np.shape(a) for a in args if isinstance(a, np.ndarray))))
            return attr(*args, **kw)

        return call


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_fused_trunk_is_the_hooked_trunk_on_a_backend_that_does_not_fuse(tiny_model_factory, arch):
    m = build_model(open_model(tiny_model_factory(arch, "q4_k_m")), Recording())
    prompt = [3, 17, 99, 5, 42, 7, 250]
    runs = []
    for hook in (None, lambda *a: None):
        m.hook = hook
        m.backend.log.clear()
        out = m.generate(prompt, 4, keep_logits=True)
        runs.append((out, list(m.backend.log)))
    (fused, log_f), (hooked, log_h) = runs
    assert log_f == log_h, "the fused ops' defaults are not the unfused op sequence"
    assert fused.tokens == hooked.tokens
    assert np.array_equal(fused.last_logits, hooked.last_logits)
    for a, b in zip(fused.step_logits, hooked.step_logits, strict=True):
        assert np.array_equal(a, b)
    assert any(op == "add" for op, _ in log_f) and any(op == "rope" for op, _ in log_f)


def test_attn_in_default_writes_the_cache_and_ropes_q():
    be = NumpyBackend()
    rng = np.random.default_rng(0)
    from tests.op_cases import dense, qtensor

    T, C, H, Hkv, D, pos0 = 3, 64, 4, 2, 16, 5
    ws = tuple(qtensor(rng, (n, C), "Q8_0", std=0.1) for n in (H * D, Hkv * D, Hkv * D))
    bs = tuple(qtensor(rng, (n,), "F32") for n in (H * D, Hkv * D, Hkv * D))
    h = rng.standard_normal((T, C)).astype(np.float32)
    cache = be.new_kv_cache(1, pos0 + T, Hkv, D)
    wts = tuple(be.load_weight(w) for w in ws)
    bts = tuple(be.load_weight(b) for b in bs)
    q = be._attn_in(AttnIn(h, wts, bts, cache, 0, pos0, (H, Hkv, D), 1e4, False))
    qr, kr, vr = (h.astype(np.float64) @ dense(w).T + dense(b) for w, b in zip(ws, bs, strict=True))
    ref_q = be.ops.rope(qr.astype(np.float32).reshape(T, H, D), pos0, 1e4, False)
    ref_k = be.ops.rope(kr.astype(np.float32).reshape(T, Hkv, D), pos0, 1e4, False)
    np.testing.assert_allclose(q, ref_q, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cache.k[0][pos0:], ref_k, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cache.v[0][pos0:], vr.reshape(T, Hkv, D), rtol=1e-4, atol=1e-4)
    assert not cache.k[0][:pos0].any() and not cache.v[0][:pos0].any()
