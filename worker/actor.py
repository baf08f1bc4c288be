"""The Ray actor that owns one device: ``TuningWorker``, and how the agent places it.

Placement: one unit of the custom resource ``device:<class>`` per worker (every device class,
Vulkan-only AMD and llvmpipe included), plus ``num_gpus=1`` for CUDA so Ray sets
CUDA_VISIBLE_DEVICES; a Vulkan worker picks and locks its device of the class itself
(worker/claim.py). The actor loads each model once and keeps it; the agent restarts a worker
that died or hung by creating a new actor in the same slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from engine.tuning import TuningConfig
from engine.tuning.shape import ModelShape
from worker.claim import claim_vulkan_device
from worker.device import resource_name
from worker.evaluator import Evaluator
from worker.records import EvalResult, WorkerInfo
from worker.refcache import ref_root

# The concurrency group of ``precompile``: it runs beside the evaluate call in flight.
COMPILE_GROUP = {"compile": 1}


class TuningWorker:
    """Evaluates candidates on the device it was placed on (see ``Evaluator``)."""

    def __init__(
        self,
        backend: str,
        worker_id: str,
        setup: Callable[[], None] | None = None,
        commit_hint: str = "",
        device_class: str = "",
    ) -> None:
        if setup is not None:  # test-only: register extra backends/variants in this process
            setup()
        self._device_lock = None  # held for the actor's life (worker/claim.py)
        device = None  # CUDA: Ray's CUDA_VISIBLE_DEVICES leaves this worker one GPU, index 0
        if backend == "vulkan" and device_class:
            device, self._device_lock = claim_vulkan_device(device_class)
        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        self.evaluator = Evaluator(
            backend, worker_id, node_id, commit_hint, device=device, ref_cache_dir=ref_root()
        )

    def info(self) -> WorkerInfo:
        return self.evaluator.info()

    def load(self, model_ref: str) -> ModelShape:
        return self.evaluator.load(model_ref)

    @ray.method(concurrency_group="compile")
    def precompile(self, model_ref: str, candidate: TuningConfig | dict[str, Any]) -> bool:
        """Compile a queued candidate's kernels in a CPU process while ``evaluate`` runs (its own
        concurrency group: it does not wait behind the running trial)."""
        return self.evaluator.precompile(model_ref, candidate)

    def evaluate(self, *args: Any, **kwargs: Any) -> EvalResult:
        """``Evaluator.evaluate`` (its arguments, one signature to keep) on this device."""
        return self.evaluator.evaluate(*args, **kwargs)


def actor_options(backend: str, device_class: str) -> dict[str, Any]:
    """Ray options that place a worker on a device of this class (and nowhere else)."""
    opts: dict[str, Any] = {
        "resources": {resource_name(device_class): 1},
        "num_cpus": 0,
        "max_restarts": 0,  # the agent restarts workers itself, after recording the failure
        "max_concurrency": 1,  # evaluate calls run one at a time; precompile has its own group
    }
    if backend == "cuda":
        opts["num_gpus"] = 1
    return opts


def spawn(
    backend: str,
    device_class: str,
    worker_id: str,
    setup: Callable[[], None] | None = None,
    commit_hint: str = "",
) -> ray.actor.ActorHandle:
    """Start a worker actor on a device of ``device_class``."""
    cls = ray.remote(concurrency_groups=COMPILE_GROUP)(TuningWorker)
    return cls.options(name=None, **actor_options(backend, device_class)).remote(
        backend, worker_id, setup, commit_hint, device_class
    )
