"""A Vulkan worker picks its own device of its class on a node with several (worker/claim.py):
exclusive per-device locks, released when the holder exits or dies; sharing only when workers
outnumber devices; the operator's FLEETTUNE_VK_DEVICE wins."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.device_info import DeviceEntry, served
from worker.claim import claim, claim_vulkan_device

ROOT = Path(__file__).resolve().parents[2]


def test_each_claim_takes_a_free_device_then_they_share(tmp_path: Path) -> None:
    a, fa = claim([3, 5], tmp_path)
    b, fb = claim([3, 5], tmp_path)
    assert (a, b) == (3, 5) and fa is not None and fb is not None
    c, fc = claim([3, 5], tmp_path)  # a third worker of the class: shares the first, no lock
    assert (c, fc) == (3, None)
    fa.close()  # the first worker exits: its device is free again
    d, fd = claim([3, 5], tmp_path)
    assert d == 3 and fd is not None
    fb.close()
    fd.close()


def test_a_killed_holder_frees_its_device(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from worker.claim import claim; "
        f"i, f = claim([0, 1], Path({str(tmp_path)!r})); print(i, flush=True); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "0"
        assert claim([0, 1], tmp_path)[0] == 1  # held by the other process
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        i, f = claim([0], tmp_path)
        assert i == 0 and f is not None  # the kernel dropped the dead process's lock
        f.close()
    finally:
        p.kill()
        p.wait()


def test_a_node_serves_its_best_kind_of_device() -> None:
    llvmpipe = DeviceEntry("vulkan", 0, "llvmpipe", "llvmpipe", "cpu")
    r1 = DeviceEntry("vulkan", 1, "AMD Radeon AI PRO R9700", "r9700", "discrete")
    r2 = DeviceEntry("vulkan", 2, "R9700", "r9700", "discrete")
    igpu = DeviceEntry("vulkan", 3, "AMD Radeon Graphics", "amd-radeon-graphics", "integrated")
    assert served([llvmpipe, r1, igpu, r2]) == [r1, r2]
    assert served([llvmpipe, igpu]) == [igpu]
    assert served([llvmpipe]) == [llvmpipe]
    assert served([]) == []


def test_vulkan_worker_claims_its_class_on_lavapipe(tmp_path, monkeypatch) -> None:
    pytest.importorskip("vulkan")
    monkeypatch.setenv("FLEETTUNE_LOCK_DIR", str(tmp_path))
    monkeypatch.delenv("FLEETTUNE_VK_DEVICE", raising=False)
    before = dict(os.environ)
    index, lock = claim_vulkan_device("llvmpipe")
    try:
        assert index == 0 and lock is not None
        assert claim_vulkan_device("r9700") == (None, None)  # no such device here
        assert dict(os.environ) == before  # the pick is returned, never put in the environment
        monkeypatch.setenv("FLEETTUNE_VK_DEVICE", "5")  # the operator's pin wins, unlocked
        assert claim_vulkan_device("llvmpipe") == (5, None)
    finally:
        lock.close()
