"""A test backend for the agent's fault-injection and multi-class tests, registered only by
``install()``: the tests pass it to the agent as its ``setup`` hook (agent.RunOptions.setup, a
general hook), which runs in the agent and in every worker process (Ray workers import it from
the driver's sys.path).

``numpy_faults``: the NumPy reference backend with extra ``matmul_prefill`` variants --
  ``wrong``      computes a visibly wrong product (validate must reject it; never promoted)
  ``nocompile``  fails to "compile": set_config raises KernelCompileError
  ``raises``     raises RuntimeError inside the forward pass (a crash the worker survives)
  ``crash``      kills the worker process mid-trial (os._exit)
  ``hang``       never returns (the agent's trial timeout must fire)
  ``slow``       a correct product, made slower (a candidate that must never be accepted)
  ``device_oom`` raises the engine's refused Vulkan allocation (a config out of device memory)
  ``lost_once``  a correct product; but the first run kills its worker, as an OOM killer or an
                 operator would (once per marker file ``$FLEETTUNE_TEST_LOST_ONCE``; unset: never)
Its device class is ``cpu-sim``, or the ``device:sim-*`` resource of the Ray node it runs on,
so one machine can host several simulated device classes (``ray.cluster_utils.Cluster``).
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from engine.backends.base import DeviceInfo
from engine.backends.numpy_ref import NumpyBackend, NumpyWeight
from engine.errors import EngineError, KernelCompileError
from engine.tuning import REGISTRY, Variant

NAME = "numpy_faults"
FAULT_VARIANTS = (
    "wrong",
    "nocompile",
    "raises",
    "crash",
    "hang",
    "slow",
    "lost_once",
    "device_oom",
)
LOST_ONCE_ENV = "FLEETTUNE_TEST_LOST_ONCE"


def _node_sim_class() -> str:
    try:
        import ray

        if not ray.is_initialized():
            return "cpu-sim"
        node = ray.get_runtime_context().get_node_id()
        for n in ray.nodes():
            if n["NodeID"] == node:
                for key in n["Resources"]:
                    if key.startswith("device:sim-"):
                        return key[len("device:") :]
    except Exception:  # noqa: BLE001 - outside Ray: the default class
        pass
    return "cpu-sim"


class FaultyBackend(NumpyBackend):
    name = NAME
    _class: str | None = None

    def device_info(self) -> DeviceInfo:
        if FaultyBackend._class is None:
            FaultyBackend._class = _node_sim_class()
        info = super().device_info()
        return dataclasses.replace(info, backend=NAME, device_class=FaultyBackend._class)

    def set_config(self, config) -> None:  # noqa: ANN001 - TuningConfig
        if config.op("matmul_prefill").variant == "nocompile":
            raise KernelCompileError("matmul_prefill.nocompile: error: expected ';' (injected)")
        super().set_config(config)

    def _matmul(self, x: np.ndarray, w: NumpyWeight) -> np.ndarray:
        variant = self.config.op("matmul_prefill").variant if x.shape[0] > 1 else ""
        if variant == "crash":
            os._exit(17)
        marker = os.environ.get(LOST_ONCE_ENV)
        if variant == "lost_once" and marker:
            try:
                with open(marker, "x"):  # the first run anywhere creates it and is killed
                    pass
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), 9)
        if variant == "hang":
            time.sleep(3600)
        if variant == "raises":
            raise RuntimeError("matmul_prefill.raises: injected failure")
        if variant == "device_oom":  # as engine.backends.vulkan.memory words a refused allocation
            raise EngineError(
                "vulkan: cannot allocate 4096.0 MiB on sim (VkErrorOutOfDeviceMemory)"
            )
        out = super()._matmul(x, w)
        if variant == "wrong":
            return out * 1.5 + 0.25
        if variant == "slow":
            for _ in range(3):
                out = super()._matmul(x, w)
        return out


def install() -> None:
    """Register the ``numpy_faults`` backend and its kernels (idempotent)."""
    from engine import backends

    backends.BACKENDS[NAME] = f"{__name__}:FaultyBackend"
    if NAME in REGISTRY.backends():
        return
    for op in REGISTRY.ops("numpy"):
        variants = [dataclasses.replace(v, backend=NAME) for v in op.variants]
        if op.name == "matmul_prefill":
            variants += [
                Variant(
                    NAME, op.name, v, source=__name__, doc=f"test-only: {v}", numeric="order_only"
                )
                for v in FAULT_VARIANTS
            ]
        REGISTRY.register(NAME, op.name, variants, op.doc)


def uninstall() -> None:
    """Remove what ``install`` registered (tests restore the shared registry after use)."""
    from engine import backends

    backends.BACKENDS.pop(NAME, None)
    if NAME in REGISTRY.backends():
        for op in REGISTRY.ops(NAME):
            REGISTRY.unregister(NAME, op.name)
