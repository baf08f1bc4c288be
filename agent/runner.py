"""The Ray runner: the agent's calls to its workers (actor creation, per-worker queues, ray.wait,
timeouts, restarts, one retry of a call whose worker was lost, retirement). What to run and what
a result means is the strategy's (agent.loop); the runner calls it back through
``agent.dispatch.Strategy``. The only runner that imports Ray (agent.loop imports it lazily).

    for each idle worker: setup calls (identify, load, A/A) -> strategy.dispatch_work
    wait for any result or deadline -> strategy.got_* / strategy.lost -> restart dead/hung workers
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from agent import cluster
from agent.dispatch import Pending, Runner, cause_line, first_line
from agent.fleet import BUSY, DEAD, IDLE, MAX_RESTARTS_IN_A_ROW, STARTING, Slot, setup_calls
from agent.infra import INFRA_LOSSES_IN_A_ROW, INFRA_TRIES, backoff_s, infrastructure_cause
from agent.phase import Phase, TrialStage, advance
from worker.actor import spawn
from worker.records import EvalResult, Outcome

log = logging.getLogger("agent")

QUEUE_DEPTH = 2  # evaluate calls per worker: the running one and the next, queued in the actor
INFO_TIMEOUT_S = 300.0  # placing a worker and opening its device
LOAD_TIMEOUT_S = 1800.0  # identify + load (may generate a synthetic model or fetch a checkpoint)


class Fleet:
    """Slots of every device class the agent tunes on, each worker a Ray actor."""

    def __init__(
        self,
        classes: dict[str, int],
        backends: dict[str, tuple[str, ...]],
        setup: Callable[[], None] | None,
        commit_hint: str,
    ) -> None:
        self.slots: list[Slot] = []
        self.setup_fn = setup
        self.commit_hint = commit_hint
        for cls, n in classes.items():
            for i in range(n):
                if backends.get(cls):
                    self.slots.append(Slot(f"{cls}-{i}", cls, backends[cls]))

    def of_class(self, device_class: str) -> list[Slot]:
        return [s for s in self.slots if s.device_class == device_class]

    def start(self, slot: Slot, models: tuple[str, ...], fresh: bool) -> None:
        """(Re)create the slot's actor and queue its setup calls (``setup_calls``)."""
        slot.actor = spawn(
            slot.backend, slot.device_class, slot.worker_id, self.setup_fn, self.commit_hint
        )
        slot.state, slot.phase = STARTING, None
        slot.setup = setup_calls(models, fresh)

    def kill(self, slot: Slot) -> None:
        if slot.actor is not None:
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            slot.actor = None


