"""`python -m tools.figures add` (issue 29): [[figure]] records generated from stored measurements,
a real `engine bench --json` of the tiny synthetic model and a real agent study, never typed by
hand; bad input is one line, exit 2, and the data file unchanged."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from engine import doc_block
from engine.cli import main as engine_main
from tools.figures import COMMAND, load, render
from tools.figures import main as figures

HEAD = """[[table]]
key = "numpy-cpu"
title = "NumPy"

[commands]
old = "an earlier call"
"""


@pytest.fixture(scope="module")
def bench_json(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real engine bench --json (NumPy, tiny model: about a second), so the schema that
    `add` reads is the writer's, not a copy that could drift."""
    import contextlib
    import io

    out = io.StringIO()
    args = ["bench", "--backend", "numpy", "--model", str(tiny_model_path), "--json"]
    args += ["--prompt-tokens", "16", "--gen-tokens", "4", "--repeats", "1", "--no-promoted"]
    with contextlib.redirect_stdout(out):
        assert engine_main(args) == 0
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    path.write_text(out.getvalue())
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "figures.toml"
    p.write_text(HEAD)
    return p


def test_bench_json_becomes_pp_and_tg_records(bench_json, data, tmp_path, capsys):
    doc = json.loads(bench_json.read_text())
    pp, tg = doc["results"][0]["prefill_tok_s"]["median"], doc["results"][0]["decode_tok_s"]
    llama = tmp_path / "llama.json"
    rows = [
        {"n_prompt": 16, "n_gen": 0, "avg_ts": 1234.56, "stddev_ts": 7.0},
        {"n_prompt": 0, "n_gen": 4, "avg_ts": 98.7, "stddev_ts": 1.0},
    ]
    llama.write_text(json.dumps(rows))
    args = ["add", "--data", str(data), "--bench", str(bench_json), "--llama", str(llama)]
    args += ["--memory-mib", "5600", "--device", "dev VM", "--table", "numpy-cpu"]
    args += ["--model", "qwen2 tiny"]
    assert figures([*args, "--command", "engine bench on the tiny model"]) == 0
    assert "2 records added" in capsys.readouterr().out
    _, commands, figs = load(data)
    assert [f.metric for f in figs] == ["pp16 tok/s", "tg4 tok/s"]
    assert figs[0].figure.startswith(f"{pp:,.1f}") and figs[1].figure.startswith(
        f"{tg['median']:,.1f}"
    )
    assert [f.reference for f in figs] == ["1,234.6 (sd 7)", "98.7 (sd 1)"]
    assert all(f.device == "dev VM" and f.model == "qwen2 tiny" for f in figs)
    assert "held by the engine; 5,600 MiB GPU" in figs[0].memory
    assert figs[0].source == "defaults bench" and figs[0].config == "registry defaults"
    # the house rule's verdict comes from the renderer's rule, not from add
    assert figs[0].counts() == "no: defaults bench, no validate pass"
    assert commands[figs[0].command] == "engine bench on the tiny model"
    assert "| pp16 tok/s |" in render(*load(data))


def test_a_new_device_gets_its_table_and_a_known_command_is_reused(bench_json, data):
    args = ["add", "--data", str(data), "--bench", str(bench_json), "--command", "an earlier call"]
    assert figures(args) == 0
    tables, commands, figs = load(data)
    assert len(tables) == 2 and tables[1]["key"].startswith("numpy-")
    assert {f.table for f in figs} == {tables[1]["key"]}
    assert tables[1]["title"].startswith("NumPy on the ")
    assert {f.command for f in figs} == {"old"} and len(commands) == 1


def test_a_hand_edited_note_keeps_its_key_and_the_same_command_gets_a_new_one(bench_json, data):
    """The 2026-12-05 proof call: last session's note was edited by hand after `add` wrote it,
    so today's identical command hashed to the same key, and the file would hold it twice."""
    import hashlib

    how = "tools/fleet_gpu.sh proof X 1.5b (2026-12-05): fresh-process bench"
    key = "add-" + hashlib.sha1(how.encode()).hexdigest()[:8]
    data.write_text(HEAD + f'{key} = "{how}, and a note added by hand"\n')
    args = ["add", "--data", str(data), "--bench", str(bench_json), "--command", how]
    assert figures(args) == 0
    _, commands, figs = load(data)
    assert commands[key].endswith("by hand") and commands[f"{key}-2"] == how
    assert {f.command for f in figs} == {f"{key}-2"}


