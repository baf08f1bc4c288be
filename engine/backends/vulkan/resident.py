"""matmul_prefill.resident on Vulkan: the prefill GEMM on fp16 copies (shaders/vulkan/
matmul_f16.comp), a mixin of VulkanBackend.

A 2-D weight's fp16 copy [N, Kp] (Kp: K rounded up to 64, zero-padded, so the GEMM's k-loop has
no bounds test) is made by the PASS_W16 program at the weight's first prefill GEMM and kept
(VkWeight.f16, counted in memory_report's weights); each GEMM converts its activations to the
same padded fp16 form (PASS_X16) and runs the cooperative-matrix GEMM per row range. The copies
are dropped when a config without the variant is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.backends.vulkan import kernels as K
from engine.backends.vulkan.kernels import fold_groups as _fold

if TYPE_CHECKING:
    from engine.backends.vulkan.memory import Lease

KPAD = 64  # matmul_f16.comp's kpad(): the fp16 rows' length is a multiple of any BK
SMALL = 64  # fill_groups' tile (weight rows and tokens)
WARPS = ((16, 32), (32, 32), (16, 16), (32, 64))  # its subgroup tiles: 8, 4, 16, 2 per group


def kpad(k: int) -> int:
    return -(-k // KPAD) * KPAD


ROWPAD = 256  # the fp16 copies' rows are allocated in multiples of this (the largest tile):
# matmul_f16.comp's DIRECT loads whole tiles, a ragged one reading pad rows it never stores


def rpad(n: int) -> int:
    return -(-n // ROWPAD) * ROWPAD


def split_ranges(groups: int, fill: int, split_k: int, split_groups: int) -> int:
    """The k-ranges wanted for a grid of ``groups`` workgroups (1: no split): split_groups 0
    keeps split_k's first rule (a grid under fill_groups, ranges rounded up to reach it), else
    as many whole copies of the grid as fit in split_groups (rounded down: one wave)."""
    if split_k < 2:
        return 1
    if split_groups == 0:
        return min(split_k, -(-fill // groups)) if groups < fill else 1
    return max(1, min(split_k, split_groups // groups))


class ResidentPrefill:
    """Mixin: expects VulkanBackend's alloc, stream, dev, pipes, _ops, _new, _pipe,
    max_weight_bytes."""

    def resident_f16(self, w: Any) -> list[tuple[Lease, int, int]]:
        """w's fp16 copy as (lease, row0, nrows) ranges, each within maxStorageBufferRange;
        made once (a dispatch per range, in stream order before the GEMMs that read it)."""
        if w.f16 is not None:
            return w.f16
        K = w.shape[-1]
        kp = kpad(K)
        per = max(1, self.max_weight_bytes // (2 * kp))
        pipe, _ = self._pipe("matmul_prefill.w16", w.qtype)
        out: list[tuple[Lease, int, int]] = []
        for lease, r0, nr in w.parts:
            for s0 in range(0, nr, per):
                ns = min(per, nr - s0)
                h = self.alloc.new(2 * kp * rpad(ns), pooled=False)
                self.stream.dispatch(
                    pipe,
                    (lease.buf, lease.buf, h.buf),
                    (h.buf,),
                    (K, ns, w.row_bytes, s0, 0, 0, 0),
                    _fold(-(-ns * (kp // 8) // 256)),
                )
                out.append((h, r0 + s0, ns))
        w.f16 = out
        return out

    def drop_resident(self) -> None:
        self.__dict__.pop("_x16_seen", None)
        for w in self._tracked("_live_weights"):
            if getattr(w, "f16", None) is not None:
                w.f16 = None

    def resident_matmul(self, x: Any, w: Any, out: Any, pipe: Any, c: Any) -> None:
        """out [T, N] = x [T, K] @ W^T through the fp16 copies (T > 1)."""
        T, K = x.shape[0], x.shape[-1]
        N = w.shape[0]
        xh = self._x16_of(x, w.qtype)
        tm, tn = int(c.tile_m), int(c.tile_n)
        for lease, r0, nr in self.resident_f16(w):
            groups, pipe_r = -(-nr // tm) * -(-T // tn), pipe
            fill = int(c.fill_groups)
            small = None
            if groups < fill and tm * tn > SMALL * SMALL:
                small = self._small_gemm(c, w.qtype)  # too few workgroups to fill the GPU
            if small is not None:
                groups, pipe_r = -(-nr // SMALL) * -(-T // SMALL), small
            ranges = split_ranges(groups, fill, int(c.split_k), int(c.split_groups))
            if ranges > 1:  # still too few workgroups (the 7B k/v: 64)
                dims = (K, nr, r0, N, T)
                if self._split_k(xh, lease, out, pipe_r, c, w.qtype, dims, groups, ranges):
                    continue
            self.stream.dispatch(
                pipe_r,
                (lease.buf, xh.buf, out.buf),
                (out.buf,),
                (K, nr, 0, 0, out.offset + r0, N, T),
                _fold(groups),  # token tiles fastest (matmul_f16.comp)
            )

    def _split_k(
        self, xh: Any, lease: Any, out: Any, pipe: Any, c: Any, qtype: str,
        dims: tuple[int, int, int, int, int], groups: int, want: int,
    ) -> bool:  # fmt: skip
        """split_k: the GEMM (pipe: the main or the fill_groups tiles) over up to ``want``
        k-ranges of whole k-steps (a grid dimension; matmul_f16.comp reads the steps per range
        from row_bytes) into fp32 partials [ranges, T, nr], then PASS_KSUM adds them in range
        order into out's rows r0 .. r0 + nr. False when k has one step (nothing to split).
        dims: K, nr, r0, N, T."""
        K, nr, r0, N, T = dims
        steps = kpad(K) // int(c.bk)
        per = -(-steps // min(want, steps))
        ranges = -(-steps // per)  # every range non-empty
        if ranges < 2:
            return False
        part = self._new((ranges, T, nr))
        x, y, _ = _fold(groups)
        self.stream.dispatch(
            pipe,
            (lease.buf, xh.buf, part.buf),
            (part.buf,),
            (K, nr, per, 0, part.offset, nr, T),
            (x, y, ranges),
        )
        ksum, _ = self._pipe("matmul_prefill.ksum", qtype)
        self.stream.dispatch(
            ksum,
            (part.buf, part.buf, out.buf),
            (out.buf,),
            (ranges, nr, 0, part.offset, out.offset + r0, N, T),
            _fold(-(-T * nr // 256)),
        )
        return True

    def _x16_of(self, x: Any, qtype: str) -> Any:
        """x's padded fp16 form (PASS_X16), made once for the projections that share x (q, k,
        v; gate, up): the pairs remembered hold x, so its buffer cannot be reused meanwhile."""
        T, K = x.shape[0], x.shape[-1]
        seen = self.__dict__.setdefault("_x16_seen", [])
        for src, xh in seen:
            if src.buf is x.buf and src.offset == x.offset and src.shape == x.shape:
                return xh
        kp = kpad(K)
        xh = self._new((rpad(T) * kp // 2,))  # fp16 pairs in float32 words
        x16, _ = self._pipe("matmul_prefill.x16", qtype)
        self.stream.dispatch(
            x16,
            (x.buf, x.buf, xh.buf),
            (xh.buf,),
            (K, 0, 0, x.offset, 0, 0, T),
            _fold(-(-T * (kp // 8) // 256)),
        )
        seen.append((x, xh))
        del seen[:-2]  # a layer's inputs: the norm's output feeds at most 3 GEMMs in a row
        return xh

    def x16_fused(self, rows: int) -> bool:
        """matmul_prefill.fuse_x16 applies: the resident variant, a prefill (rows > 1)."""
        c = self.config.knobs("matmul_prefill")
        return c.variant == "resident" and bool(c.fuse_x16) and rows > 1

    def x16_for(self, y: Any) -> tuple[Any, int]:
        """(xh, kp): the padded fp16 form of y [T, K] that the op about to be dispatched writes
        alongside y, remembered as y's (the next GEMMs on y find it as _x16_of's)."""
        T, K = y.shape[0], y.shape[-1]
        kp = kpad(K)
        xh = self._new((rpad(T) * kp // 2,))  # fp16 pairs in float32 words, as _x16_of's
        seen = self.__dict__.setdefault("_x16_seen", [])
        seen.append((y, xh))
        del seen[:-2]
        return xh, kp

    def _small_gemm(self, c: Any, qtype: str) -> Any:
        """The GEMM's pipeline with SMALL x SMALL tiles and one subgroup tile per subgroup (the
        same program and defines, other specialization constants), or None when no warp shape
        fits the subgroup size and the threads knob (or a thread would load a partial run)."""
        key = ("matmul_prefill.small", qtype)
        if key not in self._ops:
            choice = self.config.op("matmul_prefill")  # c's OpChoice: what K builds from
            prog = K.programs("matmul_prefill", choice, qtype)[0]
            _, sg = K.specialization("matmul_prefill", choice)
            lanes = sg or self.dev.info.subgroup_size
            threads, q = int(c.threads), int(c.bk) // 8
            fits = [
                (m, n)
                for m, n in WARPS
                if (SMALL // m) * (SMALL // n) * lanes == threads and (SMALL * q) % threads == 0
            ]
            pipe = None
            if fits:
                m, n = fits[0]
                spec = ((0, SMALL), (1, SMALL), (2, m), (3, n))
                pipe = self.pipes.get(prog, spec, "matmul_prefill.resident.small", sg)
            self._ops[key] = (pipe, c)
        return self._ops[key][0]
