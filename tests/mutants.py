"""The standing mutation suite: planted bugs of the kinds that really happen, each of which the
verifier must reject and blame on the op it lives in (tests/engine/verify/test_mutants.py; the
table in
docs/verify.md; tests/calibrate.py --mutants prints their numbers).

NumPy bugs are planted by subclassing the reference backend (a test-only hook); Vulkan and CUDA
bugs are patches of the shipped shaders (tests/planted), compiled in through an overlay of kernel
sources (FLEETTUNE_KERNEL_SOURCES) only while planted. Bugs in kernels that both of validate's paths
share (the reference's default rms_norm ...) are ``check="cross_check"``: only the comparison
with the NumPy backend can see them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.backends.numpy_ref import NumpyBackend, NumpyWeight
from tests import planted as shader_patches

# Prompt lengths: one token, a short one, and ones past the 32-token chunk edge with ragged tails.
PROMPT_LENGTHS = (1, 5, 37, 70)


def prompts(vocab: int) -> list[list[int]]:
    from engine.bench import bench_prompt

    return [bench_prompt(n, vocab, seed=3) for n in PROMPT_LENGTHS]


# --- NumPy plants -------------------------------------------------------------------------------
class _Planted(NumpyBackend):
    """Batched-path bugs fire for T > 1 (only the candidate runs chunks); decode-path bugs fire
    under matmul_decode.variant = ondemand (the reference keeps cached_f32)."""

    def _dense_prefill(self, w: NumpyWeight) -> np.ndarray:
        return w.dense(self.config.op("matmul_prefill").variant == "cached_f32")


class DropLastColumn(_Planted):
    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        out = super()._matmul(x, w)
        if x.shape[0] > 1:
            out[-1] = 0.0
        return out


class StaleArgmax(_Planted):
    stale = np.zeros(1, np.int32)
    _batched_tail = False

    def _argmax(self, logits):  # noqa: ANN001, ANN201
        return self.stale if self._batched_tail else super()._argmax(logits)

    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        self._batched_tail = x.shape[0] > 1 or self._batched_tail
        return super()._matmul(x, w)

    def _embedding(self, table, ids):  # noqa: ANN001, ANN201
        self._batched_tail = False
        return super()._embedding(table, ids)


class PrefillTailRows(_Planted):
    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        out = super()._matmul(x, w)
        n = out.shape[1]
        if x.shape[0] > 1 and n % 64:
            out[:, n - n % 64 :] = 0.0
        return out


class DecodeTailRows(_Planted):
    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        out = super()._matmul(x, w)
        n = out.shape[1]
        if x.shape[0] == 1 and self.config.op("matmul_decode").variant == "ondemand" and n % 32:
            out[:, n - n % 32 :] = 0.0
        return out


class KLoopShort(_Planted):
    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        if x.shape[0] == 1:
            return super()._matmul(x, w)
        k = x.shape[1] - 32
        return x[:, :k].astype(np.float32) @ self._dense_prefill(w)[:, :k].T


class Fp16Accumulate(_Planted):
    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        if x.shape[0] == 1:
            return super()._matmul(x, w)
        wd = self._dense_prefill(w)
        acc = np.zeros((x.shape[0], wd.shape[0]), np.float16)
        for k0 in range(0, x.shape[1], 32):
            part = x[:, k0 : k0 + 32].astype(np.float32) @ wd[:, k0 : k0 + 32].T
            acc = (acc.astype(np.float32) + part).astype(np.float16)
        return acc.astype(np.float32)


class _SubBlockScale(_Planted):
    qtype, period, lo, hi, factor = "Q4_K", 256, 224, 256, 1.25

    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        if x.shape[0] == 1 or w.qt.qtype != self.qtype:
            return super()._matmul(x, w)
        wd = self._dense_prefill(w).copy()
        cols = np.arange(wd.shape[1]) % self.period
        wd[:, (cols >= self.lo) & (cols < self.hi)] *= self.factor
        return x.astype(np.float32) @ wd.T


class Q4KSubBlockScale(_SubBlockScale):
    pass


class Q6KSubBlockScale(_SubBlockScale):
    qtype, period, lo, hi, factor = "Q6_K", 32, 16, 32, 0.75


class NoCausalInChunk(_Planted):
    def _attention(self, q, cache, layer, pos0):  # noqa: ANN001, ANN201
        T, H, D = q.shape
        if T == 1:
            return super()._attention(q, cache, layer, pos0)
        L = pos0 + T  # every query of the chunk sees the whole chunk
        group = H // cache.k[layer].shape[1]
        k = np.repeat(cache.k[layer][:L].astype(np.float64), group, axis=1)
        v = np.repeat(cache.v[layer][:L].astype(np.float64), group, axis=1)
        s = np.einsum("thd,lhd->htl", q.astype(np.float64), k) / np.sqrt(D)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("htl,lhd->thd", p, v).astype(np.float32)


class RopeChunkPositions(_Planted):
    def _rope(self, x, pos0, theta, neox):  # noqa: ANN001, ANN201
        return super()._rope(x, 0 if x.shape[0] > 1 else pos0, theta, neox)


class KvWriteOffByOne(_Planted):
    def _kv_write(self, cache, layer, k, v, pos0):  # noqa: ANN001, ANN201
        if k.shape[0] > 1 and pos0 + k.shape[0] < cache.capacity:
            pos0 += 1
        super()._kv_write(cache, layer, k, v, pos0)


class ArgmaxLastTie(_Planted):
    def _argmax(self, logits):  # noqa: ANN001, ANN201
        flipped = np.asarray(logits)[..., ::-1]
        return (logits.shape[-1] - 1 - np.argmax(flipped, axis=-1)).astype(np.int32)


class ArgmaxSliceUnwritten(StaleArgmax):
    """A two-stage argmax (4 slices, then a merge) after a batched prefill whose last slice
    never writes its partial: the merge reads whatever the scratch held. NaN-first, like
    np.argmax: a poisoned (NaN) partial wins and its index (-1) is no token."""

    SLICES = 4

    def _argmax(self, logits):  # noqa: ANN001, ANN201
        if not self._batched_tail:
            return NumpyBackend._argmax(self, logits)
        rows, V = logits.shape[0], logits.shape[-1]
        best = self.scratch((rows, self.SLICES), np.float32)
        where = self.scratch((rows, self.SLICES), np.int32)
        edges = np.linspace(0, V, self.SLICES + 1).astype(int)
        for s in range(self.SLICES - 1):  # the last slice is never written
            part = logits[:, edges[s] : edges[s + 1]]
            where[:, s] = edges[s] + np.argmax(part, axis=-1)
            best[:, s] = part[np.arange(rows), where[:, s] - edges[s]]
        pick = np.argmax(best, axis=-1)
        return where[np.arange(rows), pick].astype(np.int32)


class DefaultDecodeMatmulOff(_Planted):
    """The default decode matmul (T == 1), which the per-token reference runs too, scales a
    row block: validate alone compares two paths that share it."""

    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        out = super()._matmul(x, w)
        if x.shape[0] == 1:
            out[:, :8] *= 1.25
        return out


class DecodeAttentionDropsRange(_Planted):
    """A split-KV merge that loses one key range, at decode (T == 1) only."""

    def _attention(self, q, cache, layer, pos0):  # noqa: ANN001, ANN201
        L = pos0 + 1
        if q.shape[0] > 1 or L < 8:
            return super()._attention(q, cache, layer, pos0)
        lo, hi = L // 8, 2 * (L // 8)  # the second of eight ranges
        saved_k = cache.k[layer][lo:hi].copy()
        cache.k[layer][lo:hi] = -1e4 * q[0, 0].mean()  # scores pushed far from the rest
        try:
            out = super()._attention(q, cache, layer, pos0)
        finally:
            cache.k[layer][lo:hi] = saved_k
        return out


@dataclass(frozen=True)
class Mutant:
    name: str
    backend: str  # numpy | vulkan | cuda
    blamed: str  # the registry op blame must name
    what: str
    candidate: dict[str, Any] = field(default_factory=dict)  # flat config it is judged under
    check: str = "validate"  # or cross_check: a bug in a kernel both paths share
    plant: type | None = None  # NumPy: the backend subclass
    # validate's op-level replay must fail it (op_replay): the bug is in an op the hook
    # sees. False: the argmax (not a hooked op; the device-argmax check and probe see it) and
    # fused kernels that run only unhooked (seen end to end)
    op_level: bool = True

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.name}"


def _mmvw_mutant(name: str, what: str, op_level: bool = True, **knobs: int) -> Mutant:
    """A planted bug in one of mmvw's kernels (blame: matmul_decode), judged under mmvw with
    knobs (matmul_decode.<knob>)."""
    flat = {"matmul_decode.variant": "mmvw"} | {f"matmul_decode.{k}": v for k, v in knobs.items()}
    return Mutant(name, "cuda", "matmul_decode", what, flat, op_level=op_level)


_NP = {"prefill.chunk_tokens": 16}
MUTANTS: tuple[Mutant, ...] = (
    Mutant("DROP_LAST_COLUMN", "numpy", "matmul_prefill", "batched matmul leaves the last column "
           "(token) of every chunk unwritten", _NP, plant=DropLastColumn),
    Mutant("STALE_ARGMAX", "numpy", "argmax", "the batched prefill's greedy token is read from a "
           "stale argmax buffer", _NP, plant=StaleArgmax, op_level=False),
    Mutant("PREFILL_TAIL_ROWS", "numpy", "matmul_prefill", "batched matmul drops the ragged last "
           "64-row tile", _NP, plant=PrefillTailRows),
    Mutant("DECODE_TAIL_ROWS", "numpy", "matmul_decode", "DMMV skips rows past the last multiple "
           "of 32", {**_NP, "matmul_decode.variant": "ondemand"}, plant=DecodeTailRows),
    Mutant("K_LOOP_SHORT", "numpy", "matmul_prefill", "batched matmul's K loop stops one 32-block "
           "short", _NP, plant=KLoopShort),
    Mutant("FP16_ACCUMULATE", "numpy", "matmul_prefill", "batched matmul accumulates in fp16",
           _NP, plant=Fp16Accumulate),
    Mutant("Q4K_SCALE", "numpy", "matmul_prefill", "batched Q4_K dequant: sub-block 7 takes a "
           "wrong scale", _NP, plant=Q4KSubBlockScale),
    Mutant("Q6K_SCALE", "numpy", "matmul_prefill", "batched Q6_K dequant: the second 16 of each "
           "32 take a wrong scale", _NP, plant=Q6KSubBlockScale),
    Mutant("NO_CAUSAL_IN_CHUNK", "numpy", "attention", "the causal mask is missing inside a "
           "chunk", _NP, plant=NoCausalInChunk),
    Mutant("ROPE_CHUNK_POSITIONS", "numpy", "rope", "RoPE positions restart at 0 in every "
           "batched chunk", _NP, plant=RopeChunkPositions),
    Mutant("ROPE_PAST_FIRST_CHUNK", "numpy", "rope", "RoPE positions restart at 0 past the "
           "first chunk of 256 (every fixed and edge prompt fits in one)",
           {"prefill.chunk_tokens": 256}, plant=RopeChunkPositions),
    Mutant("KV_WRITE_OFF_BY_ONE", "numpy", "kv_write", "a batched chunk's K/V land one position "
           "late", _NP, plant=KvWriteOffByOne),
    Mutant("ARGMAX_SLICE_UNWRITTEN", "numpy", "argmax", "a two-stage argmax never writes its "
           "last slice's partial (the merge reads scratch nobody wrote)", _NP,
           plant=ArgmaxSliceUnwritten, op_level=False),
    Mutant("DEFAULT_DECODE_MATMUL", "numpy", "matmul_decode", "the default decode matmul "
           "(both validate paths run it) scales its first 8 rows", _NP,
           check="cross_check", plant=DefaultDecodeMatmulOff),
    Mutant("ARGMAX_LAST_TIE", "numpy", "argmax", "ties go to the last maximum", _NP,
           plant=ArgmaxLastTie, op_level=False),
    Mutant("DECODE_ATTN_DROPS_RANGE", "numpy", "attention", "decode attention loses one of its "
           "key ranges (a split-KV merge dropping a split)", _NP,
           plant=DecodeAttentionDropsRange),
    # Vulkan (lavapipe in CI): tests/planted/vulkan.patches
    Mutant("TILED_TAIL_ROWS", "vulkan", "matmul_prefill", "tiled GEMM does not write the ragged "
           "last row tile (matmul_tiled.comp)"),
    Mutant("TILED_K_SHORT", "vulkan", "matmul_prefill", "tiled GEMM's K loop one block short"),
    Mutant("TILED_NO_BARRIER", "vulkan", "matmul_prefill", "tiled GEMM reads its shared tiles "
           "without the barrier after the loads"),
    Mutant("FP16_ACCUMULATE", "vulkan", "matmul_prefill", "kpar accumulates in fp16 "
           "(matmul_prefill.comp)", {"matmul_prefill.variant": "kpar"}),
    Mutant("DMMV_TAIL_ROWS", "vulkan", "matmul_decode", "subgroup DMMV skips rows past the last "
           "multiple of 32 (matmul_decode.comp)", {"matmul_decode.variant": "subgroup"}),
    Mutant("MMVW_Q4K_MIN", "vulkan", "matmul_decode", "int8 decode matmul: both halves of a "
           "Q4_K sub-block subtract its min term (mmvw_rows.glsl)",
           {"matmul_decode.variant": "mmvw"}),
    Mutant("Q4K_SCALE_MIN", "vulkan", "matmul_prefill", "Q4_K sub-blocks 4..7 swap scale and "
           "min (dequant.glsl)"),
    Mutant("Q6K_SCALE", "vulkan", "matmul_prefill", "Q6_K: the second 16 of each 32 reuse the "
           "first 16's scale (dequant.glsl)"),
    Mutant("NO_CAUSAL_IN_CHUNK", "vulkan", "attention", "online attention without the causal "
           "mask inside a chunk", {"attention.variant": "online", "prefill.chunk_tokens": 32}),
    Mutant("ROPE_CHUNK_POS", "vulkan", "rope", "RoPE positions restart at 0 in batched chunks",
           {"prefill.chunk_tokens": 32}),
    Mutant("KV_OFF_BY_ONE", "vulkan", "kv_write", "a batched chunk's K/V written one position "
           "late", {"prefill.chunk_tokens": 32}),
    Mutant("SPLIT_MERGE_DROPS", "vulkan", "attention", "split-KV merge forgets partial 1 "
           "(attention_split.comp)"),
    Mutant("ARGMAX_LAST_TIE", "vulkan", "argmax", "two-stage argmax breaks ties to the last "
           "maximum", op_level=False),
    Mutant("RMS_WEIGHT_TWICE", "vulkan", "rms_norm", "the default rms_norm applies its weight "
           "twice (both validate paths share it)", check="cross_check"),
    Mutant("RMS_EPS_FIXED", "vulkan", "rms_norm", "the default rms_norm ignores the model's eps "
           "(1e-5 for 1e-6)", check="cross_check"),
    Mutant("ADD_NORM_NO_RES", "vulkan", "rms_norm", "rms_norm.fuse_add's norm leaves the "
           "residual out of the normed row (rms_norm.comp ADD_RES)", {"rms_norm.fuse_add": 1},
           op_level=False),
    Mutant("ROPE_BIAS_KQ", "vulkan", "rope", "rope.fuse_bias adds q's bias to k (rope.comp "
           "FUSE_BIAS)", {"rope.fuse_kv": 1, "rope.fuse_bias": 1}, op_level=False),
    # CUDA (gpu-marked): tests/planted/cuda.patches
    Mutant("MMVQ_TAIL_ROWS", "cuda", "matmul_decode", "mmvq skips the ragged last rows",
           {"matmul_decode.variant": "mmvq"}),
    _mmvw_mutant("MMVW_TAIL_ROWS", "mmvw skips the ragged last rows"),
    # the default decode matmul: the reference's per-token path runs it too
    Mutant("MMVF_Q4K_MIN", "cuda", "matmul_decode", "mmvf (the default float decode matmul): "
           "a Q4_K slot's high sub-block subtracts the low one's min", check="cross_check"),
    # mmvw's fused epilogues run only unhooked: validate rejects, blame names the fused op
    _mmvw_mutant("MMVW_GLU_UP", "mmvw_glu multiplies silu(gate) by gate, not up",
                 fuse_swiglu=1, op_level=False),
    _mmvw_mutant("MMVW_NORM_EARLY", "mmvw_norm's RMSNorm leaves out the row's last 32 values",
                 fuse_norm=1, op_level=False),
    _mmvw_mutant("MMVW_QKV_POS", "mmvw_qkv ropes k by the previous position",
                 fuse_rope=1, op_level=False),
    _mmvw_mutant("MMVW_STAGE_HALF", "mmvw's staged bulk copy brings half of a block's weight rows",
                 stage=1),
    _mmvw_mutant("Q4K_LEAN_SCALE", "mmvw's branch-free Q4_K scale decode (q4k_lean) gives a "
                 "pair's odd sub-block the even one's scale", q4k_lean=1),
    _mmvw_mutant("MMVW_Q4K_ROW0", "mmvw_q4k (q4k_kernel) computes the next block's rows",
                 q4k_kernel=1),
    _mmvw_mutant("MMVW_STREAM_SHORT", "mmvw_stream's bulk copies each leave out their row set's "
                 "last 16 bytes (stale shared memory read instead)", stream=2),
    _mmvw_mutant("MMVW_SPLIT_PART", "mmvw's split-K leaves out the last part of each row",
                 split_k=2, split_min_k=256),
    _mmvw_mutant("Q4K_WIDE_HIGH", "mmvw's wide Q4_K slot multiplies its second run's high nibbles "
                 "by the first run's activations", q4k_wide=1),
    _mmvw_mutant("Q6K_WIDE_SCALE", "mmvw's wide Q6_K slot scales its second high run by the first "
                 "one's scale", q6k_wide=1),
    Mutant("ATTN_KV_EARLY_K", "cuda", "attention_decode", "split_kw's early V loads read the "
           "K cache", {"attention_decode.variant": "split_kw", "attention_decode.kv_early": 1}),
    Mutant("ATTN_GQA_Q0", "cuda", "attention_decode", "attn_gqa scores every head of a KV "
           "group with the group's first q head", {"attention_decode.variant": "gqa"}),
    # fuse_rope and mmvf_glu are fused steps (attn_in, ffn): only the unhooked schedule runs them
    Mutant("ATTN_GQA_ROPE_SIN", "cuda", "attention_decode", "attn_gqa's fused RoPE turns by "
           "minus the angle", {"attention_decode.variant": "gqa", "attention_decode.fuse_rope": 1},
           op_level=False),
    Mutant("ATTN_TILE_SWIZZLE", "cuda", "attention_decode", "attn_tile reads its V rows "
           "without the shared-memory swizzle", {"attention_decode.variant": "tile"}),
    Mutant("MMVF_GLU_GATE", "cuda", "matmul_decode", "mmvf_glu multiplies silu(gate) by gate, "
           "not up", {"matmul_decode.fuse_swiglu": 1}, op_level=False),
    # rms_norm.block is the default: validate's reference runs it too
    Mutant("NORM_ROW_WEIGHT", "cuda", "rms_norm", "rms_norm_row (rms_norm.block, the default) "
           "reads the norm weight one float4 late", check="cross_check"),
    Mutant("MMQ_K_SHORT", "cuda", "matmul_prefill", "mmq's K loop one tile short",
           {"matmul_prefill.variant": "mmq", "prefill.gemm_min_t": 2}),
    Mutant("MMQ8_Q4K_MIN", "cuda", "matmul_prefill", "mmq8 drops the Q4_K min term",
           {"matmul_prefill.variant": "mmq8", "prefill.gemm_min_t": 2}),
    Mutant("ATTN_SPLIT_MERGE_DROPS", "cuda", "attention_decode", "split-KV combine forgets "
           "split 1 (the reference's per-token path uses it too)", check="cross_check"),
    Mutant("FLASH_NO_CAUSAL", "cuda", "attention_prefill", "flash attention without the causal "
           "mask inside a block", {"prefill.gemm_min_t": 2}),
    Mutant("FLASH_TC_NO_CAUSAL", "cuda", "attention_prefill", "tensor-core flash attention "
           "without the causal mask inside a key tile", {"attention_prefill.variant": "flash_tc"}),
    Mutant("ATTG_NO_CAUSAL", "cuda", "attention_prefill", "cuBLAS attention's softmax lets every "
           "query of a pass see the pass's last keys", {"attention_prefill.variant": "gemm"}),
)  # fmt: skip


@contextmanager
def planted(m: Mutant) -> Iterator[None]:
    """A Vulkan/CUDA mutant's patched shaders compiled in for the body (tests/planted); nothing
    for a NumPy one (its plant is a backend subclass)."""
    if m.backend == "numpy":
        yield
        return
    with shader_patches.planted(m.name):
        yield


@dataclass
class Verdict:
    mutant: str
    rejected: bool
    caught_by: str  # validate | cross_check | (none)
    blamed: str | None  # blamed op
    blame: str  # blame text
    kld: float
    nmse: float
    reasons: list[str]
    replay_failed: bool = False  # validate's op-level replay rejected it
    replay_worst: str = ""  # replay's worst op: "op NMSE / bound"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def assert_validate_catches(m: Mutant, model_path: Any, make_backend: Any = None) -> None:
    """validate rejects the planted m (its first check: not a later one) and blame names the
    op m says it must."""
    v = judge(m, model_path, make_backend)
    assert v.rejected and v.caught_by == "validate", v
    assert v.blamed == m.blamed, v.blame


def judge(m: Mutant, model_path: Any, make_backend: Any = None, steps: int = 4) -> Verdict:
    """Plant ``m``, run the check it must fail, and say what caught it and what blame named."""
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.tuning import TuningConfig
    from engine.verify.cross_check import cross_check_numpy
    from engine.verify.validate import validate

    with planted(m):
        if m.plant is not None:
            be = m.plant()
        elif make_backend is not None:
            be = make_backend()
        else:
            from tests.backend_params import open_backend

            be = open_backend(m.backend)
        try:
            model = build_model(open_model(model_path), be)
            ps = prompts(model.spec.n_vocab)
            if m.check == "cross_check":
                cc = cross_check_numpy(model, ps[1:3], steps=steps)
                blame = cc["blame"] or {}
                return Verdict(m.id, not cc["passed"], "cross_check" if not cc["passed"] else "",
                               blame.get("op"), blame.get("text", ""), cc["kld"], cc["nmse"],
                               cc["reasons"][:3])  # fmt: skip
            cand = TuningConfig.default(m.backend).replace(**m.candidate)
            rep = validate(model, cand, ps, steps=steps)
            b, r = rep.blame, rep.replay
            w = r.worst if r else None
            return Verdict(m.id, not rep.passed, "validate" if not rep.passed else "",
                           b.op if b else None, str(b) if b else "", rep.kld_max, rep.nmse,
                           rep.reasons[:3], r is not None and not r.passed,
                           f"{w.op} {w.nmse:.3g} / {w.bound:g}" if w else "")  # fmt: skip
        finally:
            close = getattr(be, "close", None)
            if close is not None:
                close()
