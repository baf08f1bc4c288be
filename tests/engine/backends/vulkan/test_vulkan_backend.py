"""The Vulkan runtime around the kernels: device info and classes, the SPIR-V disk cache,
compile and run failures that leave the process usable, recorded-graph replay, the per-kernel
profile, and the registry readable without the Vulkan binding."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import EngineError, KernelCompileError, UnsupportedError
from engine.gguf_model import QTensor
from engine.tuning import TuningConfig
from tests.device_contract import profile_two_matmuls
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    assert_no_validation_errors,
    make_backend,
    nmse,
    qtensor,
    require_vulkan,
)

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def vb():
    be = make_backend()
    yield be
    assert_no_validation_errors(be)
    be.close()


# --- device -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "vendor,name,cls",
    [
        (0x10DE, "NVIDIA H200", "nvidia-h200"),
        (0x10DE, "NVIDIA H200 NVL", "nvidia-h200"),
        (0x10DE, "NVIDIA GeForce RTX 4090", "nvidia-rtx4090"),
        (0x10DE, "NVIDIA A100-SXM4-80GB", "nvidia-a100"),
        (0x1002, "AMD Radeon AI PRO R9700 (RADV GFX1201)", "r9700"),
        (0x1002, "AMD Radeon RX 9070 XT (RADV GFX1201)", "rx9070xt"),
        (0x10005, "llvmpipe (LLVM 15.0.6, 256 bits)", "llvmpipe"),
        (0x8086, "Intel(R) Arc(tm) A770 Graphics (DG2)", "intel-arc-a770-graphics"),
    ],
)
def test_device_class(vendor, name, cls):
    require_vulkan()
    from engine.backends.vulkan.device import device_class

    assert device_class(vendor, name) == cls


def test_device_info(vb):
    info = vb.device_info()
    assert info.backend == "vulkan" and info.name and info.vendor and info.driver
    assert info.memory_bytes > 0 and info.subgroup_size >= 1
    for key in (
        "max_storage_buffer_range",
        "max_shared_memory",
        "max_workgroup_invocations",
        "min_subgroup_size",
        "max_subgroup_size",
        "subgroup_size_control",
    ):
        assert key in info.extra
    if "llvmpipe" in info.name:
        assert info.device_class == "llvmpipe" and info.subgroup_size == 8
    assert TuningConfig.default("vulkan").problems(info) == []


# --- SPIR-V cache -----------------------------------------------------------------------
def test_spirv_cache_keyed_by_compiler(tmp_path, monkeypatch):
    from engine.backends.vulkan import spirv

    if spirv.glslc_version(spirv._glslc()) is None:
        pytest.skip("glslc not installed")
    root = tmp_path / "spv"
    code = spirv.compile_spirv("argmax", (), root)
    assert code[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic, little endian
    files = list(root.glob("*/argmax-*.spv"))
    assert len(files) == 1 and (files[0].parent / "COMPILER").exists()

    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(
        spirv.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k)
    )
    assert spirv.compile_spirv("argmax", (), root) == code
    assert not calls, "a cached build must not call glslc"

    # Another compiler version: the old entry is not reused, a new one is written beside it.
    monkeypatch.setattr(spirv, "glslc_version", lambda g: "glslc from another release")
    spirv.compile_spirv("argmax", (), root)
    assert calls and len(list(root.glob("*/argmax-*.spv"))) == 2

    # Defines are part of the key.
    spirv.compile_spirv("eltwise", ("OP_ADD",), root)
    spirv.compile_spirv("eltwise", ("OP_SWIGLU",), root)
    assert len(list(root.glob("*/eltwise-*.spv"))) == 2


def test_spirv_cache_carried_to_a_machine_without_glslc(tmp_path, monkeypatch):
    from engine.backends.vulkan import spirv

    if spirv.glslc_version(spirv._glslc()) is None:
        pytest.skip("glslc not installed")
    built = tmp_path / "built"
    code = spirv.compile_spirv("rms_norm", (), built)
    carried = tmp_path / "carried"
    shutil.copytree(built, carried)  # relocated: nothing in the cache names its own path
    monkeypatch.setattr(spirv, "_glslc", lambda: None)
    monkeypatch.setenv("FLEETTUNE_SPIRV_CACHE", str(carried))
    assert spirv.compile_spirv("rms_norm", ()) == code
    with pytest.raises(KernelCompileError, match="FLEETTUNE_SPIRV_CACHE"):
        spirv.compile_spirv("attention", ())


def test_precompile_covers_every_build(tmp_path):
    from engine.backends.vulkan import spirv
    from engine.backends.vulkan.kernels import all_builds
    from engine.backends.vulkan.probe import PROBE_BUILDS

    if spirv.glslc_version(spirv._glslc()) is None:
        pytest.skip("glslc not installed")
    out = tmp_path / "all"
    assert spirv.main(["--out", str(out)]) == 0
    # the backend's builds and tools/vulkan_probe.py's microbenchmarks, none shared
    assert not set(all_builds()) & set(PROBE_BUILDS)
    assert len(list(out.glob("*/*.spv"))) == len(all_builds()) + len(PROBE_BUILDS)


def test_every_attention_and_argmax_variant_has_its_passes_precompiled():
    """The two-pass variants' programs come from kernels.PASSES; a variant registered without an
    entry there would be missing from the precompiled set (and fail at set_config)."""
    from engine.backends.vulkan.kernels import all_builds, programs
    from engine.tuning import REGISTRY, TuningConfig

    builds = set(all_builds())
    for op in ("attention", "argmax"):
        for v in REGISTRY.op("vulkan", op).variants:
            cfg = TuningConfig.default("vulkan").replace(**{f"{op}.variant": v.name})
            passes = programs(op, cfg.op(op))
            # split: partial, merge, merge_q8 (the merge under matmul_decode.mmvw) and the
            # fuse_combine partial passes (fused, fused_q8); coopmat and flash: split's + a
            # flash pass; flash also its key-split pass (attention.key_chunk)
            want = {"split": 5, "two_stage": 2, "coopmat": 6, "flash": 7}.get(v.name, 1)
            assert len(passes) == want
            assert {(p.shader, p.defines) for p in passes} <= builds


# --- failures leave the backend usable --------------------------------------------------
def test_compile_error_reports_log_and_backend_stays_usable(tmp_path, monkeypatch):
    from engine.backends import kernel_sources
    from engine.backends.vulkan import spirv

    if spirv.glslc_version(spirv._glslc()) is None:
        pytest.skip("glslc not installed")
    be = make_backend()
    try:
        rng = np.random.default_rng(0)
        w = qtensor(rng, (16, 64), "Q8_0")
        wv = be.load_weight(w)
        x = rng.standard_normal((1, 64)).astype(np.float32)
        ref = be.download(be.ops.matmul(be.upload(x), wv))
        (tmp_path / "src" / "vulkan").mkdir(parents=True)
        text = (ROOT / "shaders" / "vulkan" / "matmul_decode.comp").read_text()
        # break every variant (a config may pick any of them), in an overlay of the sources
        src = tmp_path / "src" / "vulkan" / "matmul_decode.comp"
        src.write_text(text.replace("subgroupAdd(", "subgroupAdd(oops, "))
        monkeypatch.setenv(kernel_sources.ENV, str(tmp_path / "src"))
        monkeypatch.setenv("FLEETTUNE_SPIRV_CACHE", str(tmp_path / "cache"))
        cand = TuningConfig.default("vulkan").replace(**{"matmul_decode.rows_per_wg": 8})
        be.pipes.modules.clear()  # force the (broken) source to be compiled again
        with pytest.raises(KernelCompileError, match="oops"):
            be.set_config(cand)
        assert be.config == TuningConfig.default("vulkan")
        monkeypatch.delenv(kernel_sources.ENV)
        assert np.array_equal(be.download(be.ops.matmul(be.upload(x), wv)), ref)
        be.set_config(cand)  # the next config compiles and runs
        assert nmse(ref, be.download(be.ops.matmul(be.upload(x), wv))) < 1e-10
    finally:
        be.close()


def test_unsupported_weight_type_names_tensor_and_type(vb):
    raw = np.zeros((2, 176), np.uint8)  # two Q5_K rows of 256
    with pytest.raises(UnsupportedError, match=r"blk\.3\.ffn_down\.weight.*Q5_K"):
        vb.load_weight(QTensor("blk.3.ffn_down.weight", "Q5_K", (2, 256), raw))


def test_hung_kernel_raises_instead_of_hanging():
    be = make_backend()
    try:
        rng = np.random.default_rng(1)
        wv = be.load_weight(qtensor(rng, (4096, 1024), "Q4_0"))
        x = be.upload(rng.standard_normal((64, 1024)).astype(np.float32))
        be.stream.timeout_s = 0.0  # nothing finishes in zero time: stands in for a hung kernel
        with pytest.raises(EngineError, match="did not finish"):
            be.download(be.ops.matmul(x, wv))
        with pytest.raises(EngineError):  # and later calls fail fast too
            be.download(be.ops.matmul(x, wv))
    finally:
        be.close()


# --- recording, replay, profile ---------------------------------------------------------
def _toy_weights(be, seed: int) -> dict:  # noqa: ANN001
    """_toy_step's weights on be: a 50-token embedding, one 64 x 64 matmul, the head."""
    rng = np.random.default_rng(seed)
    qts = {
        "emb": qtensor(rng, (50, 64), "Q8_0", std=1.0),
        "wq": qtensor(rng, (64, 64), "Q5_0"),
        "head": qtensor(rng, (50, 64), "Q4_1", std=1.0),
    }
    return {k: be.load_weight(v) for k, v in qts.items()}


