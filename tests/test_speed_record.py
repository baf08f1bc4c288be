"""scripts/speed_record.py: the device speed scripts' result document, steps and deadline."""

from __future__ import annotations

import json
import time

from scripts.speed_record import SpeedRecord


def test_a_failing_step_is_that_variants_result_and_the_run_goes_on(tmp_path, capsys):
    rec = SpeedRecord("m/x.gguf", tmp_path / "r.json", {"a": {}, "b": {}}, float("inf"))

    def bench(v: str) -> None:
        if v == "a":
            raise RuntimeError("kernel fault")
        rec.res["bench"][v] = {"tg128": 1.0}

    rec.step("bench", "a", bench)
    rec.step("bench", "b", bench)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert "kernel fault" in saved["bench"]["a"]["error"]
    assert saved["bench"]["b"] == {"tg128": 1.0}
    assert "x bench a: ERROR RuntimeError('kernel fault')" in capsys.readouterr().out


def test_past_the_deadline_a_step_is_skipped_and_recorded(tmp_path):
    rec = SpeedRecord("x.gguf", tmp_path / "r.json", {}, time.time() - 1)
    ran = []
    rec.step("validate", "a", ran.append)
    assert ran == [] and rec.res["validate"] == {}
    assert json.loads((tmp_path / "r.json").read_text())["skipped"] == ["validate a"]
