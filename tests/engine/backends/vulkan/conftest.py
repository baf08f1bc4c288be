"""Fixtures of the Vulkan test files: one backend per module (``vb``) and, for the files that
opt in with ``pytestmark = pytest.mark.usefixtures("clean_vb")``, the default config before each
test and the validation-layer check after it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    assert_no_validation_errors,
    make_backend,
)


@pytest.fixture(scope="module")
def vb() -> Iterator[Any]:
    be = make_backend()
    yield be
    be.close()


@pytest.fixture
def clean_vb(vb: Any) -> Iterator[None]:
    vb.set_config(TuningConfig.default("vulkan"))
    yield
    assert_no_validation_errors(vb)