def _toy_step(be, wv, tok, pos, cache):  # noqa: ANN001, ANN202
    """A decode-shaped graph: embedding -> matmul -> rope -> kv_write -> attention -> argmax."""
    x = be.ops.embedding(wv["emb"], tok)  # [1, 64]
    q = be.ops.reshape(be.ops.matmul(x, wv["wq"]), (1, 2, 32))
    q = be.ops.rope(q, pos, 1e4, True)
    be.ops.kv_write(cache, 0, q, q, pos)
    a = be.ops.reshape(be.ops.attention(q, cache, 0, pos), (1, 64))
    logits = be.ops.matmul(a, wv["head"])
    return logits, be.ops.argmax(logits)


def test_replayed_decode_matches_recorded(vb):
    wv = _toy_weights(vb, 2)

    def run(replay: bool) -> tuple[list[int], list[np.ndarray]]:
        vb.set_config(TuningConfig.default("vulkan").replace(**{"submit.replay": replay}))
        cache = vb.new_kv_cache(1, 24, 2, 32)
        tok = vb.upload(np.array([3], np.int32))
        toks, logits = [], []
        for pos in range(20):
            lg, tok = _toy_step(vb, wv, tok, pos, cache)
            logits.append(vb.download(lg))
            toks.append(int(vb.download(tok)[0]))
        return toks, logits

    before = vb.stats()
    toks, logits = run(True)
    after = vb.stats()
    assert after["replays"] - before["replays"] >= 10, "decode steps should replay"
    toks2, logits2 = run(False)
    assert toks == toks2
    for a, b in zip(logits, logits2, strict=True):
        assert np.array_equal(a, b)


