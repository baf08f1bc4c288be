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
from engine.backends.vulkan.attention import VkAttentionOps
from engine.backends.vulkan.decode_fused import FusedDecode
from engine.backends.vulkan.delta_net import VkDeltaNetOps
from engine.backends.vulkan.device import Device, open_device
from engine.backends.vulkan.elementwise import VkElementwiseOps
from engine.backends.vulkan.fused_norm import FusedNorm
from engine.backends.vulkan.kernels import fold_groups as _fold
from engine.backends.vulkan.memory import Allocator, Buffer, Lease, driver_usage
from engine.backends.vulkan.moe import VkMoeOps
from engine.backends.vulkan.pipelines import Pipeline, Pipelines
from engine.backends.vulkan.resident import ResidentPrefill
from engine.backends.vulkan.stream import GraphKey, Stream
from engine.backends.vulkan.tensor import VkTensor, VkWeight
from engine.errors import ConfigError, EngineError, KernelCompileError, UnsupportedError
from engine.tuning.variants.vulkan import QUANT_TYPES

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.gguf_model import QTensor
    from engine.tuning import TuningConfig

log = logging.getLogger(__name__)

STAGING_CHUNK = 64 << 20


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


class VulkanBackend(  # mixins: a module per op family; theirs first, as when they were here
    VkElementwiseOps,
    VkDeltaNetOps,
    VkMoeOps,
    VkAttentionOps,
    ResidentPrefill,
    FusedNorm,
    FusedDecode,
    Backend,
):
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

    def _weight_nbytes(self, w: VkWeight) -> int:
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

    def _held_bytes(self) -> int:
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
            return self._track_weight(VkWeight(qt.name, qt.qtype, tuple(qt.shape), f32=t))
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
        return self._track_weight(w)

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
        cache.check_room(pos, 1)
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

    # --- matmul dispatch (the other ops: elementwise.py, attention.py, delta_net.py, moe.py)
    def _as_tensor(self, x: Any) -> VkTensor:
        return x if isinstance(x, VkTensor) else self.upload(np.asarray(x))

    def _matmul(self, x: VkTensor, w: VkWeight) -> VkTensor:
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

    # --- views (no dispatch) -----------------------------------------------------------
    def _reshape(self, x: VkTensor, shape: tuple[int, ...]) -> VkTensor:
        return x.reshape(shape)

    def _rows(self, x: VkTensor, start: int, stop: int) -> VkTensor:
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
