"""Op cases and helpers shared by the differential suites
(tests/engine/backends/test_backend_ops.py for every
backend, tests/engine/backends/vulkan/test_vulkan_ops.py and
tests/engine/backends/cuda/test_cuda_ops.py per variant): random quantized
weights, their float64 reference, NMSE and the output checks."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.gguf_model import QTensor
from engine.quantize import quantize


def qtensor(
    rng: np.random.Generator, shape: tuple[int, ...], qtype: str, std: float = 1.0, name: str = "w"
) -> QTensor:
    """A random weight of shape, quantized to qtype by the engine's quantizer."""
    a = (rng.standard_normal(shape) * std).astype(np.float32)
    a2 = a.reshape(-1, shape[-1])
    raw = quantize(a2, qtype).view(np.uint8).reshape(a2.shape[0], -1)
    return QTensor(name, qtype, tuple(shape), raw)


def f32_tensor(name: str, a: np.ndarray) -> QTensor:
    """An F32 weight holding a (rows of the last axis), as a GGUF file would."""
    a = np.ascontiguousarray(a, np.float32)
    return QTensor(name, "F32", a.shape, a.view(np.uint8).reshape(-1, 4 * a.shape[-1]))


def dense(qt: QTensor) -> np.ndarray:
    """The weight as float64, dequantized by gguf-py (independent of the engine's decoders)."""
    out = dequantize(qt.raw, GGMLQuantizationType[qt.qtype])
    return np.asarray(out, np.float64).reshape(qt.shape)


def nmse(ref: np.ndarray, out: np.ndarray) -> float:
    """Normalized mean squared error of out against ref, in float64."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(np.sum((out - ref) ** 2) / max(np.sum(ref**2), 1e-30))


def check(out: np.ndarray, ref: np.ndarray, limit: float) -> None:
    """Same shape, no NaN or Inf, NMSE under limit."""
    assert out.shape == ref.shape, f"shape {out.shape} != {ref.shape}"
    assert np.isfinite(out).all(), "NaN or Inf in output"
    assert nmse(ref, out) < limit, f"NMSE {nmse(ref, out):.3g} >= {limit:g}"


def check_dot(out: np.ndarray, x: np.ndarray, w: np.ndarray, limit: float) -> None:
    """``out`` against x @ w.T (float64) for a matmul that rounds its activations (int8 Q8_1):
    the error is normalised by the products' expected square, sum_k x_k^2 w_k^2 per output,
    or by the realised one where that is larger. A one-row output whose true value happens to
    land near zero would otherwise make the plain NMSE of a correct kernel large (one such row
    measured 0.03 on the H200)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    ref = x @ w.T
    assert out.shape == ref.shape, f"shape {out.shape} != {ref.shape}"
    assert np.isfinite(out).all(), "NaN or Inf in output"
    scale = max(float(np.sum(ref**2)), float(np.sum((x**2) @ (w**2).T)), 1e-30)
    err = float(np.sum((np.asarray(out, np.float64) - ref) ** 2)) / scale
    assert err < limit, f"normalised error {err:.3g} >= {limit:g}"


def seed_of(*key: object) -> int:
    """A seed from test ids that is the same in every process (``hash`` of a str is not)."""
    import zlib

    return zlib.crc32(repr(key).encode())


def write_cache_and_attend(
    be, rng: np.random.Generator, T: int, H: int, Hkv: int, D: int, pos0: int
):  # noqa: ANN001, ANN201 - any backend; tensors are opaque
    """Fill a one-layer KV cache (positions before pos0 by an earlier write, then T new ones),
    check the write landed in its slots and nowhere else (a canary for out-of-range writes), and
    run attention. Returns (q, k, v, cache, k cache, v cache, attention output) as host arrays
    where they are arrays."""
    cap = pos0 + T + 5
    cache = be.new_kv_cache(1, cap, Hkv, D)
    if pos0:  # earlier positions hold values written by a previous call
        kp = rng.standard_normal((pos0, Hkv, D)).astype(np.float32)
        vp = rng.standard_normal((pos0, Hkv, D)).astype(np.float32)
        be.ops.kv_write(cache, 0, be.upload(kp), be.upload(vp), 0)
    k = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((T, Hkv, D)).astype(np.float32)
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    be.ops.kv_write(cache, 0, be.upload(k), be.upload(v), pos0)
    kc, vc = be.download(cache.k[0]), be.download(cache.v[0])
    assert np.array_equal(kc[pos0 : pos0 + T], k) and np.array_equal(vc[pos0 : pos0 + T], v)
    assert not kc[pos0 + T :].any() and not vc[pos0 + T :].any(), "write outside its slots"
    out = be.download(be.ops.attention(be.upload(q), cache, 0, pos0))
    return q, k, v, cache, kc, vc, out


