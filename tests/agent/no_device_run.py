"""A local `agent run` on a cluster that advertises no device: what the tests of its advice
(how a node joins, how to name the engine commit) share."""

from __future__ import annotations

from pathlib import Path

import pytest


def run_with_no_device(
    name: str, model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> int:
    """`agent run --local` of a small numpy experiment called name while the cluster has no
    device class; returns its exit status (the advice goes to stderr)."""
    import tomli_w

    from agent.cli import main
    from agent.local import LocalRunner

    monkeypatch.setattr(LocalRunner, "device_classes", lambda self: {})
    exp = tmp_path / "x.toml"
    exp.write_text(
        tomli_w.dumps(
            {
                "name": name,
                "models": [str(model_path)],
                "backends": ["numpy"],
                "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 8}],
                "space": {"numpy": {"prefill": {"chunk_tokens": [8, 16]}}},
            }
        )
    )
    argv = ["run", str(exp), "--local", "--storage", str(tmp_path / "s.journal"), "--no-promote"]
    return main(argv)
