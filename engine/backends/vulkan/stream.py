"""Command recording: ops append nodes; nodes become one command buffer per submit.

No submit per op: dispatches accumulate until the host needs a result (download, synchronize),
a node budget (``submit.max_nodes``) is reached, or the dynamic-scalar table is full. At submit
time the node list is the graph of that step; with ``submit.replay`` a command buffer recorded
for an identical graph (same pipelines, buffers, push constants, grid) is submitted again
instead of being re-recorded. Values that change every step while the graph does not (positions)
live in a host-visible "dynamic scalars" buffer; nodes carry the slot index, not the value.

Barriers come from hazard tracking on buffer ids: a dispatch that reads or writes a buffer
written since the last barrier (RAW, WAW), or writes one read since then (WAR), gets a
compute/transfer memory barrier first. Independent dispatches (q, k, v projections) run without
one. Every command buffer starts with a barrier against earlier submissions and ends with one
that makes device writes visible to host reads.

One submission may stay in flight while the next is recorded: a submit forced by the node budget
or a full dynamic-scalar table (the middle of a long prefill) does not wait, so Python records
the next chunk while the device runs this one. ``kick(ahead=True)`` (submit.prefill_ahead)
queues a prefill piece behind the one in flight instead of waiting for it (no idle gap between
pieces): a one-time command buffer with its own fence, its dynamic scalars in slots after those
of the pieces still in flight (the table is reset only by a waiting submit). Everything that
touches memory the device may still use waits first: the next submit (it rewrites the dynamic
scalars and may replay the same command buffer), host reads and writes, destroying buffers or
command buffers, profile reads.
Device-side ordering between submissions is the leading barrier of every command buffer.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.vulkan._vk import ffi, vk
from engine.errors import EngineError

if TYPE_CHECKING:
    from engine.backends.vulkan.device import Device
    from engine.backends.vulkan.memory import Allocator, Buffer
    from engine.backends.vulkan.pipelines import Pipeline, Pipelines

log = logging.getLogger(__name__)

DISPATCH, FILL, COPY = 0, 1, 2
DYN_SLOTS = 4096
REPLAY_ENTRIES = 16

_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
_WRITES = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
_ACCESS = (
    vk.VK_ACCESS_SHADER_READ_BIT
    | vk.VK_ACCESS_SHADER_WRITE_BIT
    | vk.VK_ACCESS_TRANSFER_READ_BIT
    | vk.VK_ACCESS_TRANSFER_WRITE_BIT
)


@dataclass(slots=True)
class Node:
    kind: int
    key: tuple[Any, ...]
    barrier: bool
    pipeline: Pipeline | None = None
    dset: Any = None
    push: bytes = b""
    groups: tuple[int, int, int] = (1, 1, 1)
    bufs: tuple[Any, ...] = ()  # FILL: (dst,), COPY: (src, dst) as handles
    args: tuple[int, ...] = ()  # FILL: (offset, size, value), COPY: (src_off, dst_off, size)


@dataclass
class Recorded:
    cmd: Any
    query_pool: Any
    names: list[str]  # per timed dispatch


@dataclass
class InFlight:
    """A submission not yet waited for, and what must live until it completes."""

    rec: Recorded
    keep: bool  # rec is in the replay cache (else freed once complete)
    keepalive: list[Any]


class GraphKey:
    """A replay key whose hash is computed once (a decode graph submits the same key every
    step; hashing and comparing a tuple of ~500 node keys each time costs ~0.2 ms)."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self._hash = hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GraphKey) and (
            self is other or (self._hash == other._hash and self.key == other.key)
        )


def pool_and_fence(dev: Device) -> tuple[Any, Any]:
    """A command pool on dev's queue family whose buffers reset one by one, and an unsignaled
    fence for its submits; the caller destroys both."""
    pool = vk.vkCreateCommandPool(
        dev.device,
        vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            queueFamilyIndex=dev.queue_family,
        ),
        None,
    )
    return pool, vk.vkCreateFence(dev.device, vk.VkFenceCreateInfo(), None)


