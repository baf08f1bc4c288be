"""Compile ahead: the next candidates' kernels compile in CPU processes on the worker's node
while the device measures the current one (engine.precompile; the GPU process then finds them
in the backend's disk cache).

``Ahead`` is a small process pool that keeps at most ``depth`` configs in flight, as Kernel
Tuner's Ray runner keeps two jobs in flight: an older request is dropped, not queued, when the
pool is full (its trial compiles on the device as before). ``precompile_task`` is the function a
pool process (or a Ray task pinned to the worker's node) runs.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

DEPTH = 2  # configs compiling ahead at once per worker


def model_qtypes(model_ref: str) -> tuple[str, ...]:
    """The weight types of a model's tensors (its GGUF header, memory-mapped: no weights read)."""
    from engine.gguf_model import GGUFModel
    from worker.models import resolve_model

    gg = GGUFModel(resolve_model(model_ref))
    return tuple(sorted({gg.tensor(n).qtype for n in gg.model_tensor_names()}))


def precompile_task(
    backend: str,
    flat: Mapping[str, Any],
    model_ref: str,
    device: int | None = None,
    qtypes: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Compile one config's kernels into the disk cache; returns what engine.precompile did.
    Runs in a CPU process: imports the engine, opens no Vulkan device. ``qtypes``: the weight
    types the worker's backend builds pipelines for (None: the model file's)."""
    from engine.precompile import precompile
    from engine.tuning import TuningConfig

    cfg = TuningConfig.from_flat(backend, dict(flat))
    if qtypes is None:
        qtypes = model_qtypes(model_ref) if backend == "vulkan" else ()
    done = precompile(cfg, qtypes, device=device)
    return {
        "backend": done.backend,
        "builds": done.builds,
        "cached": done.cached,
        "seconds": done.seconds,
        "errors": list(done.errors),
    }


class Ahead:
    """A process pool compiling the next configs of one worker (``depth`` at most in flight)."""

    def __init__(self, backend: str, depth: int = DEPTH, device: int | None = None) -> None:
        self.backend = backend
        self.depth = depth
        self.device = device
        self.submitted = 0
        self.dropped = 0
        self._futures: list[Future] = []
        self._pool: ProcessPoolExecutor | None = None

    def wanted(self) -> bool:
        """Whether this backend compiles anything (NumPy does not: no pool is started)."""
        return self.backend in ("vulkan", "cuda")

    def submit(
        self, flat: Mapping[str, Any], model_ref: str, qtypes: tuple[str, ...] | None = None
    ) -> bool:
        """Start compiling ``flat`` unless ``depth`` configs are already compiling."""
        if not self.wanted():
            return False
        self._futures = [f for f in self._futures if not f.done()]
        if len(self._futures) >= self.depth:
            self.dropped += 1
            return False
        if self._pool is None:  # spawn: a forked Vulkan/CUDA process state is not safe
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.depth, mp_context=ctx)
        fut = self._pool.submit(
            precompile_task, self.backend, dict(flat), model_ref, self.device, qtypes
        )
        fut.add_done_callback(_log_result)
        self._futures.append(fut)
        self.submitted += 1
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every compile in flight (tests; a clean shutdown)."""
        for f in list(self._futures):
            f.exception(timeout=timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _log_result(fut: Future) -> None:
    e = fut.exception()
    if e is not None:  # the trial itself compiles again on the device and reports it
        log.info("precompile failed: %s", e)
        return
    r = fut.result()
    log.debug("precompiled %d builds (%d cached) in %.2fs", r["builds"], r["cached"], r["seconds"])
