"""The worker finds its node's devices through the engine's device contract alone
(worker/device.py): what each backend lists, the best kind of each, the operator's pin, and the
index the worker then opens. No GPU needed: backends that list devices are stood in for by
subclasses whose ``list_devices`` says what a GPU node would."""

from __future__ import annotations

import pytest

from engine import backends
from engine.backends.cuda import CudaBackend
from engine.backends.numpy_ref import NumpyBackend
from engine.device_info import DeviceEntry
from engine.errors import BackendUnavailable, ConfigError
from worker.device import detect, device_classes_in, served_devices
from worker.evaluator import Evaluator

H200 = [
    DeviceEntry("cuda", i, "NVIDIA H200", "h200", "discrete", "CUDA 13.0", 141 << 30)
    for i in (0, 1)
]
AMD_NODE = [
    DeviceEntry("fakevk", 0, "llvmpipe (LLVM 15.0.6, 256 bits)", "llvmpipe", "cpu"),
    DeviceEntry("fakevk", 1, "AMD Radeon AI PRO R9700 (RADV GFX1201)", "r9700", "discrete"),
    DeviceEntry(
        "fakevk", 2, "AMD Radeon Graphics (RADV GFX1036)", "amd-radeon-graphics", "integrated"
    ),
    DeviceEntry("fakevk", 3, "AMD Radeon AI PRO R9700 (RADV GFX1201)", "r9700", "discrete"),
]


class FakeVulkanNode(NumpyBackend):
    name = "fakevk"

    @classmethod
    def list_devices(cls) -> list[DeviceEntry]:
        return list(AMD_NODE)


class Broken(NumpyBackend):
    name = "broken"

    @classmethod
    def list_devices(cls) -> list[DeviceEntry]:
        raise BackendUnavailable("no driver")


@pytest.fixture
def node(monkeypatch):
    """This machine as a node with two H200s (CUDA) and an AMD card pair (a stand-in backend)."""
    monkeypatch.setattr(CudaBackend, "list_devices", classmethod(lambda cls: list(H200)))
    monkeypatch.setitem(backends.BACKENDS, "fakevk", f"{__name__}:FakeVulkanNode")
    monkeypatch.setitem(backends.BACKENDS, "broken", f"{__name__}:Broken")
    monkeypatch.setitem(backends.DEVICE_ENV, "fakevk", "FLEETTUNE_TEST_FAKEVK_DEVICE")
    monkeypatch.delenv("FLEETTUNE_TEST_FAKEVK_DEVICE", raising=False)


def test_detect_serves_the_best_kind_each_backend_lists(node):
    found = detect(("cuda", "fakevk", "broken", "numpy"))
    assert [(d.backend, d.index) for d in found.devices] == [
        ("cuda", 0), ("cuda", 1), ("fakevk", 1), ("fakevk", 3)
    ]  # fmt: skip
    assert found.cuda_count == 2  # Ray's num_gpus
    res = found.resources()
    assert device_classes_in(res) == {"h200": 2, "r9700": 2}  # no llvmpipe, no iGPU, no cpu
    assert res["backend:cuda/h200"] == 2 and res["backend:fakevk/r9700"] == 2


def test_the_cpu_class_only_when_asked_or_alone(node):
    assert device_classes_in(detect(("broken", "numpy")).resources()) == {"cpu": 1}
    assert "cpu" not in device_classes_in(detect(("cuda", "numpy")).resources())
    with_cpu = detect(("cuda", "numpy"), with_cpu=True).resources()
    assert device_classes_in(with_cpu) == {"h200": 2, "cpu": 1}


def test_an_operators_pin_serves_that_device_only(node, monkeypatch):
    monkeypatch.setenv("FLEETTUNE_TEST_FAKEVK_DEVICE", "0")  # pins the llvmpipe on purpose
    assert [d.index for d in served_devices("fakevk")] == [0]
    monkeypatch.setenv("FLEETTUNE_TEST_FAKEVK_DEVICE", "7")  # not there: serves nothing
    assert served_devices("fakevk") == []


def test_a_backend_that_cannot_list_is_not_served(node):
    assert served_devices("broken") == []
    assert served_devices("no-such-backend") == []


def test_the_worker_opens_the_index_it_claimed():
    """The evaluator hands its device index to the engine (no environment in between): an
    index the backend does not have is the engine's own error."""
    assert Evaluator("numpy", device=0).info().device_class == "cpu"
    with pytest.raises(ConfigError, match="numpy device 2: no such device"):
        Evaluator("numpy", device=2).info()
