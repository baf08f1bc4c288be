"""The Vulkan backend: the op contract of engine.backends.base on GLSL compute shaders.

Tensors are float32/int32 views (buffer, element offset, shape) of pooled device buffers; ops
record dispatches into a Stream that is submitted when the host reads a result. Weights are the
raw GGML blocks, uploaded as bytes and decoded inside the kernels; a weight larger than
maxStorageBufferRange (the LM head of a real model) is stored as row ranges, one buffer and one
dispatch each. 1-D weights (norm scales, biases) are dequantized to float32 at load.
"""

from __future__ import annotations

import logging
import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.base import (
    Backend,
    DeviceEntry,
    DeviceInfo,
    KVCache,
    ProfileReport,
    host_row_stats,
)
from engine.backends.vulkan import kernels as K
from engine.backends.vulkan._vk import vk
from engine.backends.vulkan.decode_fused import FusedDecode
from engine.backends.vulkan.device import Device, open_device
from engine.backends.vulkan.fused_norm import FusedNorm
from engine.backends.vulkan.kernels import MAX_GROUPS
from engine.backends.vulkan.kernels import fold_groups as _fold
from engine.backends.vulkan.memory import Allocator, Buffer, Lease, driver_usage
from engine.backends.vulkan.pipelines import Pipeline, Pipelines
from engine.backends.vulkan.resident import ResidentPrefill
from engine.backends.vulkan.stream import GraphKey, Stream
from engine.errors import ConfigError, EngineError, KernelCompileError, UnsupportedError
from engine.tuning.variants.vulkan import QUANT_TYPES

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.gguf_model import QTensor
    from engine.tuning import TuningConfig

KEY_SPLITS = 64  # attention_split.comp's MAX_SPLITS: the partials its merge weighs

log = logging.getLogger(__name__)

STAGING_CHUNK = 64 << 20


