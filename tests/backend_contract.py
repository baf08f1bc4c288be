"""The backend contract (engine.backends.base.Backend) as one test class: every op against a
float64 NumPy formula on random shapes that include sizes that are not multiples of any tile,
column tile or block, and size-1 dims. Each backend's op suite subclasses it, naming its backend
and how it plants canaries around outputs:

    class TestVulkanContract(BackendContract):   # tests/engine/backends/vulkan/test_vulkan_ops.py
        backend = "vulkan"

Checks per op: NMSE under the op's limit, no NaN/Inf, exact output shape, inputs left unchanged,
canaries after outputs (``poison`` before the op, ``assert_canaries`` after), and KV-cache slots
outside the written range left untouched. A weight type a backend does not declare is skipped as
"not supported", apart from a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from engine.tuning import REGISTRY, TuningConfig
from tests.backend_params import open_backend, usable
from tests.op_cases import attention_ref, check, dense, qtensor, write_cache_and_attend

NMSE = {"matmul": 5e-4, "default": 1e-6}  # matmul: GPU accumulation order and fp16 paths
QUANTS = ["F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]


def variant_configs(be, op: str) -> list[TuningConfig]:
    """One config per registered variant of op that be's device allows (default parameters:
    Vulkan's cooperative-matrix variants need a device that has them); just the default config
    where the backend declares no op of that name (CUDA splits attention in two)."""
    base = TuningConfig.default(be.name)
    if op not in {o.name for o in REGISTRY.ops(be.name)}:
        return [base]
    cfgs = [base.replace(**{f"{op}.variant": v.name}) for v in REGISTRY.op(be.name, op).variants]
    dev = be.device_info()
    return [c for c in cfgs if not c.problems(dev)]


def _supported(be, op: str, qtype: str | None = None) -> None:
    if not REGISTRY.supports(be.name, op, qtype):
        pytest.skip(f"{be.name} declares no {op} kernel for {qtype} (not supported, not failed)")


# --- matmul: decode (T == 1) and batched prefill (1 < T <= chunk_tokens)- ----------------------
def _block_k(qtype: str) -> int:
    return 256 if qtype.endswith("_K") else 32 if qtype.startswith("Q") else 1


def _decode_variants(be) -> list[TuningConfig]:  # noqa: ANN001
    """The default config with each registered matmul_decode variant (at its defaults) that
    this device allows."""
    dev = be.device_info()
    base = TuningConfig.default(be.name)
    cfgs = [
        base.replace(**{"matmul_decode.variant": v.name})
        for v in REGISTRY.op(be.name, "matmul_decode").variants
    ]
    return [c for c in cfgs if not c.problems(dev)]


def _rope_ref(x: np.ndarray, pos0: int, theta: float, neox: bool) -> np.ndarray:
    """Rotation of each pair (a, b) by angle p * theta^(-2i/D), written per element."""
    T, H, D = x.shape
    out = np.zeros(x.shape, np.float64)
    for t in range(T):
        for i in range(D // 2):
            ang = (pos0 + t) * theta ** (-2.0 * i / D)
            c, s = np.cos(ang), np.sin(ang)
            ia, ib = (i, i + D // 2) if neox else (2 * i, 2 * i + 1)
            a, b = x[t, :, ia].astype(np.float64), x[t, :, ib].astype(np.float64)
            out[t, :, ia], out[t, :, ib] = a * c - b * s, a * s + b * c
    return out


class BackendContract:
    """Subclass with ``backend = "<name>"``; override ``be`` to share a backend the module
    already holds, and ``poison`` / ``assert_canaries`` for device memory."""

    backend = ""

    @pytest.fixture
    def be(self):  # noqa: ANN201 - the backend named by the subclass
        why = usable().get(self.backend)
        if why is not None:
            pytest.skip(f"{self.backend} backend not usable here: {why}")
        b = open_backend(self.backend)
        yield b
        b.close()

    @pytest.fixture(autouse=True)
    def _default_config(self, be) -> None:
        be.set_config(TuningConfig.default(be.name))

    # --- canaries: the backend's own hooks ----------------------------------------------------
    def poison(self, be: Any, out_elems: int) -> None:
        """Before an op: fill memory the op's output of out_elems floats may land in."""

    def assert_canaries(self, be: Any, out: Any, args: tuple[Any, ...]) -> None:
        """After op(*args): the canaries around out are intact. Host arrays (NumPy) cannot be
        written past their end; what can go wrong there is an output that shares memory with
        an input or a weight (ops return new tensors), which a later op would overwrite."""
        for a in args:
            for arr in (a, getattr(a, "f32", None)):
                if isinstance(arr, np.ndarray):
                    assert not np.shares_memory(out, arr), "output shares memory with an input"

    def out(self, be: Any, out_elems: int, op: Callable[..., Any], *args: Any) -> np.ndarray:
        """op(*args) between the canary hooks; its output downloaded."""
        self.poison(be, out_elems)
        t = op(*args)
        self.assert_canaries(be, t, args)
        return be.download(t)

    @pytest.mark.parametrize("qtype", QUANTS)
    @pytest.mark.parametrize(
        "T,N,kblocks",
        [(1, 1, 1), (1, 67, 3), (1, 130, 2), (2, 33, 1), (7, 67, 2), (17, 3, 1), (31, 45, 2)],
    )
    def test_matmul(self, be, qtype, T, N, kblocks):
        op = "matmul_decode" if T == 1 else "matmul_prefill"
        _supported(be, op, qtype)
        rng = np.random.default_rng(T * 1000 + N)
        K = {1: 37, 32: 96, 256: 256}[_block_k(qtype)] * kblocks  # odd widths where blocks allow
        w = qtensor(rng, (N, K), qtype, std=0.05)
        x = rng.standard_normal((T, K)).astype(np.float32)
        x0 = x.copy()
        out = self.out(be, T * N, be.ops.matmul, be.upload(x), be.load_weight(w))
        check(out, x.astype(np.float64) @ dense(w).T, NMSE["matmul"])
        assert np.array_equal(x, x0)

    @pytest.mark.parametrize("qtype", QUANTS)
    def test_matmul_decode_every_variant(self, be, qtype):
        """Every matmul_decode variant on ragged shapes: N not a multiple of any rows-per-workgroup,
        float rows of aligned and odd K, x a view at every offset mod 4 of a larger tensor."""
        _supported(be, "matmul_decode", qtype)
        rng = np.random.default_rng(len(qtype))
        bk = _block_k(qtype)
        shapes = [(67, 3 * bk), (5, bk)] if bk > 1 else [(67, 64), (13, 37), (2, 5)]
        for cfg in _decode_variants(be):
            be.set_config(cfg)
            for N, K in shapes:
                w = qtensor(rng, (N, K), qtype, std=0.05)
                wt = be.load_weight(w)
                ref_w = dense(w)
                for off in (0, 1, 2, 3):
                    x = rng.standard_normal(K).astype(np.float32)
                    buf = be.upload(np.concatenate([np.zeros(off, np.float32), x]))
                    xv = be.ops.reshape(be.ops.rows(buf, off, off + K), (1, K))
                    out = self.out(be, N, be.ops.matmul, xv, wt)
                    check(out, x[None].astype(np.float64) @ ref_w.T, NMSE["matmul"])

    @pytest.mark.parametrize("T", [1, 3, 40, 41])
    def test_matmul_prefill_up_to_the_chunk(self, be, T):
        """Every allowed column count up to and past the default prefill chunk works."""
        cfg = TuningConfig.default(be.name)
        T = min(T, cfg.prefill_chunk)
        rng = np.random.default_rng(T)
        w = qtensor(rng, (70, 256), "Q4_K", std=0.05)
        x = rng.standard_normal((T, 256)).astype(np.float32)
        out = self.out(be, T * 70, be.ops.matmul, be.upload(x), be.load_weight(w))
        check(out, x.astype(np.float64) @ dense(w).T, NMSE["matmul"])

    # --- the small ops ----------------------------------------------------------------------
    @pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_K", "Q6_K", "Q5_0"])
    @pytest.mark.parametrize("T", [1, 5])
    def test_embedding(self, be, qtype, T):
        _supported(be, "embedding", qtype)
        rng = np.random.default_rng(T)
        table = qtensor(rng, (37, 256), qtype)
        ids = np.array([0, 36, 5, 5, 17][:T], np.int32)
        out = self.out(be, T * 256, be.ops.embedding, be.load_weight(table), be.upload(ids))
        check(out, dense(table)[ids], 1e-12 if qtype == "F32" else 1e-6)

    @pytest.mark.parametrize("shape", [(1, 7), (3, 896), (5, 4, 64), (1, 2, 128), (33, 257)])
    def test_rms_norm(self, be, shape):
        rng = np.random.default_rng(len(shape))
        x = rng.standard_normal(shape).astype(np.float32) * 3
        w = qtensor(rng, (shape[-1],), "F32")
        out = self.out(be, x.size, be.ops.rms_norm, be.upload(x), be.load_weight(w), 1e-6)
        x64 = x.astype(np.float64)
        ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * dense(w)
        check(out, ref, NMSE["default"])

    @pytest.mark.parametrize("shape", [(1, 5), (7, 130)])
    def test_add_residual_and_bias(self, be, shape):
        rng = np.random.default_rng(1)
        a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        bias = qtensor(rng, (shape[-1],), "F32")
        out = self.out(be, a.size, be.ops.add, be.upload(a), be.upload(b))
        check(out, a.astype(np.float64) + b, 1e-12)
        out = self.out(be, a.size, be.ops.add, be.upload(a), be.load_weight(bias))
        check(out, a + dense(bias), 1e-12)

    @pytest.mark.parametrize("neox", [True, False])
    @pytest.mark.parametrize("T,H,D,pos0", [(1, 1, 64, 0), (3, 2, 64, 17), (9, 3, 128, 1000)])
    def test_rope(self, be, neox, T, H, D, pos0):
        rng = np.random.default_rng(T)
        x = rng.standard_normal((T, H, D)).astype(np.float32)
        out = self.out(be, x.size, be.ops.rope, be.upload(x), pos0, 1e6 if neox else 1e4, neox)
        check(out, _rope_ref(x, pos0, 1e6 if neox else 1e4, neox), NMSE["default"])

    def test_swiglu(self, be):
        rng = np.random.default_rng(2)
        g, u = (rng.standard_normal((3, 77)).astype(np.float32) * 4 for _ in range(2))
        g64 = g.astype(np.float64)
        out = self.out(be, g.size, be.ops.swiglu, be.upload(g), be.upload(u))
        check(out, g64 / (1 + np.exp(-g64)) * u, 1e-10)

    @pytest.mark.parametrize("T,V", [(1, 1), (1, 151936), (3, 1000), (4, 152063), (2, 37)])
    def test_argmax_first_maximum(self, be, T, V):
        """Every argmax variant: ties far apart (the first wins), the maximum at the very last
        element, -inf values; vocabularies that are multiples of nothing (152063, 37)."""
        rng = np.random.default_rng(V)
        logits = rng.standard_normal((T, V)).astype(np.float32)
        if V > 10:
            logits[0, [7, V - 3]] = 50.0  # a tie: the first index wins
        if T > 1:
            logits[1, V - 1] = 60.0  # in the last slice of any slicing
        if T > 2:
            logits[2, : V // 2] = -np.inf
            logits[2, V // 2 + 1] = -np.inf
        if T > 3:
            logits[3, 1:] = -np.inf  # the first element is the only finite one
        for cfg in variant_configs(be, "argmax"):
            be.set_config(cfg)
            out = self.out(be, T, be.ops.argmax, be.upload(logits))
            assert out.tolist() == np.argmax(logits, axis=-1).tolist(), cfg.op("argmax").variant

    @pytest.mark.parametrize(
        "T,H,Hkv,D,pos0",
        [
            (1, 2, 1, 64, 0),
            (1, 4, 2, 64, 37),
            (5, 4, 2, 64, 0),
            (7, 6, 2, 128, 11),
            (33, 2, 2, 64, 3),
            (1, 4, 4, 64, 4),  # GQA ratio 1; 5 keys: fewer than the key ranges of a split kernel
            (1, 7, 1, 80, 300),  # GQA ratio 7, D = 80, 301 keys: a multiple of no tile or split
            (1, 14, 2, 128, 549),  # a 7B-like decode: ratio 7, D = 128, 550 keys
            (6, 7, 1, 80, 45),  # causal chunk at an offset, ratio 7, odd-ish D
        ],
    )
    def test_kv_write_and_attention(self, be, T, H, Hkv, D, pos0):
        for cfg in variant_configs(be, "attention"):
            be.set_config(cfg)
            rng = np.random.default_rng(T + pos0)
            q, _, _, _, kc, vc, out = write_cache_and_attend(be, rng, T, H, Hkv, D, pos0)
            fp16 = REGISTRY.numeric_classes(cfg).get("attention", "order_only") != "order_only"
            limit = 1e-8 if be.name == "numpy" else 5e-5 if fp16 else 1e-5
            check(out, attention_ref(q, kc, vc, pos0), limit)

    def test_registry_declares_every_contract_op(self, be):
        ops = {o.name for o in REGISTRY.ops(be.name)}
        needed = {
            "prefill",
            "matmul_decode",
            "matmul_prefill",
            "embedding",
            "rms_norm",
            "add",
            "rope",
            "kv_write",
            "swiglu",
            "argmax",
        }
        assert needed <= ops, f"{be.name} does not declare {needed - ops}"
        assert "attention" in ops or {"attention_decode", "attention_prefill"} <= ops


class ConfiguredContract(BackendContract):
    """The contract on a backend fixture the test module already holds (``fixture``), under
    the default config with ``flat`` over it (a variant's whole contract)."""

    fixture = ""
    flat: dict = {}  # noqa: RUF012 - read only

    @pytest.fixture
    def be(self, request):  # noqa: ANN001, ANN201
        return request.getfixturevalue(self.fixture)

    @pytest.fixture(autouse=True)
    def _configured(self, be) -> None:  # noqa: ANN001
        be.set_config(TuningConfig.default(self.backend).replace(**self.flat))
