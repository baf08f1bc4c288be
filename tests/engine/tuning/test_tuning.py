"""The tuning registry and TuningConfig: defaults, validation errors, TOML round trip,
constraints, and the committed promoted configs (lookup:
tests/engine/tuning/test_promoted_shape.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ConfigError
from engine.tuning import REGISTRY, Constraint, Param, TuningConfig, Variant
from engine.tuning.promoted import find_promoted, promoted_path


def test_default_config_takes_registry_defaults():
    cfg = TuningConfig.default("numpy")
    assert (
        cfg.prefill_chunk == REGISTRY.op("numpy", "prefill").default.param("chunk_tokens").default
    )
    assert cfg.op("matmul_prefill").variant == "cached_f32"
    assert set(dict(cfg.ops)) == {o.name for o in REGISTRY.ops("numpy")}


def test_from_flat_and_replace():
    flat = {"prefill.chunk_tokens": 8, "matmul_decode.variant": "ondemand"}
    cfg = TuningConfig.from_flat("numpy", flat)
    assert cfg.prefill_chunk == 8 and cfg.op("matmul_decode").variant == "ondemand"
    c2 = cfg.replace(**{"prefill.chunk_tokens": 16})
    assert c2.prefill_chunk == 16 and cfg.prefill_chunk == 8  # immutable
    assert cfg.diff(c2) == {"prefill.chunk_tokens": (8, 16)}
    assert hash(cfg) != hash(c2) and cfg == TuningConfig.from_flat("numpy", cfg.flat())


@pytest.mark.parametrize(
    "flat,needle",
    [
        ({"prefill.chunk_tokens": 7}, "allowed: [1, 2, 4"),
        ({"prefill.chunk_tokens": "8"}, "not allowed"),
        ({"nosuchop.x": 1}, "no such op"),
        ({"matmul_prefill.variant": "warp9"}, "allowed: cached_f32, ondemand"),
        ({"prefill.tile": 4}, "has no parameter(s) ['tile']"),
        ({"chunk_tokens": 4}, "must look like 'op.param'"),
    ],
)
def test_bad_values_name_key_and_allowed(flat, needle):
    with pytest.raises(ConfigError, match=None) as e:
        TuningConfig.from_flat("numpy", flat)
    assert needle in str(e.value)


def test_unknown_backend():
    with pytest.raises(ConfigError, match="no kernels registered for backend 'tpu'"):
        TuningConfig.default("tpu")


def test_toml_round_trip(tmp_path):
    flat = {"prefill.chunk_tokens": 40, "matmul_prefill.variant": "ondemand"}
    cfg = TuningConfig.from_flat("numpy", flat)
    p = tmp_path / "c.toml"
    p.write_text(cfg.to_toml() + "\n[evidence]\ntrial = 3\n")
    assert TuningConfig.from_toml(p) == cfg
    only = cfg.to_toml(only_changed=True)
    assert "chunk_tokens = 40" in only and "rope" not in only
    p.write_text(only)
    assert TuningConfig.from_toml(p) == cfg


@pytest.mark.parametrize(
    "path",
    sorted((Path(__file__).parents[3] / "configs").glob("*/*/*.toml")),
    ids=lambda p: f"{p.parents[1].name}/{p.parent.name}/{p.name[:24]}",
)
def test_committed_promoted_configs_load(path):
    """Every promoted file on main loads against today's registry: a knob removed or renamed,
    or a value no longer allowed, fails here rather than on the GPU node that loads it (the
    eighth session removed matmul_decode.pipe*). Each sits where its [evidence.tuned_on] keys
    it, the engine finds it for that shape and context, and a synthetic model's shape is the
    preset's."""
    from engine.synth import preset_shape
    from engine.tuning.promoted import read_evidence, read_tuned_on
    from worker.models import is_synthetic, synthetic_args

    cfg = TuningConfig.from_toml(path)
    assert cfg.backend in REGISTRY.backends() and cfg.ops
    ev = read_evidence(path)
    shape, ctx = read_tuned_on(ev, path)
    root, device_class = path.parents[2], path.parents[1].name
    assert promoted_path(device_class, shape, ctx, root) == path
    found = find_promoted(cfg.backend, device_class, shape, ctx, root)
    assert found is not None and found.path == path and found.reason.startswith("exact shape")
    if is_synthetic(ev["model"]):
        preset, arch, mix = synthetic_args(ev["model"])
        assert preset_shape(arch, preset, mix) == shape