def begin_commands(device: Any, pool: Any, flags: int) -> Any:
    """A primary command buffer from pool, begun with flags (usage bits)."""
    cmd = vk.vkAllocateCommandBuffers(
        device,
        vk.VkCommandBufferAllocateInfo(
            commandPool=pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1
        ),
    )[0]
    vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=flags))
    return cmd


class Stream:
    def __init__(self, dev: Device, pipelines: Pipelines, alloc: Allocator) -> None:
        self.dev = dev
        self.pipes = pipelines
        self.alloc = alloc
        self.pool, self.fence = pool_and_fence(dev)
        # written by the CPU each submit, read by many dispatches: device-local where mappable
        self.dyn_lease = alloc.new(DYN_SLOTS * 4, host_visible=True, pooled=False, near=True)
        self.dyn_buf = self.dyn_lease.buf
        self.dyn_host = self.dyn_buf.host.view(np.uint32)
        self.nodes: list[Node] = []
        self.dyn_values: list[int] = []
        self.pending_r: set[int] = set()
        self.pending_w: set[int] = set()
        self.epoch = 0
        self.keepalive: list[Any] = []
        self.replay = True
        self.max_nodes = 1024
        self.cache: OrderedDict[tuple[Any, ...], Recorded] = OrderedDict()
        self.profiling = False
        self.profile: dict[str, list[float]] = {}  # name -> [calls, total ns]
        # names carry the dispatch grid ("name@gx.gy.gz"): one GEMM shape apart from another
        self.profile_grid = False
        self.timeout_s = 600.0
        self.broken: str | None = None
        self.inflight: InFlight | None = None
        # kick(ahead=True): earlier pieces still in flight (each with its fence), spare fences,
        # and the dynamic slots already written for them
        self.older: list[tuple[InFlight, Any]] = []
        self.spare_fences: list[Any] = []
        self.dyn_sent = 0
        self.dyn_pinned = 0  # slots 0 .. this read by a submission in flight from flush()
        self.nodes_key: tuple[list[Node], int, GraphKey] | None = None
        self.stats = {"submits": 0, "replays": 0, "recorded": 0, "dispatches": 0, "barriers": 0}
        # Host seconds spent recording command buffers, in vkQueueSubmit and blocked on fences:
        # what is left of the wall time is Python building the graph (and the GPU, when waits
        # are short).
        self.host_s = {"record": 0.0, "submit": 0.0, "wait": 0.0}
        alloc.on_destroy.append(self._forget)

    # --- building the graph -------------------------------------------------------------
    def dyn(self, value: int) -> int:
        """A slot of the dynamic-scalars buffer holding value at submit time. Call it right
        before the dispatch that uses the slot: a submit may only happen between the two if no
        slot is handed out yet."""
        if len(self.dyn_values) >= DYN_SLOTS:
            self.flush(wait=False)
        self.dyn_values.append(int(value))
        return len(self.dyn_values) - 1

    def _append(self, node: Node) -> None:
        self.nodes.append(node)
        # Submit after appending, never before: the node may use a dynamic slot allocated just
        # before it, which a submit would recycle.
        if len(self.nodes) >= self.max_nodes:
            self.flush(wait=False)

    def _hazard(self, reads: tuple[Buffer, ...], writes: tuple[Buffer, ...]) -> bool:
        pw, pr = self.pending_w, self.pending_r
        need = any(b.id in pw for b in reads) or any(b.id in pw or b.id in pr for b in writes)
        if need:
            pw.clear()
            pr.clear()
        for b in reads:
            pr.add(b.id)
            b.epoch = self.epoch
        for b in writes:
            pw.add(b.id)
            b.epoch = self.epoch
        return need

    def dispatch(
        self,
        pipeline: Pipeline,
        bindings: tuple[Buffer, ...],
        writes: tuple[Buffer, ...],
        push: tuple[Any, ...],
        groups: tuple[int, int, int],
    ) -> None:
        """Record a dispatch; ``bindings`` in binding order, ``writes`` the ones it writes."""
        if self.broken:
            raise EngineError(self.broken)
        wset = {b.id for b in writes}
        reads = tuple(b for b in bindings if b.id not in wset)
        barrier = self._hazard(reads, writes)
        set_key = (pipeline.n_bindings, tuple(b.id for b in bindings))
        dset = self.pipes.descriptor_set(pipeline.n_bindings, bindings)
        data = pipeline.push_struct.pack(*push)
        self._append(
            Node(
                DISPATCH,
                (pipeline.id, set_key, data, groups, barrier),
                barrier,
                pipeline,
                dset,
                data,
                groups,
            )
        )

    def fill(self, buf: Buffer, offset: int, size: int, value: int = 0) -> None:
        barrier = self._hazard((), (buf,))
        args = (offset, size, value)
        self._append(
            Node(FILL, (FILL, buf.id, args, barrier), barrier, bufs=(buf.handle,), args=args)
        )

    def copy(self, src: Buffer, src_off: int, dst: Buffer, dst_off: int, size: int) -> None:
        barrier = self._hazard((src,), (dst,))
        args = (src_off, dst_off, size)
        self._append(
            Node(
                COPY,
                (COPY, src.id, dst.id, args, barrier),
                barrier,
                bufs=(src.handle, dst.handle),
                args=args,
            )
        )

    # --- submitting ---------------------------------------------------------------------
    def _barrier(self, cmd: Any, src_stage: int, src: int, dst_stage: int, dst: int) -> None:
        mb = vk.VkMemoryBarrier(srcAccessMask=src, dstAccessMask=dst)
        vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 1, [mb], 0, None, 0, None)

    def _record(self, nodes: list[Node], keep: bool) -> Recorded:
        d = self.dev.device
        cmd = begin_commands(
            d, self.pool, 0 if keep else vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT
        )
        qp, names = None, []
        n_timed = sum(1 for n in nodes if n.kind == DISPATCH)
        if self.profiling and self.dev.timestamp_bits and n_timed:
            qp = vk.vkCreateQueryPool(
                d,
                vk.VkQueryPoolCreateInfo(
                    queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2 * n_timed
                ),
                None,
            )
            vk.vkCmdResetQueryPool(cmd, qp, 0, 2 * n_timed)
        # Order after everything submitted earlier (buffers are reused across submits).
        self._barrier(
            cmd,
            vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
            vk.VK_ACCESS_MEMORY_WRITE_BIT,
            _STAGES,
            _ACCESS,
        )
        bound = None
        lib = vk.lib
        # the hazard barrier, built once per recording (the binding's struct constructor and
        # wrapper cost ~25 us a call: most of a prefill's recording time on the H200)
        hazard = ffi.new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "srcAccessMask": _WRITES,
            "dstAccessMask": _ACCESS,
        })  # fmt: skip
        compute = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        stage_bit = vk.VK_SHADER_STAGE_COMPUTE_BIT
        bottom = vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT
        sets = ffi.new("VkDescriptorSet[1]")
        for n in nodes:
            if n.barrier:
                lib.vkCmdPipelineBarrier(
                    cmd, _STAGES, _STAGES, 0, 1, hazard, 0, ffi.NULL, 0, ffi.NULL
                )
                self.stats["barriers"] += 1
            if n.kind == DISPATCH:
                p = n.pipeline
                if bound is not p:
                    lib.vkCmdBindPipeline(cmd, compute, p.handle)
                    bound = p
                sets[0] = n.dset
                lib.vkCmdBindDescriptorSets(cmd, compute, p.layout, 0, 1, sets, 0, ffi.NULL)
                lib.vkCmdPushConstants(
                    cmd, p.layout, stage_bit, 0, len(n.push), ffi.from_buffer(n.push)
                )
                if qp is not None:
                    lib.vkCmdWriteTimestamp(cmd, bottom, qp, 2 * len(names))
                lib.vkCmdDispatch(cmd, *n.groups)
                if qp is not None:
                    lib.vkCmdWriteTimestamp(cmd, bottom, qp, 2 * len(names) + 1)
                    names.append(
                        f"{p.name}@{'.'.join(map(str, n.groups))}" if self.profile_grid else p.name
                    )
            elif n.kind == FILL:
                off, size, value = n.args
                lib.vkCmdFillBuffer(cmd, n.bufs[0], off, size, value)
            else:
                src_off, dst_off, size = n.args
                region = ffi.new(
                    "VkBufferCopy*", {"srcOffset": src_off, "dstOffset": dst_off, "size": size}
                )
                lib.vkCmdCopyBuffer(cmd, n.bufs[0], n.bufs[1], 1, region)
        self._barrier(
            cmd,
            _STAGES,
            _WRITES,
            vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
            vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT,
        )
        vk.vkEndCommandBuffer(cmd)
        self.stats["recorded"] += 1
        return Recorded(cmd, qp, names)

    def _free(self, rec: Recorded) -> None:
        vk.vkFreeCommandBuffers(self.dev.device, self.pool, 1, [rec.cmd])
        if rec.query_pool is not None:
            vk.vkDestroyQueryPool(self.dev.device, rec.query_pool, None)

    def flush(self, wait: bool = True) -> None:
        """Submit everything recorded; wait for it unless ``wait=False`` (then it stays in
        flight until the next submit or host access)."""
        if self.broken:
            raise EngineError(self.broken)
        nodes, self.nodes = self.nodes, []
        key = None
        if not nodes:
            # slots a submission in flight may still read stay out of the next piece's way
            pinned = len(self.dyn_values) if self.inflight is not None else 0
            self._reset()
            self.dyn_pinned = max(self.dyn_pinned, pinned)
            if wait:
                self.wait()
            return
        # Recorded first, while the previous submission may still run (the host's recording
        # overlaps the device's work: a prefill submitted in pieces, submit.prefill_kick). The
        # previous submission reads the dynamic scalars and may be the command buffer about to
        # be replayed: it must be complete before either is touched, and before a cached
        # command buffer is freed.
        rec, keep = None, self.replay
        if keep:
            nk = self.nodes_key
            if nk is not None and nk[0] is nodes and nk[1] == len(nodes):
                key = nk[2]
            elif nk is not None and nk[0] is nodes and nk[1] < len(nodes):
                # a replayed graph and a few nodes after it (a discrete GPU's download copy of
                # the token): key on the graph's hashed key and the extra nodes, not on a tuple
                # of every node hashed and compared again (~0.5 ms a decode token)
                tail = tuple(n.key for n in nodes[nk[1] :])
                key = GraphKey((self.profiling, nk[2], tail))
            if key is None or key.key[0] != self.profiling:
                key = GraphKey((self.profiling, tuple(n.key for n in nodes)))
            rec = self.cache.get(key)
            if rec is not None:
                self.cache.move_to_end(key)
                self.stats["replays"] += 1
        if rec is None:
            t0 = time.perf_counter()
            rec = self._record(nodes, keep)
            self.host_s["record"] += time.perf_counter() - t0
            if keep:
                self.cache[key] = rec
        try:
            self.wait()
        except EngineError:
            if not keep:
                self._free(rec)
            raise
        if keep:
            while len(self.cache) > REPLAY_ENTRIES:  # none in flight now
                self._free(self.cache.popitem(last=False)[1])
        self.dyn_host[: len(self.dyn_values)] = np.asarray(self.dyn_values, dtype=np.uint32)
        self.stats["submits"] += 1
        self.stats["dispatches"] += sum(1 for n in nodes if n.kind == DISPATCH)
        flight = InFlight(rec, keep, self.keepalive)
        pinned = len(self.dyn_values)
        self._reset()
        try:
            self._submit(rec.cmd)
        except EngineError:
            if not keep:
                self._free(rec)
            raise
        self.inflight = flight
        self.dyn_pinned = pinned  # its slots, from 0: a piece queued ahead waits for it first
        if wait:
            self.wait()

    def kick(self, min_nodes: int, ahead: bool = False) -> bool:
        """Submit the recorded nodes without waiting for them once there are at least min_nodes
        (True when it submitted): their command buffer is recorded while the previous piece
        runs, then submitted as soon as that one is done (flush), so the device works while
        the host builds and records the rest. ahead: submitted at once, queued behind the
        pieces in flight (_submit_ahead)."""
        if len(self.nodes) < min_nodes or self.broken:
            return False
        if ahead and self.nodes_key is None:
            self._submit_ahead()
        else:
            self.flush(wait=False)
        return True

    def _submit_ahead(self) -> None:
        """The recorded nodes as a one-time command buffer (never replayed: it may still be
        pending when an equal graph comes), submitted behind the submissions in flight with a
        fence of its own; only its own dynamic slots are written (the others are being read)."""
        nodes, self.nodes = self.nodes, []
        t0 = time.perf_counter()
        rec = self._record(nodes, False)
        self.host_s["record"] += time.perf_counter() - t0
        if self.dyn_pinned:  # a flush()'s submission reads slots this piece reuses: wait once
            self.wait()
        n = len(self.dyn_values)
        self.dyn_host[self.dyn_sent : n] = np.asarray(self.dyn_values[self.dyn_sent :], np.uint32)
        self.stats["submits"] += 1
        self.stats["dispatches"] += sum(1 for x in nodes if x.kind == DISPATCH)
        if self.inflight is not None:  # it keeps its fence; this piece takes another
            self.older.append((self.inflight, self.fence))
            self.inflight = None
            self.fence = (
                self.spare_fences.pop()
                if self.spare_fences
                else vk.vkCreateFence(self.dev.device, vk.VkFenceCreateInfo(), None)
            )
        flight = InFlight(rec, False, self.keepalive)
        values = self.dyn_values
        self._reset()
        self.dyn_values, self.dyn_sent = values, n  # later pieces take the slots after these
        try:
            self._submit(rec.cmd)
        except EngineError:
            self._free(rec)
            raise
        self.inflight = flight

    def idle(self) -> bool:
        """Whether no submission is in flight or its fence has signalled (never blocks)."""
        # the raw call: the binding's wrapper returns None on success and raises VkNotReady
        # the last submission's fence: earlier ones complete before it (each command buffer's
        # leading barrier orders it after everything submitted earlier)
        return self.inflight is None or vk.lib.vkGetFenceStatus(self.dev.device, self.fence) == 0

    def graph_key(self) -> GraphKey:
        """The replay key of the nodes recorded so far, for a caller that records the same list
        again (a decode graph): hand it back with ``use_key``."""
        return GraphKey((self.profiling, tuple(n.key for n in self.nodes)))

    def use_key(self, key: GraphKey) -> None:
        """The next submit's nodes are those recorded now, whose replay key is ``key``; nodes
        recorded after this call make the submit compute its key again."""
        self.nodes_key = (self.nodes, len(self.nodes), key)

    def wait(self) -> None:
        """Wait for the submission in flight, if any (host reads and writes come after this)."""
        while self.older:  # kick(ahead=True)'s earlier pieces, in submission order
            f, fence = self.older.pop(0)
            try:
                self._wait_fence(fence)
                if f.rec.query_pool is not None:
                    self._read_profile(f.rec)
            finally:
                self._free(f.rec)
                self.spare_fences.append(fence)
        self.dyn_pinned = 0  # nothing in flight reads the table after this wait
        f = self.inflight
        if f is None:
            return
        self.inflight = None
        try:
            self._wait_fence()
            if f.rec.query_pool is not None:
                self._read_profile(f.rec)
        finally:
            if not f.keep:
                self._free(f.rec)

    def busy(self, buf: Buffer) -> bool:
        """Whether recorded or in-flight work may still use buf (host access must flush first).
        Any submission in flight counts: replayed decode-graph nodes do not mark their buffers."""
        return self.inflight is not None or (buf.epoch == self.epoch and bool(self.nodes))

    def _submit(self, cmd: Any) -> None:
        d = self.dev.device
        t0 = time.perf_counter()
        try:
            vk.vkResetFences(d, 1, [self.fence])
            vk.vkQueueSubmit(
                self.dev.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[cmd])], self.fence
            )
            self.host_s["submit"] += time.perf_counter() - t0
        except vk.VkError as e:
            self.broken = (
                f"vulkan: {self.dev.info.name}: {type(e).__name__} while submitting kernels "
                "(device lost?); this backend cannot be used further"
            )
            raise EngineError(self.broken) from None

    def _wait_fence(self, fence: Any = None) -> None:
        d = self.dev.device
        t0 = time.perf_counter()
        try:
            vk.vkWaitForFences(d, 1, [fence or self.fence], vk.VK_TRUE, int(self.timeout_s * 1e9))
            self.host_s["wait"] += time.perf_counter() - t0
        except vk.VkTimeout:
            self.broken = (
                f"vulkan: {self.dev.info.name} did not finish a submission within "
                f"{self.timeout_s:.0f} s (hung kernel?); this backend cannot be used further"
            )
            raise EngineError(self.broken) from None
        except vk.VkError as e:
            self.broken = (
                f"vulkan: {self.dev.info.name}: {type(e).__name__} while running kernels "
                "(device lost?); this backend cannot be used further"
            )
            raise EngineError(self.broken) from None

    def _read_profile(self, rec: Recorded) -> None:
        n = 2 * len(rec.names)
        data = ffi.new(f"uint64_t[{n}]")
        vk.vkGetQueryPoolResults(
            self.dev.device,
            rec.query_pool,
            0,
            n,
            8 * n,
            data,
            8,
            vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
        )
        mask = (1 << self.dev.timestamp_bits) - 1 if self.dev.timestamp_bits < 64 else ~0
        period = self.dev.timestamp_period
        for i, name in enumerate(rec.names):
            ticks = (data[2 * i + 1] - data[2 * i]) & mask
            entry = self.profile.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += ticks * period

    def _reset(self) -> None:
        self.nodes_key = None
        self.dyn_values = []
        self.dyn_sent = 0
        self.pending_r.clear()
        self.pending_w.clear()
        self.keepalive = []
        self.epoch += 1

    def _forget(self, buf: Buffer) -> None:
        # A buffer about to be destroyed may be named by pending nodes (run them first) and by
        # recorded command buffers (drop them all: this only happens when weights or tables are
        # freed, never in the decode loop).
        if self.nodes and buf.epoch == self.epoch and not self.broken:
            self.flush()
        self._wait_quietly()
        self.pipes.forget_buffer(buf.id)
        if self.cache:
            for rec in self.cache.values():
                self._free(rec)
            self.cache.clear()

    def _wait_quietly(self) -> None:
        try:
            self.wait()
        except EngineError:
            pass  # broken: close() waits for the device to idle before freeing anything

    def clear_replay(self) -> None:
        self._wait_quietly()
        for rec in self.cache.values():
            self._free(rec)
        self.cache.clear()

    def destroy(self) -> None:
        d = self.dev.device
        if self.nodes and not self.broken:
            try:
                self.flush()
            except EngineError:
                pass
        self.clear_replay()
        for fence in (self.fence, *self.spare_fences, *(f for _, f in self.older)):
            vk.vkDestroyFence(d, fence, None)
        vk.vkDestroyCommandPool(d, self.pool, None)
