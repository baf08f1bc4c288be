"""Re-validation of promoted configs when the drift-sentinel key changed.

A promoted config (configs/<device class>/<family>/<shape key>.ctx<N>.toml) records in its
``[evidence]`` the sentinel key it was validated under (engine.verify.sentinel.cache_key: backend,
device class, driver, engine version, family). Under the same key the verdict stands; under
another one (a new driver, a new engine build) it is no longer evidence, and the config is
validated again before it is trusted: teacher-forced ``engine.verify.validate`` with the registry's
class budgets, on the model named in the evidence when it is on this machine, else on a
synthetic model of the config's family.

``python -m agent recheck`` does it for every promoted config of this machine's device classes;
the worker (worker/evaluator.py) does it for a promoted study baseline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ConfigError, EngineError
from engine.tuning import TuningConfig
from engine.tuning.promoted import evidence_key, key_changes, read_evidence
from engine.verify.sentinel import cache_key

RECHECK_PROMPTS = (1, 5, 37, 70)  # one token, a short one, past the 32-token chunk edge, ragged
RECHECK_STEPS = 4


def model_for(evidence: dict[str, Any], family: str) -> tuple[Path, str]:
    """(GGUF path, reference) to re-validate on: the evidence's model when it is on this machine
    (a synthetic reference, a GGUF file, a cached checkpoint), else a synthetic model of the
    family (the sentinel's ragged preset: row counts no tile divides)."""
    from engine import checkpoints
    from worker.models import is_synthetic, resolve_model

    ref = str(evidence.get("model", ""))
    if ref and is_synthetic(ref):
        return resolve_model(ref), ref
    if ref.endswith(".gguf") and Path(ref).is_file():
        return Path(ref), ref
    if ref in checkpoints.MODELS and checkpoints.is_cached(ref):
        return checkpoints.cached_path(ref), ref
    from engine.verify.sentinel import SENTINEL_PRESET

    synth = f"synthetic:{SENTINEL_PRESET}:{family}:q4_k_m"
    return resolve_model(synth), synth


def revalidate(model: Any, config: TuningConfig, budgets: dict | None = None) -> Any:
    """engine.verify.validate of ``config`` on a loaded model (teacher-forced, registry budgets
    unless ``budgets`` tightens them), on prompts of several lengths; returns the ValidateReport."""
    from engine.bench import bench_prompt
    from engine.verify.validate import validate

    vocab = model.spec.n_vocab
    prompts = [bench_prompt(n, vocab, seed=5) for n in RECHECK_PROMPTS]
    return validate(model, config, prompts, RECHECK_STEPS, budgets=budgets)


@dataclass
class Recheck:
    """One promoted config judged on this machine."""

    path: str
    backend: str
    device_class: str
    family: str
    key: dict[str, str]  # this machine's
    recorded_key: dict[str, str] | None
    changes: list[str]
    revalidated: bool
    passed: bool
    model: str = ""
    reasons: list[str] = field(default_factory=list)
    blame: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        if not self.revalidated:
            return f"ok    {self.path}: sentinel key unchanged, not re-validated"
        why = "; ".join(self.changes)
        if self.passed:
            return f"ok    {self.path}: re-validated on {self.model} ({why})"
        blame = f"; first divergence: {self.blame}" if self.blame else ""
        return (
            f"FAIL  {self.path}: fails re-validation on {self.model} ({why}): "
            + "; ".join(self.reasons[:2])
            + blame
        )


def recheck_file(
    path: Path, backend: Any, engine_version: str, force: bool = False
) -> Recheck | None:
    """Judge one promoted file with a backend instance of its device class; None when the file
    is for another backend. Re-validates only when the key changed (or ``force``)."""
    from engine.gguf_model import open_model
    from engine.models import build_model

    try:
        cfg = TuningConfig.from_toml(path)
    except ConfigError as e:
        raise ConfigError(f"promoted config {path}: {e}") from None
    if cfg.backend != backend.name:
        return None
    evidence = read_evidence(path)
    family = str(evidence.get("model_family") or path.parent.name)
    dev = backend.device_info()
    now = cache_key(backend.name, dev.device_class, dev.driver, engine_version, family)
    then = evidence_key(evidence, cfg.backend)
    changes = key_changes(then, now)
    res = Recheck(str(path), cfg.backend, dev.device_class, family, now, then, changes, False, True)
    if not changes and not force:
        return res
    if not changes:
        res.changes = ["--force"]
    model_path, res.model = model_for(evidence, family)
    model = build_model(open_model(model_path), backend)
    problems = cfg.problems(dev)
    if problems:
        res.revalidated, res.passed, res.reasons = True, False, problems
        return res
    report = revalidate(model, cfg)
    res.revalidated, res.passed = True, report.passed
    res.reasons = list(report.reasons)
    res.blame = str(report.blame) if report.blame is not None else ""
    return res


def recheck_all(
    root: Path, backends: list[str], engine_version: str, force: bool = False
) -> list[Recheck]:
    """Every promoted config under ``root`` of the device classes these backends serve here."""
    from engine import backends as registry

    out: list[Recheck] = []
    for name in backends:
        try:
            b = registry.create(name, device=registry.default_device(name))
            folder = root / b.device_info().device_class
        except Exception as e:  # noqa: BLE001 - no device, no driver, no library: one line
            raise EngineError(f"backend {name} is not usable here: {e}") from None
        # configs/<class>/<family>/<shape key>.ctx<N>.toml (engine/tuning/promoted.py)
        for path in sorted(folder.glob("*/*.toml")) if folder.is_dir() else []:
            r = recheck_file(path, b, engine_version, force)
            if r is not None:
                out.append(r)
    return out
