"""What the agent's runners share, whichever way they run the calls (agent.runner: Ray;
agent.local: this process): the call in flight (``Pending``), what a runner asks of the strategy
(``Strategy``), the state the strategy reads back and the accounting of a finished evaluation
(``Runner``), and how an error raised by a call is worded. Imports no Ray, so ``--local`` does
not either."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.acceptance import Decision
from agent.fleet import Slot
from agent.phase import Phase
from agent.study import StudyState
from engine.errors import EngineError
from engine.tuning import TuningConfig
from engine.tuning.shape import ModelShape
from worker.records import EvalResult, Outcome


@dataclass
class Pending:
    """One call in flight (or queued behind one on its worker, or waiting to be sent again)."""

    phase: Phase
    slot: Slot
    ref: Any
    dispatched: float
    deadline: float
    model: str = ""
    study: StudyState | None = None
    trial: Any = None
    flat: dict[str, Any] = field(default_factory=dict)
    role: str = ""
    config: TuningConfig | None = None  # ``flat`` resolved and checked once, by the strategy
    paired_against: int | None = None
    gap_s: float = 0.0  # agent time between the worker going idle and this dispatch
    first: EvalResult | None = None  # confirm: the result being confirmed
    first_decision: Decision | None = None
    first_overhead_s: float = 0.0
    lost: str = ""  # why its first worker was lost (it is being retried once)
    infra_tries: int = 0  # sends lost to infrastructure (agent.infra): never the config's failure


class Strategy(Protocol):
    """What a runner asks of the agent's strategy (agent.loop.Agent)."""

    def aa_args(self, slot: Slot, model: str) -> tuple[Any, ...] | None: ...
    def dispatch_work(self, slot: Slot) -> bool: ...
    def evaluate_args(self, p: Pending) -> tuple[tuple[Any, ...], dict[str, Any]]: ...
    def got_model(self, slot: Slot, model: str, shape: ModelShape) -> None: ...
    def got_aa(self, slot: Slot, model: str, res: EvalResult) -> None: ...
    def got_trial(self, p: Pending, res: EvalResult, overhead: float) -> None: ...
    def got_confirmation(self, p: Pending, res: EvalResult) -> None: ...
    def lost(self, p: Pending, outcome: Outcome, reason: str) -> None: ...
    def abandon(self, p: Pending, reason: str) -> None: ...


class Runner:
    """The state every runner keeps for the strategy (its calls, the run's warnings, the
    overhead figures of the report) and the handing on of an evaluation's result."""

    def __init__(
        self,
        strategy: Strategy,
        models: tuple[str, ...],
        trial_timeout_s: float,
        warnings: list[str],
    ) -> None:
        self.strategy = strategy
        self.models = models
        self.trial_timeout_s = trial_timeout_s
        self.warnings = warnings  # the strategy's list: one list of warnings per run
        self.pending: list[Pending] = []
        self.overheads: list[tuple[float, float]] = []  # (worker wall s, overhead s) per trial
        self.idle_gaps: list[float] = []  # worker seconds between consecutive evaluations

    def _evaluated(self, p: Pending, res: EvalResult, now: float) -> None:
        """A trial's or a confirmation's result, back at ``now``: count it on its slot, note the
        agent's overhead and the worker's idle gap, and hand it to the strategy."""
        slot = p.slot
        overhead = max(0.0, (now - p.dispatched) - res.wall_s) + p.gap_s
        if res.outcome is Outcome.OK:
            slot.failures_in_a_row = slot.infra_losses = 0
        slot.trials_done += 1
        if slot.last_finished and res.started:
            self.idle_gaps.append(max(0.0, res.started - slot.last_finished))
        slot.last_finished = res.finished
        if p.phase is Phase.TRIAL:
            slot.spans.append((res.started, res.finished))  # trials per GPU-hour
            self.overheads.append((res.wall_s, overhead))
            self.strategy.got_trial(p, res, overhead)
        else:
            self.strategy.got_confirmation(p, res)


def cause_line(e: BaseException) -> str:
    """The error raised inside a worker, as the engine worded it: Ray wraps it in a RayTaskError
    whose text is a remote traceback ("RayTaskError(ModelFileError): ray::TuningWorker.load()")."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    if isinstance(e, EngineError):  # its message names the file and the problem
        return first_line(e)
    return f"{type(e).__name__}: {first_line(e)}"


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__
