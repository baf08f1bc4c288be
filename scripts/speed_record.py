"""What a device speed script keeps (scripts/device_speed.py, device_hybrid_bench.py,
vulkan_decode_speed.py): one JSON rewritten after every step, and a deadline past which no step
starts, so a call that runs out of time still brings back what it measured."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class SpeedRecord:
    """The result document of one model's run: variants, bench, validate, profile, skipped."""

    def __init__(self, model: str, out: Path, variants: dict[str, dict], deadline: float) -> None:
        self.name = Path(model).stem
        self.out = out
        self.deadline = deadline
        self.res: dict[str, Any] = {
            "model": model,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "variants": variants,
            "bench": {},
            "validate": {},
            "profile": {},
            "skipped": [],
        }

    def save(self) -> None:
        self.out.write_text(json.dumps(self.res, indent=1, default=str))

    def late(self, what: str) -> bool:
        """Past the deadline: `what` is recorded as skipped (and saved) instead of started."""
        if time.time() < self.deadline:
            return False
        self.res["skipped"].append(what)
        print(f"{self.name}: past the deadline, skipped {what}", flush=True)
        self.save()
        return True

    def step(self, kind: str, variant: str, body: Callable[[str], None]) -> None:
        """One bench / validate / profile of a variant, skipped past the deadline:
        body(variant) records its result under res[kind][variant] and prints its line; an
        exception is that variant's result (its traceback), never the end of the run."""
        if self.late(f"{kind} {variant}"):
            return
        try:
            body(variant)
        except Exception as e:  # noqa: BLE001 - one variant's failure is its result
            self.res[kind][variant] = {"error": traceback.format_exc()}
            print(f"{self.name} {kind} {variant}: ERROR {e!r}", flush=True)
        self.save()

    def load(self, backend: str, memory: bool = False) -> Any:
        """The engine on the registry defaults (no promoted config), its load time and device
        recorded; `memory` also records the backend's memory report."""
        from engine.runtime import load
        from engine.tuning import TuningConfig

        t0 = time.time()
        eng = load(self.res["model"], backend, TuningConfig.default(backend), use_promoted=False)
        be = eng.model.backend
        self.res["load_s"] = time.time() - t0
        self.res["device"] = be.device_info().to_dict()
        extra = f" on {be.device_info().name}"
        if memory:
            self.res["memory"] = str(be.memory_report())
            extra += f" ({self.res['memory']})"
        print(f"== {self.name}: loaded in {self.res['load_s']:.1f}s{extra}", flush=True)
        self.save()
        return eng
