"""Why is Vulkan slow on this GPU? Microbenchmarks that separate the causes, most telling first
(a section that would pass --budget seconds is skipped and said so):

  info     device, driver, cooperative-matrix shapes, memory types, timestamp period
  clocks   nvidia-smi's SM / memory clocks, P-state, power (idle, under load, after)
  bar      copy and GEMM on device-only vs BAR memory, fresh and after the CPU touched it
  timing   empty-submit round trip; one small dispatch by host wall vs GPU timestamps; 100
           dispatches in one command buffer with and without barriers (per-dispatch cost);
           pipeline creation time; first vs second run of a new pipeline
  mma      pure cooperative-matrix multiply-add throughput, operands in registers
           (shaders/vulkan/probe_mma.comp): 16x16x16 fp32/fp16 accumulators x 1..16
           accumulators per subgroup, 1..8 subgroups per workgroup, compile-time vs
           specialization-constant accumulator count; then the other enumerated shapes
  sustain  the same kernel for ~1 s in 50 ms submits: TFLOP/s per submit (clock ramp) and
           nvidia-smi sampled meanwhile
  lds      multiply-adds fed from shared memory every step, per shared element type
  gemm     the resident fp16 GEMM (shaders/vulkan/matmul_f16.comp) on a 7B shape, tiles as
           specialization constants vs compile-time constants; NMSE against NumPy
  copy     16-byte copy and read-only streams over 1 GiB, per device-local memory type

usage: python tools/vulkan_probe.py [--only SECTION ...] [--budget S] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backends.vulkan import probe as P  # noqa: E402
from engine.backends.vulkan._vk import vk  # noqa: E402
from engine.backends.vulkan.device import open_device  # noqa: E402

SECTIONS = ("info", "clocks", "bar", "gemm", "copy", "timing", "sustain", "lds", "mma", "shapes")
SMI = "clocks.sm,clocks.mem,clocks.max.sm,pstate,power.draw,utilization.gpu,temperature.gpu"


def smi() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi not found"
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={SMI}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    return out.stdout.strip().replace("\n", " | ")


class Runner:
    def __init__(self, budget: float) -> None:
        self.t0 = time.perf_counter()
        self.budget = budget
        os.environ["FLEETTUNE_VK_STATS"] = "1"  # registers / spills per pipeline, if offered
        try:
            self.dev = open_device(None)
        except Exception:  # noqa: BLE001 - the statistics extension must not cost the run
            os.environ.pop("FLEETTUNE_VK_STATS")
            self.dev = open_device(None)
        self.pr = P.Probe(self.dev)
        self.rows: list[dict[str, Any]] = []
        self.sg = int(self.dev.info.subgroup_size)
        self.shapes = set(self.dev.info.extra.get("coopmat_shapes", []))
        self.coopmat = bool(self.dev.info.extra.get("cooperative_matrix"))
        self.ops = self.pr.buffer(4096)
        self.pr.upload(
            self.ops, (np.random.default_rng(0).standard_normal(2048) * 0.01).astype(np.float16)
        )
        self.out = self.pr.buffer(64 << 20)
        self.mma_cache: dict[tuple, tuple] = {}

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def emit(self, section: str, **kv: Any) -> None:
        row = {"section": section, **kv}
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    # --- sections -------------------------------------------------------------------------
    def info(self) -> None:
        i = self.dev.info
        self.emit(
            "info",
            name=i.name,
            driver=i.driver,
            subgroup=i.subgroup_size,
            sg_range=[i.extra.get("min_subgroup_size"), i.extra.get("max_subgroup_size")],
            coopmat=self.coopmat,
            shapes_enumerated=self.pr.coopmat_order(),
            max_shared=i.extra.get("max_shared_memory"),
            ts_period_ns=self.dev.timestamp_period,
            ts_bits=self.dev.timestamp_bits,
            mem_types=[(t, hex(f), h >> 20) for t, f, h in self.pr.memory_types()],
            engine_mem={
                "device": self.dev.mem.device,
                "host": self.dev.mem.host,
                "unified": self.dev.mem.unified,
            },
        )

    def clocks(self, when: str = "idle") -> None:
        self.emit("clocks", when=when, smi=smi())

    def mma_run(
        self,
        m: int,
        n: int,
        k: int,
        f16: bool,
        nacc: int | None,
        lds: int = 0,
        wg: int = 256,
        spec_nacc: int = 4,
        target_ms: float = 8.0,
        groups: int = 0,
    ) -> dict[str, Any]:
        # the pipeline of a shape is built once (kept in mma_cache)
        key = (m, n, k, f16, nacc, lds, wg, spec_nacc)
        if key not in self.mma_cache:
            defs = P.mma_defines(m, n, k, f16, nacc, lds)
            spec = {0: wg} | ({} if nacc else {1: spec_nacc})
            p, layout, dsl, dt = self.pr.pipeline("probe_mma", defs, 2, 4, spec)
            stats = self.pr.statistics(p)
            if stats and lds:
                self.emit("lds", nacc=nacc, f16=f16, elem=lds, statistics=stats)
            ds = self.pr.dset(dsl, [self.ops, self.out])
            self.mma_cache[key] = (p, layout, ds, dt)
        p, layout, ds, dt = self.mma_cache[key]
        na = nacc or spec_nacc
        groups = groups or 132 * 2048 // wg  # ~16 resident 256-thread groups per SM, 132 SMs
        subgroups = groups * (wg // self.sg)
        iters = 64
        first = None
        for _ in range(6):  # calibrate the iteration count to ~target_ms
            t = self.pr.run([("dispatch", p, layout, ds, struct.pack("<I", iters), (groups, 1, 1))])
            first = first or t.gpu_ms
            if t.gpu_ms >= 0.5 * target_ms or iters >= 1 << 20:
                break
            iters = min(1 << 20, int(iters * max(2.0, target_ms / max(t.gpu_ms, 1e-3))))
        runs = [
            self.pr.run([("dispatch", p, layout, ds, struct.pack("<I", iters), (groups, 1, 1))])
            for _ in range(3)
        ]
        flop = 2.0 * m * n * k * na * iters * subgroups
        best = min(r.gpu_ms for r in runs)
        return {
            "shape": f"{m}x{n}x{k}",
            "acc": "f16" if f16 else "f32",
            "nacc": na,
            "nacc_from": "define" if nacc else "spec",
            "lds": lds,
            "wg": wg,
            "groups": groups,
            "iters": iters,
            "tflops": round(flop / best / 1e9, 1),
            "gpu_ms": [round(r.gpu_ms, 3) for r in runs],
            "host_ms": [round(r.host_ms, 3) for r in runs],
            "create_s": round(dt, 3),
            "first_gpu_ms": round(first or 0.0, 3),
        }

    def timing(self) -> None:
        pr = self.pr
        empty = [pr.run([]).host_ms for _ in range(20)]
        self.emit(
            "timing",
            what="empty submit+fence round trip ms (median, min)",
            value=[round(statistics.median(empty), 4), round(min(empty), 4)],
        )
        src, dst = pr.buffer(4 << 20), pr.buffer(4 << 20)
        p, layout, dsl, dt = pr.pipeline("probe_copy", (), 2, 8, {0: 256})
        ds = pr.dset(dsl, [src, dst])
        push = struct.pack("<II", (4 << 20) // 16, 0xFFFFFFFF)
        item = ("dispatch", p, layout, ds, push, (256, 1, 1))
        first = pr.run([item])
        rs = [pr.run([item]) for _ in range(20)]
        self.emit(
            "timing",
            what="read 4 MiB, one dispatch per submit",
            create_s=round(dt, 3),
            first={"gpu": round(first.gpu_ms, 4), "host": round(first.host_ms, 4)},
            gpu_ms_median=round(statistics.median(r.gpu_ms for r in rs), 4),
            per_dispatch_stamp_median=round(statistics.median(r.per_dispatch_ms[0] for r in rs), 4),
            host_ms_median=round(statistics.median(r.host_ms for r in rs), 4),
        )
        for barriers in (False, True):
            t = pr.run([item] * 100, barriers=barriers)
            self.emit(
                "timing",
                what=f"100 x read 4 MiB in one command buffer, barriers={barriers}",
                gpu_ms=round(t.gpu_ms, 3),
                per_dispatch_us=round(10 * t.gpu_ms, 2),
                sum_of_stamps_ms=round(sum(t.per_dispatch_ms), 3),
                host_ms=round(t.host_ms, 3),
            )
            if barriers:
                t = pr.run([item] * 100, compute_only=True)
                self.emit(
                    "timing",
                    what="... barriers with compute stages only (no transfer)",
                    gpu_ms=round(t.gpu_ms, 3),
                    per_dispatch_us=round(10 * t.gpu_ms, 2),
                )
            t = pr.run([item] * 100, barriers=barriers, timestamps=False)
            self.emit(
                "timing",
                what=f"... same without timestamps, barriers={barriers}",
                host_ms=round(t.host_ms, 3),
            )
        if self.coopmat:
            # a fresh pipeline: its first dispatch against later ones, by GPU time
            r = self.mma_run(16, 16, 16, False, 4, wg=128, target_ms=4.0)
            self.emit(
                "timing",
                what="new MMA pipeline: create, first (calibration) vs later",
                create_s=r["create_s"],
                first_gpu_ms=r["first_gpu_ms"],
                gpu_ms=r["gpu_ms"],
                host_ms=r["host_ms"],
                iters=r["iters"],
            )

    def mma(self) -> None:
        if not self._coopmat_ok("16x16x16:f16*f16+f32=f32"):
            return
        for f16 in (False, True):
            if f16 and not self._coopmat_ok("16x16x16:f16*f16+f16=f16"):
                continue
            for nacc in P.MMA_NACC:
                if self.left() < 0:
                    return self.emit("mma", skipped="budget")
                self.emit("mma", **self.mma_run(16, 16, 16, f16, nacc))
        for wg in (32, 64, 128):
            self.emit("mma", **self.mma_run(16, 16, 16, False, 8, wg=wg))
        for na in (4, 8):
            self.emit("mma", **self.mma_run(16, 16, 16, False, None, spec_nacc=na))
        # few workgroups: is one SM's rate sane? (132 groups of 256 = one per SM)
        self.emit("mma", **self.mma_run(16, 16, 16, False, 8, groups=132))

    def shapes_sec(self) -> None:
        for m, n, k in P.MMA_SHAPES[1:]:
            for f16 in (False, True):
                acc = "f16" if f16 else "f32"
                if not self._coopmat_ok(f"{m}x{n}x{k}:f16*f16+{acc}={acc}", quiet=True):
                    continue
                for nacc in (4, 8, 16):
                    if self.left() < 0:
                        return self.emit("shapes", skipped="budget")
                    self.emit("shapes", **self.mma_run(m, n, k, f16, nacc))

    def _coopmat_ok(self, shape: str, quiet: bool = False) -> bool:
        if not self.coopmat or shape not in self.shapes:
            if not quiet:
                self.emit("mma", skipped=f"no {shape} (coopmat={self.coopmat})")
            return False
        return True

    def sustain(self) -> None:
        if not self._coopmat_ok("16x16x16:f16*f16+f32=f32"):
            return
        r = self.mma_run(16, 16, 16, False, 8, target_ms=50.0)
        p, layout, ds, _ = self._mma(16, 16, 16, False, 8)
        samples: list[str] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(f"{time.perf_counter() - t0:.2f}s {smi()}")
                stop.wait(0.15)

        flop = r["tflops"] * 1e9 * min(r["gpu_ms"])  # FLOP per run
        t0 = time.perf_counter()
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        series = []
        item = ("dispatch", p, layout, ds, struct.pack("<I", r["iters"]), (r["groups"], 1, 1))
        while time.perf_counter() - t0 < 1.2:
            series.append(round(flop / self.pr.run([item]).gpu_ms / 1e9, 1))
        stop.set()
        th.join()
        self.emit("sustain", tflops_per_submit=series, smi=samples)
        self.clocks("just after ~1.2 s of MMA")

    def lds(self) -> None:
        if not self._coopmat_ok("16x16x16:f16*f16+f32=f32"):
            return
        for f16 in (False, True):
            for e in P.LDS_ELEMS:
                if self.left() < 0:
                    return self.emit("lds", skipped="budget")
                self.emit("lds", **self.mma_run(16, 16, 16, f16, 8, lds=e))

    def _best_ms(self, item: tuple) -> float:
        return round(min(self.pr.run([item]).gpu_ms for _ in range(3)), 3)

    def bar(self) -> None:
        """Does the CPU touching a BAR-mapped (device-local, host-visible) buffer slow the GPU's
        later access to it? Copy bandwidth and the default GEMM on the engine's device type
        against the BAR type, fresh and after the CPU read / wrote it through the mapping."""
        pr = self.pr
        near = self.dev.mem.near
        dev_t = self.dev.mem.device
        size = 64 << 20
        p, layout, dsl, _ = pr.pipeline("probe_copy", ("COPY",), 2, 8, {0: 256})
        push = struct.pack("<II", size // 16, 0xFFFFFFFF)

        def copy_gbs(src: P.Buf, dst: P.Buf) -> float:
            ds = pr.dset(dsl, [src, dst])
            item = ("dispatch", p, layout, ds, push, (132 * 32, 1, 1))
            pr.run([item] * 2)
            t = min(pr.run([item] * 10).gpu_ms for _ in range(2))
            return round(10 * 2 * size / t / 1e6, 1)

        for t in dict.fromkeys(x for x in (dev_t, near) if x is not None):
            src, dst = pr.buffer(size, t), pr.buffer(size, t)
            pr.upload(src, np.ones(size // 4, np.float32))
            row = {
                "mem_type": t,
                "engine_device_type": t == dev_t,
                "fresh_gb_s": copy_gbs(src, dst),
            }
            if dst.host is not None:
                t0 = time.perf_counter()
                pr.download(dst, size, via_map=True)
                row["cpu_read_dst_s"] = round(time.perf_counter() - t0, 3)
                row["after_cpu_read_dst_gb_s"] = copy_gbs(src, dst)
                pr.upload(src, np.ones(size // 4, np.float32), via_map=True)
                row["after_cpu_write_src_gb_s"] = copy_gbs(src, dst)
                row["swapped_gb_s"] = copy_gbs(dst, src)  # read the read-back buffer
            self.emit("bar", **row)
            pr.free(src)
            pr.free(dst)
        if not self._coopmat_ok("16x16x16:f16*f16+f32=f32"):
            return
        rng = np.random.default_rng(2)
        T, N, K = 512, 18944, 3584
        wb, xb = pr.buffer(N * K * 2), pr.buffer(T * K * 2)
        pr.upload(wb, (rng.standard_normal((N, K)) * 0.05).astype(np.float16))
        pr.upload(xb, rng.standard_normal((T, K)).astype(np.float16))
        gp, glayout, gdsl, _ = pr.pipeline(
            "matmul_f16", P.gemm_defines(32, 2, 256, 16), 3, 28, {0: 128, 1: 128, 2: 64, 3: 32}
        )
        push = struct.pack("<7I", K, N, 0, 0, 0, N, T)
        for t in dict.fromkeys(x for x in (dev_t, near) if x is not None):
            yb = pr.buffer(T * N * 4, t)
            item = ("dispatch", gp, glayout, pr.dset(gdsl, [wb, xb, yb]), push, (592, 1, 1))
            pr.run([item])
            row = {"y_mem_type": t, "fresh_ms": self._best_ms(item)}
            pr.download(yb, T * N * 4)
            row["after_staging_download_ms"] = self._best_ms(item)
            if yb.host is not None:
                pr.download(yb, T * N * 4, via_map=True)
                row["after_cpu_read_through_map_ms"] = self._best_ms(item)
            # a slowdown of the whole GPU (clocks) would show here too; of the buffer, not
            row["mma_tflops_now"] = self.mma_run(16, 16, 16, False, 8, target_ms=3.0)["tflops"]
            row["smi_now"] = smi()
            self.emit("bar", gemm="default 128x128 w64x32, 7B ffn_up", **row)
            pr.free(yb)
        pr.free(wb)
        pr.free(xb)

    def gemm(self) -> None:
        if not self._coopmat_ok("16x16x16:f16*f16+f32=f32"):
            return
        pr = self.pr
        rng = np.random.default_rng(1)
        T, N, K = 512, 18944, 3584  # 7B ffn_up; then q/o's 3584 rows (112 tiles of 128 x 128)
        w = (rng.standard_normal((N, K)) * 0.05).astype(np.float16)
        x = rng.standard_normal((T, K)).astype(np.float16)
        wb, xb, yb = pr.buffer(w.nbytes), pr.buffer(x.nbytes), pr.buffer(T * N * 4)
        pr.upload(wb, w)
        pr.upload(xb, x)
        # rows spread over the whole weight (a kernel that skipped tiles must not pass); y is
        # filled with NaN before each config
        rows = np.r_[np.arange(0, 3584, 16), np.arange(3584, N, 64)]
        ref = x.astype(np.float32) @ w[rows].astype(np.float32).T
        for name, tiles, bk, nbuf, threads, mma_n, extra, fixed in P.GEMM_CONFIGS:
            if mma_n == 8 and "16x8x16:f16*f16+f32=f32" not in self.shapes:
                self.emit("gemm", config=name, skipped="no 16x8x16 fp32-accumulator shape")
                continue
            tm, tn, wm, wn = tiles
            if (tm // wm) * (tn // wn) * self.sg != threads:
                self.emit("gemm", config=name, skipped=f"not one tile per subgroup at {self.sg}")
                continue
            for how in ("spec", "fixed") if fixed else ("spec",):
                if self.left() < 0:
                    return self.emit("gemm", skipped="budget")
                if how == "spec":
                    spec = {0: tm, 1: tn, 2: wm, 3: wn}
                    defs = P.gemm_defines(bk, nbuf, threads, mma_n, extra)
                else:
                    spec, defs = {}, P.fixed_tile_defines(tiles, bk, nbuf, threads, mma_n, extra)
                p, layout, dsl, dt = pr.pipeline("matmul_f16", defs, 3, 28, spec)
                stats = pr.statistics(p)
                if stats:
                    self.emit("gemm", config=name, tiles_as=how, statistics=stats)
                ds = pr.dset(dsl, [wb, xb, yb])
                for n in (N, 3584) if how == "spec" else (N,):
                    push = struct.pack("<7I", K, n, 0, 0, 0, N, T)
                    ng = (-(-n // tm)) * (-(-T // tn))
                    item = ("dispatch", p, layout, ds, push, (ng, 1, 1))
                    pr.run([("fill", yb, T * N * 4, 0x7FC00000)])
                    first = pr.run([item])
                    runs = [pr.run([item]) for _ in range(3)]
                    y = pr.download(yb, T * N * 4).view(np.float32).reshape(T, N)
                    m = rows < n
                    d = y[:, rows[m]] - ref[:, m]
                    nmse = float(np.sum(d**2) / np.sum(ref[:, m] ** 2))
                    best = min(r.gpu_ms for r in runs)
                    self.emit(
                        "gemm",
                        config=name,
                        shape=[T, n, K],
                        tiles=tiles,
                        bk=bk,
                        buffers=nbuf,
                        threads=threads,
                        tiles_as=how,
                        groups=ng,
                        tflops=round(2.0 * T * n * K / best / 1e9, 1),
                        gpu_ms=[round(r.gpu_ms, 3) for r in runs],
                        host_ms=[round(r.host_ms, 3) for r in runs],
                        first_gpu_ms=round(first.gpu_ms, 3),
                        create_s=round(dt, 3),
                        nmse_sampled_rows=nmse,
                    )

    def copy(self) -> None:
        pr = self.pr
        size = 1 << 30
        types = [
            (t, f) for t, f, _ in pr.memory_types() if f & vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        ]
        for t, f in types:
            if self.left() < 0:
                return self.emit("copy", skipped="budget")
            try:
                src, dst = pr.buffer(size, t), pr.buffer(size, t)
            except Exception as e:  # noqa: BLE001 - a type that cannot back storage is a row
                self.emit("copy", mem_type=t, flags=hex(f), error=str(e)[:200])
                continue
            for mode in ("read", "copy"):
                defs = ("COPY",) if mode == "copy" else ()
                p, layout, dsl, _ = pr.pipeline("probe_copy", defs, 2, 8, {0: 256})
                ds = pr.dset(dsl, [src, dst])
                push = struct.pack("<II", size // 16, 0xFFFFFFFF)
                for groups in (132 * 8, 132 * 32):
                    item = ("dispatch", p, layout, ds, push, (groups, 1, 1))
                    pr.run([item])
                    best = min(pr.run([item]).gpu_ms for _ in range(3))
                    moved = size * (2 if mode == "copy" else 1)
                    self.emit(
                        "copy",
                        mem_type=t,
                        flags=hex(f),
                        engine_uses=t == self.dev.mem.device,
                        mode=mode,
                        groups=groups,
                        gb_s=round(moved / best / 1e6, 1),
                    )
        t = pr.run([("copy", src, dst, size)])
        self.emit("copy", mode="vkCmdCopyBuffer", gb_s=round(2 * size / t.gpu_ms / 1e6, 1))

    def close(self) -> None:
        self.pr.destroy()
        self.dev.destroy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--only", action="append", choices=SECTIONS, default=None)
    ap.add_argument("--budget", type=float, default=60.0, help="seconds (default 60)")
    ap.add_argument("--json", type=Path, default=None, help="write every row here")
    args = ap.parse_args(argv)
    if args.budget <= 0:
        print("--budget: must be positive", file=sys.stderr)
        return 2
    r = Runner(args.budget)
    try:
        for name in args.only or SECTIONS:
            if r.left() < 0:
                r.emit(name, skipped="budget")
                continue
            try:
                {
                    "info": r.info,
                    "clocks": r.clocks,
                    "timing": r.timing,
                    "bar": r.bar,
                    "mma": r.mma,
                    "sustain": r.sustain,
                    "lds": r.lds,
                    "gemm": r.gemm,
                    "copy": r.copy,
                    "shapes": r.shapes_sec,
                }[name]()
            except Exception as e:  # noqa: BLE001 - one section's failure is a row
                r.emit(name, error=f"{type(e).__name__}: {e}"[:400])
        r.clocks("end")
    finally:
        if args.json:
            args.json.write_text(json.dumps(r.rows, indent=1))
        r.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