def test_submit_in_flight_while_recording(vb):
    """A submit forced by the node budget does not wait: the next ops record while it runs.
    Uploads (possibly into pool buffers the device still reads) and reads in between stay
    correct."""
    vb.set_config(TuningConfig.default("vulkan").replace(**{"submit.max_nodes": 64}))
    rng = np.random.default_rng(9)
    ref = rng.standard_normal((3, 40)).astype(np.float32)
    x = vb.upload(ref)
    in_flight = 0
    for i in range(4):
        b = rng.standard_normal((3, 40)).astype(np.float32)
        bt = vb.upload(b)  # written by the host while an earlier submit may still run
        for _ in range(100):
            x = vb.ops.add(x, bt)
            ref = ref + b
            in_flight += vb.stream.inflight is not None
        if i == 1:
            assert np.array_equal(vb.download(x), ref)
            assert vb.stream.inflight is None
    assert in_flight > 0, "no submit stayed in flight"
    assert np.array_equal(vb.download(x), ref)


def test_argmax_result_is_never_stale(vb):
    """Each argmax is a new device tensor and download reads that tensor after the work that
    writes it: two steps with different logits give different tokens even when the second is
    recorded into a replayed command buffer."""
    seen = []
    for i in range(6):
        lg = np.zeros((1, 100), np.float32)
        lg[0, 10 + i] = 1.0
        seen.append(int(vb.download(vb.ops.argmax(vb.upload(lg)))[0]))
    assert seen == [10, 11, 12, 13, 14, 15]


def test_profile_reports_per_kernel_times(vb):
    prof, x, wv = profile_two_matmuls(vb, 4, 128, "Q4_K")
    assert prof.clock == "gpu-timestamps"
    assert prof.kernels["matmul_prefill.tiled[Q4_K]"].calls == 2
    assert all(k.total_ms > 0 for k in prof.kernels.values())
    assert {"add.default", "argmax.two_stage", "argmax.two_stage.merge"} <= set(prof.kernels)
    vb.set_profiling(False)
    vb.ops.matmul(x, wv)
    assert vb.profile().kernels == {}


