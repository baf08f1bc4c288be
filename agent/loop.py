"""The agent's strategy: workers of each device class evaluate trials of that class's studies,
as many in flight as there are workers; results are accepted, confirmed, told and promoted.
The calls themselves are a runner's (agent.runner: Ray; agent.local: this process; what both
share: agent.dispatch), the reporting agent.report's, a trial's record agent.trial_record's, the
end-of-run promotion agent.promote_best's and the stop on a signal agent.signals'.

    ask (a confirmation wanted? else the study's next trial) -> dispatch (runner)
    -> decide (accept?) -> tell (record the trial) -> at the end: promote each study's best
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optuna.exceptions import UpdateFinishedTrialError

from agent import lease as lease_mod
from agent import report, unsaved
from agent.acceptance import Decision, decide
from agent.dispatch import Pending
from agent.experiment import Experiment
from agent.fleet import Slot, past_invocations, remove_stale_temps
from agent.local import LocalRunner
from agent.memory import MemoryGate
from agent.phase import Phase, TrialStage
from agent.promote_best import promote_best, promoted_arg
from agent.records import Confirmation
from agent.signals import signals_held, stop_on_sigterm
from agent.space import config_key
from agent.stats import aa_noise
from agent.storage import StorageRef
from agent.storage_retry import StorageDown, retrying
from agent.study import BASELINE, StudyState, study_name
from agent.summary import RunSummary
from agent.trial_record import baseline_reason, trial_record
from engine.tuning import REGISTRY, TuningConfig
from engine.tuning.shape import ModelShape
from worker.device import engine_commit
from worker.records import EvalResult, Outcome

log = logging.getLogger("agent")

if TYPE_CHECKING:
    from agent.runner import RayRunner

__all__ = [
    "Agent",
    "ConfirmRequest",
    "Pending",
    "RunOptions",
    "run_experiment",
]

# A plain `ray start` advertises no device: the agent then sees a cluster with none.
JOIN_HINT = (
    "a node joins with `python -m worker start --address HEAD:6379` (a head with devices: "
    "`python -m worker start --head`), which advertises its devices to Ray; a plain "
    "`ray start` advertises none"
)
# `ray job submit --working-dir` uploads the code without .git: say how to name the engine build.
NO_COMMIT_HINT = (
    "engine commit unknown (this copy of the code is no git checkout, as `ray job submit "
    "--working-dir` uploads it): trial records and promotions cannot name the engine build; "
    'submit with --runtime-env-json "$(python -m agent runtime-env)"'
)
STOPPED = "the agent was stopped (Ctrl-C or SIGTERM) while this trial ran"

# A/A runs settle: a bias above AA_SETTLE on any objective is measured again, up to AA_RUNS runs
# in all, and the last run's bias is the worker's noise. A worker's first runs of a model can be
# far off (clocks ramping, first captures): the hybrid-9b fleet's one A/A run measured 101%
# decode noise, a threshold no candidate can clear, and its baseline trial right after was
# x1.001 [0.995, 1.008]. A worker whose bias is real measures it again: the last run keeps it.
AA_SETTLE = 0.05
AA_RUNS = 3


@dataclass(frozen=True)
class RunOptions:
    storage: StorageRef
    promote_repo: Path | None = None  # None: from the experiment's [promote] repo
    budget: int | None = None  # overrides budget.trials
    wall_time_s: float | None = None  # overrides budget.wall_time_s
    address: str | None = None
    promote: bool = True
    setup: Callable[[], None] | None = None  # test-only: registers extra backends everywhere
    resources: dict[str, float] | None = None  # embedded Ray resources instead of detection
    shutdown: bool = True  # shut an embedded Ray down at the end
    lease: str = lease_mod.ERROR  # another live agent holds a study: error | wait | take-over
    lease_ttl_s: float = lease_mod.TTL_S
    local: bool = False  # agent.local.LocalRunner: in this process, this machine, no Ray


@dataclass
class ConfirmRequest:
    trial: Any
    flat: dict[str, Any]
    config: TuningConfig  # ``flat`` resolved and checked when the trial was asked
    role: str
    first: EvalResult
    decision: Decision
    exclude: str | None  # worker id that measured it first (None: any worker may confirm)
    paired_against: int | None
    overhead_s: float


def project_root() -> Path:
    import engine

    return Path(engine.__file__).resolve().parents[1]


class Agent:
    def __init__(self, exp: Experiment, opts: RunOptions) -> None:
        if opts.budget is not None:
            exp = replace(exp, budget=replace(exp.budget, trials=opts.budget))
        if opts.wall_time_s is not None:
            exp = replace(exp, budget=replace(exp.budget, wall_time_s=opts.wall_time_s))
        # the worker reads [memory] from its bench plan (worker.memory)
        exp = replace(exp, bench=replace(exp.bench, memory=exp.memory))
        self.exp = exp
        self.opts = opts
        self.memory = MemoryGate(exp.memory)
        self.studies: dict[tuple[str, str], StudyState] = {}
        self.warnings: list[str] = list(exp.warnings)
        self.started = time.time()
        self.t0 = time.monotonic()
        self.promotion_errors: dict[str, str] = {}
        self.promotions: dict[str, dict[str, Any]] = {}  # study -> what this run did about it
        self._aa_runs: dict[tuple[str, str], int] = {}  # (worker, model) -> A/A runs so far
        self.runner: LocalRunner | RayRunner
        if opts.local:
            self.runner = LocalRunner(self, exp.models, exp.budget.trial_timeout_s, self.warnings)
        else:  # imported here: a --local run never imports Ray
            from agent.runner import RayRunner

            self.runner = RayRunner(self, exp.models, exp.budget.trial_timeout_s, self.warnings)

    # --- setup --------------------------------------------------------------------------
    def promote_repo(self) -> Path:
        if self.opts.promote_repo is not None:
            from agent.promote import repo_root

            given = self.opts.promote_repo.resolve()
            top = repo_root(given)
            if top != given and not getattr(self, "_root_noted", False):
                self._root_noted = True
                log.info(
                    "--promote-repo %s lies inside the git repository %s: promoting into %s, "
                    "where the engine looks",
                    given,
                    top,
                    top / "configs",
                )
            return top
        if self.exp.promote.repo == "scratch":
            from agent.promote import scratch_repo

            return scratch_repo()
        return project_root()

    def check_promotion_target(self) -> None:
        """Refuse a bad promotion repository before the first trial, not after the budget."""
        if not self.opts.promote or not self.exp.promote.enabled:
            return
        from agent.promote import check_target

        check_target(self.promote_repo().resolve(), self.exp.promote.branch)

    def run(self) -> RunSummary:
        self.check_promotion_target()
        registered = set(REGISTRY.backends())
        backends = tuple(b for b in self.exp.backends if b in registered)
        with stop_on_sigterm():
            stopped, kept = False, None
            try:
                try:
                    self.runner.connect(
                        self.opts.address, backends, self.opts.setup, self.opts.resources
                    )
                    with stop_on_sigterm():  # again: ray.init installs its own SIGTERM handler
                        self._run(backends)
                except KeyboardInterrupt:
                    stopped = True
                    raise
                finally:
                    kept = self._close(stopped)
            except (StorageDown, lease_mod.LeaseLost):  # one line (exit 2), no tracebacks
                if self.storage_down is None:
                    raise  # a lease taken over by another agent: its own message
                down = StorageDown(self.storage_down)
                raise StorageDown(_storage_down_line(down, kept)) from None
        return self._summary()

    def _run(self, backends: tuple[str, ...]) -> None:
        if self.opts.setup is not None:
            self.opts.setup()
        present = self._safe_classes(self.runner.device_classes())
        wanted = self.exp.device_classes
        classes = {c: n for c, n in present.items() if wanted is None or c in wanted}
        for c in wanted or ():
            if c not in present:
                self.warnings.append(f"device class {c!r}: no worker in the cluster")
        if not classes:
            hint = "" if present else f"; {JOIN_HINT}"
            self.warnings.append(f"no device of the wanted classes; cluster has {present}{hint}")
        log.info("device classes: %s; backends: %s", classes, backends)
        self.storage = self.opts.storage.open()
        self.retrier = retrying(self.storage, self.opts.storage.display)
        # Every study this run may touch is ours before any trial of it is read (resume fails a
        # previous holder's RUNNING trials): a second agent stops here, naming the holder.
        self.leases = lease_mod.Leases(
            self.storage, self.exp.name, self.opts.lease_ttl_s, self.opts.lease
        )
        self.leases.acquire(
            [study_name(self.exp.name, c, m) for c in classes for m in self.exp.models],
            ["maximize"] * len(self.exp.objectives),
        )
        self.leases.start()
        restored = unsaved.restore(self.opts.storage, self.storage)
        if restored:
            log.info("restored %d measured trial(s) a run whose storage went down kept", restored)
        commit = engine_commit()
        if commit == "unknown":
            self.warnings.append(NO_COMMIT_HINT)
            log.warning(NO_COMMIT_HINT)
        self.runner.start(classes, backends, self.opts.setup, commit)
        self._loop()
        for st in self.studies.values():
            self.leases.check()
            self._finalize(st)

    def _safe_classes(self, present: dict[str, int]) -> dict[str, int]:
        """The cluster's device classes that are safe names (engine.device_info.class_slug): a
        node advertising ``device:../x`` by hand must not name studies nor config paths."""
        from engine.device_info import class_slug

        for c in present:
            if class_slug(c) != c:
                self.warnings.append(f"device class {c!r} is not a safe name: its nodes ignored")
                log.warning(self.warnings[-1])
        return {c: n for c, n in present.items() if class_slug(c) == c}

    def _close(self, stopped: bool) -> Path | None:
        """Leave the storage whole (no RUNNING trial: one stopped mid-run is failed as
        interrupted, its config free to run again), the workers gone, an embedded Ray down.
        When the storage is down, the measured results it did not take are kept aside
        (agent.unsaved): returns that file, if any."""
        with stop_on_sigterm(ignore=True):  # a second signal must not cut the cleanup short
            leases = getattr(self, "leases", None)
            kept = None
            try:
                try:
                    if stopped and not (leases and leases.lost):
                        self._abandon_in_flight()
                        for st in self.studies.values():
                            try:
                                st.flush()
                            except StorageDown:
                                raise
                            except Exception as e:  # noqa: BLE001 - a write the signal cut in two
                                log.warning(
                                    "%s: a storage write failed while stopping: %s", st.name, e
                                )
                            st.settle_running(STOPPED)  # asked but not yet dispatched
                        self._promote_on_stop()
                    self._flush()
                except StorageDown:
                    pass  # the cause is raised by run(); what is left is kept aside below
                if self.storage_down:
                    kept = unsaved.save(self.opts.storage, self.studies.values())
                    self._write_status("storage down")
                else:
                    self._write_status("interrupted" if stopped else "finished")
            finally:
                self.runner.kill_all()
                if leases is not None:  # after the last write: the next holder owns the rest
                    leases.release()
                if self.opts.shutdown:
                    self.runner.shutdown()
            return kept

    @property
    def storage_down(self) -> str | None:
        retrier = getattr(self, "retrier", None)
        return retrier.down if retrier is not None else None

    def _promote_on_stop(self) -> None:
        """A stopped run still promotes each study's best that was accepted (and confirmed)
        before the stop, as its end would have: a deadline's SIGTERM (a fleet call's timeout,
        ``ray job stop``) must not cost a verified win. A candidate still awaiting confirmation
        was recorded interrupted above and is not promoted."""
        for st in self.studies.values():
            try:
                self._finalize(st)
            except StorageDown:
                raise
            except Exception as e:  # noqa: BLE001 - the stop goes on; a rerun promotes it
                log.warning("%s: not promoted while stopping: %s", st.name, e)

    def _abandon_in_flight(self) -> None:
        for p in self.runner.drain():
            if p.study is not None and p.trial is not None:
                self.abandon(p, STOPPED)
        for st in self.studies.values():
            for req in st.confirm_queue:
                p = Pending(Phase.CONFIRM, self.runner.slots[0], None, 0.0, 0.0, st.model, st)
                p.trial, p.flat, p.role = req.trial, req.flat, req.role
                rec = trial_record(p, None, Outcome.INTERRUPTED, STOPPED, 0.0)
                st.finish(req.trial, rec, None)
            st.confirm_queue.clear()

    # --- the loop -----------------------------------------------------------------------
    def _flush(self) -> None:
        """The queued storage writes; none once a lease is lost (its new holder owns the
        trials; a write to one it already failed raises UpdateFinishedTrialError)."""
        leases = getattr(self, "leases", None)
        for st in self.studies.values():
            if leases is not None and leases.lost:
                return
            try:
                st.flush()
            except UpdateFinishedTrialError as e:
                if leases is None:
                    raise
                leases.lost = f"study {st.name}: another agent finished its trials ({e})"
                raise lease_mod.LeaseLost(leases.lost) from None

    def _loop(self) -> None:
        while True:
            with signals_held():  # a storage write is never cut in half by Ctrl-C / SIGTERM
                self.leases.check()
                self.runner.dispatch_idle()  # asks dispatch_work for each worker's next calls
                self._flush()  # storage writes of finished trials, while workers run the next
                self._write_status("running")
            if not self.runner.wait():  # hands results back to got_* / lost
                return

    def _over_time(self) -> bool:
        limit = self.exp.budget.wall_time_s
        return bool(limit) and time.monotonic() - self.t0 > limit

    # --- ask and dispatch (the runner calls these) ----------------------------------------
    def aa_args(self, slot: Slot, model: str) -> tuple[Any, ...] | None:
        """The A/A call's arguments: the baseline against itself; None when the model did not
        load on the slot's class."""
        st = self.studies.get((slot.device_class, model))
        if st is None:
            return None
        self._memory_possible(st, slot)  # before the worker measures anything
        base = st.resolve(st.baseline)
        return (model, base, base, self.exp.validate, self.exp.bench, True)

    def _memory_possible(self, st: StudyState, slot: Slot) -> None:
        """ExperimentError (exit 2) when no config of the study's space fits [memory]'s budget
        on this slot's device; checked once per study and worker, before its first run."""
        if (st.name, slot.worker_id) in self.memory.checked:
            return
        self.memory.checked.add((st.name, slot.worker_id))
        device = slot.info.device if slot.info else None
        self.memory.refuse_impossible(st.name, st.space, st.baseline, st.model, device)

    def evaluate_args(self, p: Pending) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The evaluate call's arguments; every evaluation sent (first or again, by either
        runner) passes here, so the trial's move to RUNNING or CONFIRMING is made here."""
        st = p.study
        assert st is not None
        st.move(p.trial.number, TrialStage.sent(p.phase))
        assert p.config is not None  # resolved and checked once, when the trial was asked
        best = st.resolve(st.best.config)
        args = (st.model, p.config, best, self.exp.validate, self.exp.bench)
        return args, {"promoted": promoted_arg(st, p.role)}

    def _studies_of(self, slot: Slot) -> list[StudyState]:
        return [st for (c, m), st in self.studies.items() if c == slot.device_class]

    def dispatch_work(self, slot: Slot) -> bool:
        """Send the slot's next evaluation; False when there is none for it now."""
        studies = self._studies_of(slot)
        alive = self.runner.alive(slot.device_class)
        for st in studies:  # confirmations first: an accepted candidate waits on them
            for req in list(st.confirm_queue):
                if req.exclude == slot.worker_id and any(s.worker_id != req.exclude for s in alive):
                    continue
                st.confirm_queue.remove(req)
                self._dispatch_eval(
                    slot, st, req.trial, req.flat, req.config, req.role, Phase.CONFIRM, req
                )
                return True
        if self._over_time():
            return False
        ready = [st for st in studies if st.model in slot.noise and self._can_start(st)]
        ready.sort(key=lambda st: len(st.in_flight))
        for st in ready:
            self._memory_possible(st, slot)
            for _ in range(50):  # skip configs the registry rules out on this device
                asked = st.ask()
                if asked is None:
                    break
                trial, flat, role = asked
                cfg, problems = self._resolve(st, slot, flat)
                if cfg is not None:
                    self._dispatch_eval(slot, st, trial, flat, cfg, role, Phase.TRIAL, None)
                    return True
                p = Pending(Phase.TRIAL, slot, None, 0.0, 0.0, st.model, st, trial, flat, role)
                rec = trial_record(p, None, Outcome.INFEASIBLE, problems, 0.0)
                st.finish(trial, rec, None)
                report.log_trial(self.exp, st, rec)
        return False

    def _resolve(
        self, st: StudyState, slot: Slot, flat: dict[str, Any]
    ) -> tuple[TuningConfig | None, str]:
        """The config, resolved against the registry and checked against the slot's device,
        once: (the config, "") or (None, what is wrong). It travels typed to the worker, which
        neither rebuilds nor re-checks it; an infeasible one never takes a worker's turn."""
        from engine.errors import ConfigError

        try:
            cfg = st.resolve(flat)
        except ConfigError as e:
            return None, str(e)
        device = slot.info.device if slot.info else None
        problems = "; ".join(cfg.problems(device)) or self.memory.over(cfg, st.model, device)
        return (None, problems) if problems else (cfg, "")

    def _can_start(self, st: StudyState) -> bool:
        return not st.exhausted and st.budget_left() > 0

    def _dispatch_eval(
        self,
        slot: Slot,
        st: StudyState,
        trial: Any,
        flat: dict[str, Any],
        cfg: TuningConfig,
        role: str,
        phase: Phase,
        req: ConfirmRequest | None,
    ) -> None:
        p = Pending(phase, slot, None, 0.0, 0.0, st.model, st, trial, flat, role)
        p.config = cfg
        p.paired_against = st.best.trial
        if req is not None:
            p.first, p.first_decision, p.first_overhead_s = req.first, req.decision, req.overhead_s
        self.runner.send(p)

    # --- decide and tell (the runner calls these) ----------------------------------------
    def got_model(self, slot: Slot, model: str, shape: ModelShape) -> None:
        """A worker loaded ``model`` (its shape class): the study starts, from the promoted config
        nearest to that shape and the experiment's served context, else the defaults."""
        key = (slot.device_class, model)
        if key in self.studies:
            return
        from engine.tuning.promoted import find_promoted

        baseline = TuningConfig.default(slot.backend)
        source = "default"
        ctx = self.exp.memory.context_tokens
        root = self.promote_repo() / "configs"
        found = find_promoted(slot.backend, slot.device_class, shape, ctx, root=root)
        if found:
            baseline, source = found.config, f"promoted:{found.path}"
            log.info("%s on %s: baseline %s (%s)", model, slot.device_class, source, found.reason)
        st = StudyState(
            self.exp,
            slot.device_class,
            slot.backend,
            model,
            shape.family,
            self.storage,
            baseline.flat(),
            source,
        )
        st.shape = shape
        if st.interrupted_on_resume:
            log.info("%s: resumed; %d interrupted trials failed", st.name, st.interrupted_on_resume)
        if st.space_changed:
            self.warnings.append(
                f"study {st.name}: the search space changed since it began "
                f"({st.space_changed}); its {st.evaluated} trials stay and configs tried then are "
                "not run again: name the experiment anew to start over"
            )
            log.warning(self.warnings[-1])
        log.info(
            "study %s: %d evaluated of %d, space of %d configs, baseline %s",
            st.name,
            st.evaluated,
            self.exp.budget.trials,
            st.space.size,
            source,
        )
        self.studies[key] = st

    def got_aa(self, slot: Slot, model: str, res: EvalResult) -> None:
        if not res.ok:
            self.warnings.append(f"worker {slot.worker_id}: A/A run failed ({res.outcome.value})")
            slot.noise[model] = {}
            return
        key = (slot.worker_id, model)
        runs = self._aa_runs[key] = self._aa_runs.get(key, 0) + 1
        noise = {s.objective: aa_noise(s.candidate, s.best) for s in res.samples}
        shown = ", ".join(f"{k} {v:.2%}" for k, v in noise.items())
        if runs < AA_RUNS and max(noise.values(), default=0.0) > AA_SETTLE:
            log.info("worker %s: A/A run %d measured %s: measuring again", slot.worker_id, runs,
                     shown)  # fmt: skip
            slot.setup.insert(0, (Phase.AA, model))
            return
        slot.noise[model] = noise
        log.info("worker %s: A/A noise %s (run %d)", slot.worker_id, shown, runs)

    def got_trial(self, p: Pending, res: EvalResult, overhead: float) -> None:
        st = p.study
        assert st is not None
        if p.paired_against is None and res.best and st.best.trial is not None:
            # sent while the baseline still ran (its config was the best, with no trial number
            # yet): it was paired against the baseline, which has one now
            if config_key(res.best) == config_key(st.best.config):
                p.paired_against = st.best.trial
        if not res.ok:
            rec = trial_record(p, res, res.outcome, res.reason, overhead)
            st.finish(p.trial, rec, None)
            report.log_trial(self.exp, st, rec)
            if p.role == BASELINE and res.revalidation and st.best.trial is None:
                # a promoted config that no longer passes is no baseline: start from the default
                why = f"promoted {res.revalidation['path']} failed re-validation"
                self.warnings.append(f"study {st.name}: {why}; baseline is the default")
                log.warning(self.warnings[-1])
                st.rebase(TuningConfig.default(st.backend).flat(), f"default ({why})")
            return
        decision = decide(res, self.exp.acceptance, p.slot.noise.get(st.model, {}))
        if p.role == BASELINE:
            rec = trial_record(p, res, Outcome.OK, baseline_reason(res), overhead, decision)
            rec = replace(rec, accepted=False)
            st.finish(p.trial, rec, self._values(res))
            if st.best.trial is None:
                st.set_best(p.trial.number, p.flat, res.medians())
            report.log_trial(self.exp, st, rec)
            return
        if decision.accepted:
            against_current = config_key(res.best) == config_key(st.best.config)
            others = self.runner.others(p.slot)
            if (self.exp.acceptance.confirm and others) or not against_current:
                exclude = p.slot.worker_id if others else None
                st.move(p.trial.number, TrialStage.CONFIRM_WAIT)
                st.confirm_queue.append(
                    ConfirmRequest(
                        p.trial,
                        p.flat,
                        p.config,
                        p.role,
                        res,
                        decision,
                        exclude,
                        p.paired_against,
                        overhead,
                    )
                )
                log.info(
                    "trial %d [%s]: accepted on %s (%s); confirming on %s",
                    p.trial.number,
                    st.name,
                    p.slot.worker_id,
                    decision.reason,
                    "another worker" if others else "the same worker against the new best",
                )
                return
        reason = "" if decision.accepted else decision.reason
        rec = trial_record(p, res, Outcome.OK, reason, overhead, decision)
        st.finish(p.trial, rec, self._values(res))
        if rec.accepted:
            st.set_best(p.trial.number, p.flat, res.medians())
        report.log_trial(self.exp, st, rec)

    def got_confirmation(self, p: Pending, res: EvalResult) -> None:
        st = p.study
        assert st is not None and p.first is not None and p.first_decision is not None
        if res.ok:
            d2 = decide(res, self.exp.acceptance, p.slot.noise.get(st.model, {}))
            conf = Confirmation(
                Outcome.OK,
                d2.accepted,
                d2.reason,
                res.worker,
                dict(d2.estimates),
                {s.objective: s for s in res.samples},
                st.best.trial,
            )
        else:
            conf = Confirmation(res.outcome, False, res.reason, res.worker)
        reason = "" if conf.accepted else f"confirmation: {conf.reason}"
        first, overhead = p.first, p.first_overhead_s
        rec = trial_record(p, first, Outcome.OK, reason, overhead, p.first_decision, conf)
        st.finish(p.trial, rec, self._values(p.first))
        if rec.accepted:
            st.set_best(p.trial.number, p.flat, p.first.medians())
        report.log_trial(self.exp, st, rec)

    def _values(self, res: EvalResult) -> list[float]:
        med = res.medians()
        return [med[o.name] for o in self.exp.objectives]

    # --- failures (the runner calls these) ------------------------------------------------
    def lost(self, p: Pending, outcome: Outcome, reason: str) -> None:
        """Record a trial or confirmation whose worker was lost (and that is not retried)."""
        st = p.study
        if p.phase is Phase.TRIAL and st is not None:
            rec = trial_record(p, None, outcome, reason, 0.0)
            st.finish(p.trial, rec, None)
            report.log_trial(self.exp, st, rec)
        elif p.phase is Phase.CONFIRM and st is not None and p.first is not None:
            conf = Confirmation(outcome, False, reason, p.slot.info)
            rec = trial_record(
                p,
                p.first,
                Outcome.OK,
                f"confirmation: {reason}",
                p.first_overhead_s,
                p.first_decision,
                conf,
            )
            st.finish(p.trial, rec, self._values(p.first))
            report.log_trial(self.exp, st, rec)

    def abandon(self, p: Pending, reason: str) -> None:
        """Fail a call that will not run (stopped, or its worker retired): its config is free."""
        assert p.study is not None
        rec = trial_record(p, None, Outcome.INTERRUPTED, reason, 0.0)
        p.study.finish(p.trial, rec, None)

    # --- end ----------------------------------------------------------------------------
    def _finalize(self, st: StudyState) -> None:
        """Promote the study's accepted best (agent.promote_best); ``self.promotions`` says what
        this run did about it, ``self.promotion_errors`` why it did not."""
        if not self.opts.promote or not self.exp.promote.enabled:
            return
        done, error = promote_best(self.exp, self.opts.storage.display, st, self.promote_repo)
        if error:
            self.promotion_errors[st.name] = error
        if done is not None:
            self.promotions[st.name] = done

    def _write_status(self, state: str) -> None:
        path = self.opts.storage.status_path
        if not hasattr(self, "_past_runs"):  # earlier invocations, for the dashboard
            self._past_runs = past_invocations(path, self.started)
            for tmp in remove_stale_temps(path):
                log.info("removed %s, left by a status write cut short", tmp)
        try:
            self._write_run_status(path, state)
        except StorageDown:
            if state != "storage down":
                raise
        except OSError as e:  # the dashboard's view only: a full disk must not stop the run
            if not getattr(self, "_status_failed", False):
                log.warning("fleet status %s not written: %s", path, e)
            self._status_failed = True
        else:
            self._status_failed = False

    def _write_run_status(self, path: Path, state: str) -> None:
        report.write_run_status(
            path,
            self.exp,
            self.opts.storage.display,
            self.started,
            state,
            self._past_runs,
            self.runner.slots,
            list(self.studies.values()),
            self.runner.dashboard_url(),
        )

    def _summary(self) -> RunSummary:
        studies = tuple(
            report.study_summary(
                self.exp,
                st,
                self.promotions.get(st.name),
                self.promotion_errors.get(st.name, ""),
            )
            for st in self.studies.values()
        )
        from agent import throughput

        slots = self.runner.slots
        rates = [throughput.worker_rate(s.worker_id, s.spans) for s in slots if s.spans]
        wall = time.monotonic() - self.t0
        return RunSummary(
            experiment=self.exp.name,
            storage=self.opts.storage.display,
            status_file=str(self.opts.storage.status_path),
            ray=self.runner.mode,
            wall_s=wall,
            studies=studies,
            workers=tuple(s.status() for s in self.runner.slots),
            overhead=report.overhead(self.runner.overheads, self.runner.idle_gaps),
            warnings=tuple(self.warnings),
            throughput=throughput.summary(rates, wall, len(rates) or len(slots)),
        )


def _storage_down_line(e: StorageDown, kept: Path | None) -> str:
    """The one line a run whose storage went down ends with."""
    if kept is None:
        return f"{e}; run again to resume once it is back"
    return (
        f"{e}; the measured trials it did not take are kept in {kept} and restored by the next "
        "run: run again once the storage is back"
    )


def run_experiment(exp: Experiment, opts: RunOptions) -> RunSummary:
    return Agent(exp, opts).run()
