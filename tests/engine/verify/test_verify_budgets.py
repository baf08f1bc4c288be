"""The numeric budgets are data (engine/verify/budgets.toml): the file gives the bounds the registry
held as constants before, each bound sits between its measured worst correct variant and its
nearest planted bug, and the calibration script's --write output reads back through the loader."""

from __future__ import annotations

import shutil
import tomllib

import pytest

from engine.errors import ConfigError
from engine.verify import budgets as B
from engine.verify.budgets import Budget
from tests.calibrate import write_calibration

# Today's figures: the constants engine/tuning/registry.py held before they moved to the file.
TODAY_NUMERIC = {
    "order_only": Budget(5e-9, 1e-9, 1e-8, 2e-3, 4e-3, 1e-8, 1e-4),
    "fp16": Budget(1e-4, 5e-5, 3e-4, 1e-1, 1e-1, 5e-4, 2e-2),
    "bf16": Budget(5e-3, 1e-3, 1e-3, 4e-1, 8e-1, 2e-2, 1.6e-1),
    "int8_activations": Budget(1e-2, 6e-3, 1.3e-2, 1.0, 4e-1, 5e-3, 8e-2),
}
TODAY_REFERENCE = Budget(3e-12, 1e-12, 6e-12, 2e-4, 4e-3, 1e-12)
TODAY_REFERENCE_RECURRENT = Budget(3e-11, 1e-11, 6e-11, 2e-4, 4e-3, 1e-11)
TODAY_RECURRENT_END_TO_END = {
    "int8_activations": {
        "kld_max": 6e-2,
        "kld_mean": 2e-2,
        "nmse": 1.2e-1,
        "max_abs_diff": 1.6,
        "route_tie": 1.2,
    }
}


def test_the_file_gives_todays_budgets():
    assert B.NUMERIC_BUDGETS == TODAY_NUMERIC
    assert list(B.NUMERIC_BUDGETS) == list(B.CLASS_ORDER)
    assert B.REFERENCE_BUDGET == TODAY_REFERENCE
    assert B.REFERENCE_BUDGET_RECURRENT == TODAY_REFERENCE_RECURRENT
    assert B.RECURRENT_END_TO_END == TODAY_RECURRENT_END_TO_END
    from engine.tuning.registry import REGISTRY

    # the registry's classes are the file's: every variant's numeric class has a budget
    ops = [op for b in REGISTRY.backends() for op in REGISTRY.ops(b)]
    classes = {v.numeric for op in ops for v in op.variants}
    assert classes <= set(B.NUMERIC_BUDGETS)


def _tables(doc: dict) -> list[tuple[str, dict]]:
    out = [(f"numeric.{c}", t) for c, t in doc["numeric"].items()]
    out += [("reference", doc["reference"]), ("reference_recurrent", doc["reference_recurrent"])]
    return out + [(f"recurrent_end_to_end.{c}", t) for c, t in doc["recurrent_end_to_end"].items()]


def test_each_bound_sits_between_its_measurements():
    """A bound above its worst correct variant and at or below its nearest planted bug, for every
    figure the file records (bf16 is scaled from fp16 and says so: no measurement)."""
    for where, table in _tables(B.read()):
        if where == "numeric.bf16":
            assert "measured" not in table and "not measured" in table["note"]
            continue
        assert table["measured"], where
        for entry in table["measured"]:
            assert {"date", "command", "backend", "model", "worst"} <= set(entry), where
            for m in set(entry) & set(B.BOUNDS):
                assert entry[m] < table[m], (where, entry["model"], m)
        bug = table.get("nearest_bug")
        if bug:
            assert bug["nmse"] >= table["nmse"], where


def test_the_file_is_in_the_writers_form():
    """So a --write changes only the entries it records."""
    text = B.BUDGETS_FILE.read_text()
    assert B.dumps(B.read(), B.HEADER) == text
    assert tomllib.loads(text) == B.read()