class RayRunner(Runner):
    fleet: Fleet | None = None
    mode = ""  # "embedded" or "cluster" once connected

    # --- the cluster ----------------------------------------------------------------------
    def connect(
        self,
        address: str | None,
        backends: tuple[str, ...],
        setup: Any,
        resources: dict[str, float] | None,
    ) -> None:
        self.mode = cluster.connect(address, backends, setup, resources)

    def device_classes(self) -> dict[str, int]:
        return cluster.device_classes()

    def dashboard_url(self) -> str | None:
        return cluster.dashboard_url()

    @property
    def slots(self) -> list[Slot]:
        return self.fleet.slots if self.fleet is not None else []

    def start(
        self, classes: dict[str, int], backends: tuple[str, ...], setup: Any, commit: str
    ) -> None:
        self.fleet = Fleet(classes, self._backends_by_class(classes, backends), setup, commit)
        for slot in self.fleet.slots:
            self.fleet.start(slot, self.models, fresh=True)

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

    def kill_all(self) -> None:
        for slot in self.slots:
            assert self.fleet is not None
            self.fleet.kill(slot)

    def shutdown(self) -> None:
        """An embedded Ray down (a cluster stays)."""
        if self.mode == "embedded":
            ray.shutdown()

    def drain(self) -> list[Pending]:
        """Every call in flight or waiting to be sent again, taken off the runner (stopping)."""
        calls = list(self.pending)
        for slot in self.slots:
            calls += slot.resubmit
            slot.resubmit = []
        self.pending = []
        return calls

    def others(self, slot: Slot) -> list[Slot]:
        """The live workers of the slot's class but itself."""
        assert self.fleet is not None
        return [
            s for s in self.fleet.of_class(slot.device_class) if s is not slot and s.state != DEAD
        ]

    def alive(self, device_class: str) -> list[Slot]:
        assert self.fleet is not None
        return [s for s in self.fleet.of_class(device_class) if s.state != DEAD]

    # --- dispatch -------------------------------------------------------------------------
    def busy(self, slot: Slot) -> bool:
        return any(p.slot is slot for p in self.pending)

    def load(self, slot: Slot) -> int:
        return sum(p.slot is slot for p in self.pending)

    def dispatch_idle(self) -> None:
        """Keep every ready worker QUEUE_DEPTH calls deep: while it runs a trial, the next one
        waits in its actor queue, so it never idles on the agent (ask, tell, Ray round trip)."""
        for slot in self.slots:
            if slot.state == DEAD:
                continue
            if slot.restart_at:  # lost to infrastructure: started again after its backoff
                if time.monotonic() < slot.restart_at:
                    continue
                assert self.fleet is not None
                slot.restart_at = 0.0
                self.fleet.start(slot, self.models, fresh=not slot.noise)
            if slot.setup or slot.state == STARTING:
                if self.busy(slot):
                    continue
                while slot.setup and not self._dispatch_setup(slot):
                    pass
                if self.busy(slot) or slot.state == DEAD:
                    continue
                slot.state, slot.free_since = IDLE, time.monotonic()
            while self.load(slot) < QUEUE_DEPTH and (
                self._resubmit_next(slot) or self.strategy.dispatch_work(slot)
            ):
                pass
            if not self.busy(slot):
                slot.state, slot.current = IDLE, ""

    def _dispatch_setup(self, slot: Slot) -> bool:
        """Send the slot's next setup call; False when there was nothing to send for it."""
        phase, model = slot.setup.pop(0)
        now = time.monotonic()
        if phase is Phase.INFO:
            ref = slot.actor.info.remote()
        elif phase is Phase.LOAD:
            ref = slot.actor.load.remote(model)
        else:
            args = self.strategy.aa_args(slot, model)
            if args is None:  # the model did not load on this class
                return False
            ref = slot.actor.evaluate.remote(*args)
        timeout = {Phase.INFO: INFO_TIMEOUT_S, Phase.LOAD: LOAD_TIMEOUT_S}.get(
            phase, self.trial_timeout_s
        )
        slot.phase = advance(slot.phase, phase)
        self.pending.append(Pending(phase, slot, ref, now, now + timeout, model=model))
        return True

    def send(self, p: Pending, resent: bool = False) -> None:
        """Send an evaluation (trial or confirmation) to ``p.slot``: it runs now, or queued behind
        the slot's running call, whose end starts its clock."""
        slot, st = p.slot, p.study
        assert st is not None
        now = time.monotonic()
        args, kwargs = self.strategy.evaluate_args(p)
        p.ref = slot.actor.evaluate.remote(*args, **kwargs)
        queued = self.busy(slot)
        p.dispatched = now
        p.deadline = float("inf") if queued else now + self.trial_timeout_s
        p.gap_s = 0.0 if resent or queued or not slot.free_since else now - slot.free_since
        p.gap_s = max(0.0, p.gap_s)
        slot.phase = advance(slot.phase, p.phase)
        self.pending.append(p)
        if not queued:
            slot.state, slot.current = BUSY, f"{st.name} #{p.trial.number}"
        elif p.config is not None:  # it waits behind a trial: compile its kernels meanwhile
            slot.actor.precompile.remote(st.model, p.config)

    def _resubmit_next(self, slot: Slot) -> bool:
        """Send a call again (same trial) to the slot's new worker, against the current best."""
        if not slot.resubmit:  # calls queued behind one that killed the previous worker
            return False
        p = slot.resubmit.pop(0)
        assert p.study is not None
        p.slot, p.paired_against = slot, p.study.best.trial
        self.send(p, resent=True)
        return True

    def _start_next(self, slot: Slot, now: float) -> None:
        """The slot's next queued call starts running now: start its clock."""
        for q in self.pending:
            if q.slot is slot:
                if q.deadline == float("inf"):
                    q.dispatched, q.deadline = now, now + self.trial_timeout_s
                    if q.study is not None:
                        slot.current = f"{q.study.name} #{q.trial.number}"
                return

    # --- results --------------------------------------------------------------------------
    def wait(self) -> bool:
        """Wait for any result or deadline and hand each on; False when nothing is in flight."""
        restarts = [s.restart_at for s in self.slots if s.restart_at and s.state != DEAD]
        if not self.pending:
            if not restarts:
                return False
            time.sleep(max(0.0, min(restarts) - time.monotonic()))  # a worker's backoff
            return True
        refs = [p.ref for p in self.pending]
        wake = min([p.deadline for p in self.pending] + restarts)
        wait = max(0.0, wake - time.monotonic())
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
        return True

    def _handle(self, p: Pending, now: float) -> None:
        slot = p.slot
        slot.free_since = now
        self._start_next(slot, now)
        try:
            value = ray.get(p.ref)
        except Exception as e:  # noqa: BLE001 - the worker lost, or an error raised inside it
            why = infrastructure_cause(e)
            if why is not None:  # not the config's doing: retried with backoff, never charged
                self._infra_lost(p, why)
                return
            if isinstance(e, ray.exceptions.RayActorError | ray.exceptions.WorkerCrashedError):
                self._worker_lost(p, Outcome.CRASH, f"worker died: {first_line(e)}")
                return
            if p.phase in (Phase.INFO, Phase.LOAD):
                self._setup_failed(p, cause_line(e))
                return
            value = EvalResult(Outcome.CRASH, slot.info, p.flat, {}, cause_line(e))
        if p.phase is Phase.INFO:
            self._got_info(slot, value)
        elif p.phase is Phase.LOAD:
            self.strategy.got_model(slot, p.model, value)
        elif p.phase is Phase.AA:
            self.strategy.got_aa(slot, p.model, value)
        else:
            self._evaluated(p, value, now)

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
        assert self.fleet is not None
        self.fleet.kill(slot)
        slot.backend_index += 1
        if slot.backend_index >= len(slot.backends):
            slot.state, slot.setup = DEAD, []
            self.warnings.append(
                f"worker {slot.worker_id}: no backend of {list(slot.backends)} serves class "
                f"{slot.device_class!r} ({why})"
            )
            return
        self.fleet.start(slot, self.models, fresh=not slot.noise)

    def _setup_failed(self, p: Pending, why: str) -> None:
        assert self.fleet is not None
        if p.phase is Phase.INFO:
            self._next_backend(p.slot, why)
            return
        p.slot.state, p.slot.setup = DEAD, []
        self.fleet.kill(p.slot)
        self.warnings.append(f"worker {p.slot.worker_id}: cannot load {p.model}: {why}")

    # --- failures -------------------------------------------------------------------------
    def _infra_lost(self, p: Pending, why: str) -> None:
        """A call lost to infrastructure (agent.infra): its worker starts again after a backoff,
        the call and those queued behind it are sent again, and none is the config's failure:
        nothing charged to the budget nor told to the sampler. A call lost so INFRA_TRIES times
        is given up as interrupted (its config free); a worker lost so INFRA_LOSSES_IN_A_ROW
        times in a row is retired."""
        assert self.fleet is not None
        slot = p.slot
        slot.infra_losses += 1
        delay = backoff_s(slot.infra_losses)
        self.fleet.kill(slot)
        slot.last_finished = 0.0
        slot.restarts += 1
        queued = [q for q in self.pending if q.slot is slot]
        for q in queued:
            self.pending.remove(q)
        for q in [p, *queued]:
            if not q.phase.evaluation or q.study is None:
                continue
            if q is p:
                q.infra_tries += 1
            if q.infra_tries >= INFRA_TRIES:
                self.strategy.abandon(
                    q, f"lost to infrastructure {q.infra_tries} times ({why}); not the config's"
                )
                continue
            q.study.move(q.trial.number, TrialStage.retry(q.phase))
            others = [s for s in self.others(slot) if not s.restart_at]
            (min(others, key=self.load) if others else slot).resubmit.append(q)
        slot.state, slot.setup, slot.current = STARTING, [], ""
        if slot.infra_losses >= INFRA_LOSSES_IN_A_ROW:
            slot.state = DEAD
            self.warnings.append(
                f"worker {slot.worker_id}: retired after {slot.infra_losses} losses to "
                f"infrastructure in a row ({why})"
            )
            for q in slot.resubmit:
                if q.study is not None:
                    self.strategy.abandon(q, "its worker was retired")
            slot.resubmit.clear()
            return
        slot.restart_at = time.monotonic() + delay
        log.warning(
            "worker %s: %s during %s; infrastructure, not the config: %s again in %.0f s",
            slot.worker_id,
            why,
            f"trial {p.trial.number} [{p.study.name}]" if p.study is not None else p.phase,
            "restarting it and sending its calls",
            delay,
        )

    def _timed_out(self, p: Pending) -> None:
        limit = p.deadline - p.dispatched
        self._worker_lost(p, Outcome.TIMEOUT, f"no result after {limit:.0f}s; worker restarted")

    def _retry_elsewhere(self, p: Pending, reason: str) -> bool:
        """A worker lost from outside (OOM killer, operator) says nothing about its config: run
        the call once more, on another live worker of the class or on this one restarted."""
        if not p.phase.evaluation or p.lost or p.study is None:
            return False
        p.study.move(p.trial.number, TrialStage.retry(p.phase))
        p.lost = f"{reason} (on {p.slot.worker_id})"
        others = self.others(p.slot)
        target = min(others, key=self.load) if others else p.slot
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
        assert self.fleet is not None
        slot = p.slot
        log.warning("worker %s: %s (%s)", slot.worker_id, reason, p.phase)
        self.fleet.kill(slot)
        slot.last_finished = 0.0
        for q in [q for q in self.pending if q.slot is slot]:  # queued behind it: run again
            self.pending.remove(q)
            if q.study is not None:
                q.study.move(q.trial.number, TrialStage.retry(q.phase))
            slot.resubmit.append(q)
        slot.restarts += 1
        slot.failures_in_a_row += 1
        if p.lost:
            reason = f"{reason}; lost once before and retried: {p.lost}"
        if not (outcome is Outcome.CRASH and self._retry_elsewhere(p, reason)):
            self.strategy.lost(p, outcome, reason)
        if p.phase is Phase.INFO:  # never placed or never opened its device: try the next backend
            self._next_backend(slot, reason)
            return
        if slot.failures_in_a_row > MAX_RESTARTS_IN_A_ROW:
            slot.state, slot.setup = DEAD, []
            self.warnings.append(f"worker {slot.worker_id}: retired after repeated failures")
            for q in slot.resubmit:  # nobody left to run them here: free their configs
                if q.study is not None:
                    self.strategy.abandon(q, "its worker was retired")
            slot.resubmit.clear()
            return
        # A restarted worker keeps its A/A noise; one lost during setup starts over.
        self.fleet.start(slot, self.models, fresh=not slot.noise)
        if p.phase is Phase.AA and (Phase.AA, p.model) not in slot.setup:
            slot.setup.append((Phase.AA, p.model))
