"""One Optuna study per (experiment, device class, model): create or resume, ask without
duplicates, tell with the trial's record, and keep the current best.

Resume after an agent restart: trials left RUNNING by the previous agent are failed as
``interrupted`` (their configs may run again); every config that completed or failed is never
suggested again (a repeat is pruned as ``duplicate`` without running). The baseline (promoted or
default config) is enqueued as the first trial of a new study.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from agent.experiment import Experiment
from agent.phase import TrialStage, move
from agent.records import Outcome, TrialRecord
from agent.samplers import make_sampler
from agent.space import SearchSpace, config_key, space_configs
from engine.tuning import TuningConfig
from engine.tuning.shape import ModelShape
from worker.models import model_label

log = logging.getLogger(__name__)

BASELINE = "baseline"
CANDIDATE = "candidate"
# Outcomes that are ``Outcome.failed`` are told to the sampler as a violated constraint
# (``_tell_failed``): told PRUNED, with the Optuna constraint ``CONSTRAINT`` = 1.0 (a system
# attr: trial.constraints).
CONSTRAINT = "runs_and_validates"
_ENUMERATE = 20_000  # spaces up to this size are listed to draw an untried config
FAILED = "failed"  # in StudyState.told: the config was told as a violated constraint
_TOLD = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)  # PRUNED: failed or duplicate


def study_name(experiment: str, device_class: str, model: str) -> str:
    return f"{experiment}/{device_class}/{model_label(model)}"


@dataclass
class Best:
    trial: int | None  # None until the baseline trial has run
    config: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)


class StudyState:
    """A study and what the agent knows about it."""

    def __init__(
        self,
        exp: Experiment,
        device_class: str,
        backend: str,
        model: str,
        family: str,
        storage: optuna.storages.BaseStorage,
        baseline: dict[str, Any],
        baseline_source: str,
    ) -> None:
        self.exp = exp
        self.device_class = device_class
        self.backend = backend
        self.model = model
        self.family = family
        self.shape: ModelShape | None = None  # the model's shape class: keys its promotion
        self.name = study_name(exp.name, device_class, model)
        self.space: SearchSpace = exp.search_space(backend)  # resolved once, at load
        self.study = optuna.create_study(
            study_name=self.name,
            storage=storage,
            directions=["maximize"] * len(exp.objectives),
            sampler=make_sampler(exp, self.space),
            load_if_exists=True,
        )
        self.tried: set[str] = set()  # configs evaluated or failed: never run again
        # What the sampler was told for each tried config: its values (COMPLETE), or FAILED (a
        # violated constraint); a repeat is told the same (_tell_duplicate).
        self.told: dict[str, list[float] | str] = {}
        self.in_flight: dict[int, str] = {}  # trial number -> config key
        self.states: dict[int, TrialStage] = {}  # trial number -> state, until it finishes
        self.evaluated = 0  # trials that spent budget
        self.duplicates_in_a_row = 0
        # Repeats in a row after which a random untried config is enqueued (_enqueue_untried).
        self.repeat_guard = 3
        self._rng = random.Random(exp.sampler.seed)
        self.exhausted = False
        self.interrupted_on_resume = 0
        self.space_changed = ""  # on resume: how the search space differs from the study's start
        self.confirm_queue: list[Any] = []
        self._resolved: dict[str, TuningConfig] = {}  # config key -> config (see resolve)
        self.teach_failures = True  # False: failed trials told FAIL, unseen by the sampler
        # True: a repeat is told the tried config's values (_tell_duplicate); off by default,
        # as it cost more trials on the measured replay table (docs/BENCHMARKS.md).
        self.tell_duplicates = False
        self._writes: list[Callable[[], None]] = []  # storage writes deferred by finish/set_best
        # trial number -> its record's attrs, from finish until its write is stored: what a run
        # whose storage went down keeps aside for the next run (agent.unsaved)
        self.unsaved: dict[int, dict[str, Any]] = {}
        self._resume(baseline, baseline_source)

    # --- resume -------------------------------------------------------------------------
    def _space_attr(self) -> dict[str, list[str]]:
        return {k: [str(c) for c in v] for k, v in self.space.grid().items()}

    def _resume(self, baseline: dict[str, Any], source: str) -> None:
        attrs = self.study.user_attrs
        if "baseline" in attrs:
            self.baseline = dict(attrs["baseline"]["config"])
            self.baseline_source = str(attrs["baseline"]["source"])
            self.space_changed = _space_diff(attrs.get("space"), self._space_attr())
        else:
            self.baseline, self.baseline_source = dict(baseline), source
            meta = {
                "experiment": self.exp.name,
                "experiment_file": self.exp.source,
                "device_class": self.device_class,
                "backend": self.backend,
                "model": self.model,
                "family": self.family,
                "objectives": [o.name for o in self.exp.objectives],
                "target": self.exp.acceptance.target,
                "baseline": {"config": self.baseline, "source": source},
                "space": self._space_attr(),
            }
            for k, v in meta.items():
                self.study.set_user_attr(k, v)
            params = self.space.params_of(self.baseline) or {}
            self.study.enqueue_trial(params, user_attrs={"role": BASELINE})
            self._start_configs()
            self._warm_start()
            if self.exp.sampler.screen_variants:
                self._screen_variants()
        best = attrs.get("best")
        self.best = (
            Best(best["trial"], dict(best["config"]), best.get("metrics", {}))
            if best
            else (Best(None, dict(self.baseline)))
        )
        self.interrupted_on_resume = self.settle_running("the agent stopped while this trial ran")
        for t in self.study.get_trials(deepcopy=False):
            if t.state not in _TOLD or "config" not in t.user_attrs:
                continue
            rec = TrialRecord.from_attrs(self.name, t.number, t.user_attrs)
            if rec.outcome in (Outcome.INTERRUPTED, Outcome.DUPLICATE):
                continue
            key = config_key(rec.config)
            self.tried.add(key)
            if t.state is TrialState.COMPLETE and t.values is not None:
                self.told[key] = list(t.values)
            elif rec.outcome.failed and t.constraints:
                self.told[key] = FAILED
            if rec.outcome.spends_budget:
                self.evaluated += 1
            if rec.role == BASELINE and self.best.trial is None and rec.outcome is Outcome.OK:
                self.best = Best(t.number, dict(rec.config), dict(rec.metrics))

    def settle_running(self, reason: str) -> int:
        """Close every trial the storage still holds as RUNNING (none of this agent's runs now):
        one whose record was written whole is told its result; the others fail as interrupted,
        their configs free to run again. Returns how many were interrupted."""
        n = 0
        names = [o.name for o in self.exp.objectives]
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            ua = t.user_attrs
            rec = TrialRecord.from_attrs(self.name, t.number, ua)
            metrics = rec.metrics
            if "outcome" in ua and rec.outcome.spends_budget:
                # Stopped between writing the record (outcome goes last) and tell: the result is
                # whole, finish the write rather than lose it.
                if all(k in metrics for k in names):
                    self.study.tell(t.number, [metrics[k] for k in names])
                elif rec.outcome.failed:
                    self._tell_failed(optuna.trial.Trial(self.study, t._trial_id))
                else:
                    self.study.tell(t.number, state=TrialState.FAIL)
                continue
            trial = optuna.trial.Trial(self.study, t._trial_id)
            trial.set_user_attr("outcome", Outcome.INTERRUPTED.value)
            trial.set_user_attr("reason", reason)
            self.study.tell(t.number, state=TrialState.FAIL)
            n += 1
        return n

    def _start_configs(self) -> None:
        """Enqueue, after the baseline, the experiment's [[start]] configs of this backend (each
        the baseline with its overrides); recorded in the study's ``start_configs`` attr."""
        queued = []
        for st in self.exp.start:
            if st.backend != self.backend:
                continue
            flat = self._in_space(st.config)
            params = self.space.params_of(flat)
            if params is None or any(flat.get(k) != v for k, v in st.config.items()):
                # (checked at load; a promoted baseline can still put it outside): a knob of a
                # variant the config does not run would be dropped, not tried
                log.warning("%s: start %r is outside the space here: skipped", self.name, st.name)
                continue
            self.study.enqueue_trial(
                params, user_attrs={"role": CANDIDATE, "start_config": st.name}
            )
            queued.append(st.name)
        self.study.set_user_attr("start_configs", queued)
        if queued:
            log.info("%s: trying the experiment's start configs first: %s", self.name, queued)

    def _warm_start(self) -> None:
        """Enqueue, after the baseline, the best configs of this experiment on other device
        classes (agent/warmstart.py); recorded in the study's ``warm_start`` attr."""
        from agent import warmstart

        found = warmstart.from_storage(
            self.study._storage,
            self.exp.name,
            self.backend,
            self.device_class,
            self.exp.acceptance.target,
        )
        used = warmstart.enqueue(self.study, self.space, self.baseline, found, CANDIDATE)
        self.study.set_user_attr("warm_start", [w.to_dict() for w in used])
        if used:
            log.info("%s: warm start from %s", self.name, sorted({w.source for w in used}))

    def _screen_variants(self) -> None:
        """Enqueue one config per code variant the space opens that the baseline does not run:
        that variant with its registry defaults (or the space's first choice of a knob whose
        default the experiment leaves out), every other op at the baseline."""
        queued = []
        for o in self.space.ops:
            for v in o.variant_dim.choices:
                if v == self.baseline.get(o.variant_dim.key):
                    continue
                params = self.space.params_of(self._in_space({o.variant_dim.key: v}))
                if params is not None:
                    self.study.enqueue_trial(params, user_attrs={"role": CANDIDATE})
                    queued.append(f"{o.variant_dim.key}={v}")
        self.study.set_user_attr("screened_variants", queued)
        if queued:
            log.info("%s: screening %d variants first: %s", self.name, len(queued), queued)

    def _in_space(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The baseline with ``changes`` (a changed variant brings its registry defaults), then
        each knob of the chosen variants that the space does not allow at that value at the
        space's first choice: the nearest config the sampler can ask for."""
        flat = TuningConfig.from_flat(self.backend, self.baseline).replace(**changes).flat()
        for o in self.space.ops:
            for d in o.dims_of(str(flat.get(o.variant_dim.key))):
                if flat.get(d.key) not in d.choices and d.key not in changes:
                    flat[d.key] = d.choices[0]
        return flat

    @property
    def start_configs(self) -> list[str]:
        """The experiment's [[start]] configs enqueued after the baseline, by name."""
        return list(self.study.user_attrs.get("start_configs", []))

    @property
    def warm_start(self) -> list[dict[str, Any]]:
        """The configs from other device classes enqueued first (from, trial, metric)."""
        return list(self.study.user_attrs.get("warm_start", []))

    # --- ask ----------------------------------------------------------------------------
    def budget_left(self) -> int:
        return self.exp.budget.trials - self.evaluated - len(self.in_flight)

    def ask(self) -> tuple[optuna.Trial, dict[str, Any], str] | None:
        """The next config to evaluate, its trial and role; None when the space is exhausted.
        Repeats of tried or in-flight configs are pruned here, never run."""
        limit = max(30, min(self.space.size, 200))
        while True:
            trial = self.study.ask()
            role = trial.user_attrs.get("role", CANDIDATE)
            if role == BASELINE:
                if self.space.params_of(self.baseline) is not None:
                    self.space.suggest(trial, self.baseline)
                flat = dict(self.baseline)
            else:
                flat = self.space.suggest(trial, self.baseline)
            key = config_key(flat)
            if key in self.tried or key in self.in_flight.values():
                self._tell_duplicate(trial, flat, key)
                self.duplicates_in_a_row += 1
                if self.tell_duplicates and self.duplicates_in_a_row % self.repeat_guard == 0:
                    self._enqueue_untried()
                if self.duplicates_in_a_row >= limit or len(self.tried) >= self.space.size:
                    self.exhausted = True
                    log.info(
                        "%s: search space exhausted after %d configs", self.name, len(self.tried)
                    )
                    return None
                continue
            self.duplicates_in_a_row = 0
            self.in_flight[trial.number] = key
            self.states[trial.number] = TrialStage.ASKED
            return trial, flat, role

    def _enqueue_untried(self) -> bool:
        """After ``repeat_guard`` repeats in a row (the sampler has settled on configs already
        tried), enqueue a config never tried, drawn at random: the search goes on exploring
        instead of asking the same configs until the space is called exhausted."""
        taken = self.tried | set(self.in_flight.values())
        if self.space.size <= _ENUMERATE:
            every = space_configs(self.space, self.baseline)
            pool = [f for f in every if config_key(f) not in taken]
        else:  # too many to list: random draws, the first untried one
            draws = (self.space.random_config(self._rng, self.baseline) for _ in range(100))
            pool = [f for f in draws if config_key(f) not in taken][:1]
        if not pool:
            return False
        flat = self._rng.choice(pool)
        self.study.enqueue_trial(self.space.params_of(flat) or {}, user_attrs={"role": CANDIDATE})
        return True

    def move(self, number: int, nxt: TrialStage) -> None:
        """Trial ``number`` moves to ``nxt`` (agent.phase.TRIAL_MOVES; IllegalTransition if not)."""
        self.states[number] = move(number, self.states.get(number), nxt)
        if nxt is TrialStage.FINISHED:
            del self.states[number]

    # --- tell ---------------------------------------------------------------------------
    def finish(self, trial: optuna.Trial, record: TrialRecord, values: list[float] | None) -> None:
        """Close a trial: the agent's own state now; the storage write (the record as user attrs,
        then tell: COMPLETE with values, else FAIL) is queued for ``flush``, so the agent can
        hand the worker its next trial first."""
        self.move(trial.number, TrialStage.FINISHED)
        key = self.in_flight.pop(trial.number, None)
        if record.outcome.spends_budget or record.outcome is Outcome.INFEASIBLE:
            key = key or config_key(record.config)
            self.tried.add(key)
            if values is not None:
                self.told[key] = list(values)
            elif record.outcome.failed and self.teach_failures:
                self.told[key] = FAILED
        if record.outcome.spends_budget:
            self.evaluated += 1
            self.unsaved[trial.number] = record.to_attrs()

        def write() -> None:
            # One attr per storage write: "outcome" last, so a trial whose outcome is stored
            # holds its whole record even if the agent dies before tell (resume finishes it).
            attrs = record.to_attrs()
            outcome = attrs.pop("outcome")
            for k, v in attrs.items():
                trial.set_user_attr(k, v)
            trial.set_user_attr("outcome", outcome)
            if values is not None:
                self.study.tell(trial, values)
            elif record.outcome.failed:
                self._tell_failed(trial)
            else:
                self.study.tell(trial, state=TrialState.FAIL)
            self.unsaved.pop(trial.number, None)

        self._writes.append(write)

    def _tell_duplicate(self, trial: optuna.Trial, flat: dict[str, Any], key: str) -> None:
        """A repeat of a tried config, never run (no budget): told what the sampler was told for
        that config, so TPE keeps seeing a good region as good. (Told PRUNED without values, as
        before, TPE ranked repeats of the best config with the worst trials and was pushed away
        from it; told FAIL, unseen, it kept asking for them.) A repeat of a config in flight or
        never told (its record is not written yet) stays PRUNED: constant_liar covers it."""
        trial.set_user_attr("outcome", Outcome.DUPLICATE.value)
        trial.set_user_attr("config", flat)
        told = self.told.get(key) if self.tell_duplicates else None
        if told == FAILED:
            trial.set_constraint(CONSTRAINT, 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
        elif told is not None:
            self.study.tell(trial, list(told))
        else:
            self.study.tell(trial, state=TrialState.PRUNED)

    def _tell_failed(self, trial: optuna.Trial) -> None:
        """A config that cannot win (infeasible, compile error, invalid output, crash, timeout)
        is told PRUNED with a violated constraint: TPE reads PRUNED trials (never FAIL ones) and
        ranks infeasible ones below every feasible trial, so it stops proposing that region.
        (CMA-ES and random search read no constraints: agent/samplers.py.)"""
        if not self.teach_failures:  # the replay's ablation: how the agent told them before
            self.study.tell(trial, state=TrialState.FAIL)
            return
        trial.set_constraint(CONSTRAINT, 1.0)
        self.study.tell(trial, state=TrialState.PRUNED)

    def set_best(self, trial: int, config: dict[str, Any], metrics: dict[str, float]) -> None:
        self.best = Best(trial, dict(config), dict(metrics))
        attr = {"trial": trial, "config": dict(config), "metrics": metrics, "at": time.time()}
        self._writes.append(lambda: self.study.set_user_attr("best", attr))

    def flush(self) -> None:
        """Run the queued storage writes, in order; one that fails stays queued (a retry of the
        flush starts with it: each write only sets attrs and tells, which bear repeating)."""
        while self._writes:
            self._writes[0]()
            self._writes.pop(0)

    def record_promotion(self, info: dict[str, Any]) -> None:
        """Keep one promotion per (repository, branch) in ``promotions``; ``promotion`` is the
        latest (what older readers show)."""
        key = (info.get("repo"), info.get("branch"))
        kept = [
            p
            for p in self.study.user_attrs.get("promotions") or []
            if (p.get("repo"), p.get("branch")) != key
        ]
        self.study.set_user_attr("promotions", [*kept, info])
        self.study.set_user_attr("promotion", info)

    def promotion_in(self, repo: str, branch: str) -> dict[str, Any] | None:
        """The promotion recorded for this (repository, branch), if any (a record from before
        branches were kept counts for its repository's promotion branch)."""
        recs = list(self.study.user_attrs.get("promotions") or [])
        if self.promotion and self.promotion not in recs:
            recs.append(self.promotion)
        for p in reversed(recs):
            if p.get("repo") == repo and p.get("branch", branch) == branch:
                return p
        return None

    @property
    def promotion(self) -> dict[str, Any] | None:
        return self.study.user_attrs.get("promotion")

    def rebase(self, baseline: dict[str, Any], source: str) -> None:
        """A new baseline (the promoted one failed re-validation): recorded, made the best to
        pair against, and enqueued as the next baseline trial."""
        self.baseline, self.baseline_source = dict(baseline), source
        attrs = dict(self.study.user_attrs.get("baseline", {}))
        self.study.set_user_attr("baseline", {**attrs, "config": self.baseline, "source": source})
        self.best = Best(None, dict(self.baseline))
        params = self.space.params_of(self.baseline) or {}
        self.study.enqueue_trial(params, user_attrs={"role": BASELINE})

    def resolve(self, flat: Mapping[str, Any]) -> TuningConfig:
        """A flat config of this study resolved against the registry (ConfigError when it does
        not resolve), once per config: what the agent sends the worker, typed."""
        key = config_key(flat)
        cfg = self._resolved.get(key)
        if cfg is None:
            cfg = self._resolved[key] = TuningConfig.from_flat(self.backend, flat)
        return cfg

    def baseline_trial(self) -> int | None:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("role") == BASELINE:
                return t.number
        return None

    def trials_record(self, number: int) -> TrialRecord:
        t = self.study.trials[number]
        return TrialRecord.from_attrs(self.name, number, t.user_attrs)


def _space_diff(before: dict[str, list[str]] | None, now: dict[str, list[str]]) -> str:
    """What changed in the search space (a registry or experiment edit since the study began),
    in a few words; "" when nothing did or the study predates the record."""
    if before is None or before == now:
        return ""
    parts = [f"+{k}" for k in now if k not in before]
    parts += [f"-{k}" for k in before if k not in now]
    parts += [f"{k} choices" for k in now if k in before and before[k] != now[k]]
    return ", ".join(parts)
