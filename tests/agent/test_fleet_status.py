"""What the agent's status file keeps for the dashboard (past runs, the current trial's start)
and the worker's GPU state sampling (worker/gpustate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.fleet import Slot, past_invocations, write_status
from worker import gpustate

SMI = (
    "0x19, 87, 40321, 143771, 1980, 3201, 0x0000000000000000, 54, 402.11\n"
    "0x3B, 0, 4, 143771, 345, 3201, 0x0000000000000001, 31, [N/A]\n"
)


def test_past_invocations_keep_every_earlier_run(tmp_path: Path) -> None:
    path = tmp_path / "s.fleet.json"
    assert past_invocations(path, 100.0) == []  # no file yet
    first = {"host": "h", "pid": 1, "experiment": "e", "started": 10.0, "updated": 50.0}
    write_status(path, {"agent": {**first, "state": "finished", "extra": 1}, "workers": []})
    runs = past_invocations(path, 100.0)
    assert runs == [{**first, "state": "finished"}]
    # The second run wrote its list and its own entry; a third sees both, once each.
    second = {"host": "h", "pid": 2, "experiment": "e", "started": 100.0, "updated": 150.0}
    write_status(
        path,
        {"agent": {**second, "state": "running"}, "invocations": [*runs, {**second, "state": "x"}]},
    )
    assert [r["pid"] for r in past_invocations(path, 200.0)] == [1, 2]
    # A run re-reading its own file (same start) does not list itself.
    assert [r["pid"] for r in past_invocations(path, 100.0)] == [1]
    path.write_text("{not json")
    assert past_invocations(path, 1.0) == []


def test_slot_dates_its_current_trial() -> None:
    slot = Slot("c-0", "c", ("numpy",))
    assert slot.status()["current_since"] is None
    slot.current = "s #3"
    since = slot.status()["current_since"]
    assert since is not None and slot.status()["current_since"] == since  # stays put
    slot.current = "s #4"
    assert slot.status()["current_since"] >= since
    slot.current = ""
    assert slot.status()["current_since"] is None
    json.dumps(slot.status())


def test_nvidia_smi_rows_are_parsed_and_matched_by_bus() -> None:
    rows = gpustate.parse_nvidia(SMI)
    assert rows[0]["pci_bus"] == 0x19 and rows[0]["util_pct"] == 87.0
    assert rows[0]["sm_clock_mhz"] == 1980.0 and rows[0]["temp_c"] == 54.0
    assert rows[1]["power_w"] is None  # [N/A]
    assert gpustate.parse_nvidia("garbage\n") == []


def test_sample_is_none_without_a_known_gpu() -> None:
    assert gpustate.sample({"vendor": "numpy", "extra": {}}) is None
    assert gpustate.sample({}) is None


def test_nvidia_sample_picks_the_workers_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import types

    monkeypatch.setattr(gpustate.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        gpustate.subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout=SMI)
    )
    got = gpustate.sample({"vendor": "nvidia", "extra": {"pci_bus_id": 0x3B}})
    assert got is not None and got["pci_bus"] == 0x3B and got["source"] == "nvidia-smi"

    def fail(*a: object, **k: object) -> None:
        raise subprocess.TimeoutExpired("nvidia-smi", 2)

    monkeypatch.setattr(gpustate.subprocess, "run", fail)
    assert gpustate.sample({"vendor": "nvidia", "extra": {}}) is None  # never fails a trial
