"""The Vulkan backend's int8 decode path and fused decode ops (matmul_decode.mmvw, quantize_act,
rope.fuse_kv, attention.fuse_combine): the port of the CUDA backend's mmvw schedule, as a mixin
of VulkanBackend.

Under matmul_decode.mmvw a decode row (T == 1) of a Q4_K / Q6_K matmul reads its activation as
Q8_1 (shaders/vulkan/q8_1.glsl). rms_norm, swiglu and the split attention's merge of one row
write that form as they store and remember it, so the matmuls after them need no quantize
dispatch; q/k/v (and gate/up) go through one mmvw dispatch, the q/k/v biases and the residuals
are added as mmvw stores. With rope.fuse_kv = 1, RoPE of q and k and the KV write are one
dispatch; with matmul_decode.fuse_rope they happen in the q/k/v dispatch itself; with
attention.fuse_combine the attention is one dispatch. A decode layer is 8 dispatches instead of
19 with all of them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.vulkan.kernels import MMVW_TYPES
from engine.backends.vulkan.kernels import fold_groups as _fold

if TYPE_CHECKING:
    from engine.backends.base import KVCache
    from engine.backends.plan import AttnIn

MMVW_GGML = {"Q4_K": 12, "Q6_K": 14}  # mmvw.comp's per-matrix type ids (GGML's)
NO_ADD = 0xFFFFFFFF
MODE_ROPE, MODE_AT_POS = 0x100, 0x200  # mmvw.comp's RoPE-epilogue bits of a type word


class FusedDecode:
    """Mixin: expects VulkanBackend's _new, _pipe, _as_tensor, stream, config, _q8."""

    # --- Q8_1 activations ---------------------------------------------------------------
    def _int8(self) -> bool:
        return self.config.knobs("matmul_decode").variant == "mmvw"

    def _int8_row(self, n: int) -> bool:
        """Whether a row of n values gets its Q8_1 form as it is produced."""
        return self._int8() and n % 32 == 0

    @staticmethod
    def _q8_words(K: int) -> int:
        return K // 4 + K // 16

    def _q8_grid(self, n: int) -> tuple[int, int, int]:
        """Workgroups of a quantize_act pass over a row of n values: a thread per value
        (coalesced) or per 32-block."""
        c = self.config.knobs("quantize_act")
        per = int(c.wg_size) * (1 if c.coalesced else 32)
        return _fold(-(-n // per))

    def _q8_lookup(self, x: Any) -> Any:
        for src, q8 in self._q8:
            if src.buf is x.buf and src.offset == x.offset and src.size == x.size:
                return q8
        return None

    def _q8_remember(self, x: Any, q8: Any) -> None:
        self._q8.append((x, q8))
        del self._q8[:-4]  # a layer reuses one quantized input for at most 3 matmuls

    def quantize_q8(self, x: Any) -> Any:
        """x, one row of K floats (K % 32 == 0) -> its Q8_1 form (int32 words, 5K/16), reusing
        the form made when x was produced or last quantized."""
        hit = self._q8_lookup(x)
        if hit is not None:
            return hit
        K = x.size
        q8 = self._new((self._q8_words(K),), np.int32)
        pipe, _ = self._pipe("quantize_act")
        self.stream.dispatch(
            pipe, (x.buf, q8.buf), (q8.buf,), (K, x.offset, q8.offset), self._q8_grid(K)
        )
        self._q8_remember(x, q8)
        return q8

    # --- the int8 decode matmul -----------------------------------------------------------
    def _wide(self, x: Any, ws: tuple[Any, ...]) -> bool:
        """Whether ws can go through mmvw on decode row x."""
        K = x.shape[-1]
        return (
            self._int8()
            and x.size == K
            and K % 256 == 0
            and all(w.qtype in MMVW_TYPES and w.shape[-1] == K and w.parts for w in ws)
        )

    def _mmvw(
        self, x: Any, mats: list[tuple[Any, ...]], rope: tuple[Any, int, bool, int] | None = None
    ) -> None:
        """For each (w, y, y_elem, a[, mode]): y[y_elem + n] = x . w[n] (+ a[n] when a is not
        None), up to three weight buffers (row ranges count as one each) per dispatch. mode:
        MODE_ROPE / MODE_AT_POS bits (the RoPE epilogue; rope = (cos/sin table, head dim, neox,
        position) then, and every weight in one part)."""
        q8 = self.quantize_q8(x)
        pipe, c = self._pipe("matmul_decode", mats[0][0].qtype)
        rows = int(c.rows_per_wg)
        K = x.size
        jobs = []  # (weight buffer, rows, row bytes, type word, y buffer, y offset, a buf, a off)
        for w, y, y_elem, a, *mode in mats:
            for lease, r0, nr in w.parts:
                a_buf, a_off = (None, NO_ADD) if a is None else (a.buf, a.offset + r0)
                tw = MMVW_GGML[w.qtype] | (mode[0] if mode else 0)
                jobs.append(
                    (lease.buf, nr, w.row_bytes, tw, y.buf, y.offset + y_elem + r0, a_buf, a_off)
                )
        for i in range(0, len(jobs), 3):
            part = jobs[i : i + 3]
            nwg = [-(-j[1] // rows) for j in part] + [0] * (3 - len(part))
            part += [(part[0][0], 0, 0, 0, part[0][4], 0, None, NO_ADD)] * (3 - len(part))
            adds = tuple(j[6] if j[6] is not None else j[4] for j in part)
            ys = [j[4] for j in part]
            push: list[int] = [K, q8.offset, nwg[0], nwg[0] + nwg[1]]
            for j in part:
                push += [j[1], j[2], j[3], j[5], j[7]]
            table = rope[0].buf if rope else ys[0]  # unread without the RoPE epilogue
            push += [rope[1], int(rope[2]), self.stream.dyn(rope[3])] if rope else [0, 0, 0]
            self.stream.dispatch(
                pipe,
                (part[0][0], part[1][0], part[2][0], q8.buf, ys[0], *adds, ys[1], ys[2], table,
                 self.stream.dyn_buf),
                tuple({b.id: b for b in ys}.values()),
                tuple(push),
                _fold(sum(nwg)),
            )  # fmt: skip

    # --- fused ops (engine.backends.base) -------------------------------------------------
    def _attn_in(self, a: AttnIn) -> Any:
        """q/k/v in one mmvw dispatch with the biases added as they store (matmul_decode.mmvw),
        and/or both ropes + the KV write in one dispatch (rope.fuse_kv)."""
        h, wqkv, bias, cache, layer, pos0, heads, theta, neox = a
        H, Hkv, D = heads
        h = self._as_tensor(h)
        T = int(h.shape[0])
        fuse = int(self.config.knobs("rope").fuse_kv) == 1 and D % 2 == 0
        wide = T == 1 and self._wide(h, wqkv)
        if not (fuse or wide):
            return super()._attn_in(a._replace(h=h))
        cache.check_room(pos0, T)
        c = self.config.knobs("matmul_decode")
        if wide and int(c.fuse_rope) and all(len(w.parts) == 1 for w in wqkv) and D % 2 == 0:
            # q/k/v + biases, both ropes and the KV write in this one dispatch
            ck, cv = cache.k[layer], cache.v[layer]
            if ck.shape[1:] != (Hkv, D) or wqkv[0].shape[0] != H * D:
                raise ValueError(f"attn_in: q/k/v {[w.shape for w in wqkv]} against {ck.shape}")
            qo = self._new((T, H, D))
            bq, bk, bv = (None,) * 3 if bias is None else tuple(b.f32 for b in bias)
            table = self._rope_table(theta, D, pos0 + T)
            self._mmvw(
                h,
                [(wqkv[0], qo, 0, bq, MODE_ROPE), (wqkv[1], ck, 0, bk, MODE_ROPE | MODE_AT_POS),
                 (wqkv[2], cv, 0, bv, MODE_AT_POS)],
                (table, D, neox, pos0),
            )  # fmt: skip
            return qo
        if wide:
            ns = [w.shape[0] for w in wqkv]
            y = self._new((sum(ns),))
            offs = (0, ns[0], ns[0] + ns[1])
            adds = (None,) * 3 if bias is None else tuple(b.f32 for b in bias)
            self._mmvw(h, [(w, y, o, a) for w, o, a in zip(wqkv, offs, adds, strict=True)])
            q, k, v = (y[o : o + n] for o, n in zip(offs, ns, strict=True))
        else:
            q, k, v = (self.ops.matmul(h, w) for w in wqkv)
            if bias is not None and fuse and int(self.config.knobs("rope").fuse_bias):
                q, k, v = q.reshape((T, H, D)), k.reshape((T, Hkv, D)), v.reshape((T, Hkv, D))
                return self._rope_kv(q, k, v, cache, layer, pos0, theta, neox, bias)
            if bias is not None:
                q, k, v = (self.ops.add(t, b) for t, b in zip((q, k, v), bias, strict=True))
        q, k, v = q.reshape((T, H, D)), k.reshape((T, Hkv, D)), v.reshape((T, Hkv, D))
        if not fuse:
            q = self.ops.rope(q, pos0, theta, neox)
            self.ops.kv_write(cache, layer, self.ops.rope(k, pos0, theta, neox), v, pos0)
            return q
        return self._rope_kv(q, k, v, cache, layer, pos0, theta, neox)

    def _rope_kv(
        self, q: Any, k: Any, v: Any, cache: KVCache, layer: int, pos0: int, theta: float,
        neox: bool, bias: tuple[Any, Any, Any] | None = None,
    ) -> Any:  # fmt: skip
        """RoPE of q and k and the KV write in one dispatch; with bias (rope.fuse_bias) the
        q/k/v bias adds too."""
        T, H, D = q.shape
        Hkv = k.shape[1]
        ck, cv = cache.k[layer], cache.v[layer]
        if ck.shape[1:] != (Hkv, D):
            raise ValueError(f"attn_in: k {k.shape} against cache {ck.shape}")
        table = self._rope_table(theta, D, pos0 + T)
        qo = self._new((T, H, D))
        pipe, c = self._pipe("rope.kv_bias" if bias is not None else "rope.kv")
        n = T * (H + 2 * Hkv) * (D // 2)
        bufs = (q.buf, k.buf, v.buf, table.buf, qo.buf, ck.buf, cv.buf, self.stream.dyn_buf)
        push = (T, H, Hkv, D, q.offset, k.offset, v.offset, qo.offset, ck.offset, cv.offset,
                self.stream.dyn(pos0), int(bool(neox)))  # fmt: skip
        if bias is not None:
            bs = tuple(b.f32 for b in bias)
            if [b.size for b in bs] != [H * D, Hkv * D, Hkv * D]:
                raise ValueError(f"attn_in: biases {[b.size for b in bs]} for q/k/v rows")
            bufs += tuple(b.buf for b in bs)
            push += tuple(b.offset for b in bs)
        self.stream.dispatch(
            pipe, bufs, (qo.buf, ck.buf, cv.buf), push, _fold(-(-n // int(c.wg_size)))
        )
        return qo

    def _tickets(self, n: int) -> Any:
        """A zeroed uint per (token, head) for attention.fuse_combine; each use leaves it 0."""
        t = self._ticket_buf
        if t is None or t.size < n:
            n = max(n, 1024)
            t = self._new((n,), np.int32)
            self.stream.fill(t.buf, 4 * t.offset, 4 * n)
            self._ticket_buf = t
        return t

    def _attention_fused(
        self, q: Any, cache: KVCache, layer: int, pos0: int, out: Any, part: Any, ns: int,
        q8_out: bool,
    ) -> Any:  # fmt: skip
        """attention.split with fuse_combine: the partial pass whose workgroup finishes a head
        last merges it (attention_split.comp FUSED_MERGE[_Q8])."""
        T, H, D = q.shape
        ck, cv = cache.k[layer], cache.v[layer]
        tk = self._tickets(T * H)
        q8 = self._new((self._q8_words(H * D),), np.int32) if q8_out else out
        pipe, _ = self._pipe("attention.fused_q8" if q8_out else "attention.fused")
        self.stream.dispatch(
            pipe,
            (q.buf, ck.buf, cv.buf, part.buf, self.stream.dyn_buf, tk.buf, out.buf, q8.buf),
            (part.buf, tk.buf, out.buf, q8.buf),
            (H, ck.shape[1], D, q.offset, ck.offset, cv.offset, part.offset,
             self.stream.dyn(pos0), ns, 1.0 / math.sqrt(D), out.offset, tk.offset, q8.offset),
            (H, ns, T),
        )  # fmt: skip
        if q8_out:
            self._q8_remember(out, q8)
        return out

    def _matmul_add(self, x: Any, w: Any, r: Any) -> Any:
        """Under matmul_decode.mmvw a decode row's projection adds the residual as it stores."""
        x = self._as_tensor(x)
        if not (x.shape[0] == 1 and self._wide(x, (w,))):
            return super()._matmul_add(x, w, r)
        r = self._as_tensor(r)
        if r.size != w.shape[0]:
            raise ValueError(f"matmul_add: residual {r.shape} against {w.name} {w.shape}")
        y = self._new((1, w.shape[0]))
        self._mmvw(x, [(w, y, 0, r)])
        return y

    def _ffn(self, h: Any, gate: Any, up: Any, down: Any, r: Any) -> Any:
        """Under matmul_decode.mmvw: gate and up in one dispatch, swiglu + Q8_1, down +
        residual."""
        h = self._as_tensor(h)
        if not (h.shape[0] == 1 and self._wide(h, (gate, up))):
            return super()._ffn(h, gate, up, down, r)
        ng, nu = gate.shape[0], up.shape[0]
        y = self._new((ng + nu,))
        self._mmvw(h, [(gate, y, 0, None), (up, y, ng, None)])
        g = y[0:ng].reshape((1, ng))
        u = y[ng : ng + nu].reshape((1, nu))
        return self._matmul_add(self.ops.swiglu(g, u), down, r)
