"""A delta-net layer from its raw q/k/v projection (delta_net_conv_gated) for the CUDA files that
run it against another schedule and NumPy over several steps on carried states
(tests/engine/backends/cuda/test_cuda_dn_conv.py, test_cuda_dn_clu.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from engine.backends.numpy_ref import NumpyBackend
from engine.backends.plan import DnGatedIn
from tests.op_cases import f32_tensor


class ConvGatedCase:
    """Random weights and initial states for one layer; ``s_ref`` / ``c_ref`` are NumPy's
    delta-net and conv states (S, not S^T), ``states[name]`` a device copy of both per run name
    (the delta-net state as S^T under state_transposed)."""

    def __init__(
        self,
        be: Any,
        rng: np.random.Generator,
        shape: tuple[int, int, int, int, int],
        transposed: bool,
        names: tuple[str, ...],
    ) -> None:
        K, dk, dv, Hk, Hv = shape
        self.rng, self.K, self.dk, self.dv, self.Hk, self.Hv = rng, K, dk, dv, Hk, Hv
        self.Cc = 2 * Hk * dk + Hv * dv
        self.weights = (
            f32_tensor("conv", self._f(self.Cc, K) * 0.5),
            f32_tensor("dt", rng.uniform(-1, 1, Hv)),
            f32_tensor("a", -np.exp(rng.uniform(-1, 1, Hv))),
            f32_tensor("n", rng.uniform(0.5, 1.5, dv)),
        )
        s0 = self._f(Hv, dk, dv) * 0.1
        c0 = self._f(K - 1, self.Cc)
        self.ref = NumpyBackend()
        self.rw = [self.ref.load_weight(t) for t in self.weights]
        self.s_ref, self.c_ref = s0.copy(), c0.copy()
        init = np.ascontiguousarray(s0.transpose(0, 2, 1)) if transposed else s0
        self.states = {n: (be.upload(init), be.upload(c0)) for n in names}

    def _f(self, *s: int) -> np.ndarray:
        return self.rng.standard_normal(s).astype(np.float32)

    def inputs(self) -> tuple[np.ndarray, ...]:
        """A decode step's qkv [1, Cc], a, b [1, Hv] and z [1, Hv dv]."""
        return (
            self._f(1, self.Cc),
            self._f(1, self.Hv),
            self._f(1, self.Hv),
            self._f(1, self.Hv * self.dv),
        )

    def run(self, be: Any, name: str, ins: tuple[np.ndarray, ...], v_order: str) -> np.ndarray:
        """The step on be under its current config (the weights loaded under it), on name's
        states."""
        qkv, a, b, z = ins
        w = [be.load_weight(t) for t in self.weights]
        s, c = self.states[name]
        gated = DnGatedIn(be.upload(a), be.upload(b), w[1], w[2], s, v_order, 1e-6, w[3],
                          be.upload(z))  # fmt: skip
        return be.download(be._delta_net_conv_gated(be.upload(qkv), c, w[0], self.Hk, self.dk,
                                                    gated))  # fmt: skip

    def steps(
        self, be: Any, configs: dict[str, Any], v_order: str, n: int = 3
    ) -> Iterator[tuple[int, tuple[np.ndarray, ...], dict[str, np.ndarray]]]:
        """n decode steps, each run under every named config (a TuningConfig) on that name's
        states: (step, its inputs, the output under each name)."""
        for step in range(n):
            ins = self.inputs()
            outs = {}
            for name, config in configs.items():
                be.set_config(config)
                outs[name] = self.run(be, name, ins, v_order)
            yield step, ins, outs

    def reference(self, ins: tuple[np.ndarray, ...], v_order: str) -> Any:
        """NumPy's step on s_ref, c_ref (both advanced in place)."""
        qkv, a, b, z = ins
        rw = self.rw
        gated = DnGatedIn(a, b, rw[1], rw[2], self.s_ref, v_order, 1e-6, rw[3], z)
        return self.ref._delta_net_conv_gated(qkv, self.c_ref, rw[0], self.Hk, self.dk, gated)
