"""The microbenchmarks under bench/ run only on a GPU; here each is run as a program (never
imported: tests import nothing from the lab, tests/test_layers.py checks) to show it starts,
refuses bad input before any GPU work and names only valid configs (--list)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tuning import TuningConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name != "harness.py")


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_starts_and_prints_help(script):
    got = run_bench(script, "--help")
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("usage:") and "--json" in got.stdout


@pytest.mark.parametrize("argv", [["--shapes", "3b"], ["--contexts", "5,x"], ["--calls", "0"],
                                  ["--variants", "tile,nope"], ["--contexts", "0"]])  # fmt: skip
def test_attn_decode_bench_rejects_bad_input(argv):
    """One line naming the problem and exit 2, before any GPU work (no CuPy on this machine)."""
    got = run_bench("attn_decode_bench.py", *argv)
    out = got.stdout.strip().splitlines()
    assert got.returncode == 2 and len(out) == 1 and out[0].startswith("attn_decode_bench:")


def test_attn_decode_bench_cases_are_dec8_split2_with_valid_knobs():
    """Every case is dec8_split2 (split-K 2) with valid attention_decode knobs; the vec* cases
    run the vec variant (the d17 speed configs are experiments/decode-h200.toml's starts,
    checked where the experiment loads)."""
    got = run_bench("attn_decode_bench.py", "--list")
    cases = json.loads(got.stdout)["configs"]
    assert got.returncode == 0 and {"split_kw", "tile", "vec", "vec_cl_pf"} <= set(cases)
    for name, flat in cases.items():
        assert flat["matmul_decode.split_k"] == 2
        cfg = TuningConfig.from_flat("cuda", flat)
        if name.startswith("vec"):
            assert cfg.op("attention_decode").variant == "vec"


def test_bench_moe_dec_configs_are_valid_and_an_unknown_one_is_refused():
    got = run_bench("bench_moe_dec.py", "--list")
    configs = json.loads(got.stdout)["configs"]
    assert got.returncode == 0 and "wpfo2_gp_pre1" in configs
    for flat in configs.values():
        TuningConfig.from_flat("cuda", flat)
    got = run_bench("bench_moe_dec.py", "--configs", "nope")
    assert got.returncode == 2 and "unknown config(s) nope" in got.stderr


def test_gemv_bench_configs_are_valid_and_shapes_are_a_qwen2_layers():
    """One GEMV bench (bench_gemv.py merged in): the mmvw settings and the mmvf/dmmv configs are
    valid; the 7B shapes are its layer's (qkv one launch of three matrices)."""
    got = run_bench("gemv_bench.py", "--list", "--preset", "7b,9b,other",
                    "--configs", "base,lk_stage_lm,mmvf,mmvf_q4p_t16_r4_u1,dmmv")  # fmt: skip
    listed = json.loads(got.stdout)
    assert got.returncode == 0 and len(listed["configs"]) == 5
    for flat in listed["configs"].values():
        TuningConfig.from_flat("cuda", flat).check(None)
    s = listed["shapes"]["7b"]
    assert s["down_q6k"] == [["Q6_K", 3584, 18944]] and s["qkv"][1] == ["Q4_K", 512, 3584]
    assert s["lm_head"] == [["Q6_K", 152064, 3584]] and len(s["qkv"]) == 3
    assert listed["shapes"]["other"]["q8_0"] == [["Q8_0", 12288, 4096]]


@pytest.mark.parametrize("argv", [["--configs", "bogus"], ["--preset", "3b"], ["--shapes", "x"]])
def test_gemv_bench_rejects_bad_input(argv):
    got = run_bench("gemv_bench.py", *argv)
    out = got.stdout.strip().splitlines()
    assert got.returncode == 2 and len(out) == 1 and out[0].startswith("gemv_bench:")
