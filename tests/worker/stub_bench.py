"""A model whose benchmark is a stand-in: the worker's paired bench can be driven and the order
of its measurements read back, without a device."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest


def stub_measured_model(
    monkeypatch: pytest.MonkeyPatch, seconds: float = 0.0
) -> tuple[SimpleNamespace, list[str]]:
    """(model, calls): worker.evaluator.measure replaced by one that takes ``seconds`` and
    records the config the model held (set_config's argument) in calls."""
    import worker.evaluator as ev

    calls: list[str] = []

    def measure(model, prompt, gen):  # noqa: ANN001, ANN202 - a stand-in for engine.bench
        if seconds:
            time.sleep(seconds)
        calls.append(model.cfg)
        return {"prefill_tok_s": 1.0, "decode_tok_s": 1.0}

    model = SimpleNamespace(spec=SimpleNamespace(n_vocab=64), cfg="")
    model.set_config = lambda cfg: setattr(model, "cfg", cfg)
    monkeypatch.setattr(ev, "measure", measure)
    return model, calls
