"""The agent's event loop: workers of each device class evaluate trials of that class's studies,
as many in flight as there are workers; results are accepted, confirmed, told and promoted.

    for each idle worker: setup (identify, load, A/A) -> confirmation wanted? -> next trial
    wait for any result or deadline -> record, tell, maybe accept -> restart dead/hung workers
    at the end: promote each study's accepted best, write the summary
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
from optuna.exceptions import UpdateFinishedTrialError

from agent import cluster
from agent import lease as lease_mod
from agent.acceptance import Decision, decide
from agent.experiment import Experiment
from agent.fleet import (
    BUSY,
    DEAD,
    IDLE,
    INVOCATION_KEYS,
    MAX_RESTARTS_IN_A_ROW,
    STARTING,
    Fleet,
    Slot,
    past_invocations,
    write_status,
)
from agent.fleet import agent_status as agent_status_payload
from agent.records import INTERRUPTED, TrialRecord
from agent.space import config_key
from agent.stats import aa_noise, paired_ratio
from agent.storage import StorageRef
from agent.study import BASELINE, StudyState, study_name
from agent.summary import Overhead, RunSummary, StudySummary
from engine.errors import EngineError
from engine.sentinel import cache_key
from engine.tuning import REGISTRY, TuningConfig
from worker.device import engine_commit
from worker.records import EvalResult, Outcome

log = logging.getLogger("agent")

QUEUE_DEPTH = 2  # evaluate calls per worker: the running one and the next, queued in the actor
INFO_TIMEOUT_S = 300.0  # placing a worker and opening its device
LOAD_TIMEOUT_S = 1800.0  # identify + load (may generate a synthetic model or fetch a checkpoint)
STOPPED = "the agent was stopped (Ctrl-C or SIGTERM) while this trial ran"


@dataclass(frozen=True)
class RunOptions:
    storage: StorageRef
    promote_repo: Path | None = None  # None: from the experiment's [promote] repo
    budget: int | None = None  # overrides budget.trials
    address: str | None = None
    promote: bool = True
    setup: Callable[[], None] | None = None  # test-only: registers extra backends everywhere
    resources: dict[str, float] | None = None  # embedded Ray resources instead of detection
    shutdown: bool = True  # shut an embedded Ray down at the end
    lease: str = lease_mod.ERROR  # another live agent holds a study: error | wait | take-over
    lease_ttl_s: float = lease_mod.TTL_S


@dataclass
class Pending:
    kind: str  # info | load | aa | trial | confirm
    slot: Slot
    ref: Any
    dispatched: float
    deadline: float
    model: str = ""
    study: StudyState | None = None
    trial: Any = None
    flat: dict[str, Any] = field(default_factory=dict)
    role: str = ""
    paired_against: int | None = None
    gap_s: float = 0.0  # agent time between the worker going idle and this dispatch
    first: EvalResult | None = None  # confirm: the result being confirmed
    first_decision: Decision | None = None
    first_overhead_s: float = 0.0
    lost: str = ""  # why its first worker was lost (it is being retried once)


@dataclass
class ConfirmRequest:
    trial: Any
    flat: dict[str, Any]
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
        self.exp = exp
        self.opts = opts
        self.studies: dict[tuple[str, str], StudyState] = {}
        self.pending: list[Pending] = []
        self.warnings: list[str] = list(exp.warnings)
        self.started = time.time()
        self.t0 = time.monotonic()
        self.overheads: list[tuple[float, float]] = []  # (worker wall s, overhead s) per trial
        self.idle_gaps: list[float] = []  # worker seconds between consecutive evaluations
        self.promotion_errors: dict[str, str] = {}
        self.promotions: dict[str, dict[str, Any]] = {}  # study -> what this run did about it
        self.ray_mode = ""

    # --- setup --------------------------------------------------------------------------
    def promote_repo(self) -> Path:
        if self.opts.promote_repo is not None:
            return self.opts.promote_repo
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
            stopped = False
            try:
                self.ray_mode = cluster.connect(
                    self.opts.address, backends, self.opts.setup, self.opts.resources
                )
                with stop_on_sigterm():  # again: ray.init installs its own SIGTERM handler
                    self._run(backends)
            except KeyboardInterrupt:
                stopped = True
                raise
            finally:
                self._close(stopped)
        return self._summary()

    def _run(self, backends: tuple[str, ...]) -> None:
        if self.opts.setup is not None:
            self.opts.setup()
        present = cluster.device_classes()
        wanted = self.exp.device_classes
        classes = {c: n for c, n in present.items() if wanted is None or c in wanted}
        for c in wanted or ():
            if c not in present:
                self.warnings.append(f"device class {c!r}: no worker in the cluster")
        if not classes:
            self.warnings.append(f"no device of the wanted classes; cluster has {present}")
        log.info("device classes: %s; backends: %s", classes, backends)
        self.storage = self.opts.storage.open()
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
        self.fleet = Fleet(
            classes, self._backends_by_class(classes, backends), self.opts.setup, engine_commit()
        )
        for slot in self.fleet.slots:
            self.fleet.start(slot, self.exp.models, fresh=True)
        self._loop()
        for st in self.studies.values():
            self.leases.check()
            self._finalize(st)

    def _close(self, stopped: bool) -> None:
        """Leave the storage whole (no RUNNING trial: one stopped mid-run is failed as
        interrupted, its config free to run again), the workers gone, an embedded Ray down."""
        with stop_on_sigterm(ignore=True):  # a second signal must not cut the cleanup short
            leases = getattr(self, "leases", None)
            try:
                if stopped and not (leases and leases.lost):
                    self._abandon_in_flight()
                    for st in self.studies.values():
                        try:
                            st.flush()
                        except Exception as e:  # noqa: BLE001 - a write the signal cut in two
                            log.warning("%s: a storage write failed while stopping: %s", st.name, e)
                        st.settle_running(STOPPED)  # whatever was asked but not yet dispatched
                self._flush()
                self._write_status("interrupted" if stopped else "finished")
            finally:
                for slot in self.fleet.slots if hasattr(self, "fleet") else ():
                    self.fleet.kill(slot)
                if leases is not None:  # after the last write: the next holder owns the rest
                    leases.release()
                if self.ray_mode == "embedded" and self.opts.shutdown:
                    ray.shutdown()

    def _abandon_in_flight(self) -> None:
        calls = list(self.pending)
        for slot in self.fleet.slots if hasattr(self, "fleet") else ():
            calls += slot.resubmit
            slot.resubmit = []
        self.pending = []
        for p in calls:
            if p.study is not None and p.trial is not None:
                rec = self._record(p, None, INTERRUPTED, STOPPED, 0.0)
                p.study.finish(p.trial, rec, None)
        for st in self.studies.values():
            for req in st.confirm_queue:
                p = Pending("confirm", self.fleet.slots[0], None, 0.0, 0.0, st.model, st)
                p.trial, p.flat, p.role = req.trial, req.flat, req.role
                rec = self._record(p, None, INTERRUPTED, STOPPED, 0.0)
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
            self.leases.check()
            self._dispatch_idle()
            self._flush()  # storage writes of finished trials, while workers run the next ones
            self._write_status("running")
            if not self.pending:
                return
            refs = [p.ref for p in self.pending]
            wait = max(0.0, min(p.deadline for p in self.pending) - time.monotonic())
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            now = time.monotonic()
            done = {r.hex() for r in ready}
            for p in list(self.pending):
                if p not in self.pending:  # dropped while handling another (its worker died)
                    continue
                if p.ref.hex() in done:
                    self.pending.remove(p)
                    self._handle(p, now)
                elif now >= p.deadline:
                    self.pending.remove(p)
                    self._timed_out(p)

    def _backends_by_class(
        self, classes: dict[str, int], backends: tuple[str, ...]
    ) -> dict[str, tuple[str, ...]]:
        """The experiment's backends that nodes advertise for each class (``backend:<b>/<c>``);
        a class whose nodes advertise none is probed with every non-CUDA backend."""
        from worker.device import backends_for

        res = ray.cluster_resources()
        out = {}
        for c in classes:
            advertised = backends_for(res, c)
            if advertised:
                out[c] = tuple(b for b in backends if b in advertised)
            else:
                out[c] = tuple(b for b in backends if b != "cuda" or res.get("GPU", 0) >= 1)
            if not out[c]:
                self.warnings.append(
                    f"device class {c!r}: nodes serve it with {advertised}, "
                    f"the experiment lists {list(backends)}"
                )
        return out

    def _over_time(self) -> bool:
        limit = self.exp.budget.wall_time_s
        return bool(limit) and time.monotonic() - self.t0 > limit

    def _busy(self, slot: Slot) -> bool:
        return any(p.slot is slot for p in self.pending)

    def _load(self, slot: Slot) -> int:
        return sum(p.slot is slot for p in self.pending)

    def _dispatch_idle(self) -> None:
        """Keep every ready worker QUEUE_DEPTH calls deep: while it runs a trial, the next one
        waits in its actor queue, so it never idles on the agent (ask, tell, Ray round trip)."""
        for slot in self.fleet.slots:
            if slot.state == DEAD:
                continue
            if slot.setup or slot.state == STARTING:
                if self._busy(slot):
                    continue
                while slot.setup and not self._dispatch_setup(slot):
                    pass
                if self._busy(slot) or slot.state == DEAD:
                    continue
                slot.state, slot.free_since = IDLE, time.monotonic()
            while self._load(slot) < QUEUE_DEPTH and self._dispatch_work(slot):
                pass
            if not self._busy(slot):
                slot.state, slot.current = IDLE, ""

    def _dispatch_setup(self, slot: Slot) -> bool:
        """Send the slot's next setup call; False when there was nothing to send for it."""
        kind, model = slot.setup.pop(0)
        now = time.monotonic()
        if kind == "info":
            ref = slot.actor.info.remote()
        elif kind == "load":
            ref = slot.actor.load.remote(model)
        else:
            st = self.studies.get((slot.device_class, model))
            if st is None:  # the model did not load on this class
                return False
            ref = slot.actor.evaluate.remote(
                model, st.baseline, st.baseline, self.exp.validate, self.exp.bench, True
            )
        timeout = {"info": INFO_TIMEOUT_S, "load": LOAD_TIMEOUT_S}.get(
            kind, self.exp.budget.trial_timeout_s
        )
        self.pending.append(Pending(kind, slot, ref, now, now + timeout, model=model))
        return True

    def _studies_of(self, slot: Slot) -> list[StudyState]:
        return [st for (c, m), st in self.studies.items() if c == slot.device_class]

    def _dispatch_work(self, slot: Slot) -> bool:
        if slot.resubmit:  # queued behind a trial that killed the previous worker
            self._resubmit(slot, slot.resubmit.pop(0))
            return True
        studies = self._studies_of(slot)
        alive = [s for s in self.fleet.of_class(slot.device_class) if s.state != DEAD]
        for st in studies:  # confirmations first: an accepted candidate waits on them
            for req in list(st.confirm_queue):
                if req.exclude == slot.worker_id and any(s.worker_id != req.exclude for s in alive):
                    continue
                st.confirm_queue.remove(req)
                self._dispatch_eval(slot, st, req.trial, req.flat, req.role, "confirm", req)
                return True
        if self._over_time():
            return False
        ready = [st for st in studies if st.model in slot.noise and self._can_start(st)]
        ready.sort(key=lambda st: len(st.in_flight))
        for st in ready:
            for _ in range(50):  # skip configs the registry rules out on this device
                asked = st.ask()
                if asked is None:
                    break
                trial, flat, role = asked
                problems = self._problems(slot, flat)
                if not problems:
                    self._dispatch_eval(slot, st, trial, flat, role, "trial", None)
                    return True
                p = Pending("trial", slot, None, 0.0, 0.0, st.model, st, trial, flat, role)
                rec = self._record(p, None, Outcome.INFEASIBLE.value, problems, 0.0)
                st.finish(trial, rec, None)
                self._log_trial(st, rec)
        return False

    def _problems(self, slot: Slot, flat: dict[str, Any]) -> str:
        """Registry constraints this config breaks on the slot's device ("" when none): checked
        here, so an infeasible config never takes a worker's turn."""
        from engine.backends.base import DeviceInfo
        from engine.errors import ConfigError

        if slot.info is None or not slot.info.device:
            return ""
        try:
            cfg = TuningConfig.from_flat(slot.backend, flat)
        except ConfigError as e:
            return str(e)
        return "; ".join(cfg.problems(DeviceInfo(**slot.info.device)))

    def _can_start(self, st: StudyState) -> bool:
        return not st.exhausted and st.budget_left() > 0

    def _dispatch_eval(
        self,
        slot: Slot,
        st: StudyState,
        trial: Any,
        flat: dict[str, Any],
        role: str,
        kind: str,
        req: ConfirmRequest | None,
    ) -> None:
        now = time.monotonic()
        ref = slot.actor.evaluate.remote(
            st.model,
            flat,
            st.best.config,
            self.exp.validate,
            self.exp.bench,
            promoted=_promoted_arg(st, role),
        )
        queued = self._busy(slot)  # starts when the running call ends: its clock starts then
        p = Pending(
            kind,
            slot,
            ref,
            now,
            float("inf") if queued else now + self.exp.budget.trial_timeout_s,
            model=st.model,
            study=st,
            trial=trial,
            flat=flat,
            role=role,
            paired_against=st.best.trial,
            gap_s=0.0 if queued or not slot.free_since else max(0.0, now - slot.free_since),
        )
        if req is not None:
            p.first, p.first_decision, p.first_overhead_s = req.first, req.decision, req.overhead_s
        self.pending.append(p)
        if not queued:
            slot.state, slot.current = BUSY, f"{st.name} #{trial.number}"

    def _resubmit(self, slot: Slot, p: Pending) -> None:
        """Send a call again (same trial) to the slot's new worker, against the current best."""
        st = p.study
        assert st is not None
        now = time.monotonic()
        p.ref = slot.actor.evaluate.remote(
            st.model,
            p.flat,
            st.best.config,
            self.exp.validate,
            self.exp.bench,
            promoted=_promoted_arg(st, p.role),
        )
        p.slot, p.paired_against, p.gap_s = slot, st.best.trial, 0.0
        queued = self._busy(slot)
        p.dispatched = now
        p.deadline = float("inf") if queued else now + self.exp.budget.trial_timeout_s
        self.pending.append(p)
        if not queued:
            slot.state, slot.current = BUSY, f"{st.name} #{p.trial.number}"

    def _start_next(self, slot: Slot, now: float) -> None:
        """The slot's next queued call starts running now: start its clock."""
        for q in self.pending:
            if q.slot is slot:
                if q.deadline == float("inf"):
                    q.dispatched, q.deadline = now, now + self.exp.budget.trial_timeout_s
                    if q.study is not None:
                        slot.current = f"{q.study.name} #{q.trial.number}"
                return

    # --- results ------------------------------------------------------------------------
    def _handle(self, p: Pending, now: float) -> None:
        slot = p.slot
        slot.free_since = now
        self._start_next(slot, now)
        try:
            value = ray.get(p.ref)
        except ray.exceptions.RayActorError as e:
            self._worker_lost(p, Outcome.CRASH, f"worker died: {_first_line(e)}")
            return
        except Exception as e:  # noqa: BLE001 - an error raised inside the actor method
            if p.kind in ("info", "load"):
                self._setup_failed(p, _cause_line(e))
                return
            value = EvalResult(Outcome.CRASH, slot.info, p.flat, {}, _cause_line(e))
        if p.kind == "info":
            self._got_info(slot, value)
        elif p.kind == "load":
            self._got_family(slot, p.model, value)
        elif p.kind == "aa":
            self._got_aa(slot, p.model, value)
        else:
            overhead = max(0.0, (now - p.dispatched) - value.wall_s) + p.gap_s
            if value.outcome is Outcome.OK:
                slot.failures_in_a_row = 0
            slot.trials_done += 1
            if slot.last_finished and value.started:
                self.idle_gaps.append(max(0.0, value.started - slot.last_finished))
            slot.last_finished = value.finished
            if p.kind == "trial":
                self.overheads.append((value.wall_s, overhead))
                self._got_trial(p, value, overhead)
            else:
                self._got_confirmation(p, value)

    def _got_info(self, slot: Slot, info: Any) -> None:
        if info.device_class != slot.device_class:
            self._next_backend(
                slot, f"backend {slot.backend} reports class {info.device_class!r} there"
            )
            return
        slot.info = info
        log.info(
            "worker %s: %s %s (%s, driver %s) on %s",
            slot.worker_id,
            info.backend,
            info.device_name,
            info.device_class,
            info.driver,
            info.host,
        )

    def _next_backend(self, slot: Slot, why: str) -> None:
        self.fleet.kill(slot)
        slot.backend_index += 1
        if slot.backend_index >= len(slot.backends):
            slot.state, slot.setup = DEAD, []
            self.warnings.append(
                f"worker {slot.worker_id}: no backend of {list(slot.backends)} serves class "
                f"{slot.device_class!r} ({why})"
            )
            return
        self.fleet.start(slot, self.exp.models, fresh=not slot.noise)

    def _setup_failed(self, p: Pending, why: str) -> None:
        if p.kind == "info":
            self._next_backend(p.slot, why)
            return
        p.slot.state, p.slot.setup = DEAD, []
        self.fleet.kill(p.slot)
        self.warnings.append(f"worker {p.slot.worker_id}: cannot load {p.model}: {why}")

    def _got_family(self, slot: Slot, model: str, family: str) -> None:
        key = (slot.device_class, model)
        if key in self.studies:
            return
        from engine.tuning.promoted import find_promoted

        baseline = TuningConfig.default(slot.backend)
        source = "default"
        found = find_promoted(
            slot.backend, slot.device_class, family, root=self.promote_repo() / "configs"
        )
        if found:
            baseline, path = found
            source = f"promoted:{path}"
        st = StudyState(
            self.exp,
            slot.device_class,
            slot.backend,
            model,
            family,
            self.storage,
            baseline.flat(),
            source,
        )
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

    def _got_aa(self, slot: Slot, model: str, res: EvalResult) -> None:
        acc = self.exp.acceptance
        if not res.ok:
            self.warnings.append(f"worker {slot.worker_id}: A/A run failed ({res.outcome.value})")
            slot.noise[model] = {}
            return
        noise = {
            s.objective: aa_noise(paired_ratio(s.candidate, s.best, acc.confidence, acc.resamples))
            for s in res.samples
        }
        slot.noise[model] = noise
        log.info(
            "worker %s: A/A noise %s",
            slot.worker_id,
            ", ".join(f"{k} {v:.2%}" for k, v in noise.items()),
        )

    def _record(
        self,
        p: Pending,
        res: EvalResult | None,
        outcome: str,
        reason: str,
        overhead: float,
        decision: Decision | None = None,
        confirmation: dict[str, Any] | None = None,
    ) -> TrialRecord:
        st = p.study
        assert st is not None
        info = res.worker if res is not None and res.worker else p.slot.info
        base = st.baseline
        changed = {k: [base.get(k), v] for k, v in p.flat.items() if base.get(k) != v}
        est = dict(decision.estimates) if decision else {}
        return TrialRecord(
            study=st.name,
            trial=p.trial.number,
            role=p.role,
            outcome=outcome,
            reason=reason,
            config=dict(p.flat),
            changed=changed,
            paired_against=p.paired_against,
            metrics=res.medians() if res is not None and res.ok else {},
            samples={s.objective: s.to_dict() for s in res.samples} if res else {},
            estimates={k: e.to_dict() for k, e in est.items()},
            accepted=bool(decision and decision.accepted and confirmation_ok(confirmation)),
            decision=decision.to_dict() if decision else None,
            confirmation=confirmation,
            validate=res.validate if res else None,
            worker=info.to_dict() if info else None,
            host=info.host if info else "",
            device=info.device_name if info else "",
            driver=info.driver if info else "",
            engine_commit=info.engine_commit if info else "",
            started=res.started if res else 0.0,
            finished=res.finished if res else time.time(),
            wall_s=res.wall_s if res else 0.0,
            phase_s=dict(res.phase_s) if res else {},
            overhead_s=overhead,
            gpu=res.gpu if res else None,
            revalidation=res.revalidation if res else None,
        )

    def _got_trial(self, p: Pending, res: EvalResult, overhead: float) -> None:
        st = p.study
        assert st is not None
        if not res.ok:
            rec = self._record(p, res, res.outcome.value, res.reason, overhead)
            st.finish(p.trial, rec, None)
            self._log_trial(st, rec)
            if p.role == BASELINE and res.revalidation and st.best.trial is None:
                # a promoted config that no longer passes is no baseline: start from the default
                why = f"promoted {res.revalidation['path']} failed re-validation"
                self.warnings.append(f"study {st.name}: {why}; baseline is the default")
                log.warning(self.warnings[-1])
                st.rebase(TuningConfig.default(st.backend).flat(), f"default ({why})")
            return
        decision = decide(res, self.exp.acceptance, p.slot.noise.get(st.model, {}))
        if p.role == BASELINE:
            rec = self._record(p, res, "ok", _baseline_reason(res), overhead, decision)
            rec = replace(rec, accepted=False)
            st.finish(p.trial, rec, self._values(res))
            if st.best.trial is None:
                st.set_best(p.trial.number, p.flat, res.medians())
            self._log_trial(st, rec)
            return
        if decision.accepted:
            against_current = config_key(res.best) == config_key(st.best.config)
            others = [
                s
                for s in self.fleet.of_class(p.slot.device_class)
                if s is not p.slot and s.state != DEAD
            ]
            if (self.exp.acceptance.confirm and others) or not against_current:
                exclude = p.slot.worker_id if others else None
                st.confirm_queue.append(
                    ConfirmRequest(
                        p.trial, p.flat, p.role, res, decision, exclude, p.paired_against, overhead
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
        rec = self._record(
            p, res, "ok", "" if decision.accepted else decision.reason, overhead, decision
        )
        st.finish(p.trial, rec, self._values(res))
        if rec.accepted:
            st.set_best(p.trial.number, p.flat, res.medians())
        self._log_trial(st, rec)

    def _got_confirmation(self, p: Pending, res: EvalResult) -> None:
        st = p.study
        assert st is not None and p.first is not None and p.first_decision is not None
        if res.ok:
            d2 = decide(res, self.exp.acceptance, p.slot.noise.get(st.model, {}))
            conf = {
                "worker": res.worker.to_dict() if res.worker else None,
                "outcome": "ok",
                "accepted": d2.accepted,
                "reason": d2.reason,
                "estimates": {k: e.to_dict() for k, e in d2.estimates},
                "samples": {s.objective: s.to_dict() for s in res.samples},
                "paired_against": st.best.trial,
            }
        else:
            conf = {
                "worker": res.worker.to_dict() if res.worker else None,
                "outcome": res.outcome.value,
                "accepted": False,
                "reason": res.reason,
            }
        first_pending = replace(p, paired_against=p.paired_against)
        reason = "" if conf["accepted"] else f"confirmation: {conf['reason']}"
        rec = self._record(
            first_pending, p.first, "ok", reason, p.first_overhead_s, p.first_decision, conf
        )
        st.finish(p.trial, rec, self._values(p.first))
        if rec.accepted:
            st.set_best(p.trial.number, p.flat, p.first.medians())
        self._log_trial(st, rec)

    def _values(self, res: EvalResult) -> list[float]:
        med = res.medians()
        return [med[o.name] for o in self.exp.objectives]

    # --- failures -----------------------------------------------------------------------
    def _timed_out(self, p: Pending) -> None:
        limit = p.deadline - p.dispatched
        self._worker_lost(p, Outcome.TIMEOUT, f"no result after {limit:.0f}s; worker restarted")

    def _retry_elsewhere(self, p: Pending, reason: str) -> bool:
        """A worker lost from outside (OOM killer, operator) says nothing about its config: run
        the call once more, on another live worker of the class or on this one restarted."""
        if p.kind not in ("trial", "confirm") or p.lost or p.study is None:
            return False
        p.lost = f"{reason} (on {p.slot.worker_id})"
        others = [
            s
            for s in self.fleet.of_class(p.slot.device_class)
            if s is not p.slot and s.state != DEAD
        ]
        target = min(others, key=self._load) if others else p.slot
        target.resubmit.append(p)
        log.warning(
            "trial %d [%s]: its worker %s was lost (%s); retrying once on %s",
            p.trial.number,
            p.study.name,
            p.slot.worker_id,
            reason,
            target.worker_id if others else "the restarted worker",
        )
        return True

    def _worker_lost(self, p: Pending, outcome: Outcome, reason: str) -> None:
        slot = p.slot
        log.warning("worker %s: %s (%s)", slot.worker_id, reason, p.kind)
        self.fleet.kill(slot)
        slot.last_finished = 0.0
        for q in [q for q in self.pending if q.slot is slot]:  # queued behind it: run again
            self.pending.remove(q)
            slot.resubmit.append(q)
        slot.restarts += 1
        slot.failures_in_a_row += 1
        st = p.study
        if p.lost:
            reason = f"{reason}; lost once before and retried: {p.lost}"
        if outcome is Outcome.CRASH and self._retry_elsewhere(p, reason):
            pass
        elif p.kind == "trial" and st is not None:
            rec = self._record(p, None, outcome.value, reason, 0.0)
            st.finish(p.trial, rec, None)
            self._log_trial(st, rec)
        elif p.kind == "confirm" and st is not None and p.first is not None:
            conf = {
                "worker": slot.info.to_dict() if slot.info else None,
                "outcome": outcome.value,
                "accepted": False,
                "reason": reason,
            }
            rec = self._record(
                p,
                p.first,
                "ok",
                f"confirmation: {reason}",
                p.first_overhead_s,
                p.first_decision,
                conf,
            )
            st.finish(p.trial, rec, self._values(p.first))
            self._log_trial(st, rec)
        if p.kind == "info":  # never placed or never opened its device: try the next backend
            self._next_backend(slot, reason)
            return
        if slot.failures_in_a_row > MAX_RESTARTS_IN_A_ROW:
            slot.state, slot.setup = DEAD, []
            self.warnings.append(f"worker {slot.worker_id}: retired after repeated failures")
            for q in slot.resubmit:  # nobody left to run them here: free their configs
                if q.study is not None:
                    rec = self._record(q, None, INTERRUPTED, "its worker was retired", 0.0)
                    q.study.finish(q.trial, rec, None)
            slot.resubmit.clear()
            return
        # A restarted worker keeps its A/A noise; one lost during setup starts over.
        self.fleet.start(slot, self.exp.models, fresh=not slot.noise)
        if p.kind == "aa" and ("aa", p.model) not in slot.setup:
            slot.setup.append(("aa", p.model))

    # --- end ----------------------------------------------------------------------------
    def _finalize(self, st: StudyState) -> None:
        """Promote the study's accepted best into this run's (repository, branch), unless a
        promotion of it recorded there is still on that branch; ``self.promotions`` says which."""
        if not self.opts.promote or not self.exp.promote.enabled:
            return
        baseline_trial = st.baseline_trial()
        if st.best.trial is None or st.best.trial == baseline_trial:
            return
        from agent.promote import PromotionRefused, promote, still_there
        from engine.tuning.promoted import promoted_path

        repo, branch = self.promote_repo().resolve(), self.exp.promote.branch
        rel = promoted_path(st.device_class, st.family, repo / "configs").relative_to(repo)
        note = ""
        try:
            cfg = TuningConfig.from_flat(st.backend, st.best.config)
            done = st.promotion_in(str(repo), branch)
            if done and done.get("trial") == st.best.trial:
                why = still_there(repo, branch, rel, str(done.get("commit", "")), cfg)
                if not why:
                    self.promotions[st.name] = {**done, "branch": branch, "action": "already"}
                    return
                note = f"the recorded promotion of trial {st.best.trial} is gone ({why})"
            elif not done and st.promotion:
                prev = st.promotion
                note = (
                    f"promoted before into {prev.get('repo')} (commit "
                    f"{str(prev.get('commit') or '-')[:12]}); this run promotes into {repo}"
                )
            rec = st.trials_record(st.best.trial)
            prom = promote(repo, st.device_class, st.family, cfg, self._evidence(st, rec), branch)
        except PromotionRefused as e:
            self.promotion_errors[st.name] = str(e)
            log.error("not promoted: %s", e)
            return
        info = {
            "trial": st.best.trial,
            "repo": str(prom.repo),
            "branch": branch,
            "path": str(prom.path),
            "commit": prom.commit,
            "at": time.time(),
        }
        st.record_promotion(info)
        action = "committed" if prom.commit else "unchanged"
        self.promotions[st.name] = {**info, "action": action, "note": note}
        log.info("promoted %s -> %s (commit %s)", st.name, prom.path, prom.commit[:12] or "-")

    def _evidence(self, st: StudyState, rec: TrialRecord) -> dict[str, Any]:
        target = self.exp.acceptance.target
        est = rec.estimates.get(target, {})
        worker = rec.worker or {}
        return {
            "experiment": self.exp.name,
            "experiment_file": self.exp.source,
            "study": st.name,
            "storage": self.opts.storage.display,
            "trial": rec.trial,
            "paired_against": rec.paired_against if rec.paired_against is not None else -1,
            "model": st.model,
            "model_family": st.family,
            "device_class": st.device_class,
            "device": rec.device,
            "vendor": worker.get("vendor", ""),
            "driver": rec.driver,
            "host": rec.host,
            "worker": worker.get("worker_id", ""),
            "engine_commit": rec.engine_commit,
            # the drift-sentinel key it was validated under: another one means re-validate
            # (agent.recheck; the worker does it for a promoted baseline)
            "sentinel_key": cache_key(
                st.backend, st.device_class, rec.driver, rec.engine_commit, st.family
            ),
            "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "baseline_source": st.baseline_source,
            "target": target,
            "ratio": est.get("ratio", 0.0),
            "lower_bound": est.get("lower", 0.0),
            "confidence": self.exp.acceptance.confidence,
            "min_gain": self.exp.acceptance.min_gain,
            "aa_noise": (rec.decision or {}).get("noise", 0.0),
            "changed": {k: {"from": a, "to": b} for k, (a, b) in rec.changed.items()},
            "objectives": {
                name: {**rec.estimates.get(name, {}), **rec.samples.get(name, {})}
                for name in rec.samples
            },
            "validate": _validate_evidence(rec.validate),
            "confirmation": _confirmation_evidence(rec.confirmation),
        }

    def _write_status(self, state: str) -> None:
        path = self.opts.storage.status_path
        if not hasattr(self, "_past_runs"):  # earlier invocations, for the dashboard
            self._past_runs = past_invocations(path, self.started)
        agent = agent_status_payload(self.exp.name, self.opts.storage.display, self.started, state)
        acc = self.exp.acceptance
        agent.update(
            trial_timeout_s=self.exp.budget.trial_timeout_s,
            wall_time_s=self.exp.budget.wall_time_s,
            acceptance={
                "target": acc.target,
                "min_gain": acc.min_gain,
                "confidence": acc.confidence,
            },
            ray_dashboard=cluster.dashboard_url(),
        )
        payload = {
            "agent": agent,
            "invocations": [*self._past_runs, {k: agent[k] for k in INVOCATION_KEYS}],
            "workers": [s.status() for s in self.fleet.slots] if hasattr(self, "fleet") else [],
            "studies": [
                {
                    "study": st.name,
                    "device_class": st.device_class,
                    "model": st.model,
                    "evaluated": st.evaluated,
                    "budget": self.exp.budget.trials,
                    "in_flight": sorted(st.in_flight),
                    "best_trial": st.best.trial,
                }
                for st in self.studies.values()
            ],
        }
        write_status(path, payload)

    def _log_trial(self, st: StudyState, rec: TrialRecord) -> None:
        changed = " ".join(f"{k}={b}" for k, (_, b) in rec.changed.items()) or "(baseline config)"
        metrics = " ".join(f"{k}={v:.1f}" for k, v in rec.metrics.items())
        target = rec.estimates.get(self.exp.acceptance.target)
        ratio = (
            f" x{target['ratio']:.3f} [{target['lower']:.3f}, {target['upper']:.3f}]"
            if (target)
            else ""
        )
        verdict = " ACCEPTED" if rec.accepted else ""
        reason = f" -- {rec.reason.splitlines()[0][:160]}" if rec.reason else ""
        log.info(
            "trial %d [%s] %s %s: %s %s%s%s%s",
            rec.trial,
            st.name,
            rec.worker.get("worker_id", "") if rec.worker else "",
            changed,
            rec.outcome,
            metrics,
            ratio,
            verdict,
            reason,
        )

    def _best_candidate(self, st: StudyState) -> dict[str, Any] | None:
        """The measured candidate with the highest target ratio, and the bar it did not clear."""
        target, best = self.exp.acceptance.target, None
        for t in st.study.get_trials(deepcopy=False):
            ua = t.user_attrs
            est = (ua.get("estimates") or {}).get(target)
            if ua.get("outcome") != "ok" or ua.get("role") == BASELINE or not est:
                continue
            if best is None or est["ratio"] > best["ratio"]:
                dec = ua.get("decision") or {}
                best = {
                    "trial": t.number,
                    "ratio": est["ratio"],
                    "lower": est["lower"],
                    "upper": est["upper"],
                    "threshold": dec.get("threshold", 1.0 + self.exp.acceptance.min_gain),
                    "noise": dec.get("noise", 0.0),
                    "reason": ua.get("reason", ""),
                }
        return best

    def _summary(self) -> RunSummary:
        out = []
        for st in self.studies.values():
            counts: dict[str, int] = {}
            for t in st.study.get_trials(deepcopy=False):
                k = t.user_attrs.get("outcome")
                if k:
                    counts[k] = counts.get(k, 0) + 1
            base_trial = st.baseline_trial()
            is_base = st.best.trial is None or st.best.trial == base_trial
            ratio = lower = None
            if not is_base and st.best.trial is not None:
                est = st.trials_record(st.best.trial).estimates.get(self.exp.acceptance.target, {})
                ratio, lower = est.get("ratio"), est.get("lower")
            base = st.baseline
            out.append(
                StudySummary(
                    study=st.name,
                    device_class=st.device_class,
                    backend=st.backend,
                    model=st.model,
                    family=st.family,
                    evaluated=st.evaluated,
                    budget=self.exp.budget.trials,
                    outcomes=counts,
                    baseline_source=st.baseline_source,
                    best_trial=st.best.trial,
                    best_is_baseline=is_base,
                    changed={
                        k: [base.get(k), v] for k, v in st.best.config.items() if base.get(k) != v
                    },
                    best_metrics=st.best.metrics,
                    target=self.exp.acceptance.target,
                    ratio=ratio,
                    lower_bound=lower,
                    promotion=self.promotions.get(st.name),
                    promotion_error=self.promotion_errors.get(st.name, ""),
                    best_candidate=self._best_candidate(st) if is_base else None,
                    warm_start=tuple(st.warm_start),
                )
            )
        n = len(self.overheads)
        overhead = Overhead(
            n,
            sum(w for w, _ in self.overheads) / n if n else 0.0,
            sum(o for _, o in self.overheads) / n if n else 0.0,
            sum(self.idle_gaps) / len(self.idle_gaps) if self.idle_gaps else 0.0,
        )
        return RunSummary(
            experiment=self.exp.name,
            storage=self.opts.storage.display,
            status_file=str(self.opts.storage.status_path),
            ray=self.ray_mode,
            wall_s=time.monotonic() - self.t0,
            studies=tuple(out),
            workers=tuple(s.status() for s in self.fleet.slots),
            overhead=overhead,
            warnings=tuple(self.warnings),
        )


@contextmanager
def stop_on_sigterm(ignore: bool = False) -> Iterator[None]:
    """SIGTERM (``ray job stop``, systemd, kill) ends the run like Ctrl-C: a KeyboardInterrupt,
    so the agent cleans up; with ``ignore``, both are held off during the cleanup itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    handler = signal.SIG_IGN if ignore else stop
    old_term = signal.signal(signal.SIGTERM, handler)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore else None
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)


def confirmation_ok(conf: dict[str, Any] | None) -> bool:
    return conf is None or bool(conf.get("accepted"))


def _cause_line(e: BaseException) -> str:
    """The error raised inside a worker, as the engine worded it: Ray wraps it in a RayTaskError
    whose text is a remote traceback ("RayTaskError(ModelFileError): ray::TuningWorker.load()")."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    if isinstance(e, EngineError):  # its message names the file and the problem
        return _first_line(e)
    return f"{type(e).__name__}: {_first_line(e)}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _validate_evidence(v: dict[str, Any] | None) -> dict[str, Any]:
    if not v:
        return {}
    return {
        "passed": v["passed"],
        "max_abs_diff": v["max_abs_diff"],
        "nmse": v["nmse"],
        "kld": v.get("kld"),  # absent in records from before teacher-forced validate
        "numeric_classes": v.get("numeric_classes"),
        "steps": v["steps"],
        "tolerances": v["tolerances"],
        "prompts": [
            {
                "prompt_tokens": p["prompt_tokens"],
                "max_abs_diff": p["max_abs_diff"],
                "nmse": p["nmse"],
                "token_agreement": p["token_agreement"],
            }
            for p in v["prompts"]
        ],
    }


def _confirmation_evidence(c: dict[str, Any] | None) -> dict[str, Any]:
    if not c:
        return {"done": False}
    worker = c.get("worker") or {}
    return {
        "done": True,
        "worker": worker.get("worker_id", ""),
        "host": worker.get("host", ""),
        "accepted": c.get("accepted", False),
        "estimates": c.get("estimates", {}),
    }


def run_experiment(exp: Experiment, opts: RunOptions) -> RunSummary:
    return Agent(exp, opts).run()


def _promoted_arg(st: StudyState, role: str) -> dict[str, Any] | None:
    """For a study's promoted baseline: its file and the sentinel key its evidence records (read
    now, so a resumed study sees the file as it is); the worker re-validates it when its own key
    differs. None for every other trial."""
    prefix = "promoted:"
    if role != BASELINE or not st.baseline_source.startswith(prefix):
        return None
    from engine.tuning.promoted import evidence_key, read_evidence

    path = Path(st.baseline_source[len(prefix) :])
    try:
        key = evidence_key(read_evidence(path), st.backend)
    except EngineError:  # gone or unreadable since: no recorded key, so it is re-validated
        key = None
    return {"path": str(path), "key": key}


def _baseline_reason(res: EvalResult) -> str:
    rv = res.revalidation
    if not rv:
        return "baseline"
    if rv.get("revalidated"):
        return f"baseline: promoted config re-validated ({'; '.join(rv['changes'])})"
    return "baseline: promoted config under its sentinel key, not re-validated"
