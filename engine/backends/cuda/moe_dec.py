"""A decode token's MoE FFN in three launches (shaders/cuda/moe_dec.cu), mixed into CudaBackend
through CudaHybridOps: the fusion pass's _moe_ffn steps (engine/backends/fusion.py) under
moe_experts.fuse_decode.

The op-by-op schedule of a qwen35moe layer's FFN is fifteen launches (router matmul, top-k,
gate, up, SwiGLU, down, combine; the shared expert's gate, up, SwiGLU, down, gate logit,
sigmoid_mul; two adds); at decode each reads little, so the launches are the cost. Here:
route (logits + the shared expert's gate logit + top-k in the grid's last block), gate_up (the
chosen and the shared experts' gate, up and SwiGLU) and down (down projections, weighted
combine, gated shared expert, residual). Everything stays on the device: graph-safe.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.backends.plan import Moe

MAX_ROUTE_EXPERTS = 1024  # topk.cuh: 32 experts per lane
MAX_ROWS = 12  # moe_dec.cu MAXR: the routed experts (+ the shared one) one thread dots at once
MAX_TOKENS = 64  # route tickets (decode is one token; the kernels take T)
# GGML type ids (common.cuh QT_*), the kernels' run-time weight type
_QT = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14,
       "BF16": 30}  # fmt: skip
_NULL = np.uint64(0)


def _addr(a: Any) -> int:
    """A device array's address (a host array's in the CPU tests' fake backend)."""
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


def _stacked(w: Any, E: int) -> bool:
    return w.raw is not None and len(w.shape) == 3 and int(w.shape[0]) == E and w.qtype in _QT


def _matrix(w: Any, n: int | None, k: int) -> bool:
    return (
        w.raw is not None
        and len(w.shape) == 2
        and w.qtype in _QT
        and int(w.shape[1]) == k
        and (n is None or int(w.shape[0]) == n)
    )


