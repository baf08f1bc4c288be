"""The engine CLI: run/validate/bench/info/kernels with --json, and one clear error (exit 2,
naming the file and the problem) for each kind of bad model file."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.cli import main
from tests.gguf_edit import rewrite


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_json(capsys, tiny_model_path):
    args = ("run", "--model", str(tiny_model_path), "--prompt", "Hello", "--max-tokens", "5")
    code, out, _ = run_cli(capsys, *args, "--json")
    obj = json.loads(out)
    assert code == 0 and len(obj["tokens"]) == 5 and obj["prompt_tokens"]
    assert isinstance(obj["text"], str)
    code2, out2, _ = run_cli(capsys, *args, "--json", "--prefill", "per_token")
    assert json.loads(out2)["tokens"] == obj["tokens"]


def test_validate_pass_and_fail_exit_codes(capsys, tiny_model_path, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('backend = "numpy"\n[ops.prefill]\nchunk_tokens = 8\n')
    code, out, _ = run_cli(
        capsys,
        "validate",
        "--model",
        str(tiny_model_path),
        "--config",
        str(cfg),
        "--steps",
        "3",
        "--json",
    )
    rep = json.loads(out)
    assert code == 0 and rep["passed"] and rep["candidate"]["prefill.chunk_tokens"] == 8
    worst = rep["replay"]["worst"]  # op-level replay: the worst op, its NMSE and its bound
    assert rep["replay"]["passed"] and worst["nmse"] <= worst["bound"] == 1e-8
    code, out, _ = run_cli(
        capsys, "validate", "--model", str(tiny_model_path), "--steps", "2", "--max-abs-diff", "0"
    )
    assert code == 1 and "FAIL" in out and "op-level replay: PASS  worst op" in out


def test_bench_json(capsys, tiny_model_path):
    code, out, _ = run_cli(
        capsys,
        "bench",
        "--model",
        str(tiny_model_path),
        "--prompt-tokens",
        "7,20",
        "--gen-tokens",
        "4",
        "--repeats",
        "2",
        "--json",
    )
    rep = json.loads(out)
    assert code == 0 and [r["prompt_tokens"] for r in rep["results"]] == [7, 20]
    r = rep["results"][0]
    assert r["prefill_tok_s"]["min"] <= r["prefill_tok_s"]["median"] <= r["prefill_tok_s"]["max"]
    assert len(r["decode_tok_s"]["samples"]) == 2 and rep["device"]["device_class"] == "cpu"


def test_info_and_kernels(capsys, tiny_model_path):
    code, out, _ = run_cli(capsys, "info", "--model", str(tiny_model_path), "--json")
    assert code == 0 and json.loads(out)["spec"]["arch"] == "qwen2"
    code, out, _ = run_cli(capsys, "kernels", "--backend", "numpy", "--json")
    ks = json.loads(out)["numpy"]
    assert ks["prefill"][0]["params"]["chunk_tokens"]["default"] == 32
    assert ks["prefill"][0]["params"]["chunk_tokens"]["binding"] == "schedule"


def _expect_error(capsys, path, needle):
    code, _, err = run_cli(capsys, "run", "--model", str(path), "--prompt", "x")
    assert code == 2, err
    assert str(path) in err and needle in err, err


def test_not_gguf(capsys, tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello, not a model")
    _expect_error(capsys, p, "not a GGUF file")


def test_truncated(capsys, tmp_path, tiny_model_path):
    p = tmp_path / "cut.gguf"
    data = tiny_model_path.read_bytes()
    p.write_bytes(data[: len(data) * 2 // 3])
    _expect_error(capsys, p, "truncated")
    p.write_bytes(data[:200])  # cut inside the header
    _expect_error(capsys, p, "truncated or corrupt")


def test_unsupported_arch(capsys, tmp_path, tiny_model_path):
    p = rewrite(tiny_model_path, tmp_path / "mamba.gguf", arch="mamba")
    _expect_error(capsys, p, "architecture 'mamba' is not supported")


def test_unsupported_quant_type(capsys, tmp_path, tiny_model_path):
    p = rewrite(tiny_model_path, tmp_path / "q2k.gguf", retype=("blk.0.ffn_up.weight", "Q2_K"))
    _expect_error(capsys, p, "'blk.0.ffn_up.weight' has quant type Q2_K")


def test_missing_tensor(capsys, tmp_path, tiny_model_path):
    p = rewrite(tiny_model_path, tmp_path / "hole.gguf", drop="blk.1.ffn_down.weight")
    _expect_error(capsys, p, "missing tensor 'blk.1.ffn_down.weight'")


def test_missing_file_and_unknown_name(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "--model", "no-such-model", "--prompt", "x")
    assert code == 2 and "no-such-model" in err and "qwen2.5-coder-0.5b-q4km" in err


def test_bad_config_and_backend(capsys, tiny_model_path, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('backend = "numpy"\n[ops.prefill]\nchunk_tokens = 5\n')
    code, _, err = run_cli(
        capsys, "run", "--model", str(tiny_model_path), "--prompt", "x", "--config", str(cfg)
    )
    assert code == 2 and "prefill.chunk_tokens = 5" in err and "allowed" in err
    code, _, err = run_cli(
        capsys, "run", "--model", str(tiny_model_path), "--prompt", "x", "--backend", "tpu"
    )
    assert code == 2 and "unknown backend 'tpu'" in err


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("run", "validate", "bench", "models", "synth", "kernels"):
        assert cmd in out


def test_copy_is_still_valid(tmp_path, tiny_model_path):
    """The rewrite helper itself produces a loadable file when nothing is changed."""
    from engine.gguf_model import GGUFModel

    shutil.copy(tiny_model_path, tmp_path / "a.gguf")
    g = GGUFModel(rewrite(tmp_path / "a.gguf", tmp_path / "b.gguf"))
    assert g.spec == GGUFModel(tiny_model_path).spec


def test_bench_profile(capsys, tiny_model_path):
    """--profile adds time per kernel on every backend through one API: wall clock per op on
    NumPy, GPU timestamps per dispatch on Vulkan."""
    short = ("--prompt-tokens", "9", "--gen-tokens", "3", "--repeats", "1", "--warmup", "0")
    code, out, _ = run_cli(
        capsys, "bench", "--model", str(tiny_model_path), *short, "--profile", "--json"
    )
    prof = json.loads(out)["profile"]
    assert code == 0 and prof["clock"] == "wall"
    assert {"matmul_prefill", "matmul_decode", "attention"} <= set(prof["kernels"])
    assert prof["total_ms"] == pytest.approx(sum(k["total_ms"] for k in prof["kernels"].values()))
    code, out, _ = run_cli(capsys, "bench", "--model", str(tiny_model_path), *short, "--profile")
    assert code == 0 and "clock: wall" in out and "matmul_prefill" in out
    pytest.importorskip("vulkan")
    code, out, _ = run_cli(
        capsys,
        "bench",
        "--model",
        str(tiny_model_path),
        "--backend",
        "vulkan",
        "--prompt-tokens",
        "9",
        "--gen-tokens",
        "3",
        "--repeats",
        "1",
        "--profile",
        "--json",
    )
    prof = json.loads(out)["profile"]
    assert code == 0 and prof["clock"] == "gpu-timestamps"
    names = set(prof["kernels"])
    assert any(n.startswith("matmul_prefill.") for n in names)  # the 9-token prefill
    assert any(n.startswith("matmul_decode.") for n in names)  # and the decode steps
    assert all(v["calls"] > 0 and v["total_ms"] > 0 for v in prof["kernels"].values())


def test_devices_lists_every_device_of_every_backend(capsys):
    """`engine devices` lists each backend's devices with the index --device takes and whether
    workers serve it (the best kind present); a backend that cannot run says why."""
    code, out, _ = run_cli(capsys, "devices", "--json")
    doc = json.loads(out)
    assert code == 0 and {r["backend"] for r in doc["devices"]} == {"numpy", "vulkan", "cuda"}
    (cpu,) = [r for r in doc["devices"] if r["backend"] == "numpy"]
    assert cpu["index"] == 0 and cpu["device_class"] == "cpu" and cpu["served"]
    vk = [r for r in doc["devices"] if r["backend"] == "vulkan"]
    if "error" in vk[0]:
        pytest.skip(f"no Vulkan here: {vk[0]['error']}")
    assert [d["index"] for d in vk] == list(range(len(vk)))
    assert any(d["served"] for d in vk) and all(d["memory_bytes"] > 0 for d in vk)


def test_device_flag_and_env_pick_the_card(capsys, tiny_model_path, monkeypatch):
    """--device N opens card N; without it FLEETTUNE_VK_DEVICE is the default; a card that is
    not there, or a malformed variable, is one line and exit 2."""
    monkeypatch.delenv("FLEETTUNE_VK_DEVICE", raising=False)
    run = ("run", "--model", str(tiny_model_path), "--prompt", "hi", "--max-tokens", "1")
    code, _, err = run_cli(capsys, *run, "--device", "3")
    assert code == 2 and err.strip() == (
        "error: numpy device 3: no such device; choose an index 0..0"
    )
    monkeypatch.setenv("FLEETTUNE_VK_DEVICE", "x")
    code, _, err = run_cli(capsys, *run, "--backend", "vulkan")
    assert code == 2 and "FLEETTUNE_VK_DEVICE='x': give a device index" in err
    pytest.importorskip("vulkan")
    monkeypatch.setenv("FLEETTUNE_VK_DEVICE", "99")
    code, _, err = run_cli(capsys, *run, "--backend", "vulkan")
    assert code == 2 and "vulkan device 99: no such device" in err
    code, out, _ = run_cli(capsys, *run, "--backend", "vulkan", "--device", "0", "--json")
    assert code == 0 and json.loads(out)["tokens"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--prompt", ""], "--prompt is empty"),
        (["run", "--prompt", "hi", "--max-tokens", "5000"], "exceed the model's context (4096)"),
        (["run", "--prompt", "hi", "--max-tokens", "-1"], "--max-tokens -1: must be >= 0"),
        (["bench", "--repeats", "0"], "--repeats 0: must be >= 1"),
        (["bench", "--prompt-tokens", "5000"], "longer than the model's context (4096)"),
        (["validate", "--steps", "0"], "--steps 0: must be >= 1"),
        (["validate", "--nmse=-1e-3"], "--nmse -0.001: must be a finite number >= 0"),
        (["validate", "--max-abs-diff", "nan"], "--max-abs-diff nan: must be a finite"),
    ],
)
def test_bad_arguments_are_one_line_exit_2(capsys, tiny_model_path, argv, message):
    """Exit 1 is validate's "does not compute the same model": argument errors must be 2."""
    code, out, err = run_cli(capsys, *argv, "--model", str(tiny_model_path))
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and message in err


