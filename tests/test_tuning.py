"""The tuning registry and TuningConfig: defaults, validation errors, TOML round trip,
constraints, and promoted-config lookup."""

from __future__ import annotations

import pytest

from engine.errors import ConfigError
from engine.tuning import REGISTRY, Constraint, Param, TuningConfig, Variant
from engine.tuning.promoted import find_promoted, promoted_path


def test_default_config_takes_registry_defaults():
    cfg = TuningConfig.default("numpy")
    assert cfg.max_cols == REGISTRY.op("numpy", "prefill").default.param("max_cols").default
    assert cfg.op("matmul_prefill").variant == "cached_f32"
    assert set(dict(cfg.ops)) == {o.name for o in REGISTRY.ops("numpy")}


def test_from_flat_and_replace():
    flat = {"prefill.max_cols": 8, "matmul_decode.variant": "ondemand"}
    cfg = TuningConfig.from_flat("numpy", flat)
    assert cfg.max_cols == 8 and cfg.op("matmul_decode").variant == "ondemand"
    c2 = cfg.replace(**{"prefill.max_cols": 16})
    assert c2.max_cols == 16 and cfg.max_cols == 8  # immutable
    assert cfg.diff(c2) == {"prefill.max_cols": (8, 16)}
    assert hash(cfg) != hash(c2) and cfg == TuningConfig.from_flat("numpy", cfg.flat())


@pytest.mark.parametrize(
    "flat,needle",
    [
        ({"prefill.max_cols": 7}, "allowed: [1, 2, 4"),
        ({"prefill.max_cols": "8"}, "not allowed"),
        ({"nosuchop.x": 1}, "no such op"),
        ({"matmul_prefill.variant": "warp9"}, "allowed: cached_f32, ondemand"),
        ({"prefill.tile": 4}, "has no parameter(s) ['tile']"),
        ({"max_cols": 4}, "must look like 'op.param'"),
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
    flat = {"prefill.max_cols": 40, "matmul_prefill.variant": "ondemand"}
    cfg = TuningConfig.from_flat("numpy", flat)
    p = tmp_path / "c.toml"
    p.write_text(cfg.to_toml() + "\n[evidence]\ntrial = 3\n")
    assert TuningConfig.from_toml(p) == cfg
    only = cfg.to_toml(only_changed=True)
    assert "max_cols = 40" in only and "rope" not in only
    p.write_text(only)
    assert TuningConfig.from_toml(p) == cfg


def test_toml_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("backend = 'numpy'\n[ops.prefill]\nmax_cols = 3\n")
    with pytest.raises(ConfigError, match=r"bad.toml: prefill.max_cols = 3"):
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
    rule = Constraint("max_cols at most 8 on this test op", lambda c, d: c.max_cols <= 8)
    REGISTRY.register(
        "numpy",
        "test_op",
        [Variant("numpy", "test_op", "v", constraints=(rule,), params=(Param("p", (1, 2), 1),))],
    )
    try:
        assert TuningConfig.from_flat("numpy", {"prefill.max_cols": 8}).problems() == []
        bad = TuningConfig.from_flat("numpy", {"prefill.max_cols": 16})
        assert bad.problems() == ["test_op.v: max_cols at most 8 on this test op"]
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


def test_promoted_lookup(tmp_path):
    assert find_promoted("numpy", "cpu", "qwen2", tmp_path) is None
    p = promoted_path("cpu", "qwen2", tmp_path)
    p.parent.mkdir(parents=True)
    cfg = TuningConfig.default("numpy").replace(**{"prefill.max_cols": 16})
    p.write_text(cfg.to_toml())
    found = find_promoted("numpy", "cpu", "qwen2", tmp_path)
    assert found is not None and found[0] == cfg
    assert find_promoted("vulkan", "cpu", "qwen2", tmp_path) is None  # other backend: skipped


def test_engine_loads_the_promoted_config_for_its_device_class(
    tmp_path, monkeypatch, tiny_model_path
):
    from engine.runtime import load

    cfg = TuningConfig.default("numpy").replace(**{"prefill.max_cols": 8})
    p = promoted_path("cpu", "qwen2", tmp_path)
    p.parent.mkdir(parents=True)
    p.write_text(cfg.to_toml() + "\n[evidence]\ntrial = 7\n")
    monkeypatch.setenv("FLEETTUNE_CONFIGS", str(tmp_path))
    eng = load(tiny_model_path, "numpy")
    assert eng.config_source == f"promoted:{p}" and eng.model.config.max_cols == 8
    override = tmp_path / "mine.toml"
    override.write_text('backend = "numpy"\n[ops.prefill]\nmax_cols = 16\n')
    assert load(tiny_model_path, "numpy", override).model.config.max_cols == 16
    assert load(tiny_model_path, "numpy", use_promoted=False).config_source == "default"


def test_prefill_chunk_falls_back_to_max_cols():
    """Backends without prefill.chunk_tokens run one forward per MAX_COLS chunk; Vulkan's
    chunk_tokens sets the forward chunk, 0 restoring the seed's schedule."""
    np_cfg = TuningConfig.default("numpy").replace(**{"prefill.max_cols": 8})
    assert np_cfg.prefill_chunk == 8
    vk_cfg = TuningConfig.default("vulkan").replace(**{"prefill.max_cols": 8})
    assert vk_cfg.prefill_chunk == 512
    assert vk_cfg.replace(**{"prefill.chunk_tokens": 0}).prefill_chunk == 8
    assert vk_cfg.replace(**{"prefill.chunk_tokens": 128}).prefill_chunk == 128


def test_op_table_outside_ops_is_an_error(tmp_path):
    """[matmul_prefill] at the top level (instead of [ops.matmul_prefill]) used to be ignored,
    silently running the defaults."""
    p = tmp_path / "c.toml"
    p.write_text('backend = "vulkan"\n[matmul_prefill]\nvariant = "tiled"\n')
    with pytest.raises(ConfigError, match=r"\[ops.matmul_prefill\]"):
        TuningConfig.from_toml(p)
    p.write_text('backend = "vulkan"\n[ops.matmul_prefill]\nvariant = "tiled"\n')
    assert TuningConfig.from_toml(p).op("matmul_prefill").variant == "tiled"


def test_prefill_declaration_needs_max_cols():
    """The schedule reads prefill.max_cols on every backend: a declaration without it fails at
    registration, not when a model first runs."""
    with pytest.raises(ValueError, match="max_cols is required"):
        REGISTRY.register_prefill("nobackend", Param("chunk_tokens", (0, 512), 0, ""), doc="")
    for backend in ("numpy", "vulkan", "cuda"):
        (v,) = REGISTRY.op(backend, "prefill").variants
        assert v.name == "batched" and "max_cols" in {p.name for p in v.params}
