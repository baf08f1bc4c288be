"""Typed records a worker hands back: what it is (WorkerInfo) and what a candidate did (EvalResult).

Everything here is a frozen dataclass of plain values, so results pickle through Ray and turn into
JSON (``to_dict``) for Optuna user attrs, the fleet status file and promotion evidence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from engine.tuning.registry import NUMERIC_BUDGETS, Budget


class Outcome(StrEnum):
    """How an evaluation ended. Only ``ok`` trials have benchmark samples."""

    OK = "ok"
    INFEASIBLE = "infeasible"  # violates a registry constraint on this device; never compiled
    COMPILE_ERROR = "compile_error"  # set_config raised KernelCompileError
    INVALID = "invalid"  # validate failed: logits or greedy tokens differ from the reference
    CRASH = "crash"  # an exception in the engine, or the worker process died
    TIMEOUT = "timeout"  # the trial ran past the experiment's trial timeout; worker restarted


@dataclass(frozen=True)
class WorkerInfo:
    """Where an evaluation ran: the host, the Ray worker, the device and the engine build."""

    worker_id: str  # "<device class>-<index>", stable across restarts of that slot
    host: str
    node_id: str
    pid: int
    backend: str
    device_class: str
    device_name: str
    vendor: str
    driver: str
    memory_bytes: int
    engine_commit: str  # git commit of the engine checkout, "+dirty" when it has local edits
    device: dict[str, Any] = field(default_factory=dict)  # engine DeviceInfo.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Objective:
    """One throughput figure to maximize: ``prefill_tok_s`` or ``decode_tok_s`` measured on a
    prompt of ``prompt_tokens`` (decode: ``gen_tokens`` tokens generated after it)."""

    metric: str
    prompt_tokens: int
    gen_tokens: int = 1

    @property
    def name(self) -> str:
        return f"{self.metric}@{self.prompt_tokens}"


@dataclass(frozen=True)
class BenchPlan:
    """How the paired benchmark runs: ``pairs`` candidate/best pairs after ``warmup`` runs of
    each, the order alternating (AB, BA, AB, ...) so drift hits both sides alike."""

    objectives: tuple[Objective, ...]
    pairs: int = 5
    warmup: int = 1


@dataclass(frozen=True)
class ValidatePlan:
    """Validation against the reference path (per-token prefill, default config)."""

    prompts: tuple[str, ...] = ()  # texts, tokenized with the model's tokenizer
    random_prompts: tuple[int, ...] = ()  # lengths of seeded pseudo-random token-id prompts
    steps: int = 8
    # Tightened budget bounds per numeric class: ((class, ((key, value), ...)), ...); the
    # registry's NUMERIC_BUDGETS for the rest. Checked by the experiment parser: never looser.
    budgets: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()

    def budget_table(self) -> dict[str, Budget]:
        """Every class's budget: the registry's, tightened where the plan says (raises
        ConfigError naming the key for a bound looser than the registry's)."""
        table = dict(NUMERIC_BUDGETS)
        for cls, caps in self.budgets:
            table[cls] = table[cls].tightened(**dict(caps))
        return table


@dataclass(frozen=True)
class PairedSamples:
    """Per objective: candidate[i] and best[i] were measured back to back in pair i."""

    objective: str
    candidate: tuple[float, ...]
    best: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": list(self.candidate), "best": list(self.best)}


@dataclass(frozen=True)
class EvalResult:
    """One candidate evaluated on one worker: outcome, reason, validate diffs, paired samples."""

    outcome: Outcome
    worker: WorkerInfo | None
    candidate: dict[str, Any]  # flat config
    best: dict[str, Any]  # flat config of the best it was paired against
    reason: str = ""
    validate: dict[str, Any] | None = None  # summary of engine.validate.ValidateReport
    samples: tuple[PairedSamples, ...] = ()
    started: float = 0.0  # unix time
    finished: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)  # compile, validate, bench seconds
    gpu: dict[str, Any] | None = None  # worker.gpustate.sample() after the trial, when known
    # a promoted baseline: its sentinel key then and now, and whether it was re-validated
    revalidation: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def wall_s(self) -> float:
        return self.finished - self.started

    def sample(self, objective: str) -> PairedSamples:
        for s in self.samples:
            if s.objective == objective:
                return s
        raise KeyError(f"no samples for objective {objective!r}")

    def medians(self) -> dict[str, float]:
        """Median candidate throughput per objective."""
        import statistics

        return {s.objective: statistics.median(s.candidate) for s in self.samples}