def _row(config: dict, classes: list[str], nmse: float, passed: bool = True) -> dict:
    return {
        "config": config,
        "classes": classes,
        "passed": passed,
        "kld_max": nmse / 2,
        "kld_mean": nmse / 4,
        "nmse": nmse,
        "max_abs_diff": nmse * 100,
    }


def test_calibration_write_round_trips_through_the_loader(tmp_path):
    path = tmp_path / "budgets.toml"
    shutil.copy(B.BUDGETS_FILE, path)
    rows = [
        _row({"(default)": True}, ["order_only"], 3e-13),
        _row({"matmul_decode.variant": "ondemand"}, ["order_only"], 7e-13),
        _row({"matmul_decode.variant": "x"}, ["order_only"], 9e-3, passed=False),  # a failure
        _row({"matmul_prefill.variant": "tc"}, ["order_only", "fp16"], 2e-5),  # loosest: fp16
    ]
    mutants = [
        {"mutant": "under_the_bound", "rejected": True, "kld": 1e-9, "nmse": 2e-9},
        {"mutant": "missed", "rejected": False, "kld": 1e-7, "nmse": 2e-7},
        {"mutant": "nearest", "rejected": True, "kld": 3e-7, "nmse": 6.12345e-7},
        {"mutant": "far", "rejected": True, "kld": 0.1, "nmse": 0.2},
    ]
    run = {"backend": "numpy (cpu)", "model": "ragged.gguf", "command": "python tools/x.py"}
    out = {"candidates": rows, "mutants": mutants}
    assert write_calibration(path, out, run) == ["order_only", "fp16"]

    assert B.load(path) == B.load()  # the bounds are untouched
    doc = B.read(path)
    order = doc["numeric"]["order_only"]
    mine = order["measured"][-1]
    assert mine["backend"] == "numpy (cpu)" and mine["model"] == "ragged.gguf"
    assert mine["command"] == "python tools/x.py" and len(mine["date"]) == 10
    assert mine["nmse"] == 7e-13 and mine["kld_max"] == 3.5e-13 and mine["max_abs_diff"] == 7e-11
    assert mine["worst"] == '{"matmul_decode.variant": "ondemand"}'
    assert order["nearest_bug"]["name"] == "nearest" and order["nearest_bug"]["nmse"] == 6.12e-7
    assert doc["numeric"]["fp16"]["measured"][-1]["nmse"] == 2e-5
    assert doc["numeric"]["fp16"]["nearest_bug"]["name"] == "far"  # the first above fp16's 3e-4
    assert "measured" not in doc["numeric"]["bf16"]

    # a second run of the same backend and model replaces its entry, the others stay
    before = len(order["measured"])
    rows[1] = _row({"matmul_decode.variant": "ondemand"}, ["order_only"], 5e-13)
    write_calibration(path, {"candidates": rows}, run)
    again = B.read(path)["numeric"]["order_only"]
    assert len(again["measured"]) == before and again["measured"][-1]["nmse"] == 5e-13
    assert again["measured"][0] == B.read()["numeric"]["order_only"]["measured"][0]
    assert again["nearest_bug"]["name"] == "nearest"  # no mutants this time: kept


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: d["numeric"]["fp16"].update(nsme=1e-4), "nsme"),
        (lambda d: d["numeric"]["fp16"].pop("op_nmse"), "op_nmse"),
        (lambda d: d["recurrent_end_to_end"].update(fp8={"nmse": 1.0}), "fp8"),
    ],
)
def test_the_loader_refuses_a_malformed_file(tmp_path, edit, says):
    doc = B.read()
    edit(doc)
    path = tmp_path / "budgets.toml"
    path.write_text(B.dumps(doc))
    with pytest.raises(ConfigError, match=says):
        B.load(path)
    with pytest.raises(ConfigError):
        B.write(doc, path)  # nor is such a file written
