"""The local runner: the agent's calls run in this process on this machine's devices, no Ray.

Same strategy (agent.loop.Agent: ask, decide, confirm, tell, promote), same acceptance and the
same worker code (worker.evaluator.Evaluator, which the Ray actor wraps): only the dispatch
differs. One slot per device class found here, the first of the experiment's backends that
serves it; calls run one at a time, in order, with one BLAS thread as a Ray worker has.

    python -m agent run experiments/X.toml --local

What it cannot do that the Ray runner does: cut a trial short at its timeout (a call in this
process cannot be killed; its wall time is recorded), restart a worker that died (a crash of the
process ends the run; the next run resumes the study), confirm on a second device of a class.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.dispatch import Pending, Runner, cause_line, first_line
from agent.fleet import BUSY, DEAD, IDLE, Slot, setup_calls
from agent.phase import Phase, advance
from worker.records import EvalResult, Outcome

log = logging.getLogger("agent")

QUEUE_DEPTH = 2  # evaluations per slot: the one running next and the one after it


class LocalRunner(Runner):
    mode = "local"  # its trial_timeout_s is not enforced: see the module doc

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Runner's: one signature to keep
        super().__init__(*args, **kwargs)
        self.slots: list[Slot] = []
        self._backend_of: dict[str, str] = {}  # device class -> the backend that serves it
        self._threads: Any = None  # threadpoolctl's limit while connected

    # --- the machine ----------------------------------------------------------------------
    def connect(
        self,
        address: str | None,
        backends: tuple[str, ...],
        setup: Callable[[], None] | None,
        resources: dict[str, float] | None,
    ) -> None:
        """Find this machine's device classes: each backend of the experiment that opens a
        device here, the first one per class (``address`` and ``resources`` are Ray's)."""
        from threadpoolctl import threadpool_limits

        from engine import backends as engine_backends

        # One BLAS/OpenMP thread, as Ray gives a worker (num_cpus=0: OMP_NUM_THREADS=1), so a
        # config measures alike here and on the fleet; threaded BLAS on a busy machine made
        # NumPy trials 25x slower and their ranking noise. Undone in shutdown.
        self._threads = threadpool_limits(limits=1)
        if setup is not None:
            setup()
        for b in backends:
            try:
                with engine_backends.create(b) as be:  # opened to ask, closed again
                    cls = be.device_info().device_class
            except Exception as e:  # noqa: BLE001 - not usable here: say so, try the next
                log.info("backend %s: no device here (%s)", b, first_line(e))
                continue
            self._backend_of.setdefault(cls, b)

    def device_classes(self) -> dict[str, int]:
        return dict.fromkeys(self._backend_of, 1)

    def dashboard_url(self) -> str | None:
        return None

    def start(
        self,
        classes: dict[str, int],
        backends: tuple[str, ...],
        setup: Callable[[], None] | None,
        commit: str,
    ) -> None:
        from worker.evaluator import Evaluator
        from worker.refcache import ref_root

        for c in classes:
            slot = Slot(f"{c}-0", c, (self._backend_of[c],))
            slot.actor = Evaluator(
                slot.backend, slot.worker_id, "", commit, ref_cache_dir=ref_root()
            )
            slot.setup = setup_calls(self.models, fresh=True)
            self.slots.append(slot)

    def kill_all(self) -> None:
        for slot in self.slots:
            if slot.actor is not None:
                slot.actor.close()  # its compile-ahead processes
            slot.actor = None  # the evaluator and its models go with it

    def shutdown(self) -> None:
        if self._threads is not None:
            self._threads.restore_original_limits()
            self._threads = None

    def drain(self) -> list[Pending]:
        calls, self.pending = self.pending, []
        return calls

    def others(self, slot: Slot) -> list[Slot]:
        return []  # one device per class here: a confirmation runs on the same one

    def alive(self, device_class: str) -> list[Slot]:
        return [s for s in self.slots if s.device_class == device_class and s.state != DEAD]

    # --- dispatch -------------------------------------------------------------------------
    def dispatch_idle(self) -> None:
        """Run each slot's setup calls, then ask the strategy for its next evaluation."""
        for slot in self.slots:
            if slot.state == DEAD:
                continue
            while slot.setup and slot.state != DEAD:
                self._setup(slot, *slot.setup.pop(0))
            if slot.state == DEAD:
                continue
            if not any(p.slot is slot for p in self.pending):
                slot.state, slot.current, slot.free_since = IDLE, "", time.monotonic()
            # Two calls deep, as the Ray runner keeps a worker: the next one is known while the
            # current one runs, so its kernels compile ahead in a CPU process (send).
            while self._load(slot) < QUEUE_DEPTH and self.strategy.dispatch_work(slot):
                pass

    def _load(self, slot: Slot) -> int:
        return sum(p.slot is slot for p in self.pending)

    def _setup(self, slot: Slot, phase: Phase, model: str) -> None:
        ev = slot.actor
        if phase is Phase.AA:
            args = self.strategy.aa_args(slot, model)
            if args is None:  # the model did not load on this class
                return
        slot.phase = advance(slot.phase, phase)
        try:
            if phase is Phase.INFO:
                slot.info = ev.info()
            elif phase is Phase.LOAD:
                self.strategy.got_model(slot, model, ev.load(model))
            else:
                self.strategy.got_aa(slot, model, ev.evaluate(*args))
        except Exception as e:  # noqa: BLE001 - the device or the model cannot be used
            slot.state, slot.setup = DEAD, []
            what = "cannot open its device" if phase is Phase.INFO else f"cannot load {model}"
            self.warnings.append(f"worker {slot.worker_id}: {what}: {first_line(e)}")

    def send(self, p: Pending, resent: bool = False) -> None:
        """Queue an evaluation for ``p.slot``; ``wait`` runs it."""
        assert p.study is not None
        args, kwargs = self.strategy.evaluate_args(p)
        p.ref = (args, kwargs)
        queued = self._load(p.slot) > 0
        if queued and p.config is not None:  # it waits behind a trial: compile it meanwhile
            p.slot.actor.precompile(p.study.model, p.config)
        p.slot.phase = advance(p.slot.phase, p.phase)
        if not queued:
            self._start(p)
        self.pending.append(p)

    def _start(self, p: Pending) -> None:
        """The call runs now: its clock and the agent's gap before it start here."""
        assert p.study is not None
        now = time.monotonic()
        p.dispatched, p.deadline = now, now + self.trial_timeout_s
        p.gap_s = max(0.0, now - p.slot.free_since) if p.slot.free_since else 0.0
        p.slot.state, p.slot.current = BUSY, f"{p.study.name} #{p.trial.number}"

    # --- results --------------------------------------------------------------------------
    def wait(self) -> bool:
        """Run the next queued evaluation and hand its result on; False when none is queued."""
        if not self.pending:
            return False
        p = self.pending.pop(0)
        slot = p.slot
        if p.dispatched == 0.0:
            self._start(p)  # it was queued behind the one before: it starts now
        args, kwargs = p.ref
        try:
            res = slot.actor.evaluate(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the evaluator reports bad configs itself
            res = EvalResult(Outcome.CRASH, slot.info, p.flat, {}, cause_line(e))
        now = time.monotonic()
        slot.free_since = now
        if res.wall_s > self.trial_timeout_s:
            log.warning(
                "trial %d ran %.0f s, past the %.0f s trial timeout (not enforced locally)",
                p.trial.number,
                res.wall_s,
                self.trial_timeout_s,
            )
        self._evaluated(p, res, now)
        return True