def test_bad_input_is_one_line_and_the_file_untouched(bench_json, data, tmp_path, capsys):
    before = data.read_text()
    not_bench = tmp_path / "x.json"
    not_bench.write_text('{"results": []}')
    cases = {
        str(tmp_path / "missing.json"): "cannot read bench JSON",
        str(not_bench): "not an engine bench --json output",
        str(data): "not JSON",
    }
    for path, why in cases.items():
        assert figures(["add", "--data", str(data), "--bench", path, "--command", "c"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
    bad_llama = tmp_path / "l.json"
    bad_llama.write_text('{"n_prompt": 1}')
    args = ["add", "--data", str(data), "--bench", str(bench_json), "--llama", str(bad_llama)]
    assert figures([*args, "--command", "c"]) == 2
    assert "not llama-bench JSON" in capsys.readouterr().err
    assert data.read_text() == before
    assert not list(tmp_path.glob(".figures-*"))  # no temp file left behind


def test_study_best_accepted_trial_becomes_agent_trial_records(data, tmp_path, capsys):
    import optuna

    from agent.dashboard.synthetic import write_study
    from agent.storage import parse_storage

    url = f"journal://{tmp_path / 'studies.journal'}"  # a journal: no SQLite schema to build
    storage = parse_storage(url).open()
    name = write_study(storage, "h200", trials=15, seed=3, running=0)
    best = optuna.load_study(study_name=name, storage=storage).user_attrs["best"]["trial"]
    assert best  # the synthetic study accepted a candidate
    args = ["add", "--data", str(data), "--study", url, "--study-name", name]
    assert figures([*args, "--command", "agent run"]) == 0
    _, _, figs = load(data)
    assert figs and all(f.source == "agent trial" for f in figs)
    assert all(f.config.startswith(f"trial {best} of {name}") for f in figs)
    assert all(f.validate.startswith(("PASS", "FAIL")) for f in figs)
    assert "(x" in figs[0].figure  # the paired ratio beside the median

    before = data.read_text()
    assert (
        figures(
            ["add", "--data", str(data), "--study", url, "--study-name", "nope", "--command", "c"]
        )
        == 2
    )
    assert "no study 'nope'" in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert figures(["add", "--data", str(data), "--study", missing, "--command", "c"]) == 2
    assert "no such storage file" in capsys.readouterr().err
    assert data.read_text() == before and not (tmp_path / "none.db").exists()
    assert (
        figures(["add", "--data", str(data), "--study", url, "--memory-mib", "1", "--command", "c"])
        == 2
    )
    assert "go with --bench" in capsys.readouterr().err


def test_added_records_render_into_the_page(bench_json, data, tmp_path):
    page = tmp_path / "FIGURES.md"
    page.write_text(f"prose\n{doc_block.begin(COMMAND)}\nold\n{doc_block.END}\n")
    args = ["add", "--data", str(data), "--bench", str(bench_json), "--table", "numpy-cpu"]
    assert figures([*args, "--command", "c"]) == 0
    assert figures(["--data", str(data), "--page", str(page), "--write"]) == 0
    text = page.read_text()
    assert "| pp16 tok/s |" in text and "defaults bench [1]" in text
    assert tomllib.loads(data.read_text())["commands"]["old"] == "an earlier call"


def test_a_promoted_bench_takes_its_files_validate_and_counts(bench_json):
    """A bench of a promoted file is a "promoted bench" with the file's own [evidence.validate]
    verdict; with a footprint beside it the house rule counts it. (The real bench JSON of the
    tiny model, its config source pointed at a committed promoted file.)"""
    from tools.figures import Figure
    from tools.figures_add import bench_records

    promoted = sorted((Path(__file__).resolve().parents[2] / "configs" / "h200").rglob("*.toml"))
    with_validate = [p for p in promoted if "[evidence.validate]" in p.read_text()]
    assert with_validate, "no committed promoted file has an [evidence.validate] table"
    path = with_validate[0]
    doc = json.loads(bench_json.read_text())
    doc["config_source"] = {
        "kind": "promoted",
        "path": f"/root/promo/{path.relative_to(path.parents[3])}",
    }
    recs = bench_records(doc, "b.json", {}, None, "H200")
    assert recs[0]["validate"] == "not validated in the call"  # that path is not on this machine
    doc["config_source"]["path"] = str(path)
    recs = bench_records(doc, "b.json", {}, 812, "")
    assert recs[0]["source"] == "promoted bench"
    assert recs[0]["config"] == f"promoted configs/{path.relative_to(path.parents[2])}"
    assert recs[0]["validate"].startswith("PASS in its agent trial (KLD ")
    assert recs[0]["device"] == doc["device"]["name"].removeprefix("NVIDIA ")
    fig = Figure(**recs[0], table="t", command="c")
    assert fig.counts() == "yes"
