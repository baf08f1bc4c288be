"""Typed records a worker hands back: what it is (WorkerInfo) and what a candidate did (EvalResult).

Everything here is a frozen dataclass of plain values, so results pickle through Ray and turn into
JSON (``to_dict``) for Optuna user attrs, the fleet status file and promotion evidence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from engine.device_info import DeviceInfo
from engine.verify.budgets import NUMERIC_BUDGETS, Budget


class Outcome(StrEnum):
    """How a trial ended: the one list of outcome names (the agent's records, its study, the
    replay and the dashboard read these). Only ``ok`` trials have benchmark samples."""

    OK = "ok"
    INVALID = "invalid"  # validate failed: logits or greedy tokens differ from the reference
    COMPILE_ERROR = "compile_error"  # set_config raised KernelCompileError
    CRASH = "crash"  # an exception in the engine, or the worker process died
    TIMEOUT = "timeout"  # the trial ran past the experiment's trial timeout; worker restarted
    INFEASIBLE = "infeasible"  # violates a registry constraint on this device; never compiled
    # (a config whose estimated footprint is over the experiment's [memory] budget is this too)
    OVER_BUDGET = "over_budget"  # ran, but its measured footprint is over the memory budget
    # Only the agent gives these two (a worker never runs such a trial):
    DUPLICATE = "duplicate"  # config already evaluated in its study; pruned without running
    INTERRUPTED = "interrupted"  # running when the agent stopped; failed on resume, may run again

    @property
    def spends_budget(self) -> bool:
        """The candidate ran on a worker: a trial of the budget spent."""
        return self in BUDGET_OUTCOMES

    @property
    def failed(self) -> bool:
        """A config that cannot win: told to the sampler as a violated constraint."""
        return self in FAILED_OUTCOMES

    @property
    def broke(self) -> bool:
        """It ran on a worker and broke (the dashboard's "failed" filter)."""
        return self in (Outcome.COMPILE_ERROR, Outcome.CRASH, Outcome.TIMEOUT)

    @classmethod
    def of(cls, value: object) -> Outcome:
        """From a stored string; an unknown one (a record from other code) reads as a crash."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.CRASH


BUDGET_OUTCOMES = frozenset(
    {
        Outcome.OK,
        Outcome.COMPILE_ERROR,
        Outcome.INVALID,
        Outcome.CRASH,
        Outcome.TIMEOUT,
        Outcome.OVER_BUDGET,
    }
)
FAILED_OUTCOMES = frozenset(
    {
        Outcome.INFEASIBLE,
        Outcome.COMPILE_ERROR,
        Outcome.INVALID,
        Outcome.CRASH,
        Outcome.TIMEOUT,
        Outcome.OVER_BUDGET,
    }
)


_T = TypeVar("_T")


def known_fields(cls: type[_T], data: Mapping[str, Any] | None, **defaults: Any) -> dict[str, Any]:
    """The keys of ``data`` that are fields of the dataclass ``cls``, over ``defaults``: a record
    stored by older or newer code (keys missing or added since) still reads."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return {**defaults, **{k: v for k, v in (data or {}).items() if k in names}}


def same_named(obj: object, *names: str) -> dict[str, Any]:
    """``obj``'s attributes ``names`` as keyword arguments: a record's fields copied from the
    object they summarise where the names agree."""
    return {n: getattr(obj, n) for n in names}


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
    device: DeviceInfo | None = None  # the engine's record of the device (None: not known)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # the device as a dict too: JSON for attrs and the status file

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerInfo:
        blank: dict[str, Any] = {f.name: "" for f in fields(cls)}
        blank |= {"pid": 0, "memory_bytes": 0}
        kw = known_fields(cls, d, **blank)
        dev = kw.get("device")
        kw["device"] = device_from_dict(dev) if isinstance(dev, Mapping) and dev else None
        return cls(**kw)


def device_from_dict(d: Mapping[str, Any]) -> DeviceInfo:
    """A DeviceInfo stored as a dict (``to_dict``), older or newer fields tolerated."""
    return DeviceInfo(
        **known_fields(DeviceInfo, d, backend="", name="", vendor="", device_class="")
    )


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
    # the experiment's [memory] (agent.loop sets it from Experiment.memory): the worker refuses
    # a config estimated over its budget before compiling and measures the footprint after
    memory: MemoryPlan | None = None


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
class MemoryPlan:
    """The memory a trial may hold (an experiment's ``[memory]`` table): the context it serves
    (KV cache / recurrent state sized for ``context_tokens``) and a budget in bytes. The budget is
    ``budget_bytes`` when set, else the device's memory less ``reserve_bytes`` (0: the reserve is
    ``reserve_fraction`` of the device's memory). A config whose estimated footprint is over the
    budget is infeasible before it compiles; a measured footprint over it is rejected."""

    context_tokens: int = 4096
    budget_bytes: int | None = None
    reserve_bytes: int = 0
    reserve_fraction: float = 0.1

    def budget_for(self, device_memory_bytes: int) -> int | None:
        """The byte budget on a device with ``device_memory_bytes`` (None: no budget is known,
        a fixed one not set and the device's memory not reported)."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        if device_memory_bytes <= 0:
            return None
        reserve = self.reserve_bytes or int(device_memory_bytes * self.reserve_fraction)
        return max(device_memory_bytes - reserve, 0)


@dataclass(frozen=True)
class PairedSamples:
    """Per objective: candidate[i] and best[i] were measured back to back in pair i."""

    objective: str
    candidate: tuple[float, ...]
    best: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"candidate": list(self.candidate), "best": list(self.best)}

    @classmethod
    def from_dict(cls, objective: str, d: Mapping[str, Any]) -> PairedSamples:
        return cls(objective, tuple(d.get("candidate") or ()), tuple(d.get("best") or ()))


@dataclass(frozen=True)
class PromptDiff:
    """One validate prompt: the worst differences from the reference and the greedy tokens."""

    prompt_tokens: int = 0
    positions: int = 0
    max_abs_diff: float = 0.0
    nmse: float = 0.0
    kld_max: float | None = None
    kld_mean: float | None = None
    top1_checked: int = 0
    top1_agree: int = 0
    nan: int = 0
    inf: int = 0
    token_agreement: float = 0.0
    reference_tokens: tuple[int, ...] = ()
    candidate_tokens: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PromptDiff:
        kw = known_fields(cls, d)
        for k in ("reference_tokens", "candidate_tokens", "reasons"):
            kw[k] = tuple(kw.get(k) or ())
        return cls(**kw)


@dataclass(frozen=True)
class ValidateSummary:
    """What the agent records of a ValidateReport (engine.verify.validate): worst and per-prompt
    diffs. ``kld`` and ``numeric_classes`` are None in records from before teacher-forced
    validate."""

    passed: bool
    max_abs_diff: float = 0.0
    nmse: float = 0.0
    kld: float | None = None
    steps: int = 0
    tolerances: dict[str, float] = field(default_factory=dict)
    numeric_classes: tuple[str, ...] | None = None
    blame: dict[str, Any] | None = None  # engine.verify.blame.Blame.to_dict(): the first divergence
    reasons: tuple[str, ...] = ()
    prompts: tuple[PromptDiff, ...] = ()
    # engine.verify.op_replay.ReplayResult.to_dict(): per-op worst NMSE and bound on the reference's
    # inputs (None in records from before op-level replay)
    replay: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # wall seconds per validate phase

    def to_dict(self) -> dict[str, Any]:
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "tolerances": dict(self.tolerances),
            "seconds": dict(self.seconds),
            "numeric_classes": (
                list(self.numeric_classes) if self.numeric_classes is not None else None
            ),
            "reasons": list(self.reasons),
            "prompts": [p.to_dict() for p in self.prompts],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ValidateSummary:
        kw = known_fields(cls, d, passed=False)
        kw["passed"] = bool(kw["passed"])
        kw["tolerances"] = dict(kw.get("tolerances") or {})
        kw["seconds"] = dict(kw.get("seconds") or {})
        if kw.get("numeric_classes") is not None:
            kw["numeric_classes"] = tuple(kw["numeric_classes"])
        kw["reasons"] = tuple(kw.get("reasons") or ())
        kw["prompts"] = tuple(PromptDiff.from_dict(p) for p in kw.get("prompts") or ())
        return cls(**kw)


@dataclass(frozen=True)
class EvalResult:
    """One candidate evaluated on one worker: outcome, reason, validate diffs, paired samples."""

    outcome: Outcome
    worker: WorkerInfo | None
    candidate: dict[str, Any]  # flat config
    best: dict[str, Any]  # flat config of the best it was paired against
    reason: str = ""
    validate: ValidateSummary | None = None
    samples: tuple[PairedSamples, ...] = ()
    started: float = 0.0  # unix time
    finished: float = 0.0
    phase_s: dict[str, float] = field(default_factory=dict)  # compile, validate, bench seconds
    gpu: dict[str, Any] | None = None  # worker.gpustate.sample() after the trial, when known
    # a promoted baseline: its sentinel key then and now, and whether it was re-validated
    revalidation: dict[str, Any] | None = None
    # the candidate's device footprint measured after its bench: engine.device_info.MemoryReport
    # .to_dict() plus "driver_bytes" (the driver's own figure, where the backend has one) and
    # "budget_bytes"; None where the backend cannot report memory (never zeros)
    memory: dict[str, Any] | None = None

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