def test_prompt_longer_than_the_context(capsys, tiny_model_path):
    code, _, err = run_cli(
        capsys, "run", "--model", str(tiny_model_path), "--prompt", "a b " * 3000
    )
    assert code == 2 and "longer than the model's context (4096)" in err


def test_config_directory_or_binary(capsys, tiny_model_path, tmp_path):
    blob = tmp_path / "blob.toml"
    blob.write_bytes(bytes(range(256)))
    for cfg, message in ((tmp_path, "is a directory"), (blob, "not a text file")):
        code, _, err = run_cli(
            capsys, "run", "--model", str(tiny_model_path), "--prompt", "x", "--config", str(cfg)
        )
        assert code == 2 and message in err and err.count("\n") == 1


def test_synth_out_existing_directory_creates_nothing(capsys, tmp_path):
    before = sorted(tmp_path.rglob("*"))
    code, _, err = run_cli(capsys, "synth", "--out", str(tmp_path))
    assert code == 2 and "is a directory" in err
    assert sorted(tmp_path.rglob("*")) == before


def test_chat_template_the_sandbox_blocks(capsys, tmp_path, tiny_model_path):
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    p = rewrite(tiny_model_path, tmp_path / "evil.gguf", metadata={"tokenizer.chat_template": evil})
    code, out, err = run_cli(capsys, "run", "--model", str(p), "--prompt", "hi", "--chat")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "chat template does what the sandbox blocks" in err