def test_toml_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("backend = 'numpy'\n[ops.prefill]\nchunk_tokens = 3\n")
    with pytest.raises(ConfigError, match=r"bad.toml: prefill.chunk_tokens = 3"):
        TuningConfig.from_toml(p)
    p.write_text("backend = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        TuningConfig.from_toml(p)
    with pytest.raises(ConfigError, match="no such config file"):
        TuningConfig.from_toml(tmp_path / "missing.toml")
    p.write_text("backend = 'numpy'\n")
    with pytest.raises(ConfigError, match="for backend 'numpy', not 'vulkan'"):
        TuningConfig.from_toml(p, "vulkan")


@pytest.mark.parametrize("table", ["op.prefill", "opss.prefill", "prefil"])
def test_unknown_top_level_key_is_an_error(tmp_path, table):
    """A misspelt [ops.*] table was ignored and the defaults benchmarked under the file's name."""
    p = tmp_path / "typo.toml"
    p.write_text(f"backend = 'numpy'\n[{table}]\nmax_cols = 16\n")
    key = table.split(".")[0]
    with pytest.raises(ConfigError, match=rf"typo.toml: unknown top-level key\(s\) {key};"):
        TuningConfig.from_toml(p)


def test_config_path_that_is_a_directory_or_binary(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        TuningConfig.from_toml(tmp_path)
    b = tmp_path / "blob.toml"
    b.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="blob.toml: not a text file"):
        TuningConfig.from_toml(b)


def test_constraints_and_supports():
    rule = Constraint("chunks of at most 8 on this test op", lambda c, d: c.prefill_chunk <= 8)
    REGISTRY.register(
        "numpy",
        "test_op",
        [
            Variant(
                "numpy",
                "test_op",
                "v",
                constraints=(rule,),
                params=(Param("p", (1, 2), 1),),
                numeric="order_only",
            )
        ],
    )
    try:
        assert TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 8}).problems() == []
        bad = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 16})
        assert bad.problems() == ["test_op.v: chunks of at most 8 on this test op"]
        with pytest.raises(ConfigError, match="violates constraints"):
            bad.check()
    finally:
        REGISTRY.unregister("numpy", "test_op")
    assert REGISTRY.supports("numpy", "matmul_decode", "Q4_K")
    assert not REGISTRY.supports("numpy", "matmul_decode", "IQ2_XXS")
    assert not REGISTRY.supports("numpy", "no_op")


def test_param_default_must_be_allowed():
    with pytest.raises(ValueError, match="default 3 not in"):
        Param("x", (1, 2), 3)


def test_prefill_chunk_is_chunk_tokens_on_every_backend():
    """One schedule knob: prefill.chunk_tokens is the tokens per forward on every backend, and
    the column tile of a batched matmul is a knob of the variants that tile columns."""
    for backend in ("numpy", "vulkan", "cuda"):
        cfg = TuningConfig.default(backend).replace(**{"prefill.chunk_tokens": 40})
        assert cfg.prefill_chunk == 40
    vk = TuningConfig.default("vulkan").replace(**{"matmul_prefill.variant": "kpar"})
    assert vk.replace(**{"matmul_prefill.max_cols": 8}).prefill_chunk == 512  # apart
    with pytest.raises(ConfigError, match="no parameter"):
        vk.replace(**{"matmul_prefill.variant": "tiled", "matmul_prefill.max_cols": 8})


def test_op_table_outside_ops_is_an_error(tmp_path):
    """[matmul_prefill] at the top level (instead of [ops.matmul_prefill]) used to be ignored,
    silently running the defaults."""
    p = tmp_path / "c.toml"
    p.write_text('backend = "vulkan"\n[matmul_prefill]\nvariant = "tiled"\n')
    with pytest.raises(ConfigError, match=r"\[ops.matmul_prefill\]"):
        TuningConfig.from_toml(p)
    p.write_text('backend = "vulkan"\n[ops.matmul_prefill]\nvariant = "tiled"\n')
    assert TuningConfig.from_toml(p).op("matmul_prefill").variant == "tiled"


def test_prefill_declaration_is_the_same_on_every_backend():
    """register_prefill declares chunk_tokens itself, with one set of choices; a backend adds
    only its own schedule knobs, and no backend declares a column tile on the schedule."""
    op = REGISTRY.register_prefill("nobackend", 64, doc="")
    try:
        assert op.default.param("chunk_tokens").default == 64
    finally:
        REGISTRY.unregister("nobackend", "prefill")
    choices = set()
    for backend in ("numpy", "vulkan", "cuda"):
        (v,) = REGISTRY.op(backend, "prefill").variants
        assert v.name == "batched" and "max_cols" not in {p.name for p in v.params}
        choices.add(v.param("chunk_tokens").choices)
    assert len(choices) == 1


def test_coopmat_warp_tile_past_its_tile_is_refused_not_a_crash():
    """matmul_prefill.coopmat with a subgroup tile wider than the tile (no whole subgroup tile)
    and one_tile: problems() names the tile rule on no device (it divided by zero before)."""
    cfg = TuningConfig.default("vulkan").replace(
        **{
            "matmul_prefill.variant": "coopmat",
            "matmul_prefill.tile_n": 32,
            "matmul_prefill.warp_n": 64,
            "matmul_prefill.one_tile": True,
        }
    )
    assert any("tile" in p for p in cfg.problems(None))
