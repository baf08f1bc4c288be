"""The device contract on every backend (tests/device_contract.py), the parts of it only one
backend has, and CUDA's part checked without a GPU: it imports, needs no nvcc, and overrides
every device method rather than inheriting the NumPy defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.base import Backend
from engine.errors import UnsupportedError
from tests.device_contract import DeviceContract

ROOT = Path(__file__).resolve().parents[3]


class TestNumpyDevice(DeviceContract):
    backend = "numpy"
    clock = "wall"
    matmul_kernel = "matmul_prefill"


class TestVulkanDevice(DeviceContract):
    backend = "vulkan"
    clock = "gpu-timestamps"
    matmul_kernel = "matmul_prefill.tiled[Q8_0]"

    def assert_released(self, be) -> None:  # noqa: ANN001
        assert be.dev is None and be.alloc.closed

    def test_a_queue_without_timestamps_refuses_to_profile(self, be):
        be.dev.timestamp_bits = 0  # as on a device whose compute queue has none
        with pytest.raises(UnsupportedError, match="no timestamps"):
            be.set_profiling(True)

    def test_scratch_is_what_the_pool_holds_beyond_weights_and_caches(self, be):
        import numpy as np

        before = be.memory_report().scratch_bytes
        x = be.upload(np.zeros((1024, 256), np.float32))  # 1 MiB activation
        assert be.memory_report().scratch_bytes - before >= x.nbytes
        assert be.memory_report().total_bytes == be.alloc.bytes_allocated


@pytest.mark.gpu
class TestCudaDevice(DeviceContract):
    backend = "cuda"
    clock = "cuda-events"

    def assert_released(self, be) -> None:  # noqa: ANN001
        assert be._graph is None and be._k == {} and not be._profiling


def test_cuda_contract_without_a_gpu_or_nvcc():
    """The CUDA backend imports with no CuPy and no nvcc on PATH, says why it cannot open, and
    implements each device method itself (profiling by CUDA events, memory from CuPy's pool)."""
    code = (
        "import sys; sys.modules['cupy'] = None\n"
        "from engine import backends\n"
        "from engine.backends.base import Backend\n"
        "from engine.backends.cuda import CudaBackend\n"
        "from engine.errors import BackendUnavailable\n"
        "for call in (CudaBackend.list_devices, lambda: backends.create('cuda', device=0)):\n"
        "    try:\n"
        "        call()\n"
        "    except BackendUnavailable as e:\n"
        "        assert 'CuPy is not installed' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('opened without CuPy')\n"
        "own = [m for m in ('list_devices', 'set_profiling', 'profile', 'close', '_held_bytes')\n"
        "       if getattr(CudaBackend, m) is getattr(Backend, m, None)]\n"
        "assert not own, f'inherited, not implemented: {own}'\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_PATH", "CUDA_HOME")}
    env["PATH"] = "/usr/bin:/bin"  # no /usr/local/cuda/bin: nvcc is not needed to import
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_numpy_profile_counts_an_op_inside_an_op_once():
    """The wall-clock profiler times the outermost op: a hybrid MoE op's inner matmuls are in
    its time, not counted again beside it."""
    import numpy as np

    from engine.backends.numpy_ref import NumpyBackend

    class Outer(NumpyBackend):
        def _swiglu(self, gate, up):  # noqa: ANN001, ANN201 - calls another op inside
            return super()._swiglu(self.ops.add(gate, up), up)

    be = Outer()
    be.set_profiling(True)
    x = np.ones((2, 3), np.float32)
    be.ops.swiglu(x, x)
    be.ops.add(x, x)
    rep = be.profile()
    assert {n: k.calls for n, k in rep.kernels.items()} == {"swiglu": 1, "add": 1}
    be.set_profiling(False)
    assert "swiglu" not in vars(be.ops)  # the timed wrappers are gone with profiling off
    assert Backend.set_profiling is NumpyBackend.set_profiling