class CudaMoeDecodeOps:
    """moe_ffn of CudaBackend (needs its _launch, _empty, _cp, _aligned16, config)."""

    _cp: Any
    config: Any

    def _moe_dec_on(self, h: Any, r: Any, moe: Moe) -> bool:
        """Whether moe_dec.cu runs this call: a decode row, the knob on a float variant, and
        weights the kernels decode (else the op-by-op schedule)."""
        router, k, experts, shared = moe.router, moe.k, moe.experts, moe.shared
        c = self.config.knobs("moe_experts")
        if c.variant not in ("dmmv", "grouped", "tc") or not int(c.fuse_decode):
            return False
        if h.ndim != 2 or int(h.shape[0]) != 1 or tuple(r.shape) != tuple(h.shape):
            return False
        C = int(h.shape[1])
        gate, up, down = experts
        E = int(gate.shape[0]) if len(gate.shape) == 3 else 0
        if not (0 < E <= MAX_ROUTE_EXPERTS and 0 < k <= min(E, MAX_ROWS - 1)):
            return False
        if router.qtype not in _QT or not _matrix(router, E, C):
            return False
        if not all(_stacked(w, E) for w in experts) or gate.qtype != up.qtype:
            return False
        F = int(gate.shape[1])
        if tuple(gate.shape) != (E, F, C) or tuple(up.shape) != (E, F, C):
            return False
        if tuple(down.shape) != (E, C, F) or gate.row_bytes != up.row_bytes:
            return False
        if shared is None:
            return True
        sg, sgate, sup, sdown = shared
        Fs = int(sgate.shape[0])
        return (
            _matrix(sg, 1, C)
            and _matrix(sgate, Fs, C)
            and _matrix(sup, Fs, C)
            and sgate.qtype == sup.qtype
            and sgate.row_bytes == sup.row_bytes
            and _matrix(sdown, C, Fs)
        )

    def _fused_ran(self, op: str) -> None:
        """Note that a fused decode kernel of op ran (hook_bypassed_fusions names only those)."""
        ran = getattr(self, "_fusions_ran", None)
        if ran is None:
            ran = self._fusions_ran = set()
        ran.add(op)

    def _lazy_tickets(self, attr: str, n: int) -> Any:
        """The backend's n uint32 tickets named attr, made (zeroed) on first use. A kernel's
        last block resets the ones it counted on, so they are zero between launches."""
        t = getattr(self, attr, None)
        if t is None:
            t = self._cp.zeros(n, np.uint32)
            setattr(self, attr, t)
        return t

    def _route_tickets(self) -> Any:
        return self._lazy_tickets("_moe_tickets", MAX_TOKENS)  # the route's last block, per token

    def _moe_ffn(self, h: Any, r: Any, moe: Moe) -> Any:
        if not self._moe_dec_on(h, r, moe):
            return super()._moe_ffn(h, r, moe)  # type: ignore[misc]
        return self._moe_dec(h, r, moe)

    def _moe_dec(
        self, h: Any, r: Any, moe: Moe, norm: Any = None, eps: float = 0.0, pre: Any = None
    ) -> Any:
        """moe_dec.cu's three launches -> r + the MoE FFN of h; with norm, (that, its norm).
        With pre (moe_experts.fuse_pre_norm), h is None: the route computes h = rms_norm(r) *
        pre (moe_dec_route_rn) and stores it for gate_up."""
        r = self._cp.ascontiguousarray(r, dtype=np.float32)
        if pre is not None:
            r = self._aligned16(r)
            h = self._empty(r.shape)
        h = self._aligned16(self._cp.ascontiguousarray(h, dtype=np.float32))
        T, C = (int(s) for s in h.shape)
        router, k, shared = moe.router, moe.k, moe.shared
        gate, up, down = moe.experts
        E, F = int(gate.shape[0]), int(gate.shape[1])
        c = self.config.knobs("moe_experts")
        rows, tpr = int(c.rows_per_block), int(c.threads_per_row)
        nt = max(32, rows * tpr)  # moe_dec.cu NT: at least a warp
        sg = sgate = sup = sdown = None
        Fs = 0
        if shared is not None:
            sg, sgate, sup, sdown = shared
            Fs = int(sgate.shape[0])
        self._fused_ran("moe_experts")
        ldl = E + 1  # logits [T, E + 1]: column E the shared expert's gate logit
        logits, ids, wts = self._empty((T, ldl)), self._empty((T, k), np.int32), self._empty((T, k))
        if pre is not None:  # the post-attention norm in the route (moe_prenorm checked it)
            self._launch(
                "moe_dec", "moe_dec_route_rn", (E + (0 if sg is None else 1), T),
                (int(c.route_block) or 256,),
                (r, pre.f32, np.float32(eps), h, router.raw, np.int32(router.row_bytes),
                 _NULL if sg is None else sg.raw, np.int32(E), np.int32(C), logits,
                 np.int32(ldl), ids, wts, np.int32(k), self._route_tickets(),
                 np.int32(c.topk_regs)),
                pdl=True,
            )  # fmt: skip
        elif self._route_block_on(int(c.route_block), router, sg, C):
            self._launch(
                "moe_dec", "moe_dec_route_r", (E + (0 if sg is None else 1), T),
                (int(c.route_block),),
                (h, router.raw, np.int32(router.row_bytes), _NULL if sg is None else sg.raw,
                 np.int32(E), np.int32(C), logits, np.int32(ldl), ids, wts, np.int32(k),
                 self._route_tickets(), np.int32(c.topk_regs)),
                pdl=True,
            )  # fmt: skip
        else:
            self._launch(
                "moe_dec", "moe_dec_route", (math.ceil(ldl / rows), T), (nt,),
                (h, router.raw, np.int32(router.row_bytes), np.int32(_QT[router.qtype]),
                 _NULL if sg is None else sg.raw, np.int32(_QT[sg.qtype] if sg else 0),
                 np.int32(E), np.int32(C), logits, np.int32(ldl), ids, wts, np.int32(k),
                 self._route_tickets(), np.int32(c.route_vec), np.int32(c.topk_regs)),
                pdl=True,
            )  # fmt: skip
        ns = 1 if shared is not None else 0
        ldh = -(-max(F, Fs) // 4) * 4  # float4 rows
        hh = self._empty((T, k + 1, ldh))
        gate_up = "moe_dec_gate_up_p" if int(c.gate_up_pair) else "moe_dec_gate_up"
        # moe_experts.l2_prefetch: gate_up's blocks bring the down matrices into L2 (D null: off)
        pf = (_NULL, np.int32(0), _NULL, np.int32(0))
        if int(c.l2_prefetch):
            pf = (down.raw, np.int32(down.row_bytes), _NULL if sdown is None else sdown.raw,
                  np.int32(sdown.row_bytes if sdown else 0))  # fmt: skip
        self._launch(
            "moe_dec", gate_up, (math.ceil(max(F, Fs) / rows), k + ns, T),
            (nt,),
            (h, gate.raw, up.raw, np.int32(gate.row_bytes), np.int32(_QT[gate.qtype]),
             np.int32(F), np.int32(E), ids, np.int32(k),
             _NULL if sgate is None else sgate.raw, _NULL if sup is None else sup.raw,
             np.int32(sgate.row_bytes if sgate else 0), np.int32(_QT[sgate.qtype] if sgate else 0),
             np.int32(Fs), np.int32(C), hh, np.int32(ldh), *pf),
            pdl=True,
        )  # fmt: skip
        out = self._empty((T, C))
        kernel = "moe_dec_down_v1" if int(c.down_vec1) else "moe_dec_down"
        tail: tuple = ()
        if norm is not None:  # moe_experts.fuse_norm: the next layer's input norm in the tail
            hn = self._empty((T, C))
            kernel += "_norm"
            tail = (norm.f32, np.float32(eps), hn, self._norm_tickets())
        block, per_block = nt, rows
        if int(c.down_split):  # a warp per expert slot, rows_per_block outputs a block
            kernel, block = "moe_dec_down_s", 32 * (k + ns)
            occ = int(c.split_occupancy) if k + ns <= 9 else 0
            if occ == 3:  # built for 3 blocks an SM
                kernel = "moe_dec_down_s9"
            elif occ == 2:  # 8 outputs a block, built for 2 blocks an SM
                kernel, per_block = "moe_dec_down_s9r8", 8
            tail = tail or (_NULL, np.float32(0.0), _NULL, _NULL)
        elif int(c.down_wsum):  # one kernel, the norm tail where its weights are not null
            kernel = "moe_dec_down_w"
            tail = tail or (_NULL, np.float32(0.0), _NULL, _NULL)
        self._launch(
            "moe_dec", kernel, (math.ceil(C / per_block), T), (block,),
            (hh, np.int32(ldh), down.raw, np.int32(down.row_bytes), np.int32(_QT[down.qtype]),
             np.int32(F), np.int32(E), ids, wts, np.int32(k),
             _NULL if sdown is None else sdown.raw, np.int32(sdown.row_bytes if sdown else 0),
             np.int32(_QT[sdown.qtype] if sdown else 0), np.int32(Fs), logits, np.int32(ldl),
             r, out, np.int32(C), *tail),
            pdl=True,
        )  # fmt: skip
        return out if norm is None else (out, hn)

    def _route_block_on(self, threads: int, router: Any, sg: Any, C: int) -> bool:
        """moe_experts.route_block's kernel: F32 rows of 16-byte-aligned starts and lengths."""
        if not threads or C % 4:
            return False
        return all(
            w.qtype == "F32" and _addr(w.raw) % 16 == 0 and int(w.row_bytes) % 16 == 0
            for w in ((router,) if sg is None else (router, sg))
        )

    def _moe_prenorm(self, n: int) -> bool:
        c = self.config.knobs("moe_experts")
        on = c.variant in ("dmmv", "grouped", "tc") and int(c.fuse_decode)
        return bool(n == 1 and on and int(c.fuse_pre_norm))

    def _moe_ffn_prenorm(self, x: Any, pre: Any, moe: Moe, norm: Any, eps: float) -> Any:
        """Under moe_experts.fuse_pre_norm the route kernel (moe_dec_route_rn, a block per
        router row) normalises x itself: the post-attention norm's launch folded into it; with
        fuse_norm the down kernel's tail runs the next layer's norm too."""
        c = self.config.knobs("moe_experts")
        C = int(x.shape[-1])
        sg = None if moe.shared is None else moe.shared[0]
        ok = (
            self._moe_prenorm(int(x.shape[0]) if x.ndim == 2 else 0)
            and self._moe_dec_on(x, x, moe)
            and pre.f32 is not None
            and int(pre.f32.size) == C
            and self._route_block_on(int(c.route_block) or 256, moe.router, sg, C)
        )
        if not ok:
            return super()._moe_ffn_prenorm(x, pre, moe, norm, eps)  # type: ignore[misc]
        if norm is None:
            return self._moe_dec(None, x, moe, pre=pre, eps=eps)
        if self._norm_in_down(norm, C):
            return self._moe_dec(None, x, moe, norm, eps, pre=pre)
        y = self._moe_dec(None, x, moe, pre=pre, eps=eps)
        return y, self.ops.rms_norm(y, norm, eps)  # type: ignore[attr-defined]

    def _norm_in_down(self, norm: Any, C: int) -> bool:
        """moe_experts.fuse_norm: the down kernel's tail runs norm (a float row of C weights)."""
        on = int(self.config.knobs("moe_experts").fuse_norm)
        return bool(on) and norm.f32 is not None and int(norm.f32.size) == C

    def _norm_tickets(self) -> Any:
        return self._lazy_tickets("_moe_norm_tickets", MAX_TOKENS)  # the down kernel's, per token

    def _moe_ffn_norm(self, h: Any, r: Any, moe: Moe, norm: Any, eps: float) -> tuple[Any, Any]:
        """Under moe_experts.fuse_norm (with fuse_decode) the down kernel's last block runs the
        next layer's input norm too: three launches for the MoE FFN and the norm."""
        if (
            not self._moe_dec_on(h, r, moe)  # (the variants with the knob)
            or not self._norm_in_down(norm, int(h.shape[-1]))
        ):
            return super()._moe_ffn_norm(h, r, moe, norm, eps)  # type: ignore[misc]
        return self._moe_dec(h, r, moe, norm, eps)