def test_registry_module_imports_no_vulkan():
    code = (
        "import sys; sys.modules['vulkan'] = None\n"
        "from engine.tuning import REGISTRY, TuningConfig\n"
        "import engine.backends.vulkan.kernels, engine.backends.vulkan.spirv\n"
        "assert REGISTRY.supports('vulkan', 'matmul_prefill', 'Q4_K')\n"
        "print(TuningConfig.default('vulkan').prefill_chunk)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr


def test_decode_graph_replays_and_recaptures(vb):
    """decode_step captures the step once and replays it without calling the ops; crossing the
    RoPE table's end (1024 positions) or changing the cache recaptures; results equal plain
    steps at every position."""
    wv = _toy_weights(vb, 6)
    calls = []

    def run(graph: bool, p0: int, n: int) -> list[np.ndarray]:
        cache = vb.new_kv_cache(1, p0 + n + 1, 2, 32)
        tok = vb.upload(np.array([3], np.int32))
        out = []
        for pos in range(p0, p0 + n):

            def step(t, p):  # noqa: ANN001, ANN202
                calls.append(p)
                return _toy_step(vb, wv, t, p, cache)

            lg, tok = vb.decode_step(step, tok, pos, cache) if graph else step(tok, pos)
            out.append(vb.download(lg))
            out.append(vb.download(tok))
        return out

    plain = run(False, 1015, 14)
    calls.clear()
    vb._rope_tables.clear()  # start below the table's first growth again
    graphed = run(True, 1015, 14)
    assert calls == [1015, 1024], (
        f"Python ran the step at {calls}: expected a capture at 1015 and a recapture when "
        "position 1024 outgrew the 1024-entry RoPE table"
    )
    for a, b in zip(plain, graphed, strict=True):
        assert np.array_equal(a, b)
    calls.clear()
    run(True, 0, 4)  # a new cache: captured again
    assert calls[:1] == [0] and len(calls) == 1


def _attention_step(be, wv, tok, pos, cache):  # noqa: ANN001, ANN202
    """A decode step whose "logits" are the attention output: embedding -> q, k, v (GQA 4 / 2,
    D 16) -> RoPE -> KV write -> attention; the next token is its argmax."""
    x = be.ops.embedding(wv["emb"], tok)  # [1, 64]
    q = be.ops.rope(be.ops.reshape(be.ops.matmul(x, wv["wq"]), (1, 4, 16)), pos, 1e4, True)
    k = be.ops.rope(be.ops.reshape(be.ops.matmul(x, wv["wk"]), (1, 2, 16)), pos, 1e4, True)
    be.ops.kv_write(cache, 0, k, be.ops.reshape(be.ops.matmul(x, wv["wv"]), (1, 2, 16)), pos)
    a = be.ops.reshape(be.ops.attention(q, cache, 0, pos), (1, 64))
    return a, be.ops.argmax(a)


@pytest.mark.parametrize("splits", [4, 8])
def test_decode_graph_split_attention_follows_the_position(vb, splits):
    """The split-KV kernel inside a replayed decode graph: grid and push constants are those of
    the step captured at position 0, the key ranges are recomputed on the device from the
    dynamic position. Over 40 steps (ranges of ceil(L / splits) keys crossing every tile and
    range boundary; empty ranges while L < splits) the outputs equal the NumPy backend's."""
    from engine.backends.numpy_ref import NumpyBackend

    rng = np.random.default_rng(11)
    qts = {
        "emb": qtensor(rng, (64, 64), "Q8_0", std=1.0),
        "wq": qtensor(rng, (64, 64), "Q8_0", std=0.3),
        "wk": qtensor(rng, (32, 64), "Q8_0", std=0.3),
        "wv": qtensor(rng, (32, 64), "Q8_0", std=1.0),
    }
    vb.set_config(
        TuningConfig.default("vulkan").replace(
            **{
                "attention.variant": "split",
                "attention.splits": splits,
                "attention.key_threads": 4,
                "attention.wg_size": 32,  # tiles of 8 keys
                "argmax.variant": "two_stage",
                "argmax.slices": 8,
            }
        )
    )
    nb = NumpyBackend()
    wv = {k: vb.load_weight(v) for k, v in qts.items()}
    wn = {k: nb.load_weight(v) for k, v in qts.items()}
    cache, cache_n = vb.new_kv_cache(1, 48, 2, 16), nb.new_kv_cache(1, 48, 2, 16)
    tok, tok_n = vb.upload(np.array([3], np.int32)), np.array([3], np.int32)
    calls = []

    def step(t, p):  # noqa: ANN001, ANN202
        calls.append(p)
        return _attention_step(vb, wv, t, p, cache)

    before = vb.stats()["replays"]
    for pos in range(40):
        a, tok = vb.decode_step(step, tok, pos, cache)
        a_n, tok_n = _attention_step(nb, wn, tok_n, pos, cache_n)
        assert nmse(a_n, vb.download(a)) < 1e-10, f"position {pos}"
        assert vb.download(tok).tolist() == np.asarray(tok_n).tolist(), f"position {pos}"
    assert calls == [0], f"the step ran in Python at {calls}: expected one capture at 0"
    # step 1 records the graph's command buffer (step 0 ran the ops); steps 2..39 resubmit it
    assert vb.stats()["replays"] - before >= 38


def test_staging_paths_of_discrete_gpus(tiny_model_path, monkeypatch):
    """Discrete GPUs (the H200) have no host-visible device memory: uploads go through staging
    buffers copied in stream order (weights in chunks), downloads through a copy in the same
    submit. Forced here on unified memory, the model must still match the NumPy backend."""
    require_vulkan()
    from engine.backends import default_device
    from engine.backends.numpy_ref import NumpyBackend
    from engine.backends.vulkan import backend as vkb
    from engine.gguf_model import open_model
    from engine.models import build_model

    monkeypatch.setattr(vkb, "STAGING_CHUNK", 4096)  # weights cross several chunks
    be = vkb.VulkanBackend(device=default_device("vulkan"), staging=True)
    try:
        assert not be.dev.mem.unified
        x = np.arange(24, dtype=np.float32).reshape(6, 4)
        t = be.upload(x)
        assert t.buf.host is None, "device buffers must not be mapped in staging mode"
        assert np.array_equal(be.download(be.ops.rows(t, 2, 5)), x[2:5])
        rng = np.random.default_rng(8)
        w = qtensor(rng, (300, 256), "Q6_K")  # 63 KB: 16 staging chunks
        wv = be.load_weight(w)
        xs = rng.standard_normal((3, 256)).astype(np.float32)
        ref = NumpyBackend()
        assert (
            nmse(
                ref.ops.matmul(xs, ref.load_weight(w)),
                be.download(be.ops.matmul(be.upload(xs), wv)),
            )
            < 1e-10
        )
        g = open_model(tiny_model_path)
        before = be.stats()
        a = build_model(g, be).generate(list(range(3, 40)), 10, keep_logits=True)
        # each step's graph + the token's staging copy replays (keyed on the graph's key)
        assert be.stats()["replays"] - before["replays"] >= 7
        b = build_model(g, NumpyBackend()).generate(list(range(3, 40)), 10, keep_logits=True)
        assert a.tokens == b.tokens
        assert np.abs(a.last_logits - b.last_logits).max() < 1e-3
        assert_no_validation_errors(be)
    finally:
        be.close()


# The H200's memory types through NVIDIA 580 (tools/vulkan_probe.py, 2026-12-01): (index,
# property flags, heap), heaps in MiB. Type 4 is resizable BAR (device-local, host-visible,
# coherent) on the 141 GiB device heap.
H200_TYPES = [(0, 0x0, 0), (1, 0x1, 1), (2, 0x6, 0), (3, 0xE, 0), (4, 0x7, 1)]
H200_HEAPS = [96665 << 20, 143771 << 20]


def test_discrete_gpu_keeps_tensors_out_of_the_bar():
    """A discrete GPU's tensors go to device-only memory even with resizable BAR (a BAR page the
    CPU has read was followed by 4x slower GEMMs on the H200), staging and downloads to cached
    system memory, the dynamic scalars to the BAR; FLEETTUNE_VK_REBAR=1 restores the unified
    choice; an integrated / CPU device with one host-visible device heap stays unified."""
    from engine.backends.vulkan.device import MemoryTypes, choose_memory_types

    assert choose_memory_types(H200_TYPES, H200_HEAPS, True) == MemoryTypes(1, 3, False, 4)
    assert choose_memory_types(H200_TYPES, H200_HEAPS, False) == MemoryTypes(4, 4, True, 4)
    lavapipe = [(0, 0xF, 0)]
    assert choose_memory_types(lavapipe, [2 << 30], False) == MemoryTypes(0, 0, True, 0)
    # a discrete GPU with a 256 MiB BAR window only: device-only tensors, the window for scalars
    window = [(0, 0x1, 0), (1, 0x6, 1), (2, 0x7, 2)]
    heaps = [24 << 30, 64 << 30, 256 << 20]
    assert choose_memory_types(window, heaps, True) == MemoryTypes(0, 1, False, 2)
    assert choose_memory_types(window, heaps, False) == MemoryTypes(0, 1, False, 2)


def test_rebar_override(monkeypatch):
    from engine.backends.vulkan.device import MemoryTypes, choose_memory_types

    monkeypatch.setenv("FLEETTUNE_VK_REBAR", "1")
    assert choose_memory_types(H200_TYPES, H200_HEAPS, True) == MemoryTypes(4, 4, True, 4)
