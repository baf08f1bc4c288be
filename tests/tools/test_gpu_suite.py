"""tools/gpu_suite.py confines a sticky device fault to the test that raised it (no GPU needed:
a fake test module plays a context that every call fails on after the fault)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

FAKE = """
import pytest
POISONED = []

def test_a():
    pass

def test_b_faults():
    POISONED.append(1)
    raise RuntimeError("CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address")

@pytest.mark.parametrize("i", [0, 1])
def test_c_after(i):
    if POISONED:  # what every later test sees in the poisoned process
        raise RuntimeError("CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address")

def test_d_real_failure():
    assert 1 == 2
"""


def _runner():
    path = Path(__file__).resolve().parents[2] / "tools" / "gpu_suite.py"
    spec = importlib.util.spec_from_file_location("gpu_suite", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_suite"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_fault_is_confined_to_its_test(tmp_path):
    f = tmp_path / "test_fake_gpu.py"
    f.write_text(textwrap.dedent(FAKE))
    tally = _runner().run_file(f.name, "not slow", None, timeout=120, cwd=tmp_path).as_dict()
    # the faulting test fails, the ordinary failure fails, the rest pass in a fresh process
    assert (tally["passed"], tally["failed"], tally["errors"]) == (3, 2, 0), tally
    assert tally["processes"] == 2
    assert [x["test"].split("::")[-1] for x in tally["faults"]] == ["test_b_faults"]
    assert "MISALIGNED_ADDRESS" in tally["faults"][0]["error"]


def test_fault_signature():
    from tests.device_fault import fault_of

    assert fault_of("x\nCUDADriverError: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access")
    assert fault_of("vulkan.VkErrorDeviceLost: VK_ERROR_DEVICE_LOST")
    assert fault_of("CUDA_ERROR_OUT_OF_MEMORY: out of memory") is None  # not sticky


HANG = """
import time

def test_a():
    pass

def test_b_hangs():
    time.sleep(60)

def test_c():
    pass
"""


def test_hang_is_confined_to_its_test(tmp_path):
    f = tmp_path / "test_fake_hang.py"
    f.write_text(HANG)
    tally = _runner().run_file(f.name, "not slow", None, 120, test_timeout=3, cwd=tmp_path)
    d = tally.as_dict()
    assert (d["passed"], d["failed"], d["errors"]) == (2, 1, 0), d
    assert d["faults"][0]["test"].endswith("test_b_hangs")
    assert "hung" in d["faults"][0]["error"]


def test_only_and_skip_split_a_suite(capsys):
    gs = _runner()
    cuda = gs.SUITES["cuda"]
    hybrid = gs._select(cuda, "hybrid", None)
    rest = gs._select(cuda, None, "hybrid")
    assert [f for f, _, _ in hybrid] == ["tests/engine/backends/cuda/test_cuda_hybrid.py"]
    assert sorted(hybrid + rest) == sorted(cuda)  # the two halves cover the suite once
    assert gs.main(["cuda", "--only", "no_such_file"]) == 2
    assert "no file of the cuda suite" in capsys.readouterr().err


def test_every_gpu_test_file_is_in_a_suite():
    """A GPU test file missing from SUITES never runs on the device (eight were, 2026-12-01)."""
    gs = _runner()
    listed = {f for suite in gs.SUITES.values() for f, _, _ in suite}
    tests = gs.ROOT / "tests"
    gpu = {
        str(p.relative_to(gs.ROOT))
        for p in tests.rglob("test_*.py")
        if p.name != "test_gpu_suite.py"
        and ("mark.gpu" in p.read_text() or p.name.startswith("test_vulkan_"))
    }
    assert gpu - listed == set()
