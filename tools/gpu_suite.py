"""Run a GPU test suite so that a device fault is confined to the test that caused it.

    python tools/gpu_suite.py cuda            # CUDA ops (with the shared contract), CUDA backend
    python tools/gpu_suite.py vulkan          # the Vulkan suites on whatever driver is set up
    python tools/gpu_suite.py cuda --json     # the tally as JSON (per file and in total)
    python tools/gpu_suite.py cuda --only hybrid   # one part of a suite (--skip: the rest)

Each file runs in its own pytest process with tests/device_fault.py logging every outcome; a
sticky device error (a CUDA fault, a lost Vulkan device) stops that process after the test that
raised it, a test that runs past --test-timeout ends it, and a fresh process runs the file's
tests that had not run. pytest's own output goes to stderr, the tally to stdout. The tally says, per
file: passed, failed, errors, skipped, and the faults (test and error line), first one first.
Exit status: 0 when nothing failed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# suite -> (file, marker expression, -k expression or None)
SUITES: dict[str, list[tuple[str, str, str | None]]] = {
    "cuda": [  # most telling first: a caller short of time keeps the files done (--out)
        (
            "tests/engine/backends/cuda/test_cuda_ops.py",
            "gpu",
            None,
        ),  # with the shared contract (TestCudaContract)
        (
            "tests/engine/verify/test_mutants.py",
            "gpu",
            "cuda",
        ),  # the CUDA planted bugs, each rejected
        (
            "tests/engine/backends/test_device_contract.py",
            "gpu",
            "Cuda",
        ),  # the device contract on CUDA
        (
            "tests/engine/backends/cuda/test_cuda_decode_fused.py",
            "gpu",
            None,
        ),  # mmvw, rope_kv, the fused ops
        (
            "tests/engine/backends/cuda/test_cuda_hybrid.py",
            "gpu",
            None,
        ),  # delta-net, conv, MoE kernels and models
        (
            "tests/engine/backends/cuda/test_cuda_pdl.py",
            "gpu",
            None,
        ),  # programmatic dependent launch
        (
            "tests/engine/backends/cuda/test_cuda_mmvf.py",
            "gpu",
            None,
        ),  # the float decode GEMV (the default)
        ("tests/engine/backends/cuda/test_cuda_moe_dec.py", "gpu", None),  # the fused MoE decode
        (
            "tests/engine/backends/cuda/test_cuda_dn_step.py",
            "gpu",
            None,
        ),  # the fused delta-net decode step
        (
            "tests/engine/backends/cuda/test_cuda_dn_conv.py",
            "gpu",
            None,
        ),  # conv-folded step, stacked b/a, MoE norm
        (
            "tests/engine/backends/cuda/test_cuda_qk_prep.py",
            "gpu",
            None,
        ),  # q/k norm + partial RoPE in one launch
        (
            "tests/engine/backends/cuda/test_cuda_attn_decode.py",
            "gpu",
            None,
        ),  # attention_decode.gqa, .tile
        ("tests/engine/backends/cuda/test_cuda_norm_decode.py", "gpu", None),  # rms_norm.block
        (
            "tests/engine/backends/cuda/test_cuda_mmvf_glu.py",
            "gpu",
            None,
        ),  # mmvf fuse_swiglu (mmvf_glu)
        (
            "tests/engine/backends/cuda/test_cuda_moe_drift.py",
            "gpu",
            None,
        ),  # tc under drift-explained routing
        (
            "tests/engine/backends/cuda/test_cuda_mmvw_stream.py",
            "gpu",
            None,
        ),  # mmvw_stream (matmul_decode.stream)
        (
            "tests/engine/backends/cuda/test_cuda_mmvw_q4k.py",
            "gpu",
            None,
        ),  # q4k_lean, q4k_kernel (mmvw_q4k)
        ("tests/engine/backends/cuda/test_cuda_backend.py", "gpu or not gpu", None),
        ("tests/engine/backends/cuda/test_cuda_attn_vec.py", "gpu", None),  # attention_decode.vec
        (
            "tests/engine/backends/cuda/test_cuda_dn_clu.py",
            "gpu",
            None,
        ),  # delta_net.step_cluster (dn_clu.cu)
        ("tests/agent/test_memory.py", "gpu", None),  # the footprint with and without resident
    ],
    "vulkan": [
        (
            "tests/engine/backends/vulkan/test_vulkan_ops.py",
            "not gpu and not slow",
            None,
        ),  # with TestVulkanContract
        ("tests/engine/backends/vulkan/test_vulkan_backend.py", "not gpu and not slow", None),
        ("tests/engine/backends/vulkan/test_vulkan_model.py", "not gpu and not slow", None),
        ("tests/engine/backends/vulkan/test_vulkan_mmvw.py", "not gpu and not slow", None),
        ("tests/engine/backends/vulkan/test_vulkan_hybrid.py", "not gpu and not slow", None),
        ("tests/engine/backends/vulkan/test_vulkan_delta_net.py", "not gpu and not slow", None),
        ("tests/engine/backends/vulkan/test_vulkan_helpers.py", "not gpu and not slow", None),
        (
            "tests/engine/backends/vulkan/test_vulkan_coopmat.py",
            "gpu or not gpu",
            None,
        ),  # cooperative matrix: GPU
        ("tests/engine/backends/vulkan/test_vulkan_resident.py", "gpu or not gpu", None),
        (
            "tests/engine/backends/vulkan/test_vulkan_flash.py",
            "gpu or not gpu",
            None,
        ),  # attention.flash
        (
            "tests/engine/backends/vulkan/test_vulkan_resident_split.py",
            "gpu or not gpu",
            None,
        ),  # split_groups
        (
            "tests/engine/backends/vulkan/test_vulkan_stream_ahead.py",
            "not gpu and not slow",
            None,
        ),  # prefill_ahead
        (
            "tests/engine/backends/vulkan/test_vulkan_fuse_x16.py",
            "gpu or not gpu",
            None,
        ),  # fuse_x16
        ("tests/engine/backends/vulkan/test_vulkan_fused_norm.py", "not gpu and not slow", None),
        ("tests/engine/backends/test_device_contract.py", "not gpu", "Vulkan"),
    ],
}
KEYS = ("passed", "failed", "errors", "skipped")


@dataclass
class FileTally:
    file: str
    counts: Counter = field(default_factory=Counter)
    faults: list[dict[str, str]] = field(default_factory=list)
    processes: int = 0

    def as_dict(self) -> dict:
        counts = {k: self.counts.get(k, 0) for k in KEYS}
        return {"file": self.file, "processes": self.processes, "faults": self.faults, **counts}


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


def _pytest(args: list[str], log: Path, timeout: float, test_timeout: float, cwd: Path) -> int:
    env = _env(FLEETTUNE_TEST_LOG=str(log), FLEETTUNE_TEST_TIMEOUT=str(test_timeout))
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=short"]
    cmd += ["-p", "no:cacheprovider", "-p", "tests.device_fault"]
    try:
        return subprocess.run(
            cmd + args, cwd=cwd, env=env, timeout=timeout, stdout=sys.stderr
        ).returncode
    except subprocess.TimeoutExpired:
        return 124


def _collect(file: str, marker: str, k: str | None, cwd: Path) -> list[str]:
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
            "-m", marker, file] + (["-k", k] if k else [])  # fmt: skip
    out = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True).stdout
    return [ln.strip() for ln in out.splitlines() if "::" in ln and not ln.startswith(" ")]


def run_file(
    file: str,
    marker: str,
    k: str | None,
    timeout: float,
    test_timeout: float = 120,
    cwd: Path = ROOT,
) -> FileTally:
    """Run one file, restarting after each device fault until every collected test has run
    (node ids are relative to cwd)."""
    tally = FileTally(file)
    pending = _collect(file, marker, k, cwd)
    if not pending:
        return tally
    seen: dict[str, str] = {}  # nodeid -> outcome; an error in setup/teardown counts as error
    while pending:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "log.jsonl"
            log.touch()
            tally.processes += 1
            _pytest(["-m", marker, *pending], log, timeout, test_timeout, cwd)
            records = [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()]
        reported = {r["nodeid"] for r in records if r["when"] != "start"}
        started = [r["nodeid"] for r in records if r["when"] == "start"]
        why = f"no result: hung past {test_timeout:g} s or crashed"
        for n in started:  # started, never reported: the process died in it (hang or crash)
            if n not in reported:
                records.append({"nodeid": n, "when": "call", "outcome": "failed", "fault": why})
        for r in records:
            if r["when"] == "start":
                continue
            outcome = r["outcome"]
            if outcome == "failed" and r["when"] != "call":
                outcome = "errors"
            if r["nodeid"] not in seen or outcome in ("failed", "errors"):
                seen[r["nodeid"]] = outcome
            if r.get("fault"):
                tally.faults.append({"test": r["nodeid"], "error": r["fault"]})
        ran = {r["nodeid"] for r in records}  # reported, or started and died in
        rest = [n for n in pending if n not in ran]
        if len(rest) == len(pending):  # nothing ran (a crash at start-up, a timeout): stop
            for n in rest:
                seen[n] = "errors"
            break
        pending = rest
    tally.counts = Counter(seen.values())
    return tally


def _doc(suite: str, tallies: list[FileTally]) -> dict:
    total: Counter = Counter()
    for t in tallies:
        total.update(t.counts)
    files = [t.as_dict() for t in tallies]
    return {"suite": suite, "files": files, "total": {k: total.get(k, 0) for k in KEYS}}


def _select(
    files: list[tuple[str, str, str | None]], only: str | None, skip: str | None
) -> list[tuple[str, str, str | None]]:
    """The suite's files kept by --only (any part matches) and not dropped by --skip."""
    keep = [p for p in (only or "").split(",") if p]
    drop = [p for p in (skip or "").split(",") if p]
    return [
        e
        for e in files
        if (not keep or any(p in e[0] for p in keep)) and not any(p in e[0] for p in drop)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=sorted(SUITES), help="which GPU suite to run")
    ap.add_argument("--json", action="store_true", help="print the tally as JSON")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per pytest process")
    ap.add_argument("--test-timeout", type=float, default=120, help="seconds per test")
    ap.add_argument("--out", help="also write the JSON tally here, rewritten after every file")
    ap.add_argument(
        "--only",
        help="comma-separated parts of file names: run just the suite's files that contain one "
        "(two cards can split a suite)",
    )
    ap.add_argument("--skip", help="comma-separated parts of file names to leave out")
    args = ap.parse_args(argv)
    files = _select(SUITES[args.suite], args.only, args.skip)
    if not files:
        msg = f"gpu_suite: no file of the {args.suite} suite matches --only/--skip"
        print(msg, file=sys.stderr)
        return 2
    tallies: list[FileTally] = []
    for f, m, k in files:
        tallies.append(run_file(f, m, k, args.timeout, args.test_timeout))
        if args.out:  # a caller that runs out of time still has the files done so far
            Path(args.out).write_text(json.dumps(_doc(args.suite, tallies), indent=2))
    total = Counter()
    for t in tallies:
        total.update(t.counts)
    if args.json:
        print(json.dumps(_doc(args.suite, tallies), indent=2))
    else:
        print(f"\n{args.suite} suite: {'file':40s} passed failed errors skipped processes")
        for t in tallies:
            d = t.as_dict()
            print(
                f"  {t.file:52s} {d['passed']:6d} {d['failed']:6d} {d['errors']:6d} "
                f"{d['skipped']:7d} {t.processes:9d}"
            )
            for f in t.faults:
                print(f"    device fault: {f['test']}: {f['error']}")
        print(
            f"  {'total':52s} {total['passed']:6d} {total['failed']:6d} {total['errors']:6d} "
            f"{total['skipped']:7d}"
        )
    return 0 if total["failed"] == 0 and total["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
