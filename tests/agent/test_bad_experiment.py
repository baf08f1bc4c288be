"""Experiment input that used to fail late, once per worker, or reach the terminal raw: each is
one line at load or at `agent check` / `agent run`, exit 2, and nothing is created (issue 30)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import main
from agent.experiment import ExperimentError, parse_experiment


def _toml(models: str = '"synthetic:tiny"', extra: str = "", name: str = '"t"') -> str:
    return (
        f'name = {name}\nmodels = [{models}]\nbackends = ["numpy"]\n'
        '[[objectives]]\nmetric = "prefill_tok_s"\nprompt_tokens = 16\n' + extra
    )


def _refused(tmp_path: Path, capsys, text: str, needle: str) -> str:
    """`agent check` and `agent run` both say ``needle`` in one line, exit 2, no storage."""
    f = tmp_path / "e.toml"
    f.write_text(text)
    storage = tmp_path / "s.journal"
    for argv in (["check", str(f)], ["run", str(f), "--storage", str(storage), "--local"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert not storage.exists() and not list(tmp_path.glob("s.journal*"))
    return err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # every trial crashed with a MemoryError of 46.6 TiB and the run exited 0
        ("[validate]\nsteps = 100000000\n", "validate.steps 100000000"),
        ("[validate]\nrandom_prompts = [4090]\nsteps = 8\n", "validate.random_prompts 4090"),
        (
            '[[objectives]]\nmetric = "decode_tok_s"\nprompt_tokens = 4000\ngen_tokens = 200\n',
            "prompt_tokens 4000 + gen_tokens 200",
        ),
    ],
)
def test_lengths_past_the_models_context(tmp_path, capsys, extra, needle):
    err = _refused(tmp_path, capsys, _toml(extra=extra), needle)
    assert "context of models[0] = 'synthetic:tiny' (4096)" in err


def test_lengths_past_a_gguf_files_context(tmp_path, capsys, tiny_model_path):
    text = _toml(models=f'"{tiny_model_path}"', extra="[validate]\nsteps = 5000\n")
    _refused(tmp_path, capsys, text, "exceed the context of models[0]")


def test_missing_model_and_unknown_preset(tmp_path, capsys):
    _refused(tmp_path, capsys, _toml(models='"/no/such/model.gguf"'), "no such file")
    _refused(tmp_path, capsys, _toml(models='"synthetic:huge"'), "no synthetic preset 'huge'")
    _refused(tmp_path, capsys, _toml(models='"synthetic:tiny:mamba"'), "architecture 'mamba'")


def test_empty_variants_list(tmp_path, capsys):
    extra = "[space.numpy.prefill]\nvariants = []\n"
    _refused(tmp_path, capsys, _toml(extra=extra), "variants = []: an empty list allows nothing")


def test_control_characters_in_the_name_are_refused_escaped(tmp_path, capsys):
    err = _refused(tmp_path, capsys, _toml(name='"evil\\u001b[2J"'), "control characters")
    assert "\x1b" not in err and "\\x1b[2J" in err


def test_a_huge_value_is_echoed_cut(tmp_path, capsys):
    big = "x" * 2_000_000
    err = _refused(tmp_path, capsys, _toml(extra=f'[sampler]\nname = "{big}"\n'), "sampler.name")
    assert len(err) < 400 and "(2,000,002 characters)" in err


def test_parse_refuses_a_synthetic_context_overrun_without_writing_the_model():
    data = {
        "models": ["synthetic:tiny"],
        "backends": ["numpy"],
        "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 16}],
        "validate": {"steps": 5000},
    }
    with pytest.raises(ExperimentError, match="exceed the context"):
        parse_experiment(data)
