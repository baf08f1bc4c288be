"""The device contract (engine.backends.base.Backend: list_devices, open, device_info,
memory_report, set_profiling / profile, close) as one test class. Each backend's suite
subclasses it (tests/engine/backends/test_device_contract.py):

    class TestVulkanDevice(DeviceContract):
        backend = "vulkan"
        clock = "gpu-timestamps"
        matmul_kernel = "matmul_prefill.tiled[Q8_0]"   # the default prefill GEMM's profile name

Every check runs on every backend through the same calls, so a backend that drifts from the
others (a second name for weight memory, a profile in another shape, an open that ignores its
index) fails here.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from engine import backends
from engine.device_info import KINDS, DeviceEntry, MemoryReport, ProfileReport
from engine.errors import ConfigError
from engine.gguf_model import open_model
from engine.models import build_model
from tests.backend_params import open_backend, usable
from tests.op_cases import qtensor

Q8_ROW = 256 // 32 * 34  # bytes of a Q8_0 row of 256: 8 blocks of 34


def profile_two_matmuls(be: Any, seed: int, rows: int, qtype: str) -> tuple[Any, Any, Any]:
    """Profiling on, x [4, 256] times a weight of rows x 256 in qtype twice, the sum argmaxed:
    (the profile, x, the weight) on be."""
    rng = np.random.default_rng(seed)
    w = be.load_weight(qtensor(rng, (rows, 256), qtype))
    x = be.upload(rng.standard_normal((4, 256)).astype(np.float32))
    be.set_profiling(True)
    be.ops.argmax(be.ops.add(be.ops.matmul(x, w), be.ops.matmul(x, w)))
    return be.profile(), x, w


class DeviceContract:
    backend = ""
    clock = ""  # what ProfileReport.clock says on this backend
    matmul_kernel: str | None = None  # profile name of a T=4 Q8_0 matmul, where it is fixed

    def assert_released(self, be: Any) -> None:
        """Backend-specific evidence that close() let go of the device."""

    @pytest.fixture
    def entries(self) -> list[DeviceEntry]:
        why = usable().get(self.backend)
        if why is not None:
            pytest.skip(f"{self.backend} backend not usable here: {why}")
        return backends.backend_class(self.backend).list_devices()

    @pytest.fixture
    def be(self, entries):  # noqa: ANN001, ANN201 - the backend on the entry point's device
        b = open_backend(self.backend)
        yield b
        b.close()

    # --- list, open, close --------------------------------------------------------------
    def test_list_devices_describes_each_openable_device(self, entries):
        assert entries, f"{self.backend} is usable here but lists no device"
        assert [e.index for e in entries] == list(range(len(entries)))
        for e in entries:
            assert e.backend == self.backend and e.name and e.device_class and e.driver
            assert e.kind in KINDS and e.memory_bytes > 0
            assert set(e.to_dict()) == {
                "backend", "index", "name", "device_class", "kind", "driver", "memory_bytes"
            }  # fmt: skip

    def test_open_takes_the_index_it_is_given(self, entries):
        cls = backends.backend_class(self.backend)
        for e in entries:
            with cls.open(e.index) as be:
                info = be.device_info()
                assert (info.backend, info.name, info.device_class) == (
                    self.backend, e.name, e.device_class
                )  # fmt: skip
                assert info.extra.get("index", 0) == e.index

    def test_open_a_missing_index_is_one_clear_error(self, entries):
        n = len(entries)
        with pytest.raises(ConfigError, match=rf"^{self.backend} device {n}: no such device"):
            backends.create(self.backend, device=n)

    def test_close_is_idempotent_and_releases(self, entries):
        be = backends.backend_class(self.backend).open(entries[0].index)
        be.close()
        self.assert_released(be)
        be.close()  # a second close: nothing left to free, no error
        with backends.create(self.backend, device=entries[0].index) as again:  # reopens
            assert again.device_info().device_class == entries[0].device_class
        self.assert_released(again)

    # --- memory -------------------------------------------------------------------------
    def test_memory_report_counts_weights_and_caches_while_they_live(self, be):
        gc.collect()
        r0 = be.memory_report()
        assert isinstance(r0, MemoryReport)
        w = be.load_weight(qtensor(np.random.default_rng(0), (64, 256), "Q8_0"))
        cache = be.new_kv_cache(2, 16, 2, 32)  # 2 layers x (K, V) x 16 x 2 x 32 float32
        be.synchronize()
        r1 = be.memory_report()
        assert r1.weight_bytes - r0.weight_bytes == 64 * Q8_ROW
        assert r1.kv_state_bytes - r0.kv_state_bytes == 2 * 2 * 16 * 2 * 32 * 4
        assert r1.total_bytes == r1.weight_bytes + r1.kv_state_bytes + r1.scratch_bytes
        assert r1.scratch_bytes >= 0
        names = {"weight_bytes", "kv_state_bytes", "scratch_bytes", "total_bytes"}
        assert set(r1.to_dict()) == names
        del w, cache
        gc.collect()
        r2 = be.memory_report()
        assert (r2.weight_bytes, r2.kv_state_bytes) == (r0.weight_bytes, r0.kv_state_bytes)

    def test_memory_report_counts_norms_as_weights(self, be):
        """A 1-D weight (norm, bias) is a weight too, not scratch (Vulkan once left it out)."""
        gc.collect()
        r0 = be.memory_report()
        w = be.load_weight(qtensor(np.random.default_rng(0), (256,), "F32"))
        assert be.memory_report().weight_bytes - r0.weight_bytes >= 4 * 256
        del w

    def test_release_unused_keeps_what_the_config_runs(self, be):
        """release_unused frees only what no one holds: the weights and a live cache stay, and
        the same matmul gives the same bits after it."""
        rng = np.random.default_rng(2)
        w = be.load_weight(qtensor(rng, (64, 256), "Q8_0"))
        cache = be.new_kv_cache(1, 8, 2, 32)
        x = be.upload(rng.standard_normal((4, 256)).astype(np.float32))
        before = be.download(be.ops.matmul(x, w))
        r0 = be.memory_report()
        be.release_unused()
        r1 = be.memory_report()
        assert r1.kv_state_bytes == r0.kv_state_bytes and r1.weight_bytes <= r0.weight_bytes
        np.testing.assert_array_equal(be.download(be.ops.matmul(x, w)), before)
        del cache

    def test_driver_memory_is_a_figure_or_says_why_not(self, be):
        used, what = be.driver_memory()
        assert what  # what the figure counts, or why there is none
        assert used is None or (isinstance(used, int) and used > 0)

    # --- profile ------------------------------------------------------------------------
    def test_profile_times_each_kernel_until_switched_off(self, be):
        rep, x, w = profile_two_matmuls(be, 1, 64, "Q8_0")
        assert isinstance(rep, ProfileReport) and rep.clock == self.clock
        assert rep.kernels and all(k.calls > 0 and k.total_ms > 0 for k in rep.kernels.values())
        assert list(rep.kernels) == sorted(rep.kernels, key=lambda n: -rep.kernels[n].total_ms)
        assert rep.total_ms == pytest.approx(sum(k.total_ms for k in rep.kernels.values()))
        if self.matmul_kernel is not None:
            assert rep.kernels[self.matmul_kernel].calls == 2
        assert be.profile().kernels == {}  # the first report reset it
        be.ops.matmul(x, w)
        assert sum(k.calls for k in be.profile(reset=False).kernels.values()) >= 1
        be.set_profiling(False)
        be.profile()
        be.download(be.ops.matmul(x, w))
        assert be.profile().kernels == {}

    def test_profiled_generation_is_the_same_generation(self, be, tiny_model_path):
        """Profiling decode (CUDA: eager launches instead of the graph) changes no token, and
        the report names the kernels of both prefill and decode."""
        model = build_model(open_model(tiny_model_path), be)
        plain = model.generate([11, 12, 13, 14, 15], 4).tokens
        be.set_profiling(True)
        profiled = model.generate([11, 12, 13, 14, 15], 4).tokens
        rep = be.profile()
        be.set_profiling(False)
        assert profiled == plain
        assert sum(k.calls for k in rep.kernels.values()) > 4 * model.spec.n_layers
