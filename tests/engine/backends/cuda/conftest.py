"""The CUDA test files' backend: ``be``, the module's cuda_be (tests/conftest.py), left with the
default config when the module is done."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.tuning import TuningConfig


@pytest.fixture(scope="module")
def be(cuda_be: Any) -> Iterator[Any]:
    yield cuda_be
    cuda_be.set_config(TuningConfig.from_flat("cuda", {}))