def attention_ref(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int) -> np.ndarray:
    """Causal GQA attention in float64: query t of q [T, H, D] at position pos0 + t sees cache
    positions 0 .. pos0 + t of kc, vc [S, Hkv, D]."""
    T, H, D = q.shape
    Hkv = kc.shape[1]
    ref = np.zeros((T, H, D))
    for t in range(T):
        L = pos0 + t + 1
        for h in range(H):
            kv = h // (H // Hkv)
            s = kc[:L, kv].astype(np.float64) @ q[t, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            ref[t, h] = (p / p.sum()) @ vc[:L, kv]
    return ref


def assert_same_decode(got, want, what: str) -> None:  # noqa: ANN001
    """Two decodes (keep_logits) give the same tokens and every step's logits to the bit;
    what names the difference when they do not."""
    assert got.tokens == want.tokens
    for a, b in zip(got.step_logits, want.step_logits, strict=True):
        assert np.array_equal(a, b), what


def assert_graph_equals_eager(be, model, prompt: list[int], steps: int = 10):  # noqa: ANN001, ANN201
    """The backend's CUDA-graph decode gives the eager decode's tokens and logits, to the bit.
    Returns the eager decode."""
    be.use_graphs = False
    eager = model.generate(prompt, steps, keep_logits=True)
    be.use_graphs = True
    graph = model.generate(prompt, steps, keep_logits=True)
    assert_same_decode(graph, eager, "graph replay differs from eager decode")
    return eager


def hooked_decode(be, model, prompt: list[int], steps: int):  # noqa: ANN001, ANN201
    """The model's eager decode under a no-op hook: the unfused schedule, one launch per op.
    Graphs back on and the hook off afterwards."""
    model.hook = lambda *a: None
    be.use_graphs = False
    try:
        return model.generate(prompt, steps, keep_logits=True)
    finally:
        model.hook, be.use_graphs = None, True


def assert_hooked_matches(be, model, eager, prompt: list[int], steps: int) -> None:  # noqa: ANN001
    """The hooked (unfused) decode gives eager's tokens, and its logits within NMSE 1e-10."""
    hooked = hooked_decode(be, model, prompt, steps)
    assert hooked.tokens == eager.tokens
    for a, b in zip(hooked.step_logits, eager.step_logits, strict=True):
        check(b, a.astype(np.float64), 1e-10)


def k_for(qtype: str, blocks: int) -> int:
    """A row length of ``blocks`` blocks of qtype; a float type's "block" is 37 values (K not a
    multiple of 8: the fp16 rows' zero pad is read)."""
    return (256 if qtype.endswith("_K") else 32 if qtype.startswith("Q") else 37) * blocks


def assert_ssm_conv_carries_state(be, splits: list[int], K: int, Cc: int, seed: int) -> None:  # noqa: ANN001
    """ssm_conv of one sequence fed in splits (T < K - 1 included: old state rows shift up in
    place) against the NumPy backend: each split's output within NMSE 1e-12, the conv state
    equal to the bit after each split."""
    from engine.backends.numpy_ref import NumpyBackend

    rng = np.random.default_rng(seed)
    w, x, s0 = (rng.standard_normal(s).astype(np.float32) for s in ((Cc, K), (sum(splits), Cc),
                                                                      (K - 1, Cc)))  # fmt: skip
    ref, s_ref = NumpyBackend(), s0.copy()
    wn, wb = ref.load_weight(f32_tensor("conv", w)), be.load_weight(f32_tensor("conv", w))
    s_be = be.upload(s0)
    t0 = 0
    for n in splits:
        want = ref.ops.ssm_conv(x[t0 : t0 + n], s_ref, wn)
        got = be.download(be.ops.ssm_conv(be.upload(x[t0 : t0 + n]), s_be, wb))
        check(got, want.astype(np.float64), 1e-12)
        assert np.array_equal(be.download(s_be), s_ref), f"state after {t0 + n} tokens"
        t0 += n
