"""The backend contract (tests/backend_contract.py) on the NumPy reference backend; the Vulkan
and CUDA suites subclass the same class in tests/engine/backends/vulkan/test_vulkan_ops.py and
tests/engine/backends/cuda/test_cuda_ops.py."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from tests.backend_contract import BackendContract


class TestNumpyContract(BackendContract):
    backend = "numpy"


def test_the_canary_hook_catches_an_output_that_is_its_input():
    """The NumPy hook is real: an add that writes into its input is caught."""

    class InPlace(NumpyBackend):
        def _add(self, a, b):  # noqa: ANN001, ANN202
            a += b
            return a

    be = InPlace()
    x = np.ones(4, np.float32)
    with pytest.raises(AssertionError, match="shares memory"):
        TestNumpyContract().out(be, 4, be.ops.add, x, np.ones(4, np.float32))