class VkTensor:
    """A float32 or int32 tensor: ``shape`` elements from element ``offset`` of a buffer."""

    __slots__ = ("lease", "offset", "shape", "dtype")

    def __init__(self, lease: Lease, offset: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.lease = lease
        self.offset = offset
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    @property
    def buf(self) -> Buffer:
        return self.lease.buf

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def reshape(self, shape: tuple[int, ...]) -> VkTensor:
        shape = tuple(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return VkTensor(self.lease, self.offset, shape, self.dtype)

    def __getitem__(self, idx: slice) -> VkTensor:
        if not isinstance(idx, slice) or idx.step not in (None, 1):
            raise TypeError("VkTensor supports only contiguous row slices t[a:b]")
        start, stop, _ = idx.indices(self.shape[0])
        stop = max(stop, start)
        row = math.prod(self.shape[1:])
        return VkTensor(
            self.lease, self.offset + start * row, (stop - start, *self.shape[1:]), self.dtype
        )

    def __repr__(self) -> str:
        return f"VkTensor({self.shape}, {self.dtype}, buffer {self.buf.id} + {self.offset})"


@dataclass
class DecodeGraph:
    """A captured decode step: its nodes after the input-token copy, the dynamic scalars (all
    equal to the position it was captured at), and every buffer it touches, owned so that no
    other tensor can be handed one of them while the graph may still be replayed."""

    cache: Any  # weakref to the KVCache
    config: Any
    generation: int
    pos: int
    max_pos: int  # replay is valid while pos < max_pos (KV cache, RoPE table)
    inp: VkTensor
    logits: VkTensor
    tok: VkTensor
    nodes: list[Any]
    dyn: list[int]
    pending_r: set[int]
    pending_w: set[int]
    owned: list[Lease]
    keys: dict[tuple[int, int], GraphKey] = field(default_factory=dict)  # by input copy source


@dataclass
class VkWeight:
    """A weight on the device: raw GGML rows in ranges (parts) or, for 1-D weights, float32."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    row_bytes: int = 0
    parts: list[tuple[Lease, int, int]] = field(default_factory=list)  # (lease, row0, nrows)
    f32: VkTensor | None = None
    # matmul_prefill.resident: the fp16 copy [N, Kp] in row ranges (lease, row0, nrows), made
    # at the first prefill GEMM (engine/backends/vulkan/resident.py)
    f16: list[tuple[Lease, int, int]] | None = None

    @property
    def nbytes(self) -> int:
        f16 = sum(p[0].buf.size for p in self.f16 or ())
        return sum(p[0].buf.size for p in self.parts) + (self.f32.buf.size if self.f32 else 0) + f16


class VulkanBackend(ResidentPrefill, FusedNorm, FusedDecode, Backend):
    name = "vulkan"

    def __init__(
        self,
        config: TuningConfig | None = None,
        *,
        device: int | None = None,
        staging: bool = False,
    ) -> None:
        """``device``: the index of physical_devices() to open (None: the best kind present).
        ``staging=True`` treats memory as discrete even where it is unified (tests run the
        staging-buffer upload/download paths of discrete GPUs on lavapipe this way)."""
        self.dev: Device | None = None
        super().__init__(config)
        self.dev = open_device(device)
        if staging:
            self.dev.mem.unified = False
        self.alloc = Allocator(self.dev)
        self.pipes = Pipelines(self.dev)
        self.stream = Stream(self.dev, self.pipes, self.alloc)
        # Largest buffer one descriptor may cover; tests lower it to exercise row ranges.
        self.max_weight_bytes = self.dev.max_range
        self._qtypes: set[str] = set()
        self._ops: dict[tuple[str, str], tuple[Pipeline, Any]] = {}
        self._rope_tables: dict[tuple[float, int], tuple[VkTensor, int]] = {}
        self._graph: DecodeGraph | None = None
        self._graph_generation = 0  # bumped when a buffer dies or the config changes
        # Q8_1 forms of recent decode rows under matmul_decode.mmvw: (x, q8), newest last. The
        # entry holds x, so its buffer cannot be handed to another tensor while it is here.
        self._q8: list[tuple[VkTensor, VkTensor]] = []
        self._ticket_buf: VkTensor | None = None  # attention.fuse_combine's tickets (zeroed)
        self.alloc.on_destroy.append(self._invalidate_graph)
        cfg = self.config
        self.config = None  # type: ignore[assignment]
        self.set_config(cfg)

    # --- device and memory -------------------------------------------------------------
    @classmethod
    def list_devices(cls) -> list[DeviceEntry]:
        from engine.backends.vulkan.device import physical_devices

        return [
            DeviceEntry("vulkan", d.index, d.name, d.device_class, d.kind, d.driver, d.memory_bytes)
            for d in physical_devices()
        ]

    def device_info(self) -> DeviceInfo:
        return self.dev.info

    def weight_nbytes(self, w: VkWeight) -> int:
        return w.nbytes

    def release_unused(self) -> None:
        """Drop the resident fp16 copies unless the config reads them; free pooled buffers
        nobody holds."""
        if self.config.knobs("matmul_prefill").variant != "resident":
            self.drop_resident()
        self.stream.flush()
        self.alloc.trim()

    def driver_memory(self) -> tuple[int | None, str]:
        return driver_usage(self.dev.physical)

    def held_bytes(self) -> int:
        """Every live buffer: tensors, pooled free ones, staging, RoPE tables."""
        return self.alloc.bytes_allocated

    @property
    def validation_messages(self) -> list[str]:
        """Errors reported by the validation layer (FLEETTUNE_VK_VALIDATION=1)."""
        return self.dev.messages

    def _new(
        self, shape: tuple[int, ...], dtype: Any = np.float32, poison: bool = True
    ) -> VkTensor:
        n = max(math.prod(shape), 1)
        t = VkTensor(self.alloc.new(4 * n), 0, shape, dtype)
        if self.poison and poison:  # validate: an element no kernel writes reads as NaN / -1
            self.stream.fill(t.buf, 0, 4 * n, 0xFFFFFFFF)
        return t

    def _write(self, buf: Buffer, offset: int, data: np.ndarray) -> None:
        """Host bytes into a buffer, in stream order with the dispatches around it."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if buf.host is not None:
            if self.stream.busy(buf):
                self.stream.flush()  # pending or in-flight work still uses the old contents
            buf.host[offset : offset + raw.size] = raw
            return
        for c0 in range(0, raw.size, STAGING_CHUNK):
            chunk = raw[c0 : c0 + STAGING_CHUNK]
            staging = self.alloc.new(chunk.size, host_visible=True)
            staging.buf.host[: chunk.size] = chunk
            self.stream.copy(staging.buf, 0, buf, offset + c0, chunk.size)
            self.stream.keepalive.append(staging)
            if raw.size > STAGING_CHUNK:
                self.stream.flush()  # bound the staging memory of big weights

    def upload(self, a: np.ndarray) -> VkTensor:
        a = np.asarray(a)
        if a.dtype.kind in "iub":
            a = a.astype(np.int32)
        else:
            a = a.astype(np.float32)
        t = self._new(a.shape, a.dtype)
        if a.size:
            self._write(t.buf, 0, a)
        return t

    def download(self, t: VkTensor) -> np.ndarray:
        if isinstance(t, np.ndarray):
            return np.array(t, copy=True)
        n = 4 * t.size
        b = t.buf
        if b.host is not None:
            self.stream.flush()
            raw = b.host[4 * t.offset : 4 * t.offset + n].copy()
        else:
            staging = self.alloc.new(n, host_visible=True)
            if n:
                self.stream.copy(b, 4 * t.offset, staging.buf, 0, n)
            self.stream.flush()
            raw = staging.buf.host[:n].copy()
        return raw.view(t.dtype).reshape(t.shape)

    def row_stats(self, t: VkTensor, ref: Any, ref_host: np.ndarray) -> Any:
        """Op-level replay's comparison, downloaded later: t is copied into its own staging
        buffer in the stream's order and stats_host reads every copy after one flush (a
        download per hooked op waited on a fence each: most of a lavapipe replay's time)."""
        if isinstance(t, np.ndarray):
            return super().row_stats(t, ref, ref_host)
        n = 4 * t.size
        staging = self.alloc.new(n, host_visible=True)
        if n:
            self.stream.copy(t.buf, 4 * t.offset, staging.buf, 0, n)
        return _RowsAfterFlush(staging, n, t.shape, t.dtype, ref_host)

    def stats_host(self, stats: list[Any]) -> list[np.ndarray]:
        if any(isinstance(s, _RowsAfterFlush) for s in stats):
            self.stream.flush()
        return [s.stats() if isinstance(s, _RowsAfterFlush) else np.asarray(s) for s in stats]

    def synchronize(self) -> None:
        self.stream.flush()

    def load_weight(self, qt: QTensor) -> VkWeight:
        if qt.qtype not in QUANT_TYPES:
            raise UnsupportedError(
                f"vulkan backend: tensor {qt.name!r} has weight type {qt.qtype}, which has no "
                f"Vulkan kernel; supported: {sorted(QUANT_TYPES)}"
            )
        if len(qt.shape) == 1:  # norm scales and biases: tiny, always float32
            f32 = np.asarray(qt.dequantize(), dtype=np.float32).reshape(-1)
            t = VkTensor(self.alloc.new(4 * f32.size, pooled=False), 0, f32.shape, np.float32)
            self._write(t.buf, 0, f32)
            # tracked like the matrices: memory_report counted them as scratch before
            return self.track_weight(VkWeight(qt.name, qt.qtype, tuple(qt.shape), f32=t))
        n_rows = math.prod(qt.shape[:-1])  # stacked experts [E, N, K]: E * N rows
        raw = np.ascontiguousarray(qt.raw).reshape(n_rows, -1)
        row_bytes = raw.shape[1]
        if row_bytes > self.max_weight_bytes:
            raise UnsupportedError(
                f"vulkan backend: a row of {qt.name!r} ({row_bytes} B) exceeds "
                f"maxStorageBufferRange ({self.max_weight_bytes} B)"
            )
        rows_per_part = max(1, self.max_weight_bytes // row_bytes)
        w = VkWeight(qt.name, qt.qtype, tuple(qt.shape), row_bytes)
        for r0 in range(0, n_rows, rows_per_part):
            part = raw[r0 : r0 + rows_per_part]
            lease = self.alloc.new(part.nbytes, pooled=False)
            self._write(lease.buf, 0, part)
            w.parts.append((lease, r0, part.shape[0]))
        if qt.qtype not in self._qtypes:
            self._qtypes.add(qt.qtype)
            try:
                self._build(self.config, {qt.qtype})
            except KernelCompileError:
                self._qtypes.discard(qt.qtype)
                raise
        return self.track_weight(w)

    def new_kv_cache(self, n_layers: int, capacity: int, n_head_kv: int, head_dim: int) -> KVCache:
        shape = (capacity, n_head_kv, head_dim)
        ks, vs = [], []
        for _ in range(n_layers):
            for lst in (ks, vs):
                t = self._new(shape)
                self.stream.fill(t.buf, 0, 4 * t.size)  # zeros, like the reference
                lst.append(t)
        return self.track_cache(KVCache(k=ks, v=vs, capacity=capacity))

    # --- config and pipelines -----------------------------------------------------------
    def set_config(self, config: TuningConfig) -> None:
        """Switch variants/parameters: builds every pipeline the config needs for the weight
        types loaded so far. On failure (KernelCompileError, ConfigError) the previous config
        stays active and the backend stays usable."""
        if config.backend != self.name:
            raise ConfigError(f"config is for backend {config.backend!r}, not {self.name!r}")
        config.check(self.dev.info)
        ops = self._build(config, self._qtypes, fresh=True)
        self.stream.flush()
        self.config = config
        self._ops = ops
        if config.knobs("matmul_prefill").variant != "resident":
            self.drop_resident()  # the fp16 copies go with the variant that reads them
        self._q8.clear()
        self._invalidate_graph(None)
        sub = config.knobs("submit")
        self.stream.max_nodes = int(sub.max_nodes)
        self.stream.replay = bool(sub.replay)
        if not self.stream.replay:
            self.stream.clear_replay()

    def _programs(
        self, config: TuningConfig, op: str, q: str
    ) -> list[tuple[str, K.Program, tuple[tuple[int, int], ...], int]]:
        """(key, program, spec constants as (constant_id, value), required subgroup size) of
        every pass of op's chosen variant for weight type q ("" for ops without weights), from
        the registry's bindings, keyed as kernels.pass_keys says (op, then op.merge or the
        pass's own key)."""
        c = config.op(op)
        spec, sg = K.specialization(op, c)
        passes = K.programs(op, c, q)
        keys = K.pass_keys(op, c.variant)
        return [(key, p, spec, sg) for key, p in zip(keys, passes, strict=True)]

    def _build(
        self, config: TuningConfig, qtypes: set[str], fresh: bool = False
    ) -> dict[tuple[str, str], tuple[Pipeline, Any]]:
        ops = {} if fresh else self._ops
        for op in K.BUILT_OPS:
            weighted = op in K.WEIGHTED_OPS
            variant = config.op(op).variant
            for q in sorted(qtypes) if weighted else [""]:
                for key, prog, spec, sg in self._programs(config, op, q):
                    # mmvw's one program serves every int8 type: no type in its name
                    typed = q and prog.shader != "mmvw"
                    name = f"{op}.{variant}" + key[len(op) :] + (f"[{q}]" if typed else "")
                    ops[(key, q)] = (self.pipes.get(prog, spec, name, sg), config.knobs(op))
        return ops

    def _pipe(self, op: str, qtype: str = "") -> tuple[Pipeline, Any]:
        got = self._ops.get((op, qtype))
        if got is None:  # a weight type not seen at set_config time (direct op calls)
            self._qtypes.add(qtype)
            self._ops.update(self._build(self.config, {qtype}))
            got = self._ops[(op, qtype)]
        return got

    # --- decode graph -------------------------------------------------------------------
    def _invalidate_graph(self, _buf: Any) -> None:
        self._graph_generation += 1
        self._graph = None

    def decode_step(
        self, step: Callable[[Any, int], tuple[Any, Any]], tok: Any, pos: int, cache: KVCache
    ) -> tuple[Any, Any]:
        """Capture step(tok, pos) once per KV cache and config, then replay it without calling
        the Python ops: the next input token is copied into the graph's own input, the position
        goes into the dynamic scalars, and the submit hits the recorded command buffer. The
        graph's logits and token tensors are returned every step: read them before the next
        step (the model downloads the token each step)."""
        if pos + 1 > cache.capacity:
            raise ValueError(
                f"KV cache full: writing positions {pos}..{pos} into a cache of {cache.capacity}"
            )
        s = self.stream
        g = self._graph
        if not s.replay or not isinstance(tok, VkTensor) or s.broken:
            return step(tok, pos)
        if (
            g is None
            or g.cache() is not cache
            or g.config is not self.config
            or g.generation != self._graph_generation
            or pos >= g.max_pos
        ):
            g = None  # drop our reference: the old graph's buffers go back before the capture
            return self._capture(step, tok, pos, cache)
        if s.nodes:
            s.flush()
        s.copy(tok.buf, 4 * tok.offset, g.inp.buf, 0, 4)
        s.nodes.extend(g.nodes)
        s.dyn_values = [v - g.pos + pos for v in g.dyn]
        s.pending_r, s.pending_w = set(g.pending_r), set(g.pending_w)
        if s.replay:
            src = (tok.buf.id, tok.offset)
            key = g.keys.get(src)
            if key is None or key.key[0] != s.profiling:
                key = g.keys[src] = s.graph_key()
            s.use_key(key)
        if len(s.nodes) >= s.max_nodes:
            s.flush()
        return g.logits, g.tok

    def _capture(
        self, step: Callable[[Any, int], tuple[Any, Any]], tok: VkTensor, pos: int, cache: KVCache
    ) -> tuple[Any, Any]:
        s = self.stream
        s.flush()
        self._q8.clear()  # quantized forms made outside the capture are not in the graph
        self._graph = None
        owned: list[Lease] = []
        # never poisoned: a replay would run the fill after the next token's copy into it
        inp = self._new((1,), np.int32, poison=False)
        s.copy(tok.buf, 4 * tok.offset, inp.buf, 0, 4)
        submits = s.stats["submits"]
        self.alloc.capture = owned
        try:
            logits, nt = step(inp, pos)
        finally:
            self.alloc.capture = None
        # A buffer destroyed during the step (a RoPE table outgrown) bumps the generation; it is
        # harmless unless recorded nodes used it, and then its destruction submitted them.
        replayable = (
            s.stats["submits"] == submits  # the whole step is in this one node list
            and all(v == pos for v in s.dyn_values)  # every dynamic scalar is the position
            and isinstance(logits, VkTensor)
            and isinstance(nt, VkTensor)
        )
        if replayable:
            rope_cap = min((cap for _, cap in self._rope_tables.values()), default=cache.capacity)
            self._graph = DecodeGraph(
                cache=weakref.ref(cache),
                config=self.config,
                generation=self._graph_generation,
                pos=pos,
                max_pos=min(cache.capacity, rope_cap),
                inp=inp,
                logits=logits,
                tok=nt,
                nodes=list(s.nodes[1:]),
                dyn=list(s.dyn_values),
                pending_r=set(s.pending_r),
                pending_w=set(s.pending_w),
                owned=owned,
            )
        return logits, nt

    # --- profiling ----------------------------------------------------------------------
    def set_profiling(self, on: bool = True, grid: bool = False) -> None:
        """Per-kernel GPU timestamps (a query pair around every dispatch); UnsupportedError
        when the device's compute queue has no timestamps. ``grid``: kernel names carry the
        dispatch grid (``name@gx.gy.gz``), so each GEMM shape is its own row."""
        if on and not self.dev.timestamp_bits:
            raise UnsupportedError(
                f"{self.dev.info.name}: its compute queue has no timestamps; no kernel profile"
            )
        self.stream.flush()
        if bool(grid) != self.stream.profile_grid:
            self.stream.clear_replay()  # recorded command buffers carry the old names
            self.stream.profile_grid = bool(grid)
        self.stream.profiling = bool(on)

    def profile(self, reset: bool = True) -> ProfileReport:
        """Per-kernel GPU time since profiling was enabled (or the last reset)."""
        self.stream.flush()
        ms = {name: (n, ns / 1e6) for name, (n, ns) in self.stream.profile.items()}
        rep = ProfileReport.of("gpu-timestamps", ms)
        if reset:
            self.stream.profile = {}
        return rep

    def stats(self) -> dict[str, float]:
        """Counters since the backend opened: submits, replays, recorded command buffers,
        dispatches, barriers, and host seconds in recording / vkQueueSubmit / fence waits."""
        out: dict[str, float] = dict(self.stream.stats)
        out.update({f"{k}_s": v for k, v in self.stream.host_s.items()})
        return out

    # --- ops ----------------------------------------------------------------------------
    def _as_tensor(self, x: Any) -> VkTensor:
        return x if isinstance(x, VkTensor) else self.upload(np.asarray(x))

    def embedding(self, table: VkWeight, ids: VkTensor) -> VkTensor:
        ids = self._as_tensor(ids)
        if ids.dtype != np.int32:
            raise ValueError(f"embedding ids must be int32, got {ids.dtype}")
        T = ids.size
        _, C = table.shape
        out = self._new((T, C))
        pipe, c = self._pipe("embedding", table.qtype)
        wg = int(c.wg_size)
        work = T * -(-C // 8)
        for lease, r0, nr in table.parts:
            self.stream.dispatch(
                pipe,
                (lease.buf, ids.buf, out.buf),
                (out.buf,),
                (C, T, table.row_bytes, r0, nr, ids.offset, out.offset),
                _fold(-(-work // wg)),
            )
        return out

    def rms_norm(self, x: VkTensor, w: VkWeight, eps: float) -> VkTensor:
        x = self._as_tensor(x)
        D = x.shape[-1]
        wt = w.f32 if isinstance(w, VkWeight) else self._as_tensor(w)
        if wt.size != D:
            raise ValueError(f"rms_norm: weight of {wt.size} values for rows of {D}")
        rows = x.size // D
        out = self._new(x.shape)
        if rows == 1 and self._int8_row(D):  # the next matmul's Q8_1 input, in this dispatch
            q8 = self._new((self._q8_words(D),), np.int32)
            pipe, _ = self._pipe("quantize_act.norm")
            self.stream.dispatch(
                pipe,
                (x.buf, wt.buf, out.buf, q8.buf),
                (out.buf, q8.buf),
                (D, rows, x.offset, wt.offset, out.offset, float(eps), q8.offset),
                self._q8_grid(D) if self.config.knobs("quantize_act").coalesced else (1, 1, 1),
            )
            self._q8_remember(out, q8)
            return out
        pipe, _ = self._pipe("rms_norm")
        self.stream.dispatch(
            pipe,
            (x.buf, wt.buf, out.buf),
            (out.buf,),
            (D, rows, x.offset, wt.offset, out.offset, float(eps)),
            _fold(rows),
        )
        return out

    def delta_net(
        self,
        q: VkTensor,
        k: VkTensor,
        v: VkTensor,
        g: VkTensor,
        beta: VkTensor,
        state: VkTensor,
        v_order: str,
        eps: float,
    ) -> VkTensor:
        """The base contract; state [Hv, dk, dv] as S or, with state_transposed, S^T (a
        cache written under one layout must be read under the same one)."""
        q, k, v, g, beta = (self._as_tensor(t) for t in (q, k, v, g, beta))
        T, Hk, dk = q.shape
        _, Hv, dv = v.shape
        c = self.config.knobs("delta_net")
        wg, max_dk = int(c.wg_size), int(c.max_dk)
        if dv > wg or dk > max_dk or Hv % Hk or state.size != Hv * dk * dv:
            raise ValueError(
                f"delta_net: dk {dk} (<= max_dk {max_dk}), dv {dv} (<= wg_size {wg}), Hv {Hv} "
                f"a multiple of Hk {Hk}, state of {Hv * dk * dv} values (got {state.size})"
            )
        if v_order not in ("grouped", "tiled"):
            raise ValueError(f"delta_net: v_order {v_order!r}: 'grouped' or 'tiled'")
        out = self._new((T, Hv, dv))
        if c.variant == "chunked" and T > 1:
            self._delta_net_chunked(q, k, v, g, beta, state, out, v_order == "grouped", eps)
            return out
        pipe, _ = self._pipe("delta_net")
        tensors = (q, k, v, g, beta, state, out)
        self.stream.dispatch(
            pipe,
            tuple(t.buf for t in tensors),
            (state.buf, out.buf),
            (T, Hk, Hv, dk, dv, int(v_order == "grouped"), *(t.offset for t in tensors), eps),
            _fold(Hv),
        )
        return out

    def _delta_net_chunked(
        self,
        q: VkTensor,
        k: VkTensor,
        v: VkTensor,
        g: VkTensor,
        beta: VkTensor,
        state: VkTensor,
        out: VkTensor,
        grouped: bool,
        eps: float,
    ) -> None:
        """delta_net.chunked for T > 1: PASS_PREP per (chunk, head), then PASS_SCAN per (head,
        scan_wg columns) carrying the state (shaders/vulkan/delta_net_chunked.comp)."""
        T, Hk, dk = q.shape
        _, Hv, dv = v.shape
        c = self.config.knobs("delta_net")
        ch, scan_wg = int(c.chunk), int(c.scan_wg)
        n_chunks = -(-T // ch)
        # W, Y, G Q, G_L/G K, P per (head, token), G_L per (head, chunk): see the shader
        scratch = self._new((Hv * T * (dv + 3 * dk + ch) + Hv * n_chunks,))
        prep, _ = self._pipe("delta_net.prep")
        ins = (q, k, v, g, beta)
        self.stream.dispatch(
            prep,
            (*(t.buf for t in ins), scratch.buf),
            (scratch.buf,),
            (T, Hk, Hv, dk, dv, int(grouped), *(t.offset for t in ins), scratch.offset, eps),
            _fold(n_chunks * Hv),
        )
        scan, _ = self._pipe("delta_net.scan")
        self.stream.dispatch(
            scan,
            (scratch.buf, state.buf, out.buf),
            (scratch.buf, state.buf, out.buf),
            (T, Hv, dk, dv, scratch.offset, state.offset, out.offset),
            _fold(Hv * -(-dv // scan_wg)),
        )

    def matmul(self, x: VkTensor, w: VkWeight) -> VkTensor:
        x = self._as_tensor(x)
        T, Kx = x.shape[0], x.shape[-1]
        N, Kw = w.shape
        if Kx != Kw or x.size != T * Kx:
            raise ValueError(f"matmul: x {x.shape} against weight {w.name} {w.shape}")
        out = self._new((T, N))
        if T == 0:
            return out
        if T == 1 and self._wide(x, (w,)):
            self._mmvw(x, [(w, out, 0, None)])
            return out
        if T == 1:
            pipe, c = self._pipe("matmul_decode", w.qtype)
            rows = int(c.rows_per_wg)
            for lease, r0, nr in w.parts:
                self.stream.dispatch(
                    pipe,
                    (lease.buf, x.buf, out.buf),
                    (out.buf,),
                    (Kw, nr, w.row_bytes, x.offset, out.offset + r0),
                    _fold(-(-nr // rows)),
                )
            return out
        pipe, c = self._pipe("matmul_prefill", w.qtype)
        if c.variant == "resident":
            self.resident_matmul(x, w, out, pipe, c)
            self._kick()
            return out
        if c.variant in ("tiled", "coopmat"):  # the same grid and bindings
            per_wg, cols = int(c.tile_m), int(c.tile_n)
        else:
            per_wg = int(c.rows_per_wg) if c.variant == "kpar" else int(c.wg_size)
            cols = int(c.max_cols)
        chunks = -(-T // cols)
        for lease, r0, nr in w.parts:
            gx, gy, _ = _fold(-(-nr // per_wg))
            self.stream.dispatch(
                pipe,
                (lease.buf, x.buf, out.buf),
                (out.buf,),
                (Kw, nr, w.row_bytes, x.offset, out.offset + r0, N, T),
                (gx, gy, chunks),
            )
        self._kick()
        return out

    def _kick(self) -> None:
        """submit.prefill_kick: submit the recorded prefill nodes early (Stream.kick)."""
        c = self.config.knobs("submit")
        n = int(c.prefill_kick)
        if n:
            self.stream.kick(n, ahead=bool(c.prefill_ahead))

    def _eltwise(
        self, op: str, a: VkTensor, b: VkTensor, bcast: int, shape: tuple[int, ...] | None = None
    ) -> VkTensor:
        out = self._new(a.shape if shape is None else shape)
        pipe, c = self._pipe(op)
        n = out.size
        if n:
            self.stream.dispatch(
                pipe,
                (a.buf, b.buf, out.buf),
                (out.buf,),
                (n, a.offset, b.offset, out.offset, bcast),
                _fold(-(-n // int(c.wg_size))),
            )
        return out

    def add(self, a: VkTensor, b: VkTensor | VkWeight) -> VkTensor:
        a = self._as_tensor(a)
        if isinstance(b, VkWeight):
            if b.f32 is None:
                raise ValueError(f"add: {b.name} is not a 1-D weight")
            b = b.f32
        b = self._as_tensor(b)
        if b.shape == a.shape:
            return self._eltwise("add", a, b, 0)
        if b.ndim == 1 and b.size == a.shape[-1]:
            return self._eltwise("add", a, b, b.size)
        raise ValueError(f"add: shapes {a.shape} and {b.shape} do not broadcast")

    def swiglu(self, gate: VkTensor, up: VkTensor) -> VkTensor:
        gate, up = self._as_tensor(gate), self._as_tensor(up)
        if gate.shape != up.shape:
            raise ValueError(f"swiglu: shapes {gate.shape} and {up.shape} differ")
        n = gate.size
        if n and n == gate.shape[-1] and self._int8_row(n):  # one row: the down input as Q8_1
            out, q8 = self._new(gate.shape), self._new((self._q8_words(n),), np.int32)
            pipe, _ = self._pipe("quantize_act.swiglu")
            self.stream.dispatch(
                pipe,
                (gate.buf, up.buf, out.buf, q8.buf),
                (out.buf, q8.buf),
                (n, gate.offset, up.offset, out.offset, 0, q8.offset),
                self._q8_grid(n),
            )
            self._q8_remember(out, q8)
            return out
        if gate.ndim == 2 and n and self.x16_fused(gate.shape[0]):  # matmul_prefill.fuse_x16
            out = self._new(gate.shape)
            xh, kp = self.x16_for(out)
            pipe, c = self._pipe("swiglu.x16")
            T, cols = gate.shape
            self.stream.dispatch(
                pipe,
                (gate.buf, up.buf, out.buf, xh.buf),
                (out.buf, xh.buf),
                (n, gate.offset, up.offset, out.offset, 0, cols, kp, xh.offset),
                _fold(-(-T * (kp // 2) // int(c.wg_size))),
            )
            return out
        return self._eltwise("swiglu", gate, up, 0)

    def _rope_table(self, theta: float, D: int, n_pos: int) -> VkTensor:
        key = (float(theta), D)
        have = self._rope_tables.get(key)
        if have is not None and have[1] >= n_pos:
            return have[0]
        cap = max(1024, 1 << (n_pos - 1).bit_length())
        pos = np.arange(cap, dtype=np.float64)[:, None]
        inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # as the reference
        ang = pos * inv_freq  # [cap, D/2]
        table = np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)
        t = VkTensor(self.alloc.new(table.nbytes, pooled=False), 0, (table.size,), np.float32)
        self._write(t.buf, 0, table)
        self._rope_tables[key] = (t, cap)
        return t

    def rope(
        self, x: VkTensor, pos0: int, theta: float, neox: bool, n_rot: int | None = None
    ) -> VkTensor:
        x = self._as_tensor(x)
        T, H, D = x.shape
        n_rot = D if n_rot is None else n_rot
        if n_rot % 2 or not 0 < n_rot <= D:
            raise ValueError(f"rope: {n_rot} rotated dims of a head of {D}")
        table = self._rope_table(theta, n_rot, pos0 + T)
        out = self._new(x.shape)
        pipe, c = self._pipe("rope")
        n = T * H * (n_rot // 2 + D - n_rot)
        if n:
            self.stream.dispatch(
                pipe,
                (x.buf, table.buf, out.buf, self.stream.dyn_buf),
                (out.buf,),
                (T, H, D, x.offset, out.offset, self.stream.dyn(pos0), int(bool(neox)), n_rot),
                _fold(-(-n // int(c.wg_size))),
            )
        return out

    # --- hybrid ops (engine/hybrid.py) -------------------------------------------------
    def rope_partial(self, x: VkTensor, pos0: int, theta: float, n_rot: int) -> VkTensor:
        return self.rope(x, pos0, theta, True, n_rot)

    def sigmoid_mul(self, gate: VkTensor, x: VkTensor) -> VkTensor:
        gate, x = self._as_tensor(gate), self._as_tensor(x)
        if gate.shape == x.shape:
            return self._eltwise("sigmoid_mul", gate, x, 0)
        if gate.size * x.shape[-1] == x.size:  # one gate per row
            return self._eltwise("sigmoid_mul", gate, x, x.shape[-1], x.shape)
        raise ValueError(f"sigmoid_mul: gate {gate.shape} against {x.shape}")

    def router_topk(self, logits: VkTensor, k: int) -> tuple[VkTensor, VkTensor]:
        logits = self._as_tensor(logits)
        T, E = logits.shape
        if E > 1024 or not 0 < k <= min(E, 32):
            raise ValueError(f"router_topk: {E} experts (<= 1024), k {k} (<= 32)")
        ids, w = self._new((T, k), np.int32), self._new((T, k))
        pipe, _ = self._pipe("router_topk")
        self.stream.dispatch(
            pipe,
            (logits.buf, ids.buf, w.buf),
            (ids.buf, w.buf),
            (T, E, k, logits.offset, ids.offset, w.offset),
            _fold(T),
        )
        return ids, w

    def _moe_matvec(self, w: VkWeight, x: VkTensor, ids: VkTensor, x_div: int) -> VkTensor:
        """y[p, n] = expert ids[p] of w, row n, . x[p / x_div] -> [pairs, N]."""
        E, N, Kw = w.shape
        if len(w.parts) != 1 or x.shape[-1] != Kw:
            raise ValueError(f"moe: {w.name} {w.shape} (one buffer) against x {x.shape}")
        pairs = ids.size
        out = self._new((pairs, N))
        pipe, c = self._pipe("moe_experts", w.qtype)
        blocks = -(-N // int(c.rows_per_wg))
        self.stream.dispatch(
            pipe,
            (w.parts[0][0].buf, x.buf, ids.buf, out.buf),
            (out.buf,),
            (Kw, N, w.row_bytes, x.offset, out.offset, ids.offset, blocks, x_div),
            _fold(pairs * blocks),
        )
        return out

    def _moe_route(self, ids: VkTensor, E: int, qtype: str) -> tuple[VkTensor, int]:
        """moe_grouped.comp PASS_SORT: the (token, slot) pairs sorted by expert and cut into
        tiles of tile_pairs -> (route [n_tiles, tiles, order] int32, the bound on tiles). The
        pass reads no weights; like every pass of a weighted op it is built per weight type."""
        P = ids.size
        c = self.config.knobs("moe_experts")
        if E > 1024:
            raise ValueError(f"moe_experts.grouped: {E} experts (<= 1024)")
        max_tiles = -(-P // int(c.tile_pairs)) + min(E, P)
        route = self._new((1 + 3 * max_tiles + P,), np.int32)
        pipe, _ = self._pipe("moe_experts.sort", qtype)
        self.stream.dispatch(
            pipe,
            (ids.buf, route.buf),
            (route.buf,),
            (P, E, ids.offset, route.offset, max_tiles),
            (1, 1, 1),
        )
        return route, max_tiles

    def _moe_gemm(
        self, w: VkWeight, x: VkTensor, route: tuple[VkTensor, int], pairs: int, x_div: int
    ) -> VkTensor:
        """y[p, n] = expert of pair p in w, row n, . x[p / x_div], as grouped tiles -> [P, N]."""
        E, N, Kw = w.shape
        if len(w.parts) != 1 or x.shape[-1] != Kw:
            raise ValueError(f"moe: {w.name} {w.shape} (one buffer) against x {x.shape}")
        r, max_tiles = route
        out = self._new((pairs, N))
        pipe, c = self._pipe("moe_experts.gemm", w.qtype)
        self.stream.dispatch(
            pipe,
            (w.parts[0][0].buf, x.buf, r.buf, out.buf),
            (out.buf,),
            (Kw, N, w.row_bytes, x.offset, out.offset, r.offset, max_tiles, x_div),
            (-(-N // int(c.wg_size)), max_tiles, 1),
        )
        return out

    def moe_experts(
        self,
        x: VkTensor,
        ids: VkTensor,
        weights: VkTensor,
        gate: VkWeight,
        up: VkWeight,
        down: VkWeight,
    ) -> VkTensor:
        x = self._as_tensor(x)
        T, C = x.shape
        k = ids.shape[-1]
        if self.config.knobs("moe_experts").variant == "grouped" and T > 1:
            route = self._moe_route(ids, gate.shape[0], gate.qtype)
            h = self.swiglu(
                self._moe_gemm(gate, x, route, ids.size, k),
                self._moe_gemm(up, x, route, ids.size, k),
            )
            d = self._moe_gemm(down, h, route, ids.size, 1)  # [T * k, C]
        else:
            h = self.swiglu(self._moe_matvec(gate, x, ids, k), self._moe_matvec(up, x, ids, k))
            d = self._moe_matvec(down, h, ids, 1)  # [T * k, C]
        out = self._new((T, C))
        pipe, c = self._pipe("moe_experts.merge", down.qtype)
        self.stream.dispatch(
            pipe,
            (d.buf, weights.buf, out.buf),
            (out.buf,),
            (T, C, k, d.offset, weights.offset, out.offset),
            _fold(-(-T * C // int(c.wg_size))),
        )
        return out

    def cols(self, x: VkTensor, start: int, stop: int) -> VkTensor:
        x = self._as_tensor(x)
        width = x.shape[-1]
        if not 0 <= start < stop <= width:
            raise ValueError(f"cols: {start}..{stop} of rows of {width}")
        n, rows = stop - start, x.size // width
        out = self._new((*x.shape[:-1], n))
        pipe, c = self._pipe("cols")
        self.stream.dispatch(
            pipe,
            (x.buf, out.buf),
            (out.buf,),
            (rows, width, start, n, x.offset, out.offset),
            _fold(-(-rows * n // int(c.wg_size))),
        )
        return out

    def ssm_conv(self, x: VkTensor, state: VkTensor, w: VkWeight) -> VkTensor:
        x = self._as_tensor(x)
        T, Cc = x.shape
        Cw, K = w.shape
        if w.qtype != "F32" or len(w.parts) != 1 or Cw != Cc or K > 8:
            raise ValueError(f"ssm_conv: {w.name} must be one F32 [{Cc}, K <= 8], got {w.shape}")
        if state.size != (K - 1) * Cc:
            raise ValueError(f"ssm_conv: a state of {state.size} values for [{K - 1}, {Cc}]")
        out = self._new((T, Cc))
        pipe, c = self._pipe("ssm_conv")
        wbuf = w.parts[0][0].buf
        self.stream.dispatch(
            pipe,
            (x.buf, wbuf, state.buf, out.buf),
            (state.buf, out.buf),
            (T, Cc, K, x.offset, 0, state.offset, out.offset),
            _fold(-(-Cc // int(c.wg_size))),
        )
        return out

    def ssm_gates(
        self, a: VkTensor, b: VkTensor, dt_bias: VkWeight, ssm_a: VkWeight
    ) -> tuple[VkTensor, VkTensor]:
        a, b = self._as_tensor(a), self._as_tensor(b)
        Hv = a.shape[-1]
        if b.shape != a.shape or dt_bias.f32.size != Hv or ssm_a.f32.size != Hv:
            raise ValueError(f"ssm_gates: a {a.shape}, b {b.shape} against {Hv} heads")
        g, beta = self._new(a.shape), self._new(a.shape)
        pipe, c = self._pipe("ssm_gates")
        dt, sa = dt_bias.f32, ssm_a.f32
        self.stream.dispatch(
            pipe,
            (a.buf, b.buf, dt.buf, sa.buf, g.buf, beta.buf),
            (g.buf, beta.buf),
            (a.size, Hv, a.offset, b.offset, dt.offset, sa.offset, g.offset, beta.offset),
            _fold(-(-a.size // int(c.wg_size))),
        )
        return g, beta

    def kv_write(self, cache: KVCache, layer: int, k: VkTensor, v: VkTensor, pos0: int) -> None:
        k, v = self._as_tensor(k), self._as_tensor(v)
        T = k.shape[0]
        if pos0 + T > cache.capacity:
            raise ValueError(
                f"KV cache full: writing positions {pos0}..{pos0 + T - 1} "
                f"into a cache of {cache.capacity}"
            )
        ck, cv = cache.k[layer], cache.v[layer]
        row = math.prod(ck.shape[1:])
        if k.size != T * row or v.size != k.size:
            raise ValueError(f"kv_write: k {k.shape} / v {v.shape} against cache {ck.shape}")
        pipe, c = self._pipe("kv_write")
        n = k.size
        if n:
            self.stream.dispatch(
                pipe,
                (k.buf, v.buf, ck.buf, cv.buf, self.stream.dyn_buf),
                (ck.buf, cv.buf),
                (n, row, k.offset, v.offset, ck.offset, cv.offset, self.stream.dyn(pos0)),
                _fold(-(-n // int(c.wg_size))),
            )

    def attention(self, q: VkTensor, cache: KVCache, layer: int, pos0: int) -> VkTensor:
        q = self._as_tensor(q)
        T, H, D = q.shape
        ck, cv = cache.k[layer], cache.v[layer]
        Hkv = ck.shape[1]
        pipe, c = self._pipe("attention")
        wg = int(c.wg_size)
        if D > 256 or D > 8 * wg:
            raise UnsupportedError(
                f"vulkan attention: head dim {D} needs D <= 256 and D <= 8 * wg_size ({wg})"
            )
        if H % Hkv:
            raise ValueError(f"attention: {H} query heads over {Hkv} kv heads")
        if pos0 + T > cache.capacity:
            raise ValueError(f"attention: positions up to {pos0 + T - 1} beyond the cache")
        out = self._new((T, H, D))
        if not T:
            return out
        bufs = (q.buf, ck.buf, cv.buf)
        offs = (H, Hkv, D, q.offset, ck.offset, cv.offset)
        scale = 1.0 / math.sqrt(D)
        if c.variant in ("coopmat", "flash") and T > 1 and D % 16 == 0 and D <= 128:
            flash, _ = self._pipe("attention.flash")  # tensor cores; decode takes split below
            bq = 64 if c.variant == "flash" else 16  # queries per workgroup
            chunk = int(c.key_chunk) if c.variant == "flash" else 0
            ns = min(KEY_SPLITS, -(-T // chunk)) if chunk else 1
            if ns > 1:  # from T, not pos0: the shader sizes the ranges (replays stay valid)
                return self._flash_split(q, bufs, offs, out, (T, H, D, ns, scale), pos0)
            self.stream.dispatch(
                flash,
                (*bufs, out.buf, self.stream.dyn_buf),
                (out.buf,),
                (*offs, out.offset, self.stream.dyn(pos0), T, scale),
                (H, -(-T // bq), 1),
            )
            return out
        if c.variant == "online":
            self.stream.dispatch(
                pipe,
                (*bufs, out.buf, self.stream.dyn_buf),
                (out.buf,),
                (*offs, out.offset, self.stream.dyn(pos0), scale),
                (H, T, 1),
            )
            return out
        # split: the number of key ranges is fixed per dispatch (never derived from pos0), so a
        # replayed decode graph stays valid; the shader sizes the ranges from the position.
        ns = int(c.splits if T == 1 else c.splits_prefill)
        if T > MAX_GROUPS:
            raise UnsupportedError(f"vulkan attention: {T} tokens in one call (max {MAX_GROUPS})")
        dst = out if ns == 1 else self._new((T, H, ns, D + 2))  # partials: m, s, acc[D]
        q8_out = T == 1 and D % 32 == 0 and self._int8_row(H * D)
        if ns > 1 and int(c.fuse_combine):
            return self._attention_fused(q, cache, layer, pos0, out, dst, ns, q8_out)
        self.stream.dispatch(
            pipe,
            (*bufs, dst.buf, self.stream.dyn_buf),
            (dst.buf,),
            (*offs, dst.offset, self.stream.dyn(pos0), ns, scale),
            (H, ns, T),
        )
        if ns > 1 and q8_out:
            # the merge stores out's Q8_1 form too: the o projection reads it
            q8 = self._new((self._q8_words(H * D),), np.int32)
            merge, _ = self._pipe("attention.merge_q8")
            self.stream.dispatch(
                merge,
                (dst.buf, out.buf, q8.buf),
                (out.buf, q8.buf),
                (H, D, ns, dst.offset, out.offset, q8.offset),
                (H, T, 1),
            )
            self._q8_remember(out, q8)
        elif ns > 1:
            merge, _ = self._pipe("attention.merge")
            self.stream.dispatch(
                merge, (dst.buf, out.buf), (out.buf,), (H, D, ns, dst.offset, out.offset), (H, T, 1)
            )
        return out

    def _flash_split(
        self, q: VkTensor, bufs: tuple, offs: tuple, out: VkTensor, dims: tuple, pos0: int
    ) -> VkTensor:
        """attention.key_chunk: the flash pass over ns key ranges into the split kernel's
        partials [T, H, ns, D + 2], then its merge into out. dims: T, H, D, ns, scale."""
        T, H, D, ns, scale = dims
        if T > MAX_GROUPS:
            raise UnsupportedError(f"vulkan attention: {T} tokens in one call (max {MAX_GROUPS})")
        part = self._new((T, H, ns, D + 2))
        split, _ = self._pipe("attention.flash_split")
        self.stream.dispatch(
            split,
            (*bufs, part.buf, self.stream.dyn_buf),
            (part.buf,),
            (*offs, part.offset, self.stream.dyn(pos0), T, scale, ns),
            (H, -(-T // 64), ns),
        )
        merge, _ = self._pipe("attention.merge")
        self.stream.dispatch(
            merge, (part.buf, out.buf), (out.buf,), (H, D, ns, part.offset, out.offset), (H, T, 1)
        )
        return out

    def argmax(self, logits: VkTensor) -> VkTensor:
        logits = self._as_tensor(logits)
        V = logits.shape[-1]
        rows = logits.size // V
        out = self._new((rows,), np.int32)
        pipe, c = self._pipe("argmax")
        if c.variant == "default":
            self.stream.dispatch(
                pipe,
                (logits.buf, out.buf),
                (out.buf,),
                (V, rows, logits.offset, out.offset),
                _fold(rows),
            )
            return out
        # two_stage: the grid depends on the row count and the slices parameter, never on data.
        slices = int(c.slices)
        parts = self._new((rows, slices, 2), np.int32)  # (float bits, index) per slice
        fx, fy, _ = _fold(rows)
        self.stream.dispatch(
            pipe,
            (logits.buf, parts.buf),
            (parts.buf,),
            (V, rows, logits.offset, parts.offset, slices),
            (slices, fx, fy),
        )
        merge, _ = self._pipe("argmax.merge")
        self.stream.dispatch(
            merge,
            (parts.buf, out.buf),
            (out.buf,),
            (slices, rows, parts.offset, out.offset),
            _fold(rows),
        )
        return out

    def reshape(self, x: VkTensor, shape: tuple[int, ...]) -> VkTensor:
        return x.reshape(shape)

    def rows(self, x: VkTensor, start: int, stop: int) -> VkTensor:
        return x[start:stop]

    # --- teardown -----------------------------------------------------------------------
    def close(self) -> None:
        """Free every device object (the backend cannot be used afterwards); idempotent."""
        dev, self.dev = self.dev, None
        if dev is None or dev.device is None:
            return
        try:  # nothing may be freed while a (timed-out) submission still runs
            vk.vkDeviceWaitIdle(dev.device)
        except vk.VkError:
            pass
        try:
            self.stream.destroy()
        except EngineError:
            pass
        self._rope_tables.clear()
        self.alloc.close()
        self.pipes.destroy()
        dev.destroy()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the binding may be gone
            pass


@dataclass
class _RowsAfterFlush:
    """A replayed op's output copied to host-visible staging, read after the stream flushed."""

    staging: Lease
    nbytes: int
    shape: tuple[int, ...]
    dtype: Any
    ref_host: np.ndarray

    def stats(self) -> np.ndarray:
        raw = self.staging.buf.host[: self.nbytes].copy().view(self.dtype)
        return host_row_stats(raw.reshape(self.shape), self.ref_host)
